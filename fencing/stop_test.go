package fencing

import (
	"testing"
	"time"
)

// Issue 10 items 1 and 2: the orderly stop (withdrawal, or fence before
// leaving), the start from a withdrawn record, the advertised backstop.

// stop calls Stop and returns the withdrawal it asks for (nil: none).
func (h *harness) stop(reason string) *RenewRequest {
	h.t.Helper()
	h.renew = nil
	h.take(h.a.Stop(h.now, reason))
	w := h.renew
	h.renew = nil
	if w != nil && (w.Record.State != LeaseWithdrawn || w.Record.Reason != reason) {
		h.t.Fatalf("withdrawal %+v", w.Record)
	}
	return w
}

func (h *harness) expectStop(o StopOutcome) {
	h.t.Helper()
	if got := h.a.StopOutcome(); got != o {
		h.t.Fatalf("stop outcome %s, want %s; log:\n%v", got, o, h.log)
	}
}

// TestStopWithdraws: a healthy agent stops: one withdrawn record by CAS on
// the revision of its last landed renewal; once it landed nothing renews
// or asks peers again, the watchdog may be disarmed, and peers do not
// count the host as a confirmation.
func TestStopWithdraws(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	h.log = nil
	w := h.stop("orderly-stop")
	if w == nil || w.Revision != h.rev || w.Record.Epoch != h.a.Epoch() {
		t.Fatalf("withdrawal %+v (rev %d)", w, h.rev)
	}
	h.expectStop(StopPending)
	h.rev++
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	h.expectState(StateWithdrawn)
	h.expectStop(StopWithdrawn)
	if !h.dur.Withdrawn || h.dur.Fenced {
		t.Fatalf("durable %+v", h.dur)
	}
	h.advance(time.Minute)
	if h.renew != nil || h.round != nil {
		t.Fatalf("renewed or asked peers after the withdrawal: %+v %+v", h.renew, h.round)
	}
	h.expectLog("healthy>withdrawn:WithdrawnOnStop")
	if !h.a.FeedWatchdog(h.now) {
		t.Fatal("watchdog not to be fed (disarmed) after the withdrawal")
	}
	if k := h.a.PeerStatus(h.now).Answer(); k != PeerLeaseLapsed {
		t.Fatalf("withdrawn agent answers %d, want lease-lapsed", k)
	}
}

// TestStopWithdrawalFailsFences: NATS unreachable at stop (the write
// definitely failed, or timed out with an unknown outcome): the agent
// fences before leaving, and never rejoins or resumes on the way out even
// if a renewal of its lands.
func TestStopWithdrawalFailsFences(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(h *harness, w *RenewRequest)
	}{
		{"failed", func(h *harness, w *RenewRequest) {
			h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewFailed}))
		}},
		{"timed out", func(h *harness, w *RenewRequest) {
			h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewTimedOut}))
		}},
		{"no answer", func(h *harness, w *RenewRequest) { h.advance(h.a.cfg.Timing.RenewTimeout) }},
		{"conflict", func(h *harness, w *RenewRequest) {
			cur := LeaseRecord{Schema: 1, Host: "h0", State: LeaseActive, BootID: "other", Seq: 99}
			h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev + 5, Current: &cur}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(), 50, "d1")
			h.healthyFor(time.Second)
			h.log = nil
			w := h.stop("orderly-stop")
			tc.fail(h, w)
			h.expectState(StateFencing)
			h.expectStop(StopPending)
			if !h.dur.Fenced || h.dur.Withdrawn {
				t.Fatalf("durable %+v", h.dur)
			}
			h.take(h.a.FenceDone(h.now, "d1", nil))
			h.expectState(StateFenced)
			h.expectStop(StopFenced)
			h.advance(30 * time.Second)
			if h.renew != nil {
				t.Fatalf("renewal after the stop: %+v", h.renew)
			}
			h.expectState(StateFenced)
		})
	}
}

// TestStopFenceMissesDeadline: the fence at stop does not complete (libvirt
// hangs): at fence_deadline the agent escalates (reset if allowed), stops
// feeding the watchdog although its lease is still held, and reports
// StopUnfenced (the caller leaves the watchdog armed).
func TestStopFenceMissesDeadline(t *testing.T) {
	for _, reset := range []bool{false, true} {
		cfg := testConfig()
		cfg.AllowReset = reset
		h := newHarness(t, cfg, 50, "d1")
		h.healthyFor(time.Second)
		w := h.stop("orderly-stop")
		h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewFailed}))
		h.log = nil
		h.advance(cfg.Timing.FenceDeadline)
		h.expectStop(StopUnfenced)
		if !h.a.LeaseHeld(h.now) || h.a.FeedWatchdog(h.now) {
			t.Fatalf("reset %v: lease held %v, feed %v: want held, not fed", reset, h.a.LeaseHeld(h.now), h.a.FeedWatchdog(h.now))
		}
		if want := slicesContains(h.log, "reset-host"); want != reset {
			t.Fatalf("reset %v: log %v", reset, h.log)
		}
	}
}

