package fencing

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness drives an Agent through a script and records what it asked for.
type harness struct {
	t     *testing.T
	a     *Agent
	now   time.Time
	log   []string // transitions and operations, in order
	renew *RenewRequest
	round *PeerRound
	recID uint64
	rev   uint64
	dur   Durable
}

func testConfig() Config {
	c := DefaultConfig("h0", "boot-1")
	c.Enabled = true
	c.HardwareWatchdog = true
	return c
}

func members(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d", i)
	}
	return out
}

func newHarness(t *testing.T, cfg Config, nMembers int, running ...string) *harness {
	t.Helper()
	a, r, err := NewAgent(cfg, nil, nil, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, a: a, now: t0}
	h.take(r)
	a.SetMembers(members(nMembers), DefaultGuard(nMembers))
	var ds []Domain
	for _, u := range running {
		ds = append(ds, Domain{UUID: u, Running: true})
	}
	h.take(a.Domains(t0, ds))
	h.ack() // first renewal acknowledged at t0
	h.log = nil
	return h
}

func (h *harness) take(r Ready) {
	if r.Persist != nil {
		h.dur = *r.Persist
	}
	for _, tr := range r.Transitions {
		h.log = append(h.log, fmt.Sprintf("%s>%s:%s", tr.From, tr.To, tr.Reason))
	}
	if len(r.Pause) > 0 {
		h.log = append(h.log, "pause "+strings.Join(r.Pause, ","))
	}
	if len(r.Destroy) > 0 {
		h.log = append(h.log, "destroy "+strings.Join(r.Destroy, ","))
	}
	if len(r.Resume) > 0 {
		h.log = append(h.log, "resume "+strings.Join(r.Resume, ","))
	}
	if len(r.WouldFence) > 0 {
		h.log = append(h.log, "would-fence "+strings.Join(r.WouldFence, ","))
	}
	if len(r.LeftPaused) > 0 {
		h.log = append(h.log, "left-paused "+strings.Join(r.LeftPaused, ","))
	}
	if r.ResetHost {
		h.log = append(h.log, "reset-host")
	}
	if r.Reconcile {
		h.recID = r.ReconcileID
		h.log = append(h.log, "reconcile")
	}
	for _, al := range r.Alerts {
		h.log = append(h.log, "ALERT "+string(al.Reason))
	}
	if r.Renew != nil {
		h.renew = r.Renew
	}
	if r.AskPeers != nil && (h.round == nil || h.round.ID != r.AskPeers.ID) { // not a retry
		h.round = r.AskPeers
		h.log = append(h.log, fmt.Sprintf("ask %d peers", len(r.AskPeers.Peers)))
	}
}

// advance moves time forward in 100 ms ticks, answering nothing.
func (h *harness) advance(d time.Duration) {
	end := h.now.Add(d)
	for h.now.Before(end) {
		h.now = h.now.Add(100 * time.Millisecond)
		h.take(h.a.Tick(h.now))
	}
}

// ack acknowledges the outstanding renewal.
func (h *harness) ack() {
	h.t.Helper()
	if h.renew == nil {
		h.t.Fatalf("ack: no renewal outstanding")
	}
	h.rev++
	r := h.renew
	h.renew = nil
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
}

// healthyFor keeps renewing successfully for d.
func (h *harness) healthyFor(d time.Duration) {
	end := h.now.Add(d)
	for h.now.Before(end) {
		h.now = h.now.Add(100 * time.Millisecond)
		h.take(h.a.Tick(h.now))
		if h.renew != nil {
			h.ack()
		}
	}
}

// answerBy answers the current round with f(peer); PeerUnreachable means
// no answer.
func (h *harness) answerBy(f func(peer string) PeerAnswerKind) {
	h.t.Helper()
	if h.round == nil {
		h.t.Fatalf("answer: no round")
	}
	rd := h.round
	for _, p := range rd.Peers {
		if k := f(p); k != PeerUnreachable {
			h.take(h.a.PeerAnswered(h.now, rd.ID, p, PeerAnswer{Kind: k}))
		}
	}
}

// answer answers the current round: kinds per peer in order, the rest
// unreachable (by not answering).
func (h *harness) answer(kinds ...PeerAnswerKind) {
	h.t.Helper()
	if h.round == nil {
		h.t.Fatalf("answer: no round")
	}
	rd := h.round
	for i, k := range kinds {
		if i >= len(rd.Peers) {
			break
		}
		ans := PeerAnswer{Kind: k}
		if k == PeerRelayed {
			h.rev++
			ans.Revision = h.rev
		}
		h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[i], ans))
	}
}

