package controller

import (
	"os"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"hvguard/fencing"
)

// Issue 10 items 1, 2 and 5 in the simulation: orderly stops (the
// withdrawal, or a fence before leaving) with NATS reachable or not,
// restarts of every length, crash loops, agent death at every phase,
// libvirt not answering, reset + watchdog configurations. Every fix has a
// mutation switch; the deterministic tests below show that each switch
// makes the safety property fail (or, for the upgrade, a host fence).

// stopBudget is how long the simulated process may take to stop before
// systemd kills it (TimeoutStopSec in packaging/systemd).
const stopBudget = 30 * time.Second

// startStopEvent starts the events of this file on h.
func (s *sim) startStopEvent(e simEvent, h *simHost) {
	switch e.kind {
	case "stop":
		// An orderly stop (SIGTERM: systemctl stop, an upgrade), the
		// process starting again after e.dur.
		if h.dead || !h.agentUp(s.now) || h.stopping {
			return
		}
		a := h.agent
		h.stopping, h.stopAt, h.stopDown = true, s.now, e.dur
		s.apply(h, a, a.Stop(s.local(h), "orderly-stop"))
		if h.agent == a && h.agentUp(s.now) {
			s.stopStep(h, a)
		}
	case "crash-loop":
		// The process dies (crash, OOM kill) and is restarted, again and
		// again: down for e.dur, up for e.up, until the loop ends.
		end := s.now.Add(2 * time.Minute)
		var loop func()
		loop = func() {
			if h.dead || !s.now.Before(end) {
				return
			}
			s.crash(h, e.dur)
			s.after(e.dur+e.up, loop)
		}
		loop()
	case "domain-start":
		// An operator (or Nova) starts domain 0 (paused or shut off) on
		// the host, through libvirt (so not while it is down); a running
		// agent's shell relists on the started event.
		if !h.dead && h.doms[0] != domDead && h.lvDown == 0 {
			h.doms[0] = domRunning
			if h.agentUp(s.now) && h.agent != nil {
				a := h.agent
				s.apply(h, a, a.Domains(s.local(h), s.inventory(h)))
			}
		}
	case "libvirt-down":
		h.lvDown++
		s.after(e.dur, func() {
			h.lvDown--
			if h.lvDown == 0 && h.agentUp(s.now) {
				a := h.agent
				s.apply(h, a, a.Domains(s.local(h), s.inventory(h)))
			}
		})
	}
}

// stopStep ends the process once its stop is done (or systemd's budget is
// spent): the watchdog is magic-closed only when the withdrawal was
// confirmed (StopOutcome.MagicClose), otherwise left armed (and unfed):
// after a fenced stop the host resets watchdog_timeout later unless the
// agent starts again and feeds it.
func (s *sim) stopStep(h *simHost, a *fencing.Agent) {
	o := a.StopOutcome()
	if o == fencing.StopPending && s.now.Sub(h.stopAt) < stopBudget {
		return
	}
	if h.stops == nil {
		h.stops = map[fencing.StopOutcome]int{}
	}
	h.stops[o]++
	if o.MagicClose() || s.disarmAlways {
		h.wdArmed = false
	}
	s.logf("%s agent stopped: %s (watchdog armed %v)", h.name, o, h.wdArmed)
	down := h.stopDown
	h.stopping = false
	h.agent, h.downTo = nil, s.now.Add(down)
	s.after(down, func() {
		if !h.dead && h.agent == nil {
			s.logf("%s agent starts after its stop", h.name)
			s.startAgent(h)
		}
	})
}

func (s *sim) stopCounts() (out map[fencing.StopOutcome]int) {
	out = map[fencing.StopOutcome]int{}
	for _, h := range s.hosts {
		for o, n := range h.stops {
			out[o] += n
		}
	}
	return out
}