func slicesContains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// TestStopRetriesOnOwnRenewal: a renewal in flight lands before the
// withdrawal (same expected revision): the withdrawal's conflict shows our
// own record; the agent withdraws again on its revision.
func TestStopRetriesOnOwnRenewal(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	h.advance(2 * time.Second) // a renewal goes out, not answered yet
	r := h.renew
	if r == nil {
		t.Fatal("no renewal in flight")
	}
	w := h.stop("orderly-stop")
	h.rev++
	cur := r.Record
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &cur}))
	w2 := h.renew
	if w2 == nil || w2.Record.State != LeaseWithdrawn || w2.Revision != h.rev {
		t.Fatalf("second withdrawal %+v (rev %d)", w2, h.rev)
	}
	h.rev++
	h.take(h.a.Renewed(h.now, w2.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	h.expectStop(StopWithdrawn)
}

// TestStopFindsDeclaration: the withdrawal's CAS fails on a declaration
// (linearization: the controller's CAS landed first): the agent fences and
// never writes over the declaration.
func TestStopFindsDeclaration(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	w := h.stop("orderly-stop")
	h.rev++
	cur := LeaseRecord{Schema: 1, Host: "h0", Epoch: 1, State: LeaseExpired}
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &cur}))
	h.expectState(StateFencing)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateAwaitingRelease)
	h.expectStop(StopFenced)
}

// TestStopWhileFencedStaysFenced: a fenced host stops without a withdrawal
// (its domains are paused; being declared is what should happen to it).
func TestStopWhileFencedStaysFenced(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateFenced)
	if w := h.stop("orderly-stop"); w != nil {
		t.Fatalf("withdrawal from a fenced host: %+v", w)
	}
	h.expectStop(StopFenced)
}

// withdrawnRestart: a healthy agent withdraws on stop; a new process
// starts a minute later, reading the withdrawn record (reachable) or
// only its durable state (NATS unreachable).
func withdrawnRestart(t *testing.T, reachable bool) (*harness, *Agent) {
	t.Helper()
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	w := h.stop("orderly-stop")
	h.rev++
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	d := h.dur
	h.now = h.now.Add(time.Minute)
	var cur *LeaseRecord
	if reachable {
		cur = &w.Record
	}
	a, r, err := NewAgent(testConfig(), &d, cur, h.rev, h.now)
	if err != nil {
		t.Fatal(err)
	}
	h.a, h.log, h.renew = a, nil, nil
	h.take(r)
	return h, a
}

// TestStartFromWithdrawn: the next start finds its withdrawn record (an
// upgrade that took a minute): the lease age starts afresh (no fence), the
// first renewal is a CAS on the withdrawn record's revision, and the
// durable state no longer says withdrawn before that renewal goes out.
// With NATS unreachable at start, the durable state alone says so.
func TestStartFromWithdrawn(t *testing.T) {
	for _, reachable := range []bool{true, false} {
		h, a := withdrawnRestart(t, reachable)
		if h.dur.Withdrawn {
			t.Fatal("durable state still withdrawn after the start")
		}
		a.SetMembers(members(50), DefaultGuard(50))
		h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
		h.take(a.Tick(h.now))
		if !a.FeedWatchdog(h.now) {
			t.Fatalf("reachable %v: watchdog not to be fed at start", reachable)
		}
		if h.renew == nil || h.renew.Revision != h.rev || h.renew.Record.State != LeaseActive {
			t.Fatalf("reachable %v: first renewal %+v, want active on revision %d", reachable, h.renew, h.rev)
		}
		h.ack()
		h.healthyFor(30 * time.Second)
		h.expectState(StateHealthy)
		h.expectLog("starting>starting:StartedFromWithdrawnLease", "starting>healthy:Renewed")
	}
}

