package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"hvguard/agent"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/watchdog"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// Issue 10 item 1: the orderly stop and the start path of the whole
// daemon (agent.Run) against a real embedded NATS, the controller.Runner
// and test-driver domains (which keep running when the agent stops, like
// QEMU processes do). Timing ×0.1: the controller may declare a silent
// host ~3 s after its last renewal.

// quietFor is how long a test waits for a (wrong) declaration: twice
// lease_ttl + grace at the compressed timing.
const quietFor = 6 * time.Second

func (r *fenceRig) decisions(op controller.Op) []controller.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []controller.Decision
	for _, d := range r.decs {
		if d.d.Op == op && d.d.Host == r.host {
			out = append(out, d.d)
		}
	}
	return out
}

func (r *fenceRig) record() fencing.LeaseRecord {
	r.t.Helper()
	rec, _, err := r.ctrl.Read(context.Background(), r.host)
	if err != nil {
		r.t.Fatalf("read lease: %v", err)
	}
	return *rec
}

// transitionsSince returns the agent's transitions from index i on.
func (r *fenceRig) transitionsSince(i int) []fencing.Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []fencing.Transition
	for _, x := range r.trans[min(i, len(r.trans)):] {
		out = append(out, x.tr)
	}
	return out
}

func (r *fenceRig) nTransitions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.trans)
}

// stoppedRig returns a rig whose agent ran healthy (seen by the
// controller) and was stopped in order.
func stoppedRig(t *testing.T) *fenceRig {
	t.Helper()
	r := newFenceRig(t, true, fenceDomains(2))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	return r
}

