package fencing

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// conflictAbsent answers the outstanding renewal with a CAS conflict on a
// key that holds no record (deleted or purged).
func (h *harness) conflictAbsent() *RenewRequest {
	h.t.Helper()
	if h.renew == nil {
		h.advance(2 * time.Second)
	}
	r := h.renew
	h.renew = nil
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict}))
	return r
}

// TestScenarioKeyDeletedHealthyRecreates: a healthy agent whose key was
// deleted re-creates it (a create: revision 0) and carries on: no fence.
func TestScenarioKeyDeletedHealthyRecreates(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	h.log = nil
	h.conflictAbsent()
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Revision != 0 || h.renew.Record.State != LeaseActive {
		t.Fatalf("after a delete: want an active record created (revision 0), got %+v", h.renew)
	}
	h.ack()
	h.expectLog("healthy>suspect:RenewFailed", "suspect>suspect:LeaseKeyDeletedRecreated", "suspect>healthy:Renewed")
	h.healthyFor(30 * time.Second)
	h.expectState(StateHealthy)
	if h.dur.Fenced || len(h.dur.Paused) > 0 {
		t.Fatalf("durable %+v", h.dur)
	}
}

// TestScenarioKeyDeletedWhileFencedStaysFenced: a fenced agent (cut off
// past its lease) finds its key deleted when the link heals: the delete
// may have erased a declaration, so it must not rejoin and resume on that
// alone. It re-declares itself (an expired record of the next epoch,
// created over the marker), stays awaiting-release, never overwrites that
// record with a renewal, and after the explicit release resumes nothing.
// Before the fix it re-created an active record, rejoined and resumed d1.
func TestScenarioKeyDeletedWhileFencedStaysFenced(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateFenced)
	h.advance(20 * time.Second) // the controller may have declared meanwhile
	h.log = nil
	h.conflictAbsent()
	h.expectState(StateAwaitingRelease)
	h.advance(100 * time.Millisecond)
	d := h.renew
	if d == nil || d.Revision != 0 || d.Record.State != LeaseExpired || d.Record.Epoch != 1 {
		t.Fatalf("want the key re-created as an expired record of epoch 1, got %+v", d)
	}
	h.rev++
	declRev := h.rev
	h.renew = nil
	h.take(h.a.Renewed(h.now, d.Seq, RenewResult{Outcome: RenewAcked, Revision: declRev}))
	if !h.dur.Declared || !h.dur.Fenced || !slices.Equal(h.dur.Paused, []string{"d1"}) {
		t.Fatalf("durable %+v", h.dur)
	}
	// Renewals go on but never CAS on the self-declaration's revision; each
	// conflicts with it.
	self := d.Record
	for range 5 {
		h.advance(2 * time.Second)
		if h.renew == nil || h.renew.Revision == declRev || h.renew.Record.State != LeaseActive {
			t.Fatalf("renewal %+v must not overwrite the self-declaration (revision %d)", h.renew, declRev)
		}
		r := h.renew
		h.renew = nil
		h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: declRev, Current: &self}))
	}
	h.expectState(StateAwaitingRelease)
	if slices.ContainsFunc(h.log, func(l string) bool { return strings.HasPrefix(l, "resume") }) {
		t.Fatalf("resumed: %v", h.log)
	}
	// The explicit release (--unfence) of that epoch.
	h.rev++
	rel := self
	rel.State = LeaseReleased
	h.advance(2 * time.Second)
	r := h.renew
	h.renew = nil
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &rel}))
	h.advance(2 * time.Second)
	h.log = nil
	h.ack()
	h.expectLog("awaiting-release>rejoining:ReleasedAfterDeclaration", "reconcile")
	h.take(h.a.Reconciled(h.now, h.recID, nil))
	h.expectLog("rejoining>healthy:ReleasedAndReconciled", "left-paused d1")
}

// TestScenarioKeyDeletedLapsedFences: an agent whose lease lapsed while
// Held (a long outage) finds its key deleted: it fences and re-declares
// itself instead of re-creating an active record.
func TestScenarioKeyDeletedLapsedFences(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(4100 * time.Millisecond)
	h.answer(repeat(PeerCannotRenew, 16)...)
	h.expectState(StateHeld)
	for range 10 { // held for 50 s: the lease lapsed long ago
		h.advance(5 * time.Second)
		h.answer(repeat(PeerCannotRenew, 16)...)
	}
	h.expectState(StateHeld)
	h.log = nil
	h.conflictAbsent()
	h.expectState(StateFencing)
	if !slices.Contains(h.log, "pause d1") {
		t.Fatalf("log %v", h.log)
	}
	// Nothing is written while d1 may still run: a record saying
	// "declared" must never precede the fence.
	h.advance(3 * time.Second)
	if h.renew != nil {
		t.Fatalf("a write while fencing: %+v", h.renew)
	}
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateAwaitingRelease)
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Record.State != LeaseExpired || h.renew.Revision != 0 {
		t.Fatalf("want the self-declaration once fenced, got %+v", h.renew)
	}
}

// TestScenarioKeyDeletedSeenThroughRelay: cut off from NATS, a peer's relay
// is rejected because the key holds no record: the next round's renewal is
// a create (revision 0), which the next relay lands.
func TestScenarioKeyDeletedSeenThroughRelay(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(4100 * time.Millisecond)
	rd := h.round
	if rd == nil || rd.Renewal.Revision == 0 {
		t.Fatalf("round %+v", rd)
	}
	h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], PeerAnswer{Kind: PeerRelayFailed, KeyAbsent: true}))
	h.advance(3 * time.Second)
	if h.round == nil || h.round.ID == rd.ID || h.round.Renewal.Revision != 0 || h.round.Renewal.Record.State != LeaseActive {
		t.Fatalf("next round's renewal %+v: want an active record created on revision 0", h.round)
	}
	h.log = nil
	h.answer(PeerRelayed)
	h.expectState(StateHealthy)
}

// TestScenarioKeyDeletedStopWithdrawsByCreate: a healthy agent stops after
// its key was deleted: the withdrawal on its old revision conflicts with
// no record, and the lease is held, so it withdraws by creating the
// record over the marker instead of fencing before leaving.
func TestScenarioKeyDeletedStopWithdrawsByCreate(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	h.log = nil
	w := h.stop("orderly-stop")
	h.take(h.a.Renewed(h.now, w.Seq, RenewResult{Outcome: RenewConflict}))
	w2 := h.renew
	if w2 == nil || w2.Revision != 0 || w2.Record.State != LeaseWithdrawn {
		t.Fatalf("second withdrawal %+v: want a create (revision 0)", w2)
	}
	h.renew = nil
	h.rev++
	h.take(h.a.Renewed(h.now, w2.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
	h.expectState(StateWithdrawn)
	h.expectStop(StopWithdrawn)
	if slices.Contains(h.log, "pause d1") {
		t.Fatalf("fenced: %v", h.log)
	}
}
