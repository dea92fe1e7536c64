package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/daemon"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// fastConfig is the default configuration at ×0.1 of the leader lock's
// timing, listening on a free port.
func fastConfig(t *testing.T, url, id string) daemon.Config {
	t.Helper()
	cfg := daemon.DefaultConfig()
	cfg.ID = id
	cfg.NATS.URLs = []string{url}
	cfg.NATS.ReadyTimeout = daemon.Duration(5 * time.Second)
	cfg.Leader = daemon.LeaderConfig{TTL: daemon.Duration(time.Second), RenewInterval: daemon.Duration(250 * time.Millisecond),
		WriteTimeout: daemon.Duration(200 * time.Millisecond), ActMargin: daemon.Duration(200 * time.Millisecond)}
	cfg.Guard.Share = 0.5 // 4 hosts: threshold 2
	cfg.Metrics.Listen = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ctl is one in-process controller daemon.
type ctl struct {
	id     string
	addr   string
	cancel context.CancelFunc
	done   chan error

	mu        sync.Mutex
	written   []controller.Decision // declarations written
	notActing int                   // declarations decided while not acting
}

func startCtl(t *testing.T, url, id string, change func(*daemon.Config)) *ctl {
	t.Helper()
	return startCtlWith(t, url, id, change, nil)
}

// startCtlWith is startCtl with the daemon's options changed by opt.
func startCtlWith(t *testing.T, url, id string, change func(*daemon.Config), opt func(*daemon.Options)) *ctl {
	t.Helper()
	c := &ctl{id: id, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	ready := make(chan struct{})
	addr := make(chan string, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("HVGUARD_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("ctl", id)
	}
	opts := daemon.Options{Ready: ready, Listening: func(a string) { addr <- a },
		OnDecision: func(d controller.Decision, err error) {
			if d.Op != controller.OpDeclare {
				return
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			switch {
			case errors.Is(err, controller.ErrNotActing):
				c.notActing++
			case err == nil:
				c.written = append(c.written, d)
			}
		}}
	cfg := fastConfig(t, url, id)
	if change != nil {
		change(&cfg)
	}
	if opt != nil {
		opt(&opts)
	}
	go func() { c.done <- daemon.Run(ctx, cfg, log, opts) }()
	c.addr = <-addr
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s not ready after 5 s", id)
	}
	t.Cleanup(c.stop)
	return c
}

func (c *ctl) stop() {
	c.cancel()
	<-c.done
	c.done <- nil // later stops return at once
}

func (c *ctl) role(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := daemon.FetchStatus(ctx, c.addr, "")
	if err != nil {
		return "unreachable"
	}
	return st.Role
}

// waitLeader polls the controllers' /status every 10 ms until exactly one
// says leader; it fails if two ever do at once.
func waitLeader(t *testing.T, within time.Duration, cs ...*ctl) *ctl {
	t.Helper()
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		var leaders []*ctl
		for _, c := range cs {
			if c.role(t) == "leader" {
				leaders = append(leaders, c)
			}
		}
		if len(leaders) > 1 {
			t.Fatalf("%s and %s both report leader", leaders[0].id, leaders[1].id)
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no leader within %s", within)
	return nil
}

// TestTwoControllers: two controller daemons on one embedded JetStream at
// ×0.1 of the lock's timing. ctl-a starts alone and leads; ctl-b starts as
// a standby configured to accept hosts without a backstop, so its tracker
// finds such a silent host (hn) due at every tick — and writes nothing,
// while the leader refuses hn and declares the silent h0 once, signed with
// its id and term. The leader's orderly stop hands over within
// TakeoverAfter(act_margin) plus a renewal, and the new leader declares hn
// at once.
func TestTwoControllers(t *testing.T) {
	url, kv := controllertest.Bucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := &natslease.Store{KV: kv}
	h0 := controllertest.HostRecord("h0")
	h0.AgentVersion, h0.AgentState = "9.9.9", fencing.StateHealthy
	if _, err := st.Write(ctx, "h0", 0, h0, time.Second); err != nil {
		t.Fatal(err)
	}
	// The leader's decisions, as published (best effort, live).
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var evMu sync.Mutex
	var events []controller.DecisionEvent
	sub, err := nc.Subscribe(proto.ControllerDecisionSubject, func(m *nats.Msg) {
		if e, err := controller.DecodeDecisionEvent(m.Data); err == nil {
			evMu.Lock()
			events = append(events, e)
			evMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	declaredBy := func(host string) []string {
		evMu.Lock()
		defer evMu.Unlock()
		var out []string
		for _, e := range events {
			if e.Op == "declare" && e.Host == host && e.Error == "" {
				out = append(out, fmt.Sprintf("%s/%d", e.Controller, e.Term))
			}
		}
		return out
	}
	hn := controllertest.HostRecord("hn")
	hn.Backstop = fencing.BackstopNone
	hnRev, err := st.Write(ctx, "hn", 0, hn, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go controllertest.Renew(renewCtx, st, "h1", "h2", "h3")

	a := startCtl(t, url, "ctl-a", nil)
	if l := waitLeader(t, 3*time.Second, a); l != a {
		t.Fatal("unreachable")
	}
	b := startCtl(t, url, "ctl-b", func(c *daemon.Config) { c.Tracker.AcceptNoBackstop = true })

	// h0: declared once, by the leader.
	if rec := waitExpired(t, st, "h0", 10*time.Second); !strings.Contains(rec.Reason, "controller ctl-a, term ") {
		t.Fatalf("h0's declaration not signed by the leader ctl-a: %q", rec.Reason)
	}
	// hn: due for the standby at every tick, never written.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && b.notActingNow() < 8 {
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range []*ctl{a, b} {
		c.mu.Lock()
		t.Logf("%s: %d declarations written, %d decided while not acting", c.id, len(c.written), c.notActing)
		c.mu.Unlock()
	}
	b.mu.Lock()
	if len(b.written) != 0 || b.notActing < 8 {
		t.Fatalf("the standby wrote %v and decided %d times while not acting (want none written, ≥ 8 decided: two seconds of ticks)", b.written, b.notActing)
	}
	b.mu.Unlock()
	if e, err := kv.Get(ctx, "hn"); err != nil || e.Revision() != hnRev {
		t.Fatalf("hn changed while ctl-b was standby: %v %v", e, err)
	}
	a.mu.Lock()
	if len(a.written) != 1 || a.written[0].Host != "h0" {
		t.Fatalf("the leader wrote %v, want one declaration of h0", a.written)
	}
	a.mu.Unlock()
	// Published: the leader's declaration of h0, nothing of the standby's.
	for end := time.Now().Add(2 * time.Second); len(declaredBy("h0")) == 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := declaredBy("h0"); len(got) != 1 || !strings.HasPrefix(got[0], "ctl-a/") {
		t.Fatalf("decision events declaring h0: %v, want one by ctl-a", got)
	}
	if got := declaredBy("hn"); len(got) != 0 {
		t.Fatalf("the standby published declarations of hn: %v", got)
	}
	// The fleet view's lease columns: the agent's version and fence state.
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	sta, err := daemon.FetchStatus(sctx, a.addr, "")
	scancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range sta.Tracker.Hosts {
		if h.Host == "h0" && (h.AgentVersion != "9.9.9" || h.FenceState != fencing.StateHealthy) {
			t.Fatalf("status of h0: agent %q fence %q, want 9.9.9 healthy", h.AgentVersion, h.FenceState)
		}
	}

	// Orderly stop of the leader: resign, hand-over.
	stopped := time.Now()
	a.stop()
	if next := waitLeader(t, 3*time.Second, b); next != b {
		t.Fatal("unreachable")
	}
	handover := time.Since(stopped)
	t.Logf("orderly stop of ctl-a → ctl-b leader in %s", handover)
	if bound := controller.TakeoverAfter(200*time.Millisecond, 0.01) + 500*time.Millisecond; handover > bound {
		t.Fatalf("hand-over after the orderly stop took %s > %s", handover, bound)
	}
	rec := waitExpired(t, st, "hn", time.Second)
	t.Logf("hn declared %s after ctl-a stopped: %s", time.Since(stopped), rec.Reason)
	if !strings.Contains(rec.Reason, "controller ctl-b, term ") {
		t.Fatalf("hn's declaration not signed by the new leader ctl-b: %q", rec.Reason)
	}
}

func (c *ctl) notActingNow() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notActing
}

// waitExpired waits until host's lease is declared expired (epoch 1).
func waitExpired(t *testing.T, st *natslease.Store, host string, within time.Duration) *fencing.LeaseRecord {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		rec, _, err := st.Read(context.Background(), host)
		if err == nil && rec.State == fencing.LeaseExpired {
			if rec.Epoch != 1 {
				t.Fatalf("%s declared at epoch %d, want 1", host, rec.Epoch)
			}
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not declared within %s: %+v %v", host, within, rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestControllerWaitsForNATS: a controller started while no NATS server
// listens reports ready in the degraded mode after nats.ready_timeout
// (/healthz says why), keeps retrying, and once a JetStream server comes
// up on its URL opens (creates) the lease bucket and leads.
func TestControllerWaitsForNATS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := fastConfig(t, fmt.Sprintf("nats://127.0.0.1:%d", port), "ctl-late")
	cfg.NATS.ReadyTimeout = daemon.Duration(300 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
			daemon.Options{Ready: ready, Listening: func(a string) { addr <- a }})
	}()
	defer func() { cancel(); <-done }()
	c := &ctl{id: "ctl-late", addr: <-addr}
	time.Sleep(time.Second)
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	st, err := daemon.FetchStatus(sctx, c.addr, "")
	scancel()
	if err != nil || st.Role != "standby" || st.Health == "ok" || st.Tracker != nil || st.NATSConnected {
		t.Fatalf("without NATS: status %+v, %v; want a standby, unhealthy, no lease view", st, err)
	}
	select {
	case <-ready:
		t.Fatal("Options.Ready closed without NATS (it means: watches synced)")
	default:
	}
	deliverytest.StartJetStream(t, t.TempDir(), port)
	started := time.Now()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("not ready 10 s after NATS came up")
	}
	if l := waitLeader(t, 3*time.Second, c); l != c {
		t.Fatal("unreachable")
	}
	t.Logf("leading %s after NATS came up", time.Since(started))
}

// TestControllerTrackerRestartsOnRollback: a controller daemon whose lease
// stream is rolled back under it (its store directory put back to an
// earlier copy, the server restarted on the same port) finds it
// (controller rollback.go), counts one revision-regressed decision, and
// runs on with a fresh tracker that lists the stream as it is now: it
// keeps leading and sees the hosts renewing again. h2 withdrew after the
// backup (the rollback loses its withdrawn record; its key holds its older
// active record): the fresh tracker keeps it withdrawn (reviewer X22) and
// does not declare it.
func TestControllerTrackerRestartsOnRollback(t *testing.T) {
	srv, dir, port := controllertest.RollbackServer(t)
	url := srv.ClientURL()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	renew := func(hosts ...string) { // puts, whatever the revision (the fleet renewing)
		for _, h := range hosts {
			tok, _ := proto.HostToken(h)
			b, _ := controllertest.HostRecord(h).Encode()
			pctx, c := context.WithTimeout(ctx, time.Second)
			_, _ = kv.Put(pctx, tok, b)
			c()
		}
	}
	hosts := []string{"h0.example.org", "h1.example.org", "h2.example.org"}
	renew(hosts...)
	controllertest.Restart(t, &srv, dir, "", port)
	backup := controllertest.StreamCopy(t, dir) // the lease stream at revision 3
	controllertest.Restart(t, &srv, dir, "", port)

	var mu sync.Mutex
	var rolled, kept []controller.Decision
	// The mass-failure guard off in effect (every host may be silent):
	// the rollback's outage counts every host silent for a guard window,
	// and h1's death must meet the rollback gate, not a hold.
	c := startCtlWith(t, url, "ctl-rb", func(c *daemon.Config) { c.Guard.Share = 1 }, func(o *daemon.Options) {
		prev := o.OnDecision
		o.OnDecision = func(d controller.Decision, err error) {
			mu.Lock()
			switch {
			case d.Op == controller.OpRevisionRegressed:
				rolled = append(rolled, d)
			case d.Op == controller.OpWithdrawn && strings.Contains(d.Reason, "rolled back"):
				kept = append(kept, d)
			}
			mu.Unlock()
			prev(d, err)
		}
	})
	waitLeader(t, 5*time.Second, c)
	var stopped atomic.Bool // h2 withdrew: its agent writes no more
	var died atomic.Bool    // h1's host died (after the rollback)
	go func() {
		for ctx.Err() == nil {
			renew(hosts[0])
			if !died.Load() {
				renew(hosts[1])
			}
			if !stopped.Load() {
				renew(hosts[2])
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	// renewing waits until the tracker shows every host renewing at a
	// revision above above.
	renewing := func(what string, above uint64) {
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			st, err := daemon.FetchStatus(sctx, c.addr, "")
			scancel()
			ok := err == nil && st.Tracker != nil && len(st.Tracker.Hosts) == len(hosts)
			if ok {
				for _, h := range st.Tracker.Hosts {
					ok = ok && h.LastRenewalSeconds < 1 && h.Revision > above
				}
			}
			if ok {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s: the controller's tracker does not see the hosts renewing above revision %d within 20 s: %+v (%v)", what, above, st.Tracker, err)
			}
		}
	}
	renewing("before the rollback", 9)
	// h2 stops in order: its withdrawn record lands after the backup —
	// the rollback loses it, and its key holds its older active record.
	stopped.Store(true)
	time.Sleep(200 * time.Millisecond)
	w := controllertest.HostRecord(hosts[2])
	w.State, w.Reason = fencing.LeaseWithdrawn, "orderly-stop"
	wb, _ := w.Encode()
	tok2, _ := proto.HostToken(hosts[2])
	if _, err := kv.Put(ctx, tok2, wb); err != nil {
		t.Fatal(err)
	}
	// An operator's confirmation of h1 left from an earlier rollback: it
	// names that rollback's marker (cleared since), not this one's.
	cfg := fastConfig(t, url, "ctl-rb")
	if _, err := daemon.MarkRollback(ctx, cfg, "test", "an earlier rollback", time.Now(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.ConfirmRollback(ctx, cfg, []string{hosts[1]}, "test", "an earlier rollback", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.MarkRollback(ctx, cfg, "test", "", time.Now(), true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * controller.RollbackCheckInterval) // delivered; checks passed
	mu.Lock()
	if len(rolled) != 0 {
		t.Fatalf("rollback found before the rollback: %+v", rolled)
	}
	mu.Unlock()
	controllertest.Restart(t, &srv, dir, backup, port)
	rb := time.Now()
	for {
		mu.Lock()
		n := len(rolled)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Since(rb) > 10*time.Second {
			t.Fatal("no revision-regressed decision 10 s after the lease stream rolled back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	t.Logf("found %s after the rollback: %s", time.Since(rb).Round(10*time.Millisecond), rolled[0].Reason)
	mu.Unlock()
	renewing2 := func() { // the fresh tracker sees h0 and h1 renew
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			st, err := daemon.FetchStatus(sctx, c.addr, "")
			scancel()
			n := 0
			if err == nil && st.Tracker != nil {
				for _, h := range st.Tracker.Hosts {
					if h.Host != hosts[2] && h.LastRenewalSeconds < 1 {
						n++
					}
				}
			}
			if n == 2 {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("after the rollback: the fresh tracker does not see h0 and h1 renewing within 20 s (%v)", err)
			}
		}
	}
	renewing2()
	time.Sleep(5 * time.Second) // h2 would be due 3.05 s after the fresh tracker's start (lease_ttl + grace at x0.1)
	c.mu.Lock()
	for _, d := range c.written {
		if d.Host == hosts[2] {
			c.mu.Unlock()
			t.Fatalf("the withdrawn %s declared after the rollback lost its withdrawal: %s", hosts[2], d.Reason)
		}
	}
	c.mu.Unlock()
	select {
	case err := <-c.done:
		c.done <- err
		t.Fatalf("the daemon stopped after the rollback: %v", err)
	default:
	}
	if r := c.role(t); r != "leader" {
		t.Fatalf("after the rollback the controller is %s, want leader", r)
	}
	mu.Lock()
	if len(rolled) != 1 {
		t.Fatalf("%d revision-regressed decisions, want 1 (the fresh tracker must not find the rollback again): %+v", len(rolled), rolled)
	}
	if len(kept) == 0 || kept[0].Host != hosts[2] {
		t.Fatalf("no withdrawn decision keeping %s withdrawn across the rollback: %+v", hosts[2], kept)
	}
	t.Logf("%s", kept[0].Reason)
	mu.Unlock()

	// The rollback gate: h1 dies now. Nothing since the rollback proved
	// its record (no beacon named it): not declared, shown gated, the
	// stale confirmation ignored — until an operator confirms it.
	died.Store(true)
	declaredH1 := func() bool { return c.declared(hosts[1]) }
	time.Sleep(controller.ConfirmClockSkew + 3*controller.ConfirmPollInterval)
	if declaredH1() {
		t.Fatalf("the dead %s declared after the rollback with nothing proving its record (the rollback gate), or on a confirmation from before the rollback", hosts[1])
	}
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	st, err := daemon.FetchStatus(sctx, c.addr, "")
	scancel()
	gated := false
	for _, h := range st.Tracker.Hosts {
		gated = gated || h.Host == hosts[1] && h.RollbackGated
	}
	if err != nil || !gated {
		t.Fatalf("status does not show %s rollback-gated: %+v (%v)", hosts[1], st.Tracker, err)
	}
	var text strings.Builder
	daemon.PrintStatus(&text, st)
	if !strings.Contains(text.String(), "confirm-rollback "+hosts[1]) {
		t.Fatalf("status text does not name the command for %s:\n%s", hosts[1], text.String())
	}
	confirmDeclares(t, ctx, cfg, c, hosts[1])

	// The controller is restarted by hand: it has no carry, and h2's key
	// holds its older active record (the rollback lost its withdrawal).
	// The rollback marker stands (h0 and h2 never proved themselves):
	// the restarted controller is gated too, and does not declare the
	// withdrawn h2. With the marker cleared (mark-rollback --clear, too
	// early: the keys were not rotated) a restarted controller declares
	// h2 — the hole the marker closes.
	c.stop()
	declaredBy := func(c *ctl, host string) bool { return c.declared(host) }
	guardOff := func(c *daemon.Config) { c.Guard.Share = 1 }
	c2 := startCtlWith(t, url, "ctl-rb2", guardOff, nil)
	waitLeader(t, 5*time.Second, c2)
	time.Sleep(controller.ConfirmClockSkew + 3*controller.ConfirmPollInterval)
	if declaredBy(c2, hosts[2]) {
		t.Fatalf("the controller restarted after the rollback declared the withdrawn %s (its withdrawal lost in the rollback): the rollback marker did not gate it", hosts[2])
	}
	c2.stop()
	if _, err := daemon.MarkRollback(ctx, cfg, "test", "", time.Now(), true); err != nil {
		t.Fatalf("clearing the rollback marker: %v", err)
	}
	c3 := startCtlWith(t, url, "ctl-rb3", guardOff, nil)
	waitLeader(t, 5*time.Second, c3)
	for end := time.Now().Add(3050*time.Millisecond + 3*controller.ConfirmPollInterval); !declaredBy(c3, hosts[2]); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("with the marker cleared the restarted controller did not declare %s either: the test no longer shows what the marker closes", hosts[2])
		}
	}
	t.Logf("with the marker cleared, a restarted controller declared the withdrawn %s (the hole the marker closes)", hosts[2])
}

// TestControllerPicksUpRollbackMarker: a running controller that read "no
// rollback marker" at its start reads it again (MarkerRecheckInterval):
// an operator's mark-rollback (a restore made while no controller ran, or
// the detecting controller's write failed) gates it without a restart —
// h1, dying after the mark, is not declared (no beacon proves its record)
// until the operator confirms it (reviewer X51: it never looked again).
func TestControllerPicksUpRollbackMarker(t *testing.T) {
	url, nc, js := controllertest.JetStream(t)
	_ = nc
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"h0.example.org", "h1.example.org"}
	var died atomic.Bool
	go func() {
		for ctx.Err() == nil {
			for i, h := range hosts {
				if i == 1 && died.Load() {
					continue
				}
				tok, _ := proto.HostToken(h)
				b, _ := controllertest.HostRecord(h).Encode()
				pctx, c := context.WithTimeout(ctx, time.Second)
				_, _ = kv.Put(pctx, tok, b)
				c()
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	c := startCtlWith(t, url, "ctl-mark", func(c *daemon.Config) { c.Guard.Share = 1 }, nil)
	waitLeader(t, 5*time.Second, c)
	cfg := fastConfig(t, url, "ctl-mark")
	if _, err := daemon.MarkRollback(ctx, cfg, "test", "restored while no controller ran", time.Now(), false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(controller.MarkerRecheckInterval + controller.ConfirmPollInterval)
	died.Store(true)
	time.Sleep(controller.ConfirmClockSkew + 2*controller.ConfirmPollInterval)
	if c.declared(hosts[1]) {
		t.Fatalf("%s declared although the rollback marker stands and nothing proved its record: the running controller did not pick the marker up", hosts[1])
	}
	confirmDeclares(t, ctx, cfg, c, hosts[1])
}

// declared: c wrote a declaration of host.
func (c *ctl) declared(host string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.written {
		if d.Host == host {
			return true
		}
	}
	return false
}

// confirmDeclares: an operator confirms host (hvguard-controller
// confirm-rollback); c declares it within 3 polls.
func confirmDeclares(t *testing.T, ctx context.Context, cfg daemon.Config, c *ctl, host string) {
	t.Helper()
	confirmed := time.Now()
	if _, err := daemon.ConfirmRollback(ctx, cfg, []string{host}, "test", "checked: powered off", time.Now()); err != nil {
		t.Fatal(err)
	}
	for !c.declared(host) {
		if time.Since(confirmed) > 3*controller.ConfirmPollInterval {
			t.Fatalf("the confirmed %s not declared %v after the operator's confirmation", host, time.Since(confirmed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s declared %v after the operator's confirmation", host, time.Since(confirmed).Round(10*time.Millisecond))
}