// TestStartLapsedDoesNotFeed: a restart (same boot) whose durable lease
// lapsed while the agent was down (a crash, a crash loop) must not feed
// the watchdog at start: arming feeds the device, so the caller arms it
// only once FeedWatchdog says so (a renewal lands, or the fence completes).
func TestStartLapsedDoesNotFeed(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	d := h.dur
	now := h.now.Add(20 * time.Second)
	a, _, err := NewAgent(testConfig(), &d, nil, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	if a.FeedWatchdog(now) {
		t.Fatal("a restart with a lapsed lease may feed the watchdog")
	}
	// A fresh boot, or a first start, may.
	if a, _, _ := NewAgent(testConfig(), nil, nil, 0, now); !a.FeedWatchdog(now) {
		t.Fatal("first start may not feed")
	}
}

// TestBackstopSlowestPath: item 2: with the watchdog armed the record says
// watchdog even when a reset is allowed (a dead agent is reset by the
// watchdog only); reset only without a watchdog.
func TestBackstopSlowestPath(t *testing.T) {
	c := testConfig()
	for _, tc := range []struct {
		wd, reset bool
		action    Action
		want      Backstop
	}{
		{true, false, ActionPause, BackstopWatchdog},
		{true, true, ActionPause, BackstopWatchdog},
		{true, false, ActionResetHost, BackstopWatchdog},
		{false, true, ActionPause, BackstopReset},
		{false, false, ActionResetHost, BackstopReset},
		{false, false, ActionPause, BackstopNone},
	} {
		c.HardwareWatchdog, c.AllowReset, c.Action = tc.wd, tc.reset, tc.action
		if got := c.Backstop(); got != tc.want {
			t.Errorf("watchdog %v reset %v action %s: %s, want %s", tc.wd, tc.reset, tc.action, got, tc.want)
		}
	}
}

// TestRestartFencedFeedsOnlyAfterListing: a restart carries "fenced" over
// from the durable state; a crash mid-fence (or a domain started since)
// may leave domains running, so the watchdog is fed only once this
// process listed the domains (fencing whatever runs). Found by the
// simulation (TestSimCrashLoopWatchdog): a crash loop with libvirt not
// answering kept a host "fenced" and fed while its domains ran.
func TestRestartFencedFeedsOnlyAfterListing(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second) // fencing: the pause is issued, never done
	h.expectState(StateFencing)
	d := h.dur
	h.now = h.now.Add(3 * time.Second)
	a, _, err := NewAgent(testConfig(), &d, nil, 0, h.now)
	if err != nil {
		t.Fatal(err)
	}
	if a.State() != StateFenced || a.FeedWatchdog(h.now) {
		t.Fatalf("restarted %s, feed %v: want fenced, not fed before a listing", a.State(), a.FeedWatchdog(h.now))
	}
	h.a = a
	if w := h.stop("orderly-stop"); w != nil || a.StopOutcome() != StopUnfenced {
		t.Fatalf("stop before a listing: %+v %s", w, a.StopOutcome())
	}
	a, _, _ = NewAgent(testConfig(), &d, nil, 0, h.now)
	h.a = a
	h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
	h.expectState(StateFencing) // the running domain is fenced again
	h.take(a.FenceDone(h.now, "d1", nil))
	if a.State() != StateFenced || !a.FeedWatchdog(h.now) {
		t.Fatalf("%s, feed %v", a.State(), a.FeedWatchdog(h.now))
	}
}

// TestStartFromWithdrawnConfirmsNothing: an agent started from its
// withdrawn record that cannot renew (NATS cut) is not counted by the
// controller (withdrawn), so it must not confirm "cannot renew" to its
// peers, Held or not, until a renewal of its lands (found by the
// simulation: TestSimWithdrawnRestartDoesNotConfirm).
func TestStartFromWithdrawnConfirmsNothing(t *testing.T) {
	h, a := withdrawnRestart(t, false)
	a.SetMembers(members(50), DefaultGuard(50))
	h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
	h.advance(5 * time.Second) // renewals unanswered: asking peers
	if k := a.PeerStatus(h.now).Answer(); k != PeerLeaseLapsed {
		t.Fatalf("withdrawn restart answers %d while it cannot renew, want lease-lapsed", k)
	}
	h.answer(repeat(PeerCannotRenew, 20)...) // held by its peers
	h.expectState(StateHeld)
	if k := a.PeerStatus(h.now).Answer(); k != PeerLeaseLapsed {
		t.Fatalf("withdrawn restart, held, answers %d, want lease-lapsed", k)
	}
	h.advance(time.Second)
	h.ack() // a renewal lands: the record is active again
	if k := a.PeerStatus(h.now).Answer(); k == PeerLeaseLapsed {
		t.Fatal("still lease-lapsed after a renewal landed")
	}
}

