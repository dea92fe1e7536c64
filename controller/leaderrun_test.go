package controller_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing/natslease"
)

// fastLeader: the default constants × 0.1.
func fastLeader(id string) controller.LeaderConfig {
	c := controller.DefaultLeaderConfig(id)
	c.TTL, c.RenewInterval, c.WriteTimeout, c.ActMargin = time.Second, 250*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	return c
}

type leaderProc struct {
	id     string
	nc     *nats.Conn
	run    *controller.LeaderRunner
	cancel context.CancelFunc
	done   chan struct{}
}

func startLeader(t *testing.T, url, id string) *leaderProc {
	t.Helper()
	return startLeaderEligible(t, url, id, nil)
}

// startLeaderEligible is startLeader with the runner's Eligible.
func startLeaderEligible(t *testing.T, url, id string, eligible func() bool) *leaderProc {
	t.Helper()
	nc, err := nats.Connect(url, nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	core, err := controller.NewLeader(fastLeader(id))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("HVGUARD_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("ctrl", id)
	}
	p := &leaderProc{id: id, nc: nc, cancel: cancel, done: make(chan struct{}),
		run: &controller.LeaderRunner{KV: kv, Core: core, Log: log, Eligible: eligible}}
	go func() { defer close(p.done); _ = p.run.Run(ctx) }()
	t.Cleanup(func() { p.stop(); nc.Close() })
	return p
}

func (p *leaderProc) stop() {
	p.cancel()
	<-p.done
}

// actors samples every live runner's MayAct every 10 ms for d and fails if
// two may act at once; it returns who acted last and when it first acted.
func actors(t *testing.T, procs []*leaderProc, d time.Duration) (last *leaderProc, first map[string]time.Time) {
	t.Helper()
	first = map[string]time.Time{}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		now := time.Now()
		var acting []*leaderProc
		for _, p := range procs {
			if p.run.MayAct(now) {
				acting = append(acting, p)
				if _, ok := first[p.id]; !ok {
					first[p.id] = now
				}
			}
		}
		if len(acting) > 1 {
			t.Fatalf("%s and %s may act at once", acting[0].id, acting[1].id)
		}
		if len(acting) == 1 {
			last = acting[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	return last, first
}

// Three controllers on one JetStream: exactly one leads; an orderly stop
// hands over within TakeoverAfter(ActMargin) + a renewal; a leader whose
// connection dies (as with kill -9: no resignation) is replaced after
// TakeoverAfter(TTL); never two may act at once (sampled every 10 ms).
func TestLeaderRunnerHandover(t *testing.T) {
	t.Parallel()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	var procs []*leaderProc
	for _, id := range []string{"c1", "c2", "c3"} {
		procs = append(procs, startLeader(t, srv.ClientURL(), id))
	}
	leader, _ := actors(t, procs, 2500*time.Millisecond)
	if leader == nil {
		t.Fatal("no leader 2.5 s after start (takeover after 1.02 s)")
	}
	t.Logf("elected %s term %d", leader.id, leader.run.Term())

	// Orderly stop: resign.
	stopped := time.Now()
	leader.stop()
	rest := without(procs, leader)
	next, first := actors(t, rest, 1500*time.Millisecond)
	if next == nil {
		t.Fatal("no leader after the orderly stop")
	}
	handover := first[next.id].Sub(stopped)
	t.Logf("orderly stop → %s acting in %s", next.id, handover)
	if bound := controller.TakeoverAfter(200*time.Millisecond, 0.01) + 500*time.Millisecond; handover > bound {
		t.Fatalf("hand-over after resign took %s > %s", handover, bound)
	}

	// Crash: the connection dies with the process; no resignation lands.
	crashed := time.Now()
	next.nc.Close()
	rest = without(rest, next)
	third, first := actors(t, rest, 2500*time.Millisecond)
	if third == nil {
		t.Fatal("no leader after the crash")
	}
	failover := first[third.id].Sub(crashed)
	t.Logf("crash → %s acting in %s", third.id, failover)
	if min := controller.TakeoverAfter(time.Second, 0.01) - 250*time.Millisecond - 200*time.Millisecond; failover < min {
		t.Fatalf("took over %s after the crash: before the old lease could have lapsed (%s)", failover, min)
	}
	if next.run.MayAct(time.Now()) {
		t.Fatal("the crashed leader still believes it may act")
	}
}

func without(ps []*leaderProc, x *leaderProc) []*leaderProc {
	var out []*leaderProc
	for _, p := range ps {
		if p != x {
			out = append(out, p)
		}
	}
	return out
}

// A leader that is no longer Eligible (the daemon: its connection to the
// agents' account is down, while the lock's own connection is up) stops
// renewing: it may act no more once its lock lapses, and a standby takes
// over after TakeoverAfter(TTL); never two at once. Without the check the
// leader keeps the lock for as long as the lock's connection lives.
func TestLeaderRunnerIneligibleHandsOver(t *testing.T) {
	t.Parallel()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	var eligible atomic.Bool
	eligible.Store(true)
	c1 := startLeaderEligible(t, srv.ClientURL(), "c1", eligible.Load)
	leader, _ := actors(t, []*leaderProc{c1}, 2500*time.Millisecond)
	if leader != c1 {
		t.Fatal("c1 does not lead 2.5 s after its start")
	}
	c2 := startLeader(t, srv.ClientURL(), "c2")
	if l, _ := actors(t, []*leaderProc{c1, c2}, time.Second); l != c1 {
		t.Fatal("c1 lost the lock while eligible")
	}
	cut := time.Now()
	eligible.Store(false)
	next, first := actors(t, []*leaderProc{c1, c2}, 3*time.Second)
	if next != c2 {
		t.Fatalf("c2 not leading 3 s after c1 became ineligible (last acting: %v)", next)
	}
	t.Logf("ineligible c1 → c2 acting after %s", first["c2"].Sub(cut).Round(10*time.Millisecond))
	if c1.run.MayAct(time.Now()) {
		t.Fatal("the ineligible c1 still may act")
	}
}
