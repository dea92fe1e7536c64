package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/keyfile"
	"hvguard/proto"
)

// TestAgentSignsEvents: the whole agent (Run; fencing off, reconcile on)
// with fence.signing.mode optional publishes its lifecycle and reconcile
// events signed with its host key: every event stored on its subjects
// verifies against the host's key under signing required (what a
// controller with signing required accepts).
func TestAgentSignsEvents(t *testing.T) {
	recDomains(t)
	nova := recNova(t)
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	cfg := recConfig(t, ns.ClientURL(), nova.CloudsYAML(t))
	dir := t.TempDir()
	seed := filepath.Join(dir, "agent.seed")
	pub, err := keyfile.Generate(seed)
	if err != nil {
		t.Fatal(err)
	}
	ctlPub, _ := keyfile.Generate(filepath.Join(dir, "ctl.seed"))
	hosts := filepath.Join(dir, "host_keys")
	if err := os.WriteFile(hosts, []byte("node1 "+pub+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Fence.Signing = SigningConfig{Mode: "optional", KeyFile: seed, ControllerKeys: []string{ctlPub}, HostKeysFile: hosts}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keyfile.HostKeys(hosts)
	if err != nil {
		t.Fatal(err)
	}
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: keys}
	runAgent(t, cfg)

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, _ := proto.HostToken("node1")
	var cons jetstream.Consumer
	for { // the agent creates the stream
		if cons, err = js.OrderedConsumer(ctx, proto.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{proto.SubjectPrefix + "." + tok + ".>"}}); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	kinds := map[string]int{}
	for kinds[proto.KindLifecycle] == 0 || kinds[proto.KindReconcile] == 0 {
		d, _ := ctx.Deadline()
		m, err := cons.Next(jetstream.FetchMaxWait(time.Until(d)))
		if err != nil {
			t.Fatalf("events of node1 by kind %v: %v", kinds, err)
		}
		_, kind, _ := proto.SubjectHost(m.Subject())
		kinds[kind]++
		h := m.Headers()
		if err := ring.VerifyEvent("node1", m.Subject(), m.Data(), h.Get(proto.EventSignerHeader), h.Get(proto.EventSigHeader)); err != nil {
			t.Errorf("%s event: %v (headers %v)", kind, err, h)
		}
	}
	t.Logf("verified events by kind: %v", kinds)
}