func (h *harness) declare(epoch uint64) {
	h.rev++
	if h.renew == nil {
		h.advance(2 * time.Second)
	}
	r := h.renew
	h.renew = nil
	cur := LeaseRecord{Schema: 1, Host: "h0", Epoch: epoch, State: LeaseExpired}
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &cur}))
}

func (h *harness) expectState(s State) {
	h.t.Helper()
	if h.a.State() != s {
		h.t.Fatalf("state %s, want %s; log:\n%s", h.a.State(), s, strings.Join(h.log, "\n"))
	}
}

func (h *harness) expectLog(want ...string) {
	h.t.Helper()
	if !slices.Equal(h.log, want) {
		h.t.Fatalf("log:\n%s\nwant:\n%s", strings.Join(h.log, "\n"), strings.Join(want, "\n"))
	}
	h.log = nil
}

func repeat(k PeerAnswerKind, n int) []PeerAnswerKind {
	out := make([]PeerAnswerKind, n)
	for i := range out {
		out[i] = k
	}
	return out
}

func TestScenarioHealthyRenewals(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Minute)
	h.expectState(StateHealthy)
	if !h.a.FeedWatchdog(h.now) {
		t.Fatal("healthy agent may not feed the watchdog")
	}
	h.expectLog()
}

func TestScenarioOneLostRenewalIsOnlySuspect(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(3900 * time.Millisecond) // renewal at 2 s not acked, times out at 4 s
	h.expectState(StateHealthy)
	h.advance(100 * time.Millisecond)
	// At 4 s: timed out AND SuspectAfter reached: straight to asking peers.
	h.expectLog(
		"healthy>suspect:RenewTimedOutOutcomeUnknown",
		"suspect>asking-peers:NoAcknowledgedRenewalForSuspectAfter",
		"ask 16 peers")
	h.ack() // the renewal sent at 4 s is acknowledged
	h.expectState(StateHealthy)
	if got := h.a.LeaseExpiry(); !got.Equal(t0.Add(4*time.Second + DefaultLeaseTTL)) {
		t.Fatalf("lease expiry %s: must count from the send time (4 s)", got.Sub(t0))
	}
}

func TestScenarioRelayByPeer(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(4 * time.Second)
	h.expectState(StateAskingPeers)
	h.answer(PeerUnreachable, PeerCannotRenew, PeerRelayed)
	h.expectState(StateHealthy)
	if h.a.Reason() != ReasonRelayedByPeer {
		t.Fatalf("reason %s", h.a.Reason())
	}
}

// TestScenarioRackCut: a rack of 8 cut off together (threshold 10 of 50):
// the rack members answer "cannot renew", nobody else answers: fence, and
// the fence completes before the lease lapses.
func TestScenarioRackCut(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1", "d2")
	rack := func(p string) PeerAnswerKind {
		if p >= "h1" && p <= "h7" && len(p) == 2 {
			return PeerCannotRenew
		}
		return PeerUnreachable
	}
	h.advance(4 * time.Second)
	h.log = nil
	h.answerBy(rack)
	h.advance(3 * time.Second) // round ends at 7 s; another round fits (7+3 <= 10)
	h.expectState(StateAskingPeers)
	h.answerBy(rack)
	h.advance(3 * time.Second)
	h.expectState(StateFencing)
	h.log = slices.DeleteFunc(h.log, func(l string) bool { return strings.HasPrefix(l, "ask ") })
	h.expectLog(
		"asking-peers>fencing:IsolatedBecauseTooFewPeersCantRenew",
		"pause d1,d2")
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.take(h.a.FenceDone(h.now, "d2", nil))
	h.expectState(StateFenced)
	if !h.now.Before(h.a.LeaseExpiry()) {
		t.Fatalf("fenced at %s, lease lapsed at %s", h.now.Sub(t0), h.a.LeaseExpiry().Sub(t0))
	}
	if got := h.dur.Paused; !slices.Equal(got, []string{"d1", "d2"}) {
		t.Fatalf("durable paused set %v", got)
	}
}

// TestScenarioMassOutageHolds: 11 hosts (self + 10 peers) of 50 cannot
// renew, which is more than the guard threshold (10): hold, no fence; keep
// re-confirming; the watchdog is fed.
func TestScenarioMassOutageHolds(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(4 * time.Second)
	h.log = nil
	h.answer(repeat(PeerCannotRenew, 10)...)
	h.expectState(StateHeld)
	h.expectLog("asking-peers>held:HeldBecauseMostPeersCantRenew")
	for range 20 {
		h.advance(5 * time.Second)
		h.answer(repeat(PeerCannotRenew, 10)...)
		h.expectState(StateHeld)
		if !h.a.FeedWatchdog(h.now) {
			t.Fatal("held agent must feed the watchdog")
		}
	}
	// NATS comes back: our renewal is acknowledged.
	h.advance(time.Second)
	h.ack()
	h.expectState(StateHealthy)
	if len(h.a.Paused()) != 0 {
		t.Fatal("a held agent paused domains")
	}
}

