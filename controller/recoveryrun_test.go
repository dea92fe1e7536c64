package controller_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// recoveryEnv is a lease bucket whose host h0 fell silent and is declared
// by a real tracker (signed), h1-h3 renewing, and the recovery bucket.
type recoveryEnv struct {
	ctx     context.Context
	leases  jetstream.KeyValue
	rkv     jetstream.KeyValue
	st      *natslease.Store
	tracker *controller.Runner
	cloud   *controllertest.RecoveryCloud
	// nc, if set, is the runners' RecoveryRunner.NC (leader reads).
	nc *nats.Conn
}

// recoveryBuckets starts JetStream with a lease bucket keeping 16
// revisions and the recovery bucket; ctx ends with the test (60 s at most).
func recoveryBuckets(t *testing.T) (ctx context.Context, nc *nats.Conn, leases, rkv jetstream.KeyValue) {
	t.Helper()
	_, nc, js := controllertest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	leases, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fencing.Bucket, History: 16})
	if err != nil {
		t.Fatal(err)
	}
	rkv, err = controller.EnsureRecoveryBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, nc, leases, rkv
}

func newRecoveryEnv(t *testing.T) *recoveryEnv {
	t.Helper()
	ctx, _, leases, rkv := recoveryBuckets(t)
	st := &natslease.Store{KV: leases}
	if _, err := st.Write(ctx, "h0", 0, controllertest.HostRecord("h0"), time.Second); err != nil {
		t.Fatal(err)
	}
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &controller.Runner{Store: st, Tracker: tr, Log: quiet(),
		Signature: func() string { return "declared by controller ctl-a, term 1" }}
	go r.Run(ctx)
	return &recoveryEnv{ctx: ctx, leases: leases, rkv: rkv, st: st, tracker: r, cloud: controllertest.NewRecoveryCloud()}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runner returns a recovery runner named who, acting while acting says so.
func (e *recoveryEnv) runner(t *testing.T, who string, acting *atomic.Bool, events *[]recovery.Event, mu *sync.Mutex) *controller.RecoveryRunner {
	t.Helper()
	cfg := recovery.DefaultConfig()
	cfg.Mode = recovery.ModeEvacuate
	core, err := recovery.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rr := &controller.RecoveryRunner{KV: e.rkv, Leases: e.st, NC: e.nc, Core: core, Cloud: e.cloud.As(who), View: e.tracker.View,
		MayAct: func(time.Time) bool { return acting.Load() }, Log: quiet(), By: func() string { return who },
		OnEvent: func(ev recovery.Event) {
			mu.Lock()
			defer mu.Unlock()
			*events = append(*events, ev)
		}}
	go rr.Run(e.ctx)
	return rr
}

// record returns h0's recovery record in the bucket (nil: none).
func (e *recoveryEnv) record(t *testing.T) (*recovery.Record, uint64) {
	t.Helper()
	en, err := e.rkv.Get(e.ctx, "h0")
	if err != nil {
		return nil, 0
	}
	r, err := recovery.DecodeRecord(en.Value())
	if err != nil {
		t.Fatal(err)
	}
	return &r, en.Revision()
}

func (e *recoveryEnv) waitPhase(t *testing.T, p recovery.Phase, within time.Duration) *recovery.Record {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if r, _ := e.record(t); r != nil && r.Phase == p {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, _ := e.record(t)
	t.Fatalf("h0 not %s within %s: %+v; calls %v", p, within, r, e.cloud.Calls())
	return nil
}

func (e *recoveryEnv) waitDeclared(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if rec, _, err := e.st.Read(e.ctx, "h0"); err == nil && rec.State == fencing.LeaseExpired {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("h0 never declared")
}

// A standby (MayAct false) writes no record and calls nothing for a
// declared host; once it may act it recovers the host.
func TestRecoveryRunnerStandbyWritesNothing(t *testing.T) {
	t.Parallel()
	e := newRecoveryEnv(t)
	var acting atomic.Bool
	var mu sync.Mutex
	var events []recovery.Event
	e.runner(t, "ctl-a", &acting, &events, &mu)
	e.waitDeclared(t)
	time.Sleep(2 * time.Second) // ≥ 4 recovery ticks with the declaration standing
	if r, _ := e.record(t); r != nil || len(e.cloud.Calls()) != 0 {
		t.Fatalf("standby wrote %+v / called %v", r, e.cloud.Calls())
	}
	mu.Lock()
	n := len(events)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("standby published %d events", n)
	}
	acting.Store(true)
	r := e.waitPhase(t, recovery.PhaseRecovered, 15*time.Second)
	for _, in := range r.Instances {
		if in.Evac != recovery.Completed || in.Dest != "h9" {
			t.Errorf("instance %+v", in)
		}
	}
	if r.DeclaredBy != "ctl-a" || r.Epoch != 1 {
		t.Errorf("declaration %q epoch %d", r.DeclaredBy, r.Epoch)
	}
	for _, id := range []string{"s-bfv-1", "s-bfv-2", "s-eph"} {
		if n := e.cloud.Count("evacuate " + id); n != 1 {
			t.Errorf("%s evacuated %d times", id, n)
		}
	}
}

// A leader change in the middle of the evacuations: the new leader
// resumes from the bucket and repeats no completed step; the deposed one
// calls nothing more.
func TestRecoveryRunnerLeaderChangeResumes(t *testing.T) {
	t.Parallel()
	e := newRecoveryEnv(t)
	var aActs, bActs atomic.Bool
	var mu sync.Mutex
	var aEv, bEv []recovery.Event
	aActs.Store(true)
	e.cloud.OnEvacuate = func(who, id string) {
		if who == "ctl-a" {
			aActs.Store(false) // deposed right after its first evacuation
			bActs.Store(true)
		}
	}
	e.runner(t, "ctl-a", &aActs, &aEv, &mu)
	e.runner(t, "ctl-b", &bActs, &bEv, &mu)
	e.waitDeclared(t)
	e.waitPhase(t, recovery.PhaseRecovered, 20*time.Second)
	calls := e.cloud.Calls()
	sawB := false
	evacs := map[string]int{}
	for _, c := range calls {
		sawB = sawB || strings.HasSuffix(c, "by ctl-b")
		if sawB && strings.HasSuffix(c, "by ctl-a") {
			t.Fatalf("the deposed leader called after the new one: %v", calls)
		}
		if f := strings.Fields(c); f[0] == "evacuate" {
			evacs[f[1]]++
		}
	}
	if !sawB || e.cloud.Count("evacuate") != 3 || len(evacs) != 3 {
		t.Fatalf("calls %v", calls)
	}
	for id, n := range evacs {
		if n != 1 {
			t.Errorf("%s evacuated %d times: %v", id, n, calls)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bEv) == 0 || bEv[len(bEv)-1].Op != "recovered" {
		t.Errorf("ctl-b events %v", bEv)
	}
}

// The lease comes back (an operator releases it, the agent renews) while
// the recovery runs: the fresh read before the next destructive call stops
// it; once the agent is healthy forced_down is cleared.
func TestRecoveryRunnerLeaseBackStops(t *testing.T) {
	t.Parallel()
	e := newRecoveryEnv(t)
	var acting atomic.Bool
	var mu sync.Mutex
	var events []recovery.Event
	acting.Store(true)
	released := make(chan struct{})
	e.cloud.OnEvacuate = func(_, id string) {
		select {
		case <-released:
			return
		default:
		}
		rec, rev, err := e.st.Read(e.ctx, "h0")
		if err != nil {
			t.Error(err)
			return
		}
		rel := *rec
		rel.State, rel.Reason = fencing.LeaseReleased, "unfence by an operator"
		if _, err := e.st.Write(e.ctx, "h0", rev, rel, time.Second); err != nil {
			t.Error(err)
		}
		close(released)
	}
	e.runner(t, "ctl-a", &acting, &events, &mu)
	e.waitDeclared(t)
	r := e.waitPhase(t, recovery.PhaseStopped, 20*time.Second)
	if n := e.cloud.Count("evacuate"); n != 1 {
		t.Fatalf("%d evacuations after the lease came back: %v", n, e.cloud.Calls())
	}
	if !strings.Contains(r.Reason, string(recovery.WhyChanged)) {
		t.Errorf("reason %q", r.Reason)
	}
	// The agent takes the lease over, rejoins and reconciles.
	rec, rev, err := e.st.Read(e.ctx, "h0")
	if err != nil {
		t.Fatal(err)
	}
	back := *rec
	back.State, back.AgentState, back.Reason = fencing.LeaseActive, fencing.StateHealthy, ""
	go func() { // renewals by CAS on the agent's own last revision
		for e.ctx.Err() == nil {
			if n, err := e.st.Write(e.ctx, "h0", rev, back, time.Second); err == nil {
				rev = n
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	e.waitPhase(t, recovery.PhaseDone, 15*time.Second)
	if e.cloud.Forced("h0") || e.cloud.Count("force-down=false h0") != 1 {
		t.Fatalf("forced_down not cleared once: %v", e.cloud.Calls())
	}
}

// The core spells the lease states and the healthy agent state as the
// lease record does (it imports only the standard library).
func TestRecoveryLeaseStatesMatchFencing(t *testing.T) {
	for core, rec := range map[string]string{
		recovery.LeaseActive: string(fencing.LeaseActive), recovery.LeaseExpired: string(fencing.LeaseExpired),
		recovery.LeaseReleased: string(fencing.LeaseReleased), recovery.LeaseWithdrawn: string(fencing.LeaseWithdrawn),
		recovery.AgentHealthy: string(fencing.StateHealthy),
	} {
		if core != rec {
			t.Errorf("core %q, lease record %q", core, rec)
		}
	}
	// The signature the tracker's runner appends is the one the core
	// reads.
	if got := recovery.DeclaredBy("no renewal (declared by controller ctl-a-1b2c3d, term 7)"); got != "ctl-a-1b2c3d" {
		t.Errorf("DeclaredBy %q", got)
	}
}