// TestFenceOrderlyStopWithdraws: a healthy agent is stopped (SIGTERM):
// it withdraws its lease; the controller alerts (withdrawn) and never
// declares the host, whose domains keep running. Then an upgrade: the agent
// starts again 6 s later (longer than lease_ttl): it takes the lease back
// from its withdrawn record without fencing anything.
func TestFenceOrderlyStopWithdraws(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, fenceDomains(2))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second) // the controller sees renewals
	// The withdrawal's beacon says withdrawn (fencing.Beacon.State): a
	// controller that never saw the withdrawn record (overwritten before
	// its watch delivered it) learns of it from there (reviewer X11).
	bnc, err := nats.Connect(r.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer bnc.Close()
	bsubj, _ := proto.BeaconSubject(r.host)
	withdrawnBeacons := make(chan fencing.Beacon, 16)
	var bmu sync.Mutex
	var chain []fencing.Beacon // every beacon, in order
	if _, err := bnc.Subscribe(bsubj, func(m *nats.Msg) {
		b, err := fencing.DecodeBeacon(m.Data)
		if err != nil {
			t.Errorf("beacon: %v", err)
			return
		}
		bmu.Lock()
		chain = append(chain, b)
		bmu.Unlock()
		if b.State == fencing.LeaseWithdrawn {
			withdrawnBeacons <- b
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := bnc.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		bmu.Lock()
		n := len(chain)
		bmu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d beacons of the healthy agent in 20 s", n)
		}
	}
	stop := time.Now()
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	took := time.Since(stop)
	select {
	case b := <-withdrawnBeacons:
		e, err := r.ctrl.KV.Get(context.Background(), strings.ReplaceAll(r.host, ".", "_"))
		if err != nil || b.Revision != e.Revision() {
			t.Errorf("withdrawal beacon names revision %d, the key is at %v (%v)", b.Revision, e, err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("no beacon naming the withdrawal (state withdrawn) within 2 s of the orderly stop")
	}
	// Each beacon names the one published before it (fencing.Beacon.Prev,
	// the chain a controller checks for lost beacons): none was lost here.
	bmu.Lock()
	if len(chain) < 4 {
		t.Errorf("%d beacons received, want 3 renewals' and the withdrawal's", len(chain))
	}
	for i := 1; i < len(chain); i++ {
		if chain[i].Prev != chain[i-1].Revision {
			t.Errorf("beacon %d (revision %d) names prev %d, the beacon before it named %d", i, chain[i].Revision, chain[i].Prev, chain[i-1].Revision)
		}
	}
	bmu.Unlock()
	time.Sleep(quietFor)
	if at, running := r.declared(); !at.IsZero() {
		t.Fatalf("declared %s after an orderly stop, domains running: %v\n%s", at.Sub(stop), running, r.history())
	}
	if rec := r.record(); rec.State != fencing.LeaseWithdrawn || rec.Reason != "orderly-stop" {
		t.Fatalf("record %s (%q), want withdrawn (orderly-stop)\n%s", rec.State, rec.Reason, r.history())
	}
	if len(r.decisions(controller.OpWithdrawn)) != 1 {
		t.Fatalf("no (or repeated) withdrawn alert\n%s", r.history())
	}
	if !r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("a domain was touched by the stop\n%s", r.history())
	}

	// The upgrade: the new process starts from the withdrawn record.
	i := r.nTransitions()
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(quietFor)
	for _, tr := range r.transitionsSince(i) {
		// (suspect / asking-peers may show on a loaded machine at ×0.1
		// timing; a fence may not: the lease age starts afresh.)
		if tr.To == fencing.StateFencing || tr.To == fencing.StateFenced {
			t.Fatalf("restart after the stop went %s\n%s", tr, r.history())
		}
	}
	if at, _ := r.declared(); !at.IsZero() || r.record().State != fencing.LeaseActive || !r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("after the restart: declared %v, record %s\n%s", at, r.record().State, r.history())
	}
	t.Logf("stop took %s (withdrawal, drain, flush); restarted after %s without fencing\n%s",
		took.Round(time.Millisecond), quietFor, r.history())
}

// TestFenceStopCutOffFences: the agent is stopped while cut off from NATS:
// the withdrawal cannot land, so it fences (pauses every domain) before
// leaving; the controller's later declaration finds them paused. The
// hardware watchdog is left armed (closed without the magic close: the
// host would reset watchdog_timeout later). Then an operator resumes a
// domain and the agent starts again (still cut off): it carries on fenced,
// pauses that domain again and arms (feeds) the watchdog.
func TestFenceStopCutOffFences(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, fenceDomains(2))
	r.cfg.Fence.WatchdogDevice = "/dev/watchdog-test"
	r.cfg.Fence.WatchdogTimeout = agent.Duration(time.Second)
	var devs []*recDevice
	var devMu sync.Mutex
	r.opts.OpenWatchdog = func(string) (watchdog.Device, error) {
		devMu.Lock()
		defer devMu.Unlock()
		devs = append(devs, &recDevice{})
		return devs[len(devs)-1], nil
	}
	dev := func(i int) *recDevice {
		devMu.Lock()
		defer devMu.Unlock()
		if i < len(devs) {
			return devs[i]
		}
		return nil
	}
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)
	r.prx.Blackhole(true)
	stop := time.Now()
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	took := time.Since(stop)
	if !r.allDomains(lifecycle.StatePaused) {
		t.Fatalf("the stop left domains running while the lease could not be withdrawn\n%s", r.history())
	}
	at := r.waitFor("the controller's declaration", 15*time.Second, func() bool { at, _ := r.declared(); return !at.IsZero() })
	if _, running := r.declared(); len(running) > 0 {
		t.Fatalf("declared while %v run\n%s", running, r.history())
	}
	found := false
	for _, tr := range r.transitionsSince(0) {
		found = found || tr.Reason == fencing.ReasonWithdrawalNotConfirmed
	}
	if !found {
		t.Fatalf("no %s transition\n%s", fencing.ReasonWithdrawalNotConfirmed, r.history())
	}
	d0 := dev(0)
	d0.mu.Lock()
	mc, cl := d0.magicClosed, d0.closed
	d0.mu.Unlock()
	if mc || !cl {
		t.Fatalf("fenced stop: watchdog magic-closed %v, closed %v (want closed without the magic close: left armed)\n%s", mc, cl, r.history())
	}
	t.Logf("stop (fenced) took %s; declared %s after the stop, every domain paused; watchdog left armed\n%s", took.Round(time.Millisecond),
		at.Sub(stop).Round(time.Millisecond), r.history())

	// An operator starts a domain again; the agent starts, NATS still cut.
	if err := r.wl.Resume(context.Background(), r.domains[0]); err != nil {
		t.Fatal(err)
	}
	i := r.nTransitions()
	restarted := time.Now()
	r.startAgent()
	r.waitFor("the restart arms the watchdog", 10*time.Second, func() bool { d := dev(1); return d != nil && !d.lastFeed().IsZero() })
	r.waitFor("the resumed domain paused again", 10*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	var refenced bool
	for _, tr := range r.transitionsSince(i) {
		refenced = refenced || tr.Reason == fencing.ReasonRestartedFenced
	}
	if !refenced {
		t.Fatalf("the restart did not carry on fenced\n%s", r.history())
	}
	d1 := dev(1)
	d1.mu.Lock()
	first := d1.feeds[0]
	d1.mu.Unlock()
	t.Logf("restart: watchdog armed (fed) %s after the restart began (the stopped process's watchdog must be fed within watchdog_timeout of its exit)\n%s",
		first.Sub(restarted).Round(time.Millisecond), r.history())
}