// drawStopSim draws a schedule of stops, crashes, crash loops and libvirt
// outages mixed with cuts; hosts allow a reset or not (all have the
// watchdog), and the controller accepts agent-dependent backstops, so a
// host advertising reset (LegacyBackstop) would be declared with the
// short grace.
func drawStopSim(t *rapid.T, upgradesOnly bool) *sim {
	n := rapid.IntRange(3, 10).Draw(t, "hosts")
	rack := rapid.IntRange(1, 4).Draw(t, "rack_size")
	racks := (n + rack - 1) / rack
	gc := DefaultConfig()
	gc.AcceptAgentDependentBackstop = true
	gc.GuardShare = rapid.SampledFrom([]float64{fencing.DefaultGuardShare, 0.5, 0.8}).Draw(t, "guard_share")
	gc.GuardCount = rapid.IntRange(1, fencing.DefaultGuardCount).Draw(t, "guard_count")
	kinds := []string{"stop", "restart", "crash-loop", "libvirt-down", "cut-host", "cut-rack", "outage",
		"cut+stop", "cut+restart", "cut+crash-loop", "cut+stop", "cut+restart", "cut+crash-loop"}
	if upgradesOnly {
		kinds = []string{"stop"}
	}
	var evs []simEvent
	for range rapid.IntRange(1, 6).Draw(t, "events") {
		e := simEvent{kind: rapid.SampledFrom(kinds).Draw(t, "kind"),
			at: time.Duration(rapid.IntRange(50, 1000).Draw(t, "at")) * simStep}
		// Every length: blips, around the detection, fence and watchdog
		// times, and long.
		e.dur = time.Duration(rapid.OneOf(rapid.IntRange(1, 50), rapid.IntRange(50, 200), rapid.IntRange(200, 1200)).Draw(t, "dur")) * simStep
		switch e.kind {
		case "cut-rack":
			r := rapid.IntRange(0, racks-1).Draw(t, "rack")
			for h := r * rack; h < min(n, (r+1)*rack); h++ {
				e.hosts = append(e.hosts, h)
			}
		case "outage":
			k := rapid.IntRange(1, n).Draw(t, "outage_hosts")
			e.hosts = rapid.Permutation(seq(n)).Draw(t, "outage_perm")[:k]
		case "crash-loop", "cut+crash-loop":
			e.dur = time.Duration(rapid.IntRange(1, 80).Draw(t, "loop_down")) * simStep
			e.up = time.Duration(rapid.IntRange(1, 60).Draw(t, "loop_up")) * simStep
			e.hosts = []int{rapid.IntRange(0, n-1).Draw(t, "host")}
		default:
			e.hosts = []int{rapid.IntRange(0, n-1).Draw(t, "host")}
		}
		if k, ok := strings.CutPrefix(e.kind, "cut+"); ok {
			// Agent death (or a stop) at every phase of an isolation: the
			// host cut off (and libvirt not answering, so no fence can
			// complete, or answering), then its agent stops, crashes or
			// crash-loops 0–25 s into the cut: healthy, suspect, asking,
			// fencing, fenced, lapsed.
			cut := simEvent{kind: "cut-host", at: e.at, hosts: e.hosts,
				dur: time.Duration(rapid.IntRange(100, 1500).Draw(t, "cut_dur")) * simStep}
			evs = append(evs, cut)
			if rapid.Bool().Draw(t, "libvirt_down") {
				evs = append(evs, simEvent{kind: "libvirt-down", at: e.at, hosts: e.hosts, dur: cut.dur})
			}
			e.kind = k
			e.at += time.Duration(rapid.IntRange(0, 250).Draw(t, "phase")) * simStep
		}
		evs = append(evs, e)
	}
	reset := make([]bool, n)
	for i := range reset {
		reset[i] = rapid.Bool().Draw(t, "allow_reset")
	}
	drift := rapid.SampledFrom([]float64{0, fencing.MaxClockDrift / 2, fencing.MaxClockDrift}).Draw(t, "drift")
	s := newSimWith(rapid.Uint64().Draw(t, "seed"), n, rack, rapid.IntRange(1, 3).Draw(t, "domains"), drift, gc, evs,
		func(h *simHost) { h.allowReset = reset[len(h.name)*0+hostIndex(h.name)] })
	if !upgradesOnly {
		s.pSlow = rapid.SampledFrom([]float64{0, 0.005, 0.02}).Draw(t, "p_slow")
	}
	return s
}

func hostIndex(name string) int {
	var i int
	for _, c := range name[1:] {
		i = i*10 + int(c-'0')
	}
	return i
}

