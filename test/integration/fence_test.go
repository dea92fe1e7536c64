package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/test/netcut"
)

// fastFence compresses every fencing constant ten times (same ratios as
// the defaults): renew 200 ms, timeout 200 ms, peers 300 ms, fence deadline
// 500 ms, TTL 1.5 s. The controller (default config) then grants a grace
// of 0.5 + 1 (its reset budget) + drift ≈ 1.53 s: it may declare ~3 s after
// the last landed renewal, the agent fences ~1 s after it.
func fastFence(f *agent.FenceConfig) {
	f.RenewInterval = agent.Duration(200 * time.Millisecond)
	f.RenewTimeout = agent.Duration(200 * time.Millisecond)
	f.PeerTimeout = agent.Duration(300 * time.Millisecond)
	f.FenceDeadline = agent.Duration(500 * time.Millisecond)
	f.LeaseTTL = agent.Duration(1500 * time.Millisecond)
	f.HeldRecheck = agent.Duration(500 * time.Millisecond)
	f.MembersRefresh = agent.Duration(500 * time.Millisecond)
}

// fenceDomains is the number of test-driver domains a rig starts
// (HVGUARD_FENCE_DOMAINS overrides, for measuring pause latency).
func fenceDomains(def int) int {
	if n, err := strconv.Atoi(os.Getenv("HVGUARD_FENCE_DOMAINS")); err == nil && n > 0 {
		return n
	}
	return def
}

type timedDecision struct {
	at time.Time
	d  controller.Decision
	// runningAtDecision lists the rig's domains that could run when the
	// controller declared the agent's host (must be empty).
	runningAtDecision []string
}

type timedTransition struct {
	at time.Time
	tr fencing.Transition
}

// ownDomains restricts an agent's fencing to its test's own domains: the
// test driver (test:///default) is shared by every agent of this process,
// so the fence tests can run in parallel without pausing each other's (or
// the non-fence tests') domains. Production fences every domain.
type ownDomains struct {
	agent.FenceHypervisor
	uuids []string
}

func (o ownDomains) ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error) {
	all, err := o.FenceHypervisor.ListDomains(ctx)
	var out []lifecycle.DomainSnapshot
	for _, d := range all {
		if slices.Contains(o.uuids, d.UUID) {
			out = append(out, d)
		}
	}
	return out, err
}

// fenceRig is one fencing agent (agent.Run, the whole daemon) connected to
// a real embedded nats-server through a blackholing TCP proxy, running
// test-driver domains, five healthy hosts kept renewed by the test, and
// the controller.Runner on a direct connection watching the same bucket.
type fenceRig struct {
	t        *testing.T
	prx      *netcut.Proxy
	wl       *libvirtx.Conn
	ctrl     *natslease.Store
	natsURL  string // direct
	host     string
	cfg      agent.Config
	domains  []string
	start    time.Time
	resets   atomic.Int32
	mu       sync.Mutex
	trans    []timedTransition
	decs     []timedDecision
	stopAgnt func() error
	opts     agent.Options // extra options for startAgent
}