// runUntilExit runs agent.Run and returns its error (a failed start).
func runUntilExit(t *testing.T, cfg agent.Config, opts agent.Options) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- agent.Run(context.Background(), cfg, quietLog(), opts) }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("agent.Run did not return within 30 s")
		return nil
	}
}

// TestFenceFailedStartWithdraws: after an orderly stop, the next start
// fails after fencing started — a corrupt outbox state.json (an upgrade
// gone wrong). The start took the lease back (a renewal) and withdraws it
// again on its way out ("start-failed: outbox: …"): never declared, the
// domains keep running. The same start with the outbox repaired works.
func TestFenceFailedStartWithdraws(t *testing.T) {
	t.Parallel()
	r := stoppedRig(t)
	state := filepath.Join(r.cfg.StateDir, "outbox", "state.json")
	good, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, []byte("{corrupt"), 0o600); err != nil {
		t.Fatal(err)
	}
	i := r.nTransitions()
	err = runUntilExit(t, r.cfg, r.agentOptions(agent.Options{}))
	if err == nil || !strings.Contains(err.Error(), "outbox") {
		t.Fatalf("start with a corrupt outbox: %v", err)
	}
	rec := r.record()
	if rec.State != fencing.LeaseWithdrawn || !strings.HasPrefix(rec.Reason, "start-failed: outbox") {
		t.Fatalf("record %s (%q), want withdrawn (start-failed: outbox…)\n%s", rec.State, rec.Reason, r.history())
	}
	time.Sleep(quietFor)
	if at, running := r.declared(); !at.IsZero() {
		t.Fatalf("declared after a failed start (running %v)\n%s", running, r.history())
	}
	if !r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("a domain was touched\n%s", r.history())
	}
	t.Logf("failed start: %v; record withdrawn (%s); transitions %v", err, rec.Reason, r.transitionsSince(i))
	if err := os.WriteFile(state, good, 0o600); err != nil {
		t.Fatal(err)
	}
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
}

// lapsedWatchdogRig is a rig whose agent has a (test) watchdog device, no
// reset, and a fence.json whose lease lapsed a minute ago.
func lapsedWatchdogRig(t *testing.T) *fenceRig {
	t.Helper()
	r := newFenceRig(t, true, 2)
	r.cfg.Fence.AllowReset = false
	r.cfg.Fence.WatchdogDevice = "/dev/watchdog-test"
	r.cfg.Fence.WatchdogTimeout = agent.Duration(time.Second)
	r.writeLapsedFenceState()
	return r
}

// writeLapsedFenceState writes a fence.json whose lease lapsed a minute ago
// in this boot: the previous process crashed.
func (r *fenceRig) writeLapsedFenceState() {
	r.t.Helper()
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		r.t.Skip("no boot id:", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		r.t.Fatal(err)
	}
	d := fencing.Durable{Host: r.host, BootID: strings.TrimSpace(string(bootID)), Incarnation: 1, HaveLease: true,
		LastAck: time.Unix(ts.Sec, ts.Nsec).UTC().Add(-time.Minute)}
	b, _ := json.Marshal(d)
	if err := os.MkdirAll(r.cfg.StateDir, 0o700); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.cfg.StateDir, "fence.json"), b, 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// TestFenceWatchdogLateArmFailureStops: the watchdog is armed late (the