// TestPropertyStopsCrashesNoDeclarationWhileDomainsRun: for random
// schedules of orderly stops (NATS reachable or cut at the time), crashes
// with restarts of every length (0.1 s to 2 min), crash loops (down 0.1–8
// s, up 0.1–6 s), libvirt not answering (fences cannot complete), rack and
// host cuts and outages, hosts with and without allow_reset (all with the
// watchdog): the controller never declares a host while a domain on it
// can run.
func TestPropertyStopsCrashesNoDeclarationWhileDomainsRun(t *testing.T) {
	var runs, declared int
	stops := map[fencing.StopOutcome]int{}
	rapid.Check(t, func(rt *rapid.T) {
		s := drawStopSim(rt, false)
		envMutation(t, s)
		s.run(rt)
		runs++
		declared += len(s.declared)
		for o, n := range s.stopCounts() {
			stops[o] += n
		}
	})
	// Not vacuous: stops withdrew and fenced, hosts were declared.
	if runs >= 50 && (stops[fencing.StopWithdrawn] == 0 || stops[fencing.StopFenced] == 0 || declared == 0) {
		t.Errorf("%d schedules: stops %v, %d declared: the generator no longer reaches the interesting cases", runs, stops, declared)
	}
	t.Logf("%d schedules: stops withdrawn %d, fenced %d, unfenced %d, pending at kill %d; %d hosts declared", runs,
		stops[fencing.StopWithdrawn], stops[fencing.StopFenced], stops[fencing.StopUnfenced], stops[fencing.StopPending], declared)
}

// TestPropertyUpgradeFencesNobody: orderly stops and restarts of every
// length (an upgrade, a `systemctl restart`, a host left stopped for two
// minutes) with NATS reachable fence nobody, reset nobody, and the
// controller declares nothing.
func TestPropertyUpgradeFencesNobody(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := drawStopSim(rt, true)
		envMutation(t, s)
		s.run(rt)
		if ops, resets := s.fenced(); ops+resets > 0 || len(s.declared) > 0 {
			rt.Fatalf("upgrade fenced: %d fence ops, %d resets, declared %v\nevents %v\n%s", ops, resets, s.declared, s.events,
				strings.Join(s.fencedTrace(), "\n"))
		}
	})
}

// mutations are the switches of issue 10's fixes, by name: on removes the
// fix (HVGUARD_SIM_MUTATION=<name> runs the random properties with it, by
// hand: see docs/fencing.md).
var mutations = map[string]func(s *sim, on bool){
	"stop-without-withdrawal":    func(_ *sim, on bool) { fencing.Mutations.StopWithoutWithdrawal = on },
	"legacy-backstop":            func(_ *sim, on bool) { fencing.Mutations.LegacyBackstop = on },
	"restart-keeps-age":          func(_ *sim, on bool) { fencing.Mutations.RestartKeepsWithdrawnAge = on },
	"withdrawn-declarable":       func(_ *sim, on bool) { withdrawnDeclarable = on },
	"fenced-feeds-unlisted":      func(_ *sim, on bool) { fencing.Mutations.FencedFeedsUnlisted = on },
	"withdrawn-restart-confirms": func(_ *sim, on bool) { fencing.Mutations.WithdrawnRestartConfirms = on },
	"withdrawn-key-not-carried":  func(_ *sim, on bool) { fencing.Mutations.WithdrawnKeyNotCarried = on },
	"feed-at-start":              func(s *sim, on bool) { s.feedAtStart = on },
	"disarm-always":              func(s *sim, on bool) { s.disarmAlways = on },
	"fenced-stop-magic-closes":   func(_ *sim, on bool) { fencing.Mutations.FencedStopMagicCloses = on },
}

// envMutation applies HVGUARD_SIM_MUTATION to s (and resets it when the
// test ends).
func envMutation(tb interface{ Cleanup(func()) }, s *sim) {
	m := mutations[os.Getenv("HVGUARD_SIM_MUTATION")]
	if m == nil {
		return
	}
	m(s, true)
	tb.Cleanup(func() { m(s, false) })
}

// scenario runs a deterministic schedule with the mutation on or off and
// returns the first safety violation ("" if none) and the simulation.
type scenario struct {
	hosts, rack int
	guard       func(c *Config)
	configure   func(h *simHost)
	events      []simEvent
}

func (sc scenario) run(t *testing.T, mutation string, on bool) (string, *sim) {
	t.Helper()
	gc := DefaultConfig()
	gc.GuardCount, gc.GuardShare = 2, 0.8 // one silent host of five is declared
	if sc.guard != nil {
		sc.guard(&gc)
	}
	s := newSimWith(1, sc.hosts, sc.rack, 2, 0, gc, sc.events, sc.configure)
	if m := mutations[mutation]; m != nil {
		m(s, on)
		defer m(s, false)
	}
	for s.now.Before(t0.Add(simDuration)) {
		s.step()
		if len(s.errs) > 0 {
			return s.errs[0], s
		}
	}
	return "", s
}

