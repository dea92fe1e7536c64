package controller_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// newLeaseStore returns the lease bucket on a fresh embedded JetStream.
func newLeaseStore(t *testing.T) *natslease.Store {
	t.Helper()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := natslease.EnsureBucket(context.Background(), js, true)
	if err != nil {
		t.Fatal(err)
	}
	return &natslease.Store{KV: kv, NC: nc}
}

// TestRunnerDeclaresSilentHost: against a real JetStream KV, three hosts
// renew; h0 stops; the runner declares it (by CAS, next epoch) after
// lease_ttl + grace and never declares the others; a refused host is
// never declared.
func TestRunnerDeclaresSilentHost(t *testing.T) {
	t.Parallel()
	st := newLeaseStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	timing := fencing.DefaultTiming()
	timing.RenewInterval, timing.RenewTimeout, timing.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	timing.FenceDeadline, timing.LeaseTTL = 500*time.Millisecond, 1500*time.Millisecond
	rec := func(h string, bs fencing.Backstop) fencing.LeaseRecord {
		return fencing.LeaseRecord{Schema: 1, Host: h, State: fencing.LeaseActive, FencingEnabled: true,
			Action: fencing.ActionPause, Backstop: bs, Timing: timing}
	}
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5                    // 4 hosts: threshold 2
	cfg.AcceptAgentDependentBackstop = true // the hosts here advertise reset
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []controller.Decision
	r := &controller.Runner{Store: st, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnDecision: func(d controller.Decision, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				got = append(got, d)
			}
		}}
	revs := map[string]uint64{}
	write := func(h string, bs fencing.Backstop) {
		if n, err := st.Write(ctx, h, revs[h], rec(h, bs), time.Second); err == nil {
			revs[h] = n
		}
	}
	for _, h := range []string{"h0", "h1", "h2"} {
		write(h, fencing.BackstopReset)
	}
	write("h3", fencing.BackstopNone)
	go r.Run(ctx)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		write("h1", fencing.BackstopReset)
		write("h2", fencing.BackstopReset)
		if time.Since(start) < time.Second {
			write("h0", fencing.BackstopReset)
		}
		time.Sleep(150 * time.Millisecond)
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	var declared []string
	refused := false
	for _, d := range got {
		switch d.Op {
		case controller.OpDeclare:
			declared = append(declared, d.Host)
		case controller.OpRefuse:
			refused = refused || d.Host == "h3"
		}
	}
	if len(declared) != 1 || declared[0] != "h0" || !refused {
		t.Fatalf("declared %v (want [h0]), h3 refused %v; decisions %v", declared, refused, got)
	}
	cur, _, err := st.Read(context.Background(), "h0")
	if err != nil || cur.State != fencing.LeaseExpired || cur.Epoch != 1 {
		t.Fatalf("h0 record %+v %v", cur, err)
	}
}

// TestRunnerRestoresGuardVersions: against a real KV, a controller
// publishes guard version 1 (5 hosts: threshold 1) and stops; the bucket
// grows to 10 hosts whose agents name no version (from before versions:
// any kept version may be theirs); a new controller (restart, or a new
// leader) restores version 1 from the published guard before it watches,
// publishes version 2 (threshold 2) with version 1 in its history, and
// keeps holding with threshold 1.
func TestRunnerRestoresGuardVersions(t *testing.T) {
	st := newLeaseStore(t)
	put := func(from, to int) {
		for i := from; i < to; i++ {
			h := fmt.Sprintf("h%d", i)
			r := fencing.LeaseRecord{Schema: 1, Host: h, State: fencing.LeaseActive, FencingEnabled: true,
				Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: fencing.DefaultTiming()}
			if _, err := st.Write(context.Background(), h, 0, r, time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	runUntil := func(tr *controller.Tracker, version uint64) fencing.Guard {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan struct{})
		r := &controller.Runner{Store: st, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		go func() { defer close(done); _ = r.Run(ctx) }()
		defer func() { cancel(); <-done }()
		for ctx.Err() == nil {
			if g, err := st.ReadGuard(ctx); err == nil && g.Version == version {
				return g
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("guard version %d never published", version)
		return fencing.Guard{}
	}
	put(0, 5)
	tr1, _ := controller.NewTracker(controller.DefaultConfig())
	if g := runUntil(tr1, 1); g.Members != 5 {
		t.Fatalf("v1 %+v", g)
	}
	put(5, 10)
	tr2, _ := controller.NewTracker(controller.DefaultConfig())
	g := runUntil(tr2, 2)
	if g.Members != 10 || len(g.History) != 2 || g.History[0] != (fencing.GuardVersion{Version: 1, Threshold: 1}) {
		t.Fatalf("v2 %+v: want 10 members and version 1 in its history", g)
	}
	if th := tr2.Threshold(); th != 1 {
		t.Fatalf("threshold %d after the restart, want 1 (version 1 restored)", th)
	}
}

// TestRunnerStandbyRestoresGuardOnTakeover: a standby (MayAct false)
// watches while the leader publishes versions 1 and 2; when it takes over
// it reads the published guard before it publishes: it goes on with
// version 2 (same membership) and its history, instead of starting again
// at version 1 for another membership.
func TestRunnerStandbyRestoresGuardOnTakeover(t *testing.T) {
	st := newLeaseStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	put := func(from, to int) {
		for i := from; i < to; i++ {
			h := fmt.Sprintf("h%d", i)
			r := fencing.LeaseRecord{Schema: 1, Host: h, State: fencing.LeaseActive, FencingEnabled: true,
				Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: fencing.DefaultTiming()}
			if _, err := st.Write(ctx, h, 0, r, time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitVersion := func(v uint64) fencing.Guard {
		for ctx.Err() == nil {
			if g, err := st.ReadGuard(ctx); err == nil && g.Version == v {
				return g
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("guard version %d never published", v)
		return fencing.Guard{}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var standbyActs atomic.Bool
	tr2, _ := controller.NewTracker(controller.DefaultConfig())
	standby := &controller.Runner{Store: st, Tracker: tr2, Log: quiet, MayAct: func(time.Time) bool { return standbyActs.Load() }}
	done2 := make(chan struct{})
	go func() { defer close(done2); _ = standby.Run(ctx) }()
	defer func() { cancel(); <-done2 }()

	put(0, 5)
	lctx, lcancel := context.WithCancel(ctx)
	tr1, _ := controller.NewTracker(controller.DefaultConfig())
	leader := &controller.Runner{Store: st, Tracker: tr1, Log: quiet}
	done1 := make(chan struct{})
	go func() { defer close(done1); _ = leader.Run(lctx) }()
	waitVersion(1)
	put(5, 10)
	waitVersion(2)
	lcancel()
	<-done1
	standbyActs.Store(true)
	time.Sleep(time.Second) // the standby's first ticks as the leader
	g, err := st.ReadGuard(ctx)
	if err != nil || g.Version != 2 || g.Members != 10 || len(g.History) != 2 || g.History[0].Version != 1 {
		t.Fatalf("after the take-over: %+v %v: want version 2 (10 members) with version 1 in its history", g, err)
	}
}