// TestStopWhileRejoiningWithRunningDomain (reviewer R2): fenced, then the
// renewals land again: rejoining, waiting for the reconciliation (Nova
// slow). The host holds its lease, so a domain may start meanwhile (Nova
// schedules an instance, an operator starts one): Domains does not fence
// it while rejoining. A stop now must not end "fenced": StopFenced makes
// the caller magic-close the watchdog and leave, the active record lapses
// and the controller declares the host while that domain runs.
func TestStopWhileRejoiningWithRunningDomain(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateFenced)
	h.advance(2 * time.Second)
	h.ack()
	h.expectState(StateRejoining)
	h.take(h.a.Domains(h.now, []Domain{{UUID: "d1"}, {UUID: "d2", Running: true}}))
	h.log = nil
	w := h.stop("orderly-stop")
	for range 100 {
		if h.a.StopOutcome() != StopPending {
			break
		}
		switch {
		case w != nil:
			h.rev++
			h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
			w = nil
		case slicesContains(h.log, "pause d2"):
			h.take(h.a.FenceDone(h.now, "d2", nil))
		default:
			h.advance(100 * time.Millisecond)
		}
	}
	switch o := h.a.StopOutcome(); {
	case o == StopWithdrawn:
	case o == StopFenced && slicesContains(h.log, "pause d2"):
	default:
		t.Fatalf("stop outcome %s with d2 running and never fenced; log:\n%v", o, h.log)
	}
}

// TestRestartBehindWithdrawnKeyConfirmsNothing (reviewer R2): the gap
// left by TestStartFromWithdrawnConfirmsNothing's fix. A process starts
// from its withdrawn record (NATS reachable at the read), its renewals do
// not land (its rack is cut off right after), it crashes and starts again
// with NATS unreachable: its durable state no longer says withdrawn (the
// first process rewrote it at start, on purpose: its lease age must
// carry over), so the second process confirms its peers' holds — while
// the key still says withdrawn and the controller does not count the
// host.
func TestRestartBehindWithdrawnKeyConfirmsNothing(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	w := h.stop("orderly-stop")
	h.rev++
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	start := func(cur *LeaseRecord) {
		d := h.dur
		a, r, err := NewAgent(testConfig(), &d, cur, h.rev, h.now)
		if err != nil {
			t.Fatal(err)
		}
		h.a, h.renew, h.round = a, nil, nil
		h.take(r)
		a.SetMembers(members(50), DefaultGuard(50))
		h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
	}
	h.now = h.now.Add(time.Minute)
	start(&w.Record) // the key says withdrawn
	h.advance(3 * time.Second)
	start(nil) // crashed; NATS unreachable at the next start
	h.advance(5 * time.Second)
	if k := h.a.PeerStatus(h.now).Answer(); k != PeerLeaseLapsed {
		t.Fatalf("%s behind a withdrawn key: answers %d, want lease-lapsed", h.a.State(), k)
	}
	h.answer(repeat(PeerCannotRenew, 20)...)
	if k := h.a.PeerStatus(h.now).Answer(); k != PeerLeaseLapsed {
		t.Fatalf("%s behind a withdrawn key: answers %d, want lease-lapsed", h.a.State(), k)
	}
	h.advance(time.Second)
	h.ack() // a renewal lands: the key is active, the controller counts the host
	h.advance(5 * time.Second)
	if k := h.a.PeerStatus(h.now).Answer(); k == PeerLeaseLapsed {
		t.Fatal("still lease-lapsed after a renewal landed")
	}
}

// TestStopWhileFencingWithdraws: a stop while a fence is in progress (here
// it cannot complete: libvirt does not answer) also withdraws: once that
// lands the host cannot be declared whatever the fence does. The paused
// set survives as "fenced" in the durable state, so the next start
// resumes it only through the rejoin.
func TestStopWhileFencingWithdraws(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1", "d2")
	h.advance(10 * time.Second) // fencing; the pauses are never answered
	h.expectState(StateFencing)
	h.take(h.a.FenceDone(h.now, "d1", nil)) // one of them done
	w := h.stop("start-failed: fencing: watchdog")
	if w == nil {
		t.Fatal("no withdrawal from a fencing host")
	}
	h.rev++
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	h.expectStop(StopWithdrawn)
	if !h.dur.Fenced || !h.dur.Withdrawn || len(h.dur.Paused) != 2 {
		t.Fatalf("durable %+v: want fenced, withdrawn, the paused set", h.dur)
	}
}
