package controller_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// Attack (reviewer X1): a controller that first sees a host's lease
// already declared — it (re)started, or took over from a controller with
// another configuration, after the declaration — must still refuse to
// recover a host whose backstop it does not accept. The declaration was
// written by a controller that accepted the agent-dependent reset
// backstop; this one does not (the default). The tracker computes a
// host's refusal (and its grace) only from an active record, so a host
// first observed expired shows Refused "" and Due = lease_ttl + 0: the
// recovery confirms the declaration and forces the host down, removes its
// attachments and evacuates it.
func TestAttackRecoveryFirstSeenExpiredBackstopNotAccepted(t *testing.T) {
	_, _, js := controllertest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leases, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fencing.Bucket, History: 16})
	if err != nil {
		t.Fatal(err)
	}
	rkv, err := controller.EnsureRecoveryBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	st := &natslease.Store{KV: leases}
	declared := controllertest.HostRecord("h0")
	declared.Backstop = fencing.BackstopReset // this controller's config refuses it
	declared.State, declared.Epoch = fencing.LeaseExpired, 1
	declared.Reason = "no renewal for 3.1s (lease_ttl 1.5s + grace 1.6s) (declared by controller ctl-old, term 4)"
	if _, err := st.Write(ctx, "h0", 0, declared, time.Second); err != nil {
		t.Fatal(err)
	}
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	cfg := controller.DefaultConfig() // AcceptAgentDependentBackstop off
	cfg.GuardShare = 0.5
	if _, err := cfg.Grace(declared); err == nil {
		t.Fatal("the test needs a backstop this controller refuses")
	}
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := &controller.Runner{Store: st, Tracker: tr, Log: quiet(),
		Signature: func() string { return "declared by controller ctl-a, term 5" }}
	go run.Run(ctx)

	cloud := controllertest.NewRecoveryCloud()
	rcfg := recovery.DefaultConfig()
	rcfg.Mode = recovery.ModeEvacuate
	core, err := recovery.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []recovery.Event
	var acting atomic.Bool
	acting.Store(true)
	rr := &controller.RecoveryRunner{KV: rkv, Leases: st, Core: core, Cloud: cloud.As("ctl-a"), View: run.View,
		MayAct: func(time.Time) bool { return acting.Load() }, Log: quiet(), By: func() string { return "ctl-a" },
		OnEvent: func(ev recovery.Event) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Op == "refused" && ev.Why == recovery.WhyBackstop {
				refused = append(refused, ev)
			}
		}}
	go rr.Run(ctx)
	// lease_ttl + grace is 3.05 s at this timing: 8 s is well past it.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if calls := cloud.Calls(); len(calls) > 0 {
			t.Fatalf("a host whose backstop this controller refuses was recovered: %v", calls)
		}
		mu.Lock()
		n := len(refused)
		mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("neither refused (%s) nor recovered within 8 s; calls %v", recovery.WhyBackstop, cloud.Calls())
}