// mustFailOnlyMutated: the schedule is safe with the fix and violates the
// safety property without it.
func (sc scenario) mustFailOnlyMutated(t *testing.T, mutation string) *sim {
	t.Helper()
	if err, s := sc.run(t, mutation, false); err != "" {
		t.Fatalf("with the fix: %s\n%s", err, strings.Join(s.tail(60), "\n"))
	}
	err, s := sc.run(t, mutation, true)
	if err == "" {
		t.Fatalf("mutation %s: the safety property still holds (the test does not guard the fix)\n%s", mutation, strings.Join(s.tail(60), "\n"))
	}
	t.Logf("mutation %s: %s", mutation, err)
	_, s = sc.run(t, mutation, false)
	return s
}

// TestSimOrderlyStopWithdraws (item 1): a healthy host is stopped
// (systemctl stop) and stays down: its withdrawal lands, the controller
// never declares it (domains keep running, unprotected, alerted). The old
// stop (nothing written, watchdog magic-closed) is declared 21–31 s later
// while its domains run.
func TestSimOrderlyStopWithdraws(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{{at: 20 * time.Second, kind: "stop", hosts: []int{0}, dur: 170 * time.Second}}}
	s := sc.mustFailOnlyMutated(t, "stop-without-withdrawal")
	if len(s.declared) > 0 || s.host("h00").stops[fencing.StopWithdrawn] != 1 {
		t.Fatalf("declared %v, stops %v", s.declared, s.host("h00").stops)
	}
	sc.mustFailOnlyMutated(t, "withdrawn-declarable")
}

// TestSimStopCutOffFences (item 1): the host is cut off from NATS (and
// its peers) when it is stopped: the withdrawal cannot land, so it fences
// before leaving; the controller declares it later, with every domain
// paused. The old stop leaves them running.
func TestSimStopCutOffFences(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{
		{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
		{at: 21 * time.Second, kind: "stop", hosts: []int{0}, dur: 170 * time.Second},
	}}
	s := sc.mustFailOnlyMutated(t, "stop-without-withdrawal")
	if !s.declared["h00"] || s.host("h00").stops[fencing.StopFenced] != 1 {
		t.Fatalf("declared %v, stops %v", s.declared, s.host("h00").stops)
	}
}

// TestSimStopFenceIncompleteKeepsWatchdog (item 1): cut off and libvirt not
// answering at the stop: the fence cannot complete, the process leaves
// with the watchdog armed and unfed, and the host resets before the
// controller may declare. Magic-closing it on every stop (the old
// shutdown) leaves the domains running into the declaration.
func TestSimStopFenceIncompleteKeepsWatchdog(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{
		{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
		{at: 20 * time.Second, kind: "libvirt-down", hosts: []int{0}, dur: 170 * time.Second},
		{at: 21 * time.Second, kind: "stop", hosts: []int{0}, dur: 170 * time.Second},
	}}
	s := sc.mustFailOnlyMutated(t, "disarm-always")
	if h := s.host("h00"); h.resets != 1 || h.stops[fencing.StopUnfenced] != 1 {
		t.Fatalf("resets %d, stops %v", h.resets, h.stops)
	}
}

// TestSimDeadAgentWatchdogGrace (item 2): a host with allow_reset and the
// watchdog is cut off; libvirt does not answer, so its fence cannot
// complete, and its agent dies 13 s into the cut (crash, OOM kill),
// before it could escalate to a reset. Only the watchdog stops the
// domains, up to L + lease_ttl + watchdog_timeout: the record must
// advertise the watchdog (grace 15.5 s), not reset (grace 6.3 s, declared
// at L + 21.3 s while the domains run).
func TestSimDeadAgentWatchdogGrace(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5,
		guard:     func(c *Config) { c.AcceptAgentDependentBackstop = true },
		configure: func(h *simHost) { h.allowReset = true },
		events: []simEvent{
			{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
			{at: 20 * time.Second, kind: "libvirt-down", hosts: []int{0}, dur: 170 * time.Second},
			{at: 33 * time.Second, kind: "restart", hosts: []int{0}, dur: 170 * time.Second},
		}}
	s := sc.mustFailOnlyMutated(t, "legacy-backstop")
	if h := s.host("h00"); h.resets != 1 || !s.declared["h00"] {
		t.Fatalf("resets %d, declared %v", h.resets, s.declared)
	}
}