// lease had lapsed at start: the agent fenced at once) and the device then
// refuses to be armed: the record must not go on advertising a watchdog
// backstop that is not there, so the agent leaves through the stop path
// (Run returns the arming error) instead of retrying while it renews; it
// leaves the host fenced (or withdrawn): no rig domain runs under an
// active record.
func TestFenceWatchdogLateArmFailureStops(t *testing.T) {
	t.Parallel()
	r := lapsedWatchdogRig(t)
	opts := r.agentOptions(agent.Options{
		OpenWatchdog: func(string) (watchdog.Device, error) { return nil, errors.New("device busy (test)") },
	})
	err := runUntilExit(t, r.cfg, opts)
	if err == nil || !strings.Contains(err.Error(), "device busy") {
		t.Fatalf("Run: %v, want the arming error\n%s", err, r.history())
	}
	// No record at all is as safe (nothing advertised): the arming can
	// fail before the agent's first write lands (seen once under CI load).
	rec, _, rerr := r.ctrl.Read(context.Background(), r.host)
	if rerr != nil && !errors.Is(rerr, jetstream.ErrKeyNotFound) {
		t.Fatalf("read lease: %v", rerr)
	}
	if rec == nil {
		t.Logf("no lease record written before the exit\n%s", r.history())
		return
	}
	for _, u := range r.domains {
		if st, err := r.wl.State(context.Background(), u); rec.State == fencing.LeaseActive && (err != nil || st == lifecycle.StateRunning) {
			t.Fatalf("left with record %s and %s %v (%v)\n%s", rec.State, u, st, err, r.history())
		}
	}
	t.Logf("%v\n%s", err, r.history())
}

// startLapsedCutHung runs the rig's agent with NATS cut and libvirt's
// Suspend hanging (until release is closed) and a recording watchdog,
// and returns when it has been fencing for 2 s. armed is the unix nanos
// of the arming (0: not armed); stop ends the agent.
func (r *fenceRig) startLapsedCutHung() (armed *atomic.Int64, release chan struct{}, stop func()) {
	armed, release = new(atomic.Int64), make(chan struct{})
	dev := &recDevice{}
	opts := r.agentOptions(agent.Options{
		OpenWatchdog:        func(string) (watchdog.Device, error) { armed.Store(time.Now().UnixNano()); return dev, nil },
		WrapFenceHypervisor: func(h agent.FenceHypervisor) agent.FenceHypervisor { return hungPause{h, release} },
	})
	r.prx.Blackhole(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, r.cfg, quietLog(), opts) }()
	r.waitState(fencing.StateFencing, 10*time.Second)
	time.Sleep(2 * time.Second)
	return armed, release, func() { cancel(); <-done }
}

// TestFenceWatchdogNotArmedAfterLapse (crash loops): the agent starts with
// a fence.json whose lease lapsed a minute ago in this boot (the previous
// process crashed) and NATS unreachable, libvirt's Suspend hanging: arming
// feeds the watchdog, so the agent must not arm it while neither the lease
// is held nor the fence complete (a crash loop re-arming at every start
// would keep the host alive); once the fence completes it arms it.
func TestFenceWatchdogNotArmedAfterLapse(t *testing.T) {
	t.Parallel()
	r := lapsedWatchdogRig(t)
	armed, release, stop := r.startLapsedCutHung()
	defer stop()
	if at := armed.Load(); at != 0 {
		t.Fatalf("watchdog armed (fed) with the lease lapsed and the fence incomplete\n%s", r.history())
	}
	close(release)
	fenced := r.waitState(fencing.StateFenced, 10*time.Second)
	r.waitFor("watchdog armed after the fence", 5*time.Second, func() bool { return armed.Load() != 0 })
	if a := time.Unix(0, armed.Load()); a.Before(fenced.Add(-100 * time.Millisecond)) {
		t.Fatalf("armed at %s, before the fence completed (%s)", a, fenced)
	}
	t.Logf("not armed while lapsed and unfenced; armed %s after the fence completed\n%s",
		time.Unix(0, armed.Load()).Sub(fenced).Round(time.Millisecond), r.history())
}