// TestScenarioHoldEndsForOthers: held, then the others recover (they now
// relay-fail, i.e. can renew but our key is unreachable for them) — fence.
func TestScenarioHoldEndsForOthers(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(4 * time.Second)
	h.answer(repeat(PeerCannotRenew, 10)...)
	h.expectState(StateHeld)
	h.advance(5 * time.Second)
	h.log = nil
	h.answer(repeat(PeerRelayFailed, 16)...)
	h.expectState(StateHeld) // until HeldRecheck+PeerTimeout after the last confirmation
	h.advance(3 * time.Second)
	h.expectState(StateHeld)
	h.advance(5 * time.Second)
	h.expectState(StateFencing)
	h.log = slices.DeleteFunc(h.log, func(l string) bool { return strings.HasPrefix(l, "ask ") })
	h.expectLog("held>fencing:IsolatedBecauseHoldNoLongerConfirmed", "pause d1")
}

func TestScenarioNoPeerAnswersFencesAtDeadline(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.expectState(StateFencing)
	if h.a.Reason() != ReasonIsolatedBecauseNoPeerAnswered {
		t.Fatalf("reason %s", h.a.Reason())
	}
	// Fence not done by the lease expiry (15 s): no reset allowed, watchdog
	// backstop: alert, and the watchdog is no longer fed.
	h.advance(4900 * time.Millisecond)
	if !h.a.FeedWatchdog(h.now) {
		t.Fatal("lease still held at 14.9 s")
	}
	h.log = nil
	h.advance(100 * time.Millisecond)
	h.expectLog("fencing>fencing:FenceDeadlineMissedNoResetAllowed", "ALERT FenceDeadlineMissedNoResetAllowed")
	if h.a.FeedWatchdog(h.now) {
		t.Fatal("watchdog fed with an incomplete fence and a lapsed lease")
	}
}

func TestScenarioEscalateToReset(t *testing.T) {
	cfg := testConfig()
	cfg.AllowReset = true
	h := newHarness(t, cfg, 50, "d1")
	h.advance(15 * time.Second)
	if !slices.Contains(h.log, "reset-host") {
		t.Fatalf("no reset: %v", h.log)
	}
}

// TestScenarioRejoinNotDeclared: fenced, renewals succeed again: reconcile,
// then resume only what hvguard paused.
func TestScenarioRejoinNotDeclared(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1", "d2")
	h.take(h.a.Domains(h.now, []Domain{{UUID: "d1", Running: true}, {UUID: "d2", Running: true}, {UUID: "d3"}}))
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.take(h.a.FenceDone(h.now, "d2", nil))
	h.expectState(StateFenced)
	h.advance(20 * time.Second)
	h.log = nil
	h.ack()
	h.expectLog("fenced>rejoining:RenewedAfterFenceNotDeclared", "reconcile")
	h.take(h.a.Reconciled(h.now, h.recID, []string{"d2"}))
	h.expectLog("rejoining>healthy:ResumedAfterReconcile", "resume d1")
	if len(h.dur.Paused) != 0 {
		t.Fatalf("paused set not cleared: %v", h.dur.Paused)
	}
}

// TestScenarioDeclaredStaysFenced: fenced, then the controller's
// declaration is seen: stay fenced until released; after the release
// nothing is resumed.
func TestScenarioDeclaredStaysFenced(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.advance(20 * time.Second)
	h.log = nil
	h.declare(1)
	h.expectLog("fenced>awaiting-release:DeclaredExpiredByController")
	declRev := h.rev
	h.advance(time.Minute)
	if h.renew == nil || h.renew.Revision == declRev {
		t.Fatalf("a renewal must never CAS on the declaration's revision (%d): %+v", declRev, h.renew)
	}
	h.expectState(StateAwaitingRelease)
	if !h.a.FeedWatchdog(h.now) {
		t.Fatal("a fenced host must keep feeding the watchdog")
	}
	if st := h.a.PeerStatus(h.now); st.Answer() != PeerDeclared {
		t.Fatalf("peer answer %v", st)
	}
	// Release: the next renewal conflicts with a released record of epoch 1.
	h.rev++
	rel := LeaseRecord{Schema: 1, Host: "h0", Epoch: 1, State: LeaseReleased}
	r := h.renew
	h.renew = nil
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &rel}))
	h.advance(2 * time.Second)
	h.log = nil
	if h.renew.Revision != h.rev || h.renew.Record.Epoch != 1 {
		t.Fatalf("renewal after release: rev %d epoch %d", h.renew.Revision, h.renew.Record.Epoch)
	}
	h.ack()
	h.expectLog("awaiting-release>rejoining:ReleasedAfterDeclaration", "reconcile")
	h.take(h.a.Reconciled(h.now, h.recID, nil))
	h.expectLog("rejoining>healthy:ReleasedAndReconciled", "left-paused d1")
}