// TestSimResetOnlyRefused (item 2): a host with allow_reset and NO
// watchdog, in the same situation: nothing stops its domains once the
// agent is dead, so the controller refuses it by default (never
// declared); accepting agent-dependent backstops declares it while its
// domains run (the documented risk of AcceptAgentDependentBackstop).
func TestSimResetOnlyRefused(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5,
		configure: func(h *simHost) { h.allowReset, h.noWatchdog = true, h.name == "h00" },
		events: []simEvent{
			{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
			{at: 20 * time.Second, kind: "libvirt-down", hosts: []int{0}, dur: 170 * time.Second},
			{at: 33 * time.Second, kind: "restart", hosts: []int{0}, dur: 170 * time.Second},
		}}
	if err, s := sc.run(t, "", false); err != "" || len(s.declared) > 0 {
		t.Fatalf("default controller: %s, declared %v", err, s.declared)
	}
	sc.guard = func(c *Config) { c.AcceptAgentDependentBackstop = true }
	if err, _ := sc.run(t, "", false); err == "" {
		t.Fatal("accepting the reset-only backstop: no violation (the risk is not demonstrated)")
	} else {
		t.Logf("AcceptAgentDependentBackstop: %s", err)
	}
}

// TestSimCrashLoopWatchdog (crash loops): cut off with libvirt not
// answering, the agent crash-loops (each process lives 2 s, restarted 3 s
// later). A start feeds the watchdog only while the durable lease allows
// it, so the host resets within lease_ttl + watchdog_timeout of its last
// landed renewal. Arming (= feeding) at every start keeps it alive, and the
// controller declares it while its domains run.
func TestSimCrashLoopWatchdog(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{
		{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
		{at: 20 * time.Second, kind: "libvirt-down", hosts: []int{0}, dur: 170 * time.Second},
		{at: 22 * time.Second, kind: "crash-loop", hosts: []int{0}, dur: 3 * time.Second, up: 2 * time.Second},
	}}
	s := sc.mustFailOnlyMutated(t, "feed-at-start")
	if h := s.host("h00"); h.resets != 1 {
		t.Fatalf("resets %d", h.resets)
	}
	// The process that crashed mid-fence left "fenced" in its durable
	// state: the next start must not feed on the strength of the file.
	sc.mustFailOnlyMutated(t, "fenced-feeds-unlisted")
}

// TestSimUpgradeDoesNotFence (item 1, start path): an upgrade that keeps
// the agent down for 40 s (longer than fence_by) with NATS reachable: the
// new process starts from its withdrawn record with a fresh lease age and
// fences nothing. Keeping the withdrawn process's lease age fences every
// domain at the start.
func TestSimUpgradeDoesNotFence(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{{at: 20 * time.Second, kind: "stop", hosts: []int{0}, dur: 40 * time.Second}}}
	for _, on := range []bool{false, true} {
		err, s := sc.run(t, "restart-keeps-age", on)
		ops, resets := s.fenced()
		if err != "" || len(s.declared) > 0 || resets > 0 {
			t.Fatalf("mutation %v: %s, declared %v, resets %d", on, err, s.declared, resets)
		}
		if (ops > 0) != on {
			t.Fatalf("mutation %v: %d fence operations\n%s", on, ops, strings.Join(s.fencedTrace(), "\n"))
		}
	}
}

// TestSimWithdrawnRestartDoesNotConfirm: h00 was stopped (withdrawn) and
// starts again while its rack (h00–h03) is cut off from NATS and from the
// other rack, so no renewal of it lands: its record stays withdrawn and
// the controller counts only h01–h03 (3, not more than its threshold 3).
// h00 must not confirm "cannot renew" to them: with its confirmation they
// are Held (1 + 3 > 3) and the controller declares them while their
// domains run.
func TestSimWithdrawnRestartDoesNotConfirm(t *testing.T) {
	sc := scenario{hosts: 6, rack: 4,
		guard: func(c *Config) { c.GuardCount, c.GuardShare = 3, 0.8 },
		events: []simEvent{
			{at: 10 * time.Second, kind: "stop", hosts: []int{0}, dur: 26 * time.Second},
			{at: 35 * time.Second, kind: "cut-rack", hosts: []int{0, 1, 2, 3}, dur: 150 * time.Second},
		}}
	sc.mustFailOnlyMutated(t, "withdrawn-restart-confirms")
}
