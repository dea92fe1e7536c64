package natslease_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/test/netcut"
)

// Compressed timing (every constant /10 of the defaults, same ratios) so a
// partition runs in seconds: renew 200 ms, timeout 200 ms, peers 300 ms,
// fence deadline 500 ms, TTL 1.5 s. The controller's grace is then
// 0.5 + 1 (its minimum reset budget) + drift ≈ 1.53 s.
func fastTiming() fencing.Timing {
	t := fencing.DefaultTiming()
	t.RenewInterval, t.RenewTimeout, t.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	t.FenceDeadline, t.LeaseTTL = 500*time.Millisecond, 1500*time.Millisecond
	return t
}

// rig is one agent (h0, behind the blackholing proxy) with two running
// domains on a fake hypervisor, five healthy hosts kept renewed by the
// test, and the controller tracker on a direct connection, all against a
// real embedded nats-server with JetStream.
type rig struct {
	t        *testing.T
	prx      *netcut.Proxy
	agentKV  *natslease.Store
	ctrlKV   *natslease.Store
	agent    *fencing.Agent
	tracker  *controller.Tracker
	mu       sync.Mutex
	running  map[string]bool
	events   []string
	declared time.Time
	fencedAt time.Time
	resumed  time.Time
	start    time.Time
}

func newRig(t *testing.T) *rig {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	prx := netcut.New(t, srv.Addr().String())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	anc, err := delivery.Connect("nats://"+prx.Addr(), "agent-h0", log, nil, nats.Timeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	cnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	ctx := context.Background()
	cjs, _ := jetstream.New(cnc)
	ckv, err := natslease.EnsureBucket(ctx, cjs, true)
	if err != nil {
		t.Fatal(err)
	}
	ajs, _ := jetstream.New(anc)
	akv, err := natslease.EnsureBucket(ctx, ajs, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, prx: prx, agentKV: &natslease.Store{KV: akv}, ctrlKV: &natslease.Store{KV: ckv},
		running: map[string]bool{"d1": true, "d2": true}}
	return r
}

func (r *rig) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%6.2fs ", time.Since(r.start).Seconds())+fmt.Sprintf(format, args...))
}

// run drives the agent and the controller until stop returns true or the
// deadline passes; cut/heal are scheduled by the caller through hooks.
func (r *rig) run(ctx context.Context, hooks func(elapsed time.Duration)) {
	t := r.t
	r.start = time.Now()
	timing := fastTiming()
	cfg := fencing.DefaultConfig("h0", "boot")
	cfg.Enabled, cfg.AllowReset, cfg.Timing = true, true, timing
	cfg.HeldRecheck = 500 * time.Millisecond
	// Healthy hosts h1..h5 (the test keeps them renewed).
	hostRec := func(h string) fencing.LeaseRecord {
		return fencing.LeaseRecord{Schema: 1, Host: h, BootID: "b", State: fencing.LeaseActive, FencingEnabled: true,
			Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: timing}
	}
	revs := map[string]uint64{}
	renewOthers := func() {
		for i := 1; i <= 5; i++ {
			h := fmt.Sprintf("h%d", i)
			n, err := r.ctrlKV.Write(ctx, h, revs[h], hostRec(h), time.Second)
			if err == nil {
				revs[h] = n
			}
		}
	}
	renewOthers()
	// The agent's backstop is reset (a recorder here, no watchdog): the
	// controller must accept that agent-dependent backstop explicitly.
	ccfg := controller.DefaultConfig()
	ccfg.AcceptAgentDependentBackstop = true
	tr, err := controller.NewTracker(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	r.tracker = tr
	updates := make(chan natslease.Update, 1024)
	synced := make(chan struct{})
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go r.ctrlKV.Watch(wctx, updates, synced)
	<-synced

	now := func() time.Time { return time.Now() }
	a, rd, err := fencing.NewAgent(cfg, nil, nil, 0, now())
	if err != nil {
		t.Fatal(err)
	}
	r.agent = a
	renewed := make(chan func(time.Time) fencing.Ready, 64)
	apply := func(rd fencing.Ready) {}
	apply = func(rd fencing.Ready) {
		for _, tr := range rd.Transitions {
			r.logf("agent %s", tr)
		}
		for _, u := range rd.Pause {
			r.mu.Lock()
			r.running[u] = false
			r.mu.Unlock()
			apply(a.FenceDone(now(), u, nil))
		}
		for _, u := range rd.Resume {
			r.mu.Lock()
			r.running[u] = true
			if r.resumed.IsZero() {
				r.resumed = time.Now()
			}
			r.mu.Unlock()
			r.logf("resume %s", u)
		}
		if rd.Reconcile {
			id := rd.ReconcileID
			apply(a.Reconciled(now(), id, nil))
		}
		if rd.ResetHost {
			r.logf("RESET HOST requested")
		}
		if rq := rd.Renew; rq != nil {
			req := *rq
			go func() {
				res := r.agentKV.Renew(ctx, req, timing.RenewTimeout)
				renewed <- func(n time.Time) fencing.Ready { return a.Renewed(n, req.Seq, res) }
			}()
		}
		if rd.AskPeers != nil {
			// No peer endpoint in this test: nobody answers.
		}
		if a.State() == fencing.StateFenced || a.State() == fencing.StateAwaitingRelease {
			if r.fencedAt.IsZero() {
				r.fencedAt = time.Now()
			}
		}
	}
	apply(rd)
	members := []string{"h0", "h1", "h2", "h3", "h4", "h5"}
	a.SetMembers(members, fencing.DefaultGuard(len(members)))
	apply(a.Domains(now(), []fencing.Domain{{UUID: "d1", Running: true}, {UUID: "d2", Running: true}}))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	published := false
	lastOthers := time.Now()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case f := <-renewed:
			apply(f(now()))
		case u := <-updates:
			if u.Record != nil {
				for _, d := range tr.Observe(now(), u.Host, u.Revision, u.Record) {
					r.logf("controller %s", d)
				}
				if !published && tr.Members() == 6 {
					tr.GuardPublished(tr.Guard(), nil)
					published = true
				}
			}
		case <-tick.C:
			apply(a.Tick(now()))
			if time.Since(lastOthers) > 150*time.Millisecond {
				renewOthers()
				lastOthers = time.Now()
			}
			for _, d := range tr.Tick(now()) {
				r.logf("controller %s", d)
				if d.Op == controller.OpDeclare {
					if _, err := r.ctrlKV.Write(ctx, d.Host, d.Revision, d.Record, time.Second); err == nil {
						r.mu.Lock()
						if d.Host == "h0" && r.declared.IsZero() {
							r.declared = time.Now()
							for u, run := range r.running {
								if run {
									t.Errorf("declared h0 while %s runs", u)
								}
							}
						}
						r.mu.Unlock()
						r.logf("controller DECLARED %s", d.Host)
					}
				}
			}
			hooks(time.Since(r.start))
		}
	}
}