// TestFenceLibvirtHungAtStart: after an orderly stop (upgrade) the new
// process finds libvirtd not answering (a socket that accepts and never
// speaks): fencing runs before libvirt, so the lease is taken back and
// renewed while the start waits for libvirt (nothing declared), and the
// SIGTERM that ends the wait withdraws it again ("start-failed: libvirt
// …"). Before, fencing started only after libvirt answered: the record the
// previous process left was declared while the domains ran.
func TestFenceLibvirtHungAtStart(t *testing.T) {
	t.Parallel()
	r := stoppedRig(t)
	sock := filepath.Join(t.TempDir(), "libvirt.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	cfg := r.cfg
	cfg.Libvirt.URI = "qemu+unix:///system?socket=" + sock
	cfg.Libvirt.ConnectTimeout = agent.Duration(time.Second)
	i := r.nTransitions()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, quietLog(), r.agentOptions(agent.Options{})) }()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(quietFor) // libvirt still not answering
	if at, running := r.declared(); !at.IsZero() {
		t.Fatalf("declared while the start waited for libvirt (running %v)\n%s", running, r.history())
	}
	if rec := r.record(); rec.State != fencing.LeaseActive {
		t.Fatalf("record %s while starting: the lease is not renewed\n%s", rec.State, r.history())
	}
	cancel()
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "libvirt") {
		t.Fatalf("Run: %v", err)
	}
	rec := r.record()
	if rec.State != fencing.LeaseWithdrawn || !strings.HasPrefix(rec.Reason, "start-failed: libvirt") {
		t.Fatalf("record %s (%q), want withdrawn (start-failed: libvirt…)\n%s", rec.State, rec.Reason, r.history())
	}
	time.Sleep(quietFor)
	if at, _ := r.declared(); !at.IsZero() || !r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("declared %v after the failed start\n%s", at, r.history())
	}
	t.Logf("renewed while libvirt hung; %v; withdrawn (%s); transitions %v", err, rec.Reason, r.transitionsSince(i))
}

// TestFenceLostStateUsesRuntimeCopy (limit (2), reviewer R2): the previous
// process of this boot crashed with its lease lapsed a minute ago, and
// state_dir/fence.json is lost; the per-boot runtime copy
// (fence.runtime_dir) survives. NATS unreachable, libvirt's Suspend
// hanging. The start takes the runtime copy (the lease age of the crashed
// process): it fences at once and does not arm (feed) the watchdog while
// the fence is incomplete. Before the copy existed it started as a first
// start, whose assumed lease age armed the watchdog at once. Both copies
// are written again.
func TestFenceLostStateUsesRuntimeCopy(t *testing.T) {
	t.Parallel()
	r := lapsedWatchdogRig(t)
	state := filepath.Join(r.cfg.StateDir, "fence.json")
	raw, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := json.Marshal(map[string]any{"state_dir": r.cfg.StateDir, "durable": json.RawMessage(raw)})
	runtimeCopy := filepath.Join(r.cfg.Fence.RuntimeDir, "fence.json")
	if err := os.WriteFile(runtimeCopy, cp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	armed, release, stop := r.startLapsedCutHung()
	defer stop()
	defer close(release)
	if armed.Load() != 0 {
		t.Fatalf("watchdog armed (fed) at a start whose state_dir lost fence.json: the runtime copy was not used\n%s", r.history())
	}
	for _, p := range []string{state, runtimeCopy} {
		if st, err := os.Stat(p); err != nil || !st.ModTime().After(time.Now().Add(-5*time.Second)) {
			t.Fatalf("%s not written again: %v", p, err)
		}
	}
	t.Logf("not armed; fencing from the runtime copy's lease age\n%s", r.history())
}
