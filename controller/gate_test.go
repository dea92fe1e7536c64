package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestRunnerStandbyNeverWrites: a Runner whose MayAct says no (a standby)
// watches a host that falls silent, decides it is due, and writes nothing
// — neither the declaration nor the guard: the host's key keeps its one
// revision. Once MayAct says yes (it became the leader) the host is
// declared within a few ticks, not DeclareRetry later.
func TestRunnerStandbyNeverWrites(t *testing.T) {
	t.Parallel()
	_, kv := controllertest.Bucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := &natslease.Store{KV: kv}
	rec := controllertest.HostRecord("h0")
	rev0, err := st.Write(ctx, "h0", 0, rec, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Three more hosts renew (a lone silent host would be held by the
	// mass-failure guard); their writes are not the standby's.
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go controllertest.Renew(renewCtx, st, "h1", "h2", "h3")
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5 // 4 hosts: threshold 2
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var acting atomic.Bool
	var mu sync.Mutex
	var gated, declared int
	var declaredAt time.Time
	r := &controller.Runner{Store: st, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MayAct: func(time.Time) bool { return acting.Load() },
		OnDecision: func(d controller.Decision, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case d.Op == controller.OpDeclare && errors.Is(err, controller.ErrNotActing):
				gated++
			case d.Op == controller.OpDeclare && err == nil:
				declared++
				declaredAt = time.Now()
			}
		}}
	go r.Run(ctx)
	grace, err := cfg.Grace(rec)
	if err != nil {
		t.Fatal(err)
	}
	due := rec.Timing.LeaseTTL + grace
	time.Sleep(due + 2*time.Second)
	mu.Lock()
	g, dcl := gated, declared
	mu.Unlock()
	if g < 2 || dcl != 0 {
		t.Fatalf("standby: %d declarations decided and not written (want ≥ 2: due each tick), %d written (want 0)", g, dcl)
	}
	e, err := kv.Get(ctx, "h0")
	if err != nil || e.Revision() != rev0 {
		t.Fatalf("standby changed h0: revision %v (want %d), err %v", e, rev0, err)
	}
	if _, err := kv.Get(ctx, fencing.GuardKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("standby published the guard (get: %v)", err)
	}
	v, err := r.View(ctx)
	if err != nil || len(v.Hosts) != 4 || v.Hosts[0].Host != "h0" || v.Hosts[0].State != fencing.LeaseActive || v.Hosts[0].LastRenewalSeconds < due.Seconds() || !v.Hosts[0].Silent {
		t.Fatalf("standby view %+v %v: want h0 active, silent for > %s", v, err, due)
	}

	became := time.Now()
	acting.Store(true)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if cur, _, err := st.Read(ctx, "h0"); err == nil && cur.State == fencing.LeaseExpired {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if declared != 1 {
		t.Fatalf("leader: %d declarations written, want 1", declared)
	}
	if lag := declaredAt.Sub(became); lag > controller.DeclareRetry/2 {
		t.Fatalf("declared %s after acting began: waited for DeclareRetry (%s) instead of the next tick", lag, controller.DeclareRetry)
	}
	if _, err := kv.Get(ctx, fencing.GuardKey); err != nil {
		t.Fatalf("leader did not publish the guard: %v", err)
	}
}