func (r *rig) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ""
	for _, e := range r.events {
		s += e + "\n"
	}
	return s
}

// TestPartitionHealAfterExpiry: the agent's link is blackholed: its domains
// are paused before the controller declares it expired; after the heal
// (with its held writes delivered late) it learns of the declaration and
// stays fenced; the declaration is never overwritten.
func TestPartitionHealAfterExpiry(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var cut, healed bool
	r.run(ctx, func(el time.Duration) {
		switch {
		case !cut && el > 2*time.Second:
			cut = true
			r.logf("CUT")
			r.prx.Blackhole(true)
		case cut && !healed && !r.declared.IsZero() && time.Since(r.declared) > 500*time.Millisecond:
			healed = true
			r.logf("HEAL")
			r.prx.Blackhole(false)
		case healed && r.agent.State() == fencing.StateAwaitingRelease:
			cancel()
		}
	})
	if r.fencedAt.IsZero() || r.declared.IsZero() || !r.fencedAt.Before(r.declared) {
		t.Fatalf("fenced at %v, declared at %v\n%s", r.fencedAt, r.declared, r.dump())
	}
	if r.agent.State() != fencing.StateAwaitingRelease || !r.resumed.IsZero() {
		t.Fatalf("state %s, resumed %v\n%s", r.agent.State(), r.resumed, r.dump())
	}
	rec, _, err := r.ctrlKV.Read(context.Background(), "h0")
	if err != nil || rec.State != fencing.LeaseExpired {
		t.Fatalf("record %+v %v: the declaration was overwritten\n%s", rec, err, r.dump())
	}
	t.Logf("fenced %s before the declaration\n%s", r.declared.Sub(r.fencedAt), r.dump())
}

// TestPartitionHealBeforeExpiry: the link heals after the fence but before
// the controller may declare: renewals land again, the reconciliation runs,
// the paused domains are resumed, and the controller declares nothing.
func TestPartitionHealBeforeExpiry(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var cut, healed bool
	var done time.Time
	r.run(ctx, func(el time.Duration) {
		switch {
		case !cut && el > 2*time.Second:
			cut = true
			r.logf("CUT")
			r.prx.Blackhole(true)
		case cut && !healed && !r.fencedAt.IsZero():
			healed = true
			r.logf("HEAL")
			r.prx.Blackhole(false)
		case healed && !r.resumed.IsZero() && done.IsZero():
			done = time.Now()
		case !done.IsZero() && time.Since(done) > 3*time.Second:
			cancel() // long enough for a (wrong) declaration to show
		}
	})
	if r.resumed.IsZero() || !r.declared.IsZero() {
		t.Fatalf("resumed %v, declared %v\n%s", r.resumed, r.declared, r.dump())
	}
	if r.agent.State() != fencing.StateHealthy {
		t.Fatalf("state %s\n%s", r.agent.State(), r.dump())
	}
	t.Logf("\n%s", r.dump())
}