func newFenceRig(t *testing.T, fast bool, nDomains int) *fenceRig {
	t.Helper()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	r := &fenceRig{t: t, prx: netcut.New(t, srv.Addr().String()), wl: workloadConn(t),
		natsURL: srv.ClientURL(), host: "fence-h0.example.org", start: time.Now()}
	for range nDomains {
		u, _ := newDomain(t, r.wl, "fence")
		r.domains = append(r.domains, u)
	}

	secret := filepath.Join(t.TempDir(), "peer.secret")
	if err := os.WriteFile(secret, []byte("integration-test-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := agentConfig(t, r.host, "nats://"+r.prx.Addr(), t.TempDir())
	cfg.Fence.Enabled = true
	cfg.Fence.Action = "pause"
	cfg.Fence.AllowReset = true // backstop "reset"; the reset itself is a recorder
	cfg.Fence.PeerSecretFile = secret
	cfg.Fence.PeerListen = "127.0.0.1:0"
	// Nobody listens there: the healthy hosts have no peer endpoint, so a
	// cut-off agent hears from no peer (isolation), as a cut host would.
	cfg.Fence.PeerURL = "http://127.0.0.1:9/{host}"
	// Tests end with the link cut: do not wait 10 s to flush the outbox.
	cfg.ShutdownTimeout = agent.Duration(time.Second)
	if fast {
		fastFence(&cfg.Fence)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.cfg = cfg

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
	r.ctrl = &natslease.Store{KV: kv}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.renewOthers(ctx, cfg.Fence.Core("x", "b").Timing)

	// The agent's backstop is reset (a recorder here, no watchdog): the
	// controller must accept that agent-dependent backstop explicitly.
	ccfg := controller.DefaultConfig()
	ccfg.AcceptAgentDependentBackstop = true
	tr, err := controller.NewTracker(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	run := &controller.Runner{Store: r.ctrl, Tracker: tr, Log: quietLog(), OnDecision: r.onDecision}
	done := make(chan struct{})
	go func() { defer close(done); _ = run.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// renewOthers keeps five healthy hosts (h1..h5) renewed, so the guard
// threshold is min(10, floor(0.2*6)) = 1: one silent host is declared.
func (r *fenceRig) renewOthers(ctx context.Context, timing fencing.Timing) {
	revs := map[string]uint64{}
	tick := time.NewTicker(timing.RenewInterval * 3 / 4)
	defer tick.Stop()
	for {
		for i := 1; i <= 5; i++ {
			h := fmt.Sprintf("h%d.example.org", i)
			rec := fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: h, BootID: "b", State: fencing.LeaseActive,
				FencingEnabled: true, Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: timing}
			if n, err := r.ctrl.Write(ctx, h, revs[h], rec, time.Second); err == nil {
				revs[h] = n
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *fenceRig) onDecision(d controller.Decision, err error) {
	if err != nil {
		return
	}
	td := timedDecision{at: time.Now(), d: d}
	if d.Op == controller.OpDeclare && d.Host == r.host {
		// The safety property, checked at the moment of the declaration
		// against libvirt's real state.
		for _, u := range r.domains {
			if st, err := r.wl.State(context.Background(), u); err != nil || st == lifecycle.StateRunning {
				td.runningAtDecision = append(td.runningAtDecision, fmt.Sprintf("%s(%v,%v)", u, st, err))
			}
		}
	}
	r.mu.Lock()
	r.decs = append(r.decs, td)
	r.mu.Unlock()
}

func (r *fenceRig) onTransition(tr fencing.Transition) {
	r.mu.Lock()
	r.trans = append(r.trans, timedTransition{time.Now(), tr})
	r.mu.Unlock()
}

func (r *fenceRig) startAgent() {
	r.t.Helper()
	r.stopAgnt = startAgent(r.t, r.cfg, r.agentOptions(r.opts))
}

// agentOptions completes opts for the rig's agent: fencing restricted to
// the rig's domains (then opts' own wrapper), resets and transitions
// recorded.
func (r *fenceRig) agentOptions(opts agent.Options) agent.Options {
	wrap := opts.WrapFenceHypervisor
	opts.WrapFenceHypervisor = func(h agent.FenceHypervisor) agent.FenceHypervisor {
		var own agent.FenceHypervisor = ownDomains{h, r.domains}
		if wrap != nil {
			own = wrap(own)
		}
		return own
	}
	opts.ResetHost = func() error { r.resets.Add(1); return nil }
	opts.OnFenceTransition = r.onTransition
	return opts
}

func (r *fenceRig) state() fencing.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.trans) == 0 {
		return ""
	}
	return r.trans[len(r.trans)-1].tr.To
}

// declared returns when the controller declared the agent's host (zero:
// not yet), and the domains that could run then.
func (r *fenceRig) declared() (time.Time, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.decs {
		if d.d.Op == controller.OpDeclare && d.d.Host == r.host {
			return d.at, d.runningAtDecision
		}
	}
	return time.Time{}, nil
}

func (r *fenceRig) history() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, x := range r.trans {
		fmt.Fprintf(&b, "%7.3fs agent %s\n", x.at.Sub(r.start).Seconds(), x.tr)
	}
	for _, x := range r.decs {
		fmt.Fprintf(&b, "%7.3fs controller %s\n", x.at.Sub(r.start).Seconds(), x.d)
	}
	return b.String()
}

func (r *fenceRig) waitFor(what string, timeout time.Duration, ok func() bool) time.Time {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %s waiting for %s\n%s", timeout, what, r.history())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Now()
}

func (r *fenceRig) waitState(s fencing.State, timeout time.Duration) time.Time {
	r.t.Helper()
	return r.waitFor("fence state "+string(s), timeout, func() bool { return r.state() == s })
}

// allDomains reports whether every rig domain is in state want.
func (r *fenceRig) allDomains(want lifecycle.State) bool {
	for _, u := range r.domains {
		st, err := r.wl.State(context.Background(), u)
		if err != nil || st != want {
			return false
		}
	}
	return true
}

func (r *fenceRig) reasons() []fencing.Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []fencing.Reason
	for _, x := range r.trans {
		out = append(out, x.tr.Reason)
	}
	return out
}

// TestFencePartitionHealBeforeExpiry: the agent's NATS link is blackholed:
// its domains are paused (libvirt state) well before the controller could
// declare it; the link heals before that: renewals land, the reconciliation
// hook runs, exactly the paused domains are resumed, nothing is declared.
func TestFencePartitionHealBeforeExpiry(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, fenceDomains(3))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second) // the controller sees renewals; the guard is published and read
	cut := time.Now()
	r.prx.Blackhole(true)
	paused := r.waitFor("all domains paused", 10*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("declared before the heal\n%s", r.history())
	}
	r.prx.Blackhole(false)
	healed := time.Now()
	resumed := r.waitFor("all domains running again", 10*time.Second, func() bool { return r.allDomains(lifecycle.StateRunning) })
	time.Sleep(3 * time.Second) // long enough for a (wrong) declaration to show
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("declared after a heal before expiry\n%s", r.history())
	}
	if st := r.state(); st != fencing.StateHealthy {
		t.Fatalf("state %s, want healthy\n%s", st, r.history())
	}
	if !slices.Contains(r.reasons(), fencing.ReasonResumedAfterReconcile) {
		t.Fatalf("no %s transition\n%s", fencing.ReasonResumedAfterReconcile, r.history())
	}
	if n := r.resets.Load(); n != 0 {
		t.Fatalf("%d host resets requested", n)
	}
	t.Logf("%d domains: cut→all paused %s, heal→all resumed %s\n%s", len(r.domains),
		paused.Sub(cut).Round(time.Millisecond), resumed.Sub(healed).Round(time.Millisecond), r.history())
}

// TestFencePartitionHealAfterExpiry: the partition lasts past the
// controller's declaration: the domains were paused before it; after the
// heal the agent learns of the declaration and stays fenced (never
// resumed, the declaration never overwritten); an agent restarted while
// fenced stays fenced; `--unfence` refuses while the reconciliation hook
// reports unreconciled evacuations, then releases: the agent takes its
// lease over and leaves the domains paused for the operator.
func TestFencePartitionHealAfterExpiry(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, fenceDomains(3))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)
	cut := time.Now()
	r.prx.Blackhole(true)
	paused := r.waitFor("all domains paused", 10*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	decl := r.waitFor("the controller's declaration", 15*time.Second, func() bool { at, _ := r.declared(); return !at.IsZero() })
	declAt, running := r.declared()
	if len(running) > 0 {
		t.Fatalf("declared while domains could run: %v\n%s", running, r.history())
	}
	if !paused.Before(declAt) {
		t.Fatalf("paused at %s, declared at %s\n%s", paused.Sub(cut), declAt.Sub(cut), r.history())
	}
	_ = decl
	time.Sleep(300 * time.Millisecond)
	r.prx.Blackhole(false)
	r.waitState(fencing.StateAwaitingRelease, 10*time.Second)
	time.Sleep(time.Second)
	r.assertStaysFenced("after the heal")

	// Restart while fenced.
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	r.assertStaysFenced("agent stopped")
	r.startAgent()
	r.waitState(fencing.StateAwaitingRelease, 10*time.Second)
	time.Sleep(time.Second)
	r.assertStaysFenced("after a restart")

	// Unfence: refused while evacuations are unreconciled, then released.
	direct := r.cfg
	direct.NATS.URLs = []string{r.natsURL}
	if _, err := agent.Unfence(context.Background(), direct, quietLog(), pendingEvacuations{"srv-1"}); !errors.Is(err, agent.ErrUnreconciled) {
		t.Fatalf("unfence with an unreconciled evacuation: %v, want ErrUnreconciled", err)
	}
	msg, err := agent.Unfence(context.Background(), direct, quietLog(), nil)
	if err != nil {
		t.Fatalf("unfence: %v", err)
	}
	t.Log(msg)
	r.waitFor("released and reconciled", 10*time.Second, func() bool {
		return slices.Contains(r.reasons(), fencing.ReasonReleasedReconciled)
	})
	if r.state() != fencing.StateHealthy {
		t.Fatalf("state %s after the release\n%s", r.state(), r.history())
	}
	time.Sleep(500 * time.Millisecond)
	if !r.allDomains(lifecycle.StatePaused) {
		t.Fatalf("a domain was resumed after a declaration\n%s", r.history())
	}
	if _, err := agent.Unfence(context.Background(), direct, quietLog(), nil); !errors.Is(err, agent.ErrNotDeclared) {
		t.Fatalf("second unfence: %v, want ErrNotDeclared", err)
	}
	t.Logf("%d domains: cut→all paused %s, cut→declared %s: margin %s\n%s", len(r.domains),
		paused.Sub(cut).Round(time.Millisecond), declAt.Sub(cut).Round(time.Millisecond),
		declAt.Sub(paused).Round(time.Millisecond), r.history())
}