func TestScenarioDeclaredWhileHoldingLeaseFencesAtOnce(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	h.log = nil
	h.declare(1)
	h.expectLog("healthy>fencing:DeclaredExpiredWhileHoldingLease", "pause d1", "ALERT DeclaredExpiredWhileHoldingLease")
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateAwaitingRelease)
}

// TestScenarioLateWriteAdopted: a renewal timed out, but landed; the next
// CAS conflicts with our own record, which is adopted (its send time).
func TestScenarioLateWriteAdopted(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(2 * time.Second)
	late := h.renew
	h.advance(2 * time.Second) // times out; a new renewal is sent at 4 s (same revision)
	if h.renew.Revision != late.Revision {
		t.Fatal("a timed-out renewal must not change the expected revision")
	}
	h.rev++
	cur := late.Record
	r := h.renew
	h.renew = nil
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &cur}))
	h.expectState(StateHealthy)
	if got := h.a.LeaseExpiry().Sub(t0); got != 2*time.Second+DefaultLeaseTTL {
		t.Fatalf("lease from the late write's send time: %s", got)
	}
}

func TestScenarioMonitorOnly(t *testing.T) {
	cfg := testConfig()
	cfg.Action = ActionNone
	cfg.HardwareWatchdog = false
	h := newHarness(t, cfg, 50, "d1")
	h.advance(10 * time.Second)
	h.expectState(StateFenced)
	if !slices.Contains(h.log, "would-fence d1") || slices.Contains(h.log, "pause d1") {
		t.Fatalf("log %v", h.log)
	}
}

// TestScenarioRestartFenced: fence state and the paused set survive a
// restart; a restarted agent stays fenced and, on rejoin, resumes them.
func TestScenarioRestartFenced(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	d := h.dur
	h.now = h.now.Add(30 * time.Second)
	a, r, err := NewAgent(testConfig(), &d, &LeaseRecord{Schema: 1, Host: "h0", State: LeaseActive}, h.rev, h.now)
	if err != nil {
		t.Fatal(err)
	}
	h.a, h.log, h.renew = a, nil, nil
	h.take(r)
	h.take(a.Domains(h.now, []Domain{{UUID: "d1"}}))
	h.take(a.Tick(h.now))
	h.expectState(StateFenced)
	h.ack()
	h.take(h.a.Reconciled(h.now, h.recID, nil))
	h.expectLog("starting>fenced:RestartedFenced", "fenced>rejoining:RenewedAfterFenceNotDeclared", "reconcile",
		"rejoining>healthy:ResumedAfterReconcile", "resume d1")
}

// TestScenarioRestartDuringPartitionFences: the agent restarts 6 s into a
// partition: the lease age comes from the durable state, so it fences by
// the same deadline as without the restart.
func TestScenarioRestartDuringPartitionFences(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(6 * time.Second)
	d := h.dur
	h.now = h.now.Add(time.Second)
	a, r, err := NewAgent(testConfig(), &d, nil, 0, h.now)
	if err != nil {
		t.Fatal(err)
	}
	h.a = a
	h.take(r)
	a.SetMembers(members(50), DefaultGuard(50))
	h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
	h.advance(3 * time.Second)
	h.expectState(StateFencing)
}

func TestConfigValidate(t *testing.T) {
	c := testConfig()
	c.Timing.LeaseTTL = 8 * time.Second
	c.Action = "explode"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "lease_ttl") || !strings.Contains(err.Error(), "explode") {
		t.Fatalf("err %v", err)
	}
	if err := testConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	// renew_interval below MinRenewInterval: each renewal's beacon would
	// pass the controller's per-host verification budget (reviewer X81).
	c = testConfig()
	c.Timing.RenewInterval = 20 * time.Millisecond
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "renew_interval must be at least 100ms") || !strings.Contains(err.Error(), "20ms") {
		t.Fatalf("renew_interval 20ms: err %v, want it named with the minimum", err)
	}
	c.Timing.RenewInterval = MinRenewInterval
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "at least") {
		t.Fatalf("renew_interval %s refused: %v", MinRenewInterval, err)
	}
}
