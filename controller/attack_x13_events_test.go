package controller_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	ir "hvguard/controller/instancerecovery"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// idCloud is testCloud recording which servers it started.
type idCloud struct {
	testCloud
	mu      sync.Mutex
	started []string
}

func (c *idCloud) Start(ctx context.Context, id string) error {
	c.mu.Lock()
	c.started = append(c.started, id)
	c.mu.Unlock()
	return c.testCloud.Start(ctx, id)
}
func (c *idCloud) HardReboot(ctx context.Context, id string) error { return c.Start(ctx, id) }

func (c *idCloud) startedIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.started)
}

// TestX13ReflectedLifecycleEventRefused (reviewer X13, the "JetStream
// reflection" of lifecycle events; issue 11): compute-1's NATS user may
// not publish on compute-2's lifecycle subject (the shipped permissions
// refuse it), but a direct get of a value it stored in a lease key it may
// write, with compute-2's lifecycle subject as the reply, makes the server
// publish it there, headers included, and HVGUARD_EVENTS stores it as
// compute-2's event. The forgery is a stop of an HA-enabled instance that
// instance recovery would start: once unsigned, once signed by compute-1's
// own host key. Against nats-server with the shipped permissions, a
// controller consumer with signing required (under the controller's user)
// feeding a real instance recovery runner refuses both — counted by
// reason, never applied to the fleet view, never acted on — while compute-2's
// genuine stop, published by its real agent publisher signed with its host
// key, is applied and recovered.
func TestX13ReflectedLifecycleEventRefused(t *testing.T) {
	url := natspermtest.StartServer(t)
	hosts := []string{"compute-1.example.org", "compute-2.example.org"}
	victim := hosts[1]
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const forgedUUID = "0f0f0f0f-1111-4222-8333-444444444444"

	// The controller: consumer and instance recovery, as the daemon wires
	// them (controller/daemon/instance.go), on the controller's user.
	// (the instance recovery bucket in the controllers' account).
	cnc := natspermtest.Connect(t, url, "controller:ctl-1")
	cjs, _ := jetstream.New(cnc)
	ijs, _ := jetstream.New(natspermtest.Connect(t, url, "controller:ctl-1:control"))
	ikv, err := controller.EnsureInstanceBucket(ctx, ijs, false)
	if err != nil {
		t.Fatal(err)
	}
	cloud := &idCloud{testCloud: testCloud{s: ir.Server{Found: true, Host: victim, Project: "p", VMState: "stopped", PowerState: 4,
		Status: "SHUTOFF", Metadata: map[string]string{"HA_Enabled": "True"}}}}
	cfg := ir.DefaultConfig()
	cfg.ID, cfg.PollInterval = "ctl-1", 100*time.Millisecond
	core, err := ir.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runner := &controller.InstanceRecoveryRunner{Core: core, KV: ikv, Cloud: cloud, CloudTimeout: time.Second,
		MayAct: func(time.Time) bool { return true }, LeaderNow: time.Now}
	var mu sync.Mutex
	var seen []string // domain UUIDs the fleet view applied
	cons := &controller.Consumer{JS: cjs, ID: "ctl-1", Keys: f.ring,
		OnApplied: func(fe controller.FleetEvent, v controller.Verdict) {
			mu.Lock()
			seen = append(seen, fe.DomainUUID)
			mu.Unlock()
			runner.Observe(fe, v)
		},
		OnSynced: runner.Synced}
	go func() { _ = runner.Run(ctx) }()
	go func() { _ = cons.Run(ctx) }()

	// The attack: compute-1 (its NKey, its host key) reflects two forged
	// stops of compute-2 onto compute-2's lifecycle subject.
	_, anc := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
	ajs, _ := jetstream.New(anc)
	subj, err := proto.LifecycleSubject(victim)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	forged, err := (&proto.LifecycleEvent{Schema: proto.SchemaVersion, Host: victim, Incarnation: 99, Seq: 1, DomainUUID: forgedUUID,
		DomainName: "instance-0000000f", Transition: proto.TransitionStopped, State: "shutoff", LibvirtEvent: "STOPPED", LibvirtDetail: "FAILED",
		OccurredAt: now, ObservedAt: now, Classification: proto.ClassificationStoppedUnexpectedly, ClassificationReason: "no-operation"}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := anc.Publish(subj, forged); err != nil { // refused by the permissions (asynchronously)
		t.Fatal(err)
	}
	signer, sig := f.signers[hosts[0]].SignEvent(subj, forged)
	for key, signed := range map[string]bool{"x13-unsigned": false, "x13-signed": true} {
		m := nats.NewMsg("$KV." + fencing.Bucket + "." + key)
		m.Data = forged
		if signed { // compute-1's own key, over compute-2's subject
			m.Header.Set(proto.EventSignerHeader, signer)
			m.Header.Set(proto.EventSigHeader, sig)
		}
		if _, err := ajs.PublishMsg(ctx, m); err != nil {
			t.Fatalf("the attacker's put refused: %v", err)
		}
		// The direct get (the stored message verbatim, headers and all)
		// is denied to agents since X14; the message get's answer (JSON:
		// the forgery base64'd inside, no event headers) still lands.
		get := "$JS.API.DIRECT.GET." + natslease.StreamName + ".$KV." + fencing.Bucket + "." + key
		if err := anc.PublishRequest(get, subj, nil); err != nil {
			t.Fatal(err)
		}
		if err := anc.PublishMsg(&nats.Msg{Subject: "$JS.API.STREAM.MSG.GET." + natslease.StreamName, Reply: subj,
			Data: []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + key + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The reflection lands: two answers are stored as compute-2's events
	// (otherwise this test would show nothing). Before X14's fix they were
	// the forgeries verbatim (one unsigned, one signed by compute-1's
	// key: refused as unsigned and foreign-key); now they are the message
	// gets' JSON answers, unsigned.
	rd := natspermtest.Connect(t, url, "reader:dashboard")
	rjs, _ := jetstream.New(rd)
	stream, err := rjs.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err == nil && info.State.Subjects[subj] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reflected forgeries were not stored on %s: %+v %v", subj, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// compute-2's genuine stop, through its real outbox and publisher,
	// signed with its host key, stored after the forgeries.
	publishGenuineStop(ctx, t, url, f, victim, now)

	// Wait for the genuine stop to be recovered (the forgeries, stored
	// before it, were handled before it).
	for deadline := time.Now().Add(15 * time.Second); !slices.Contains(cloud.startedIDs(), testUUID) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // anything the forgeries started would show by now
	ids := cloud.startedIDs()
	if slices.Contains(ids, forgedUUID) {
		t.Errorf("instance recovery started %s on compute-1's reflected forgery of compute-2's event (started: %v)", forgedUUID, ids)
	}
	if !slices.Contains(ids, testUUID) {
		t.Errorf("compute-2's genuine, signed stop was not recovered within 15 s (started: %v, refused: %v)", ids, refusedCounts(cons))
	}
	mu.Lock()
	if slices.Contains(seen, forgedUUID) {
		t.Errorf("the fleet view applied compute-1's reflected forgery of compute-2's event (applied: %v)", seen)
	}
	mu.Unlock()
	cons.View(func(fl *controller.Fleet) {
		if h := fl.Host(victim); h == nil || h.Domains[forgedUUID] != nil || h.Incarnation == 99 {
			t.Errorf("fleet view of compute-2 records the forgery: %+v", h)
		}
	})
	if got, want := refusedCounts(cons), map[string]uint64{fencing.EventUnsigned: 2}; !maps.Equal(got, want) {
		t.Errorf("refused %v, want %v", got, want)
	}
}

func refusedCounts(c *controller.Consumer) map[string]uint64 {
	out := map[string]uint64{}
	for i, r := range controller.RefusedReasons {
		if n := c.Stats.Refused[i].Load(); n > 0 {
			out[r] = n
		}
	}
	return out
}