func (r *fenceRig) assertStaysFenced(when string) {
	r.t.Helper()
	if !r.allDomains(lifecycle.StatePaused) {
		r.t.Fatalf("%s: a domain runs again\n%s", when, r.history())
	}
	rec, _, err := r.ctrl.Read(context.Background(), r.host)
	if err != nil || rec.State != fencing.LeaseExpired {
		r.t.Fatalf("%s: record %+v, %v: the declaration was overwritten\n%s", when, rec, err, r.history())
	}
}

// pendingEvacuations is a reconciliation hook reporting unreconciled
// evacuations (what Nova would show after an evacuation by hand).
type pendingEvacuations []string

func (p pendingEvacuations) Reconcile(context.Context, []string) ([]string, error) { return nil, nil }
func (p pendingEvacuations) Unreconciled(context.Context) ([]string, error)        { return p, nil }

// TestFencePartitionDefaultTiming: the same partition at the default
// constants (renew 2 s, TTL 15 s, fence deadline 5 s; controller grace with
// the reset backstop 6.3 s): the domains are paused about 10 s after the
// last landed renewal, the controller declares about 21 s after it. Takes
// ~35 s, which would push `go test ./...` well past a minute: it runs when
// HVGUARD_FENCE_DEFAULT_TIMING=1 (test/netns/run.sh sets it).
func TestFencePartitionDefaultTiming(t *testing.T) {
	if os.Getenv("HVGUARD_FENCE_DEFAULT_TIMING") != "1" {
		t.Skip("default timing takes ~35 s; set HVGUARD_FENCE_DEFAULT_TIMING=1")
	}
	t.Parallel()
	r := newFenceRig(t, false, fenceDomains(10))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 20*time.Second)
	time.Sleep(3 * time.Second)
	cut := time.Now()
	r.prx.Blackhole(true)
	paused := r.waitFor("all domains paused", 20*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	r.waitFor("the controller's declaration", 30*time.Second, func() bool { at, _ := r.declared(); return !at.IsZero() })
	declAt, running := r.declared()
	if len(running) > 0 || !paused.Before(declAt) {
		t.Fatalf("declared at %s while %v could run (paused at %s)\n%s", declAt.Sub(cut), running, paused.Sub(cut), r.history())
	}
	t.Logf("%d domains at default timing: cut→all paused %s, cut→declared %s: margin %s\n%s", len(r.domains),
		paused.Sub(cut).Round(time.Millisecond), declAt.Sub(cut).Round(time.Millisecond),
		declAt.Sub(paused).Round(time.Millisecond), r.history())
}
