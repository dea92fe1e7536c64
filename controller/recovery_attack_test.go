package controller_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	ctx, _, leases, rkv := recoveryBuckets(t)
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

// Attack (reviewer X1): nova_hosts maps the live, renewing lease host h1
// to nova-compute host h0 — which is also the declared lease host h0's
// own (identity) name. Nova host h0 is, by the configuration, h1's: the
// recovery of h0 must not force it down nor evacuate its servers (their
// host's agent is alive; each evacuation would run a second copy). It
// does: the runner never asks whether another lease host claims the same
// nova-compute host.
func TestAttackRecoveryNovaHostClaimedByLiveHost(t *testing.T) {
	t.Parallel()
	e := newRecoveryEnv(t)
	cfg := recovery.DefaultConfig()
	cfg.Mode = recovery.ModeEvacuate
	cfg.NovaHosts = map[string]string{"h1": "H0"} // case differs: the same host to Nova's MariaDB
	core, err := recovery.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []recovery.Event
	rr := &controller.RecoveryRunner{KV: e.rkv, Leases: e.st, Core: core, Cloud: e.cloud.As("ctl-a"), View: e.tracker.View,
		MayAct: func(time.Time) bool { return true }, Log: quiet(), By: func() string { return "ctl-a" },
		OnEvent: func(ev recovery.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		}}
	go rr.Run(e.ctx)
	e.waitDeclared(t)
	deadline := time.Now().Add(6 * time.Second) // lease_ttl + grace is 3.05 s
	for time.Now().Before(deadline) {
		if calls := e.cloud.Calls(); len(calls) > 0 {
			t.Fatalf("the nova-compute host of live lease host h1 was recovered for h0: %v", calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev.Op == "refused" {
			return
		}
	}
	t.Errorf("no refusal said: %+v", events)
}

// Attack (reviewer X1): a rolling upgrade — a newer controller (record
// schema 2) was recovering h0 and an older one (schema 1) leads again
// (the newer one crashed). The older one cannot decode the record; it
// ignores it, then overwrites it by CAS with a fresh recovery of its own
// and calls Nova for a host whose progress it cannot read (the newer
// one's intents, in flight or not, are lost). A record it cannot read
// must stop it from recovering that host, not be overwritten.
func TestAttackRecoveryNewerRecordNotOverwritten(t *testing.T) {
	t.Parallel()
	e := newRecoveryEnv(t)
	newer := []byte(`{"schema":2,"host":"h0","nova_host":"h0","mode":"evacuate","epoch":1,"phase":"evacuate","started_by":"controller ctl-new, term 9","instances":[{"id":"s-bfv-1","evac":"intent","attempts":1}]}`)
	rev, err := e.rkv.Create(e.ctx, "h0", newer)
	if err != nil {
		t.Fatal(err)
	}
	var acting atomic.Bool
	acting.Store(true)
	var mu sync.Mutex
	var events []recovery.Event
	e.runner(t, "ctl-old", &acting, &events, &mu)
	e.waitDeclared(t)
	deadline := time.Now().Add(6 * time.Second) // lease_ttl + grace is 3.05 s
	for time.Now().Before(deadline) {
		if calls := e.cloud.Calls(); len(calls) > 0 {
			t.Fatalf("recovered a host whose record it cannot read: %v", calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	en, err := e.rkv.Get(e.ctx, "h0")
	if err != nil || en.Revision() != rev {
		t.Fatalf("the newer version's record was overwritten: %v %v", en, err)
	}
}

// Attack (reviewer X1): the agent's host was renamed (h0 → h0-new) without
// an orderly stop (a crash, then the new configuration): the old key h0
// is left active, falls silent and is declared, while the same machine —
// the same boot id, its guests running, Nova still calling it h0 —
// renews as h0-new. The recovery of h0 forces down and evacuates a live
// host's servers. A declared host whose boot id another renewing lease
// host carries is alive under another name: never recovered.
func TestAttackRecoveryRenamedHostAlive(t *testing.T) {
	t.Parallel()
	ctx, _, leases, rkv := recoveryBuckets(t)
	st := &natslease.Store{KV: leases}
	old := controllertest.HostRecord("h0")
	old.BootID = "5f1c7a2e-0d43-4c1b-9a57-3b0e2f6d8c11"
	if _, err := st.Write(ctx, "h0", 0, old, time.Second); err != nil {
		t.Fatal(err)
	}
	renamed := controllertest.HostRecord("h0-new")
	renamed.BootID = old.BootID // the same running machine
	stop := controllertest.RenewRecord(ctx, st, renamed)
	defer stop()
	go controllertest.Renew(ctx, st, "h1", "h2", "h3", "h4")
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := &controller.Runner{Store: st, Tracker: tr, Log: quiet(),
		Signature: func() string { return "declared by controller ctl-a, term 1" }}
	go run.Run(ctx)
	e := &recoveryEnv{ctx: ctx, leases: leases, rkv: rkv, st: st, tracker: run, cloud: controllertest.NewRecoveryCloud()}
	var acting atomic.Bool
	acting.Store(true)
	var mu sync.Mutex
	var events []recovery.Event
	e.runner(t, "ctl-a", &acting, &events, &mu)
	e.waitDeclared(t)
	deadline := time.Now().Add(6 * time.Second) // lease_ttl + grace is 3.05 s
	for time.Now().Before(deadline) {
		if calls := e.cloud.Calls(); len(calls) > 0 {
			t.Fatalf("recovered h0 while its machine renews as h0-new: %v", calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
