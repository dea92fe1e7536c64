package controller_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/natsperm"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// x17StartServer is natspermtest.StartServer (the event stream and the
// lease bucket provisioned by an admin, then only the shipped accounts
// file) with jsExtra added to the server's jetstream block; denyPurge
// provisions both streams with deny_purge (nats stream edit --deny-purge).
func x17StartServer(t *testing.T, jsExtra string, old bool) string {
	t.Helper()
	dir := t.TempDir()
	start := func(conf string) *server.Server {
		main := filepath.Join(dir, "nats-server.conf")
		if err := os.WriteFile(main, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := server.ProcessConfigFile(main)
		if err != nil {
			t.Fatalf("nats-server config: %v", err)
		}
		o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		return s
	}
	js := fmt.Sprintf("jetstream: {store_dir: %q%s}\n", filepath.Join(dir, "js"), jsExtra)
	admin := start(js + fmt.Sprintf("accounts { %s { jetstream: enabled, users: [{user: admin, password: x17}] }, %s { jetstream: enabled } }\n",
		natsperm.Account, natsperm.ControlAccount))
	nc, err := nats.Connect(admin.ClientURL(), nats.UserInfo("admin", "x17"))
	if err != nil {
		t.Fatal(err)
	}
	j, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := delivery.StreamConfig(1)
	if old { // provisioned before X17: purges and message deletes allowed
		ev.DenyPurge, ev.DenyDelete = false, false
	}
	if _, err := j.CreateStream(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if !old {
		if _, err := natslease.CreateBucket(ctx, j, 1); err != nil {
			t.Fatal(err)
		}
	} else {
		if _, err := j.CreateKeyValue(ctx, natslease.BucketConfig(1)); err != nil {
			t.Fatal(err)
		}
		st, err := j.Stream(ctx, natslease.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.AllowRollup, cfg.AllowDirect = false, false
		if _, err := j.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()
	admin.Shutdown()
	admin.WaitForShutdown()
	shipped, err := os.ReadFile(natspermtest.ShippedAccounts())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hvguard-accounts.conf"), shipped, 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(js + "include ./hvguard-accounts.conf\n")
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// TestX17PubAckPurgesStreamsNonStrictNATS (a, c and lost events; reviewer
// X17). What is left of the reflection are JSON answers, and X14/X15
// found none that does anything on $JS.API.*: the API decodes a request
// with DisallowUnknownFields — but only in nats-server's JetStream
// "strict" mode (jetstream { strict: true }, v2.15.2's default, opts.go
// NoJetStreamStrict; a server with strict: false logs the unknown fields
// and decodes the request again leniently: server.unmarshalRequest; the
// releases where strict was opt-in — not checked here — alike). A PubAck
// is {"stream":"KV_hvguard-leases","seq":N}, and a stream purge request is
// {"filter","seq","keep"}: seq N purges every message below N. So
// compute-1 (shipped permissions) puts its own key with the reply subject
// $JS.API.STREAM.PURGE.<stream> (NATS never checks the reply subject):
//   - KV_hvguard-leases: every record below the put is gone without a
//     marker — compute-2's record, the agents' guard copy — the purge
//     the bucket's --no-allow-rollup was provisioned to forbid (a dead
//     host's declaration, a CAS on its last revision, fails);
//   - HVGUARD_EVENTS: every event below N (the lease stream's sequence,
//     normally far ahead of the event stream's) is gone — compute-2's
//     genuine signed stop, stored while no controller consumed, is never
//     seen by the controllers' durable.
//
// "strict" (the default server) must hold (control: the same requests do
// nothing); "non-strict" is the same server with jetstream { strict:
// false } — it failed until hvguard's streams denied purges and message
// deletes (natslease.HardenStream, delivery.StreamConfig; a PubAck on
// $JS.API.STREAM.MSG.DELETE.HVGUARD_EVENTS would have deleted event N:
// the same lenient decoding of {"seq","no_erase"}); streams provisioned
// before that on a non-strict server are still open, and reported by
// both daemons ("non-strict-old-provisioning": natslease.WarnStream).
func TestX17PubAckPurgesStreamsNonStrictNATS(t *testing.T) {
	for _, tc := range []struct {
		name, js string
		old      bool
	}{{"strict", "", false}, {"non-strict", ", strict: false", false}, {"non-strict-old-provisioning", ", strict: false", true}} {
		t.Run(tc.name, func(t *testing.T) {
			url := x17StartServer(t, tc.js, tc.old)
			if tc.old {
				// Streams provisioned before (purges allowed) on a
				// non-strict server: the purge works (X17's finding);
				// both daemons say so (natslease.WarnStream).
				cjs, _ := jetstream.New(natspermtest.Connect(t, url, "controller:ctl-1"))
				var buf bytes.Buffer
				if !natslease.WarnStream(context.Background(), cjs, slog.New(slog.NewTextHandler(&buf, nil))) ||
					!strings.Contains(buf.String(), "deny_purge false") || !strings.Contains(buf.String(), "strict: false") {
					t.Fatalf("the old provisioning on a non-strict server not reported: %q", buf.String())
				}
				t.Logf("reported: %s", buf.String())
				return
			}
			hosts := []string{"compute-1.example.org", "compute-2.example.org"}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			victim, vnc := permStore(t, url, "agent:"+hosts[1], f, hosts[1])
			rec := fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: hosts[1], State: fencing.LeaseActive, Epoch: 1}
			if _, err := victim.Write(ctx, hosts[1], 0, rec, natslease.ReadTimeout); err != nil {
				t.Fatal(err)
			}
			// compute-2's genuine signed stop, stored; no controller
			// consumes yet (a restart, an upgrade).
			publishGenuineStop(ctx, t, url, f, hosts[1], time.Now().UTC())
			vjs, _ := jetstream.New(vnc)
			events := func() uint64 {
				s, err := vjs.Stream(ctx, proto.StreamName)
				if err != nil {
					t.Fatal(err)
				}
				return s.CachedInfo().State.Msgs
			}
			for deadline := time.Now().Add(5 * time.Second); events() == 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("compute-2's stop not stored")
				}
			}
			_, anc := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
			for _, st := range []string{proto.StreamName, natslease.StreamName} {
				if err := anc.PublishRequest("$KV."+fencing.Bucket+".x17", "$JS.API.STREAM.PURGE."+st, []byte("x17")); err != nil {
					t.Fatal(err)
				}
			}
			if err := anc.Flush(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			_, _, err := victim.Read(ctx, hosts[1])
			n := events()
			t.Logf("%s: compute-2's record read: %v; events stored: %d", tc.name, err, n)
			if errors.Is(err, jetstream.ErrKeyNotFound) || n == 0 {
				t.Fatalf("%s: a PubAck reflected onto $JS.API.STREAM.PURGE.* purged: compute-2's lease record (%v), the event stream (%d events left: compute-2's stop lost)", tc.name, err, n)
			}
		})
	}
}

// TestX17PubAckOnConsumerResetNATS (held; reviewer X17). security.md says
// a JSON answer aimed at a consumer's reset subject "has no top-level
// seq" — a message get's or a stream info's. A PubAck has one:
// {"stream":"KV_hvguard-leases","seq":N}, and the reset handler decodes
// leniently (json.Unmarshal, no strict mode). compute-1 (shipped
// permissions) pushes the lease stream's sequence past the event stream's
// (60 puts) and puts its key with the reply subject $JS.API.CONSUMER.
// RESET.HVGUARD_EVENTS.<the controllers' durable>: it holds only because
// the server's PubAck carries no reply subject of its own and
// consumer.processResetReq ignores a request without one (nats-server
// v2.15.2). compute-2's next genuine stop must be applied.
func TestX17PubAckOnConsumerResetNATS(t *testing.T) {
	durable := controller.DurableName("ctl-1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _, anc := startAttackRig(ctx, t, durable)
	for i := 0; i < 60; i++ {
		if err := anc.Publish("$KV."+fencing.Bucket+".x17", []byte("x17")); err != nil {
			t.Fatal(err)
		}
	}
	if err := anc.PublishRequest("$KV."+fencing.Bucket+".x17", "$JS.API.CONSUMER.RESET."+proto.StreamName+"."+durable, []byte("x17")); err != nil {
		t.Fatal(err)
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	publishGenuineStop(ctx, t, r.url, r.f, r.hosts[1], time.Now().UTC())
	if !r.applied(testUUID, 8*time.Second) {
		ci, err := r.cjs.Consumer(ctx, proto.StreamName, durable)
		var state any = err
		if err == nil {
			state = ci.CachedInfo().Delivered
		}
		t.Fatalf("compute-2's genuine signed stop not applied within 8 s (the controllers' durable delivered: %+v)", state)
	}
	t.Log("compute-2's stop applied")
}
