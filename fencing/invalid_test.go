package fencing

import (
	"testing"
	"time"
)

// conflictWith answers the outstanding renewal with a CAS conflict showing
// res (its Revision set to a new revision of the key) and returns that
// revision.
func (h *harness) conflictWith(res RenewResult) uint64 {
	h.t.Helper()
	if h.renew == nil {
		h.advance(2 * time.Second)
	}
	r := h.renew
	h.renew = nil
	h.rev += 3 // other keys' writes in between
	res.Outcome, res.Revision = RenewConflict, h.rev
	h.take(h.a.Renewed(h.now, r.Seq, res))
	return h.rev
}

// TestScenarioInvalidRecordHealthyRewrites (issue 11): a healthy agent
// whose key holds a record it does not trust (a forgery: unsigned, signed
// by another host, bad signature) says so loudly and writes its next
// renewal by CAS on that record's revision, like over a delete marker: no
// fence. Before, an undecodable record made every renewal fail
// (RenewFailed, the revision never learned) and the host fenced.
func TestScenarioInvalidRecordHealthyRewrites(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	h.log = nil
	bad := h.conflictWith(RenewResult{Invalid: "expired record of h0 signed by \"Kh1\", neither a key of h0 nor a controller key"})
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Revision != bad || h.renew.Record.State != LeaseActive {
		t.Fatalf("want an active renewal by CAS on the invalid record's revision %d, got %+v", bad, h.renew)
	}
	h.ack()
	h.expectLog("healthy>suspect:RenewFailed", "suspect>suspect:LeaseKeyDeletedRecreated", "ALERT InvalidLeaseRecord", "suspect>healthy:Renewed")
	h.healthyFor(30 * time.Second)
	h.expectState(StateHealthy)
}

// TestScenarioInvalidRecordWhileFencedSelfDeclares: a fenced agent past its
// lease finds an untrusted record in its key: it may have been written
// over a real declaration (hiding it), so, as after a key delete, the
// agent declares itself (expired, next epoch) by CAS on that record, stays
// awaiting release and resumes nothing on its own.
func TestScenarioInvalidRecordWhileFencedSelfDeclares(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.advance(20 * time.Second)
	h.log = nil
	bad := h.conflictWith(RenewResult{Invalid: "undecodable"})
	h.expectState(StateAwaitingRelease)
	h.advance(100 * time.Millisecond)
	if d := h.renew; d == nil || d.Revision != bad || d.Record.State != LeaseExpired || d.Record.Epoch != 1 {
		t.Fatalf("want a self-declaration (expired, epoch 1) by CAS on revision %d, got %+v", bad, d)
	}
	if !h.dur.Declared || !h.dur.Fenced {
		t.Fatalf("durable %+v", h.dur)
	}
}

// TestScenarioReplayedDeclarationIgnored (issue 11): every agent can read
// every key, so a compromised node can write a copy of an old, genuine,
// controller-signed declaration of h0 (epoch 1, from before h0 was
// released and took its lease back) into h0's key. The copy names the
// revision it was first written on (PrevRev), older than revisions h0
// knows were in its key since: h0 ignores it (alert), renews over it and
// fences nothing. Without the check (StaleRecord) h0 took it for a
// declaration while holding its lease and fenced.
func TestScenarioReplayedDeclarationIgnored(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(5 * time.Second)
	h.log = nil
	old := LeaseRecord{Schema: 1, Host: "h0", Epoch: 0, State: LeaseExpired, PrevRev: 1, Signer: "Kctl", Sig: "genuine"}
	bad := h.conflictWith(RenewResult{Current: &old})
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Revision != bad {
		t.Fatalf("want a renewal over the replay (revision %d), got %+v", bad, h.renew)
	}
	h.ack()
	h.expectLog("healthy>suspect:RenewFailed", "suspect>suspect:LeaseKeyDeletedRecreated", "ALERT InvalidLeaseRecord", "suspect>healthy:Renewed")
	h.healthyFor(20 * time.Second)
	h.expectState(StateHealthy)

	// A genuine declaration (written on a revision at or after the last
	// one h0 knows) is still a declaration.
	h.advance(20 * time.Second) // cut off: fenced, lease lapsed
	h.take(h.a.FenceDone(h.now, "d1", nil))
	decl := LeaseRecord{Schema: 1, Host: "h0", Epoch: 1, State: LeaseExpired, PrevRev: h.rev, Signer: "Kctl", Sig: "genuine"}
	h.conflictWith(RenewResult{Current: &decl})
	h.expectState(StateAwaitingRelease)
}

// TestScenarioForeignRecordRewritten: a record of another host written into
// h0's key (by a node with write access to the bucket) left h0 unable to
// renew (it never learned the revision) until it fenced; it is now an
// untrusted record like any other.
func TestScenarioForeignRecordRewritten(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(3 * time.Second)
	other := LeaseRecord{Schema: 1, Host: "h1", State: LeaseActive}
	bad := h.conflictWith(RenewResult{Current: &other})
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Revision != bad {
		t.Fatalf("want a renewal over the foreign record (revision %d), got %+v", bad, h.renew)
	}
	h.ack()
	h.healthyFor(30 * time.Second)
	h.expectState(StateHealthy)
}

// TestUntrustedRecordMutation: with the checks switched off
// (Mutations.UntrustedRecordsTrusted, the behaviour before issue 11) each
// scenario above fails: the host fences (or never renews again).
func TestUntrustedRecordMutation(t *testing.T) {
	Mutations.UntrustedRecordsTrusted = true
	defer func() { Mutations.UntrustedRecordsTrusted = false }()
	for name, f := range map[string]func(*testing.T){
		"invalid":  TestScenarioInvalidRecordHealthyRewrites,
		"replayed": TestScenarioReplayedDeclarationIgnored,
		"foreign":  TestScenarioForeignRecordRewritten,
	} {
		ft := &testing.T{}
		done := make(chan struct{})
		go func() { defer close(done); f(ft) }()
		<-done
		if !ft.Failed() {
			t.Errorf("%s: passes without the fix", name)
		}
	}
}

// TestLyingPeersHold (issue 11): with LyingPeers 1 a hold needs one more
// confirmation than the guard threshold requires (one of them may be a
// compromised node answering "cannot renew" while it renews, which the
// controller does not count silent): 10 confirmations (11 > threshold 10)
// hold with LyingPeers 0 and not with 1; 11 hold with 1.
func TestLyingPeersHold(t *testing.T) {
	for _, c := range []struct {
		lying, confirmations int
		held                 bool
	}{{0, 10, true}, {1, 10, false}, {1, 11, true}} {
		cfg := testConfig()
		cfg.LyingPeers = c.lying
		h := newHarness(t, cfg, 50, "d1")
		h.advance(4 * time.Second)
		h.answer(repeat(PeerCannotRenew, c.confirmations)...)
		if got := h.a.State() == StateHeld; got != c.held {
			t.Errorf("lying peers %d, %d confirmations: held %t, want %t", c.lying, c.confirmations, got, c.held)
		}
	}
}

// TestIncarnationNeverGoesBack: a start whose durable state was lost (both
// copies) begins at incarnation 1; when the key holds a signed record of a
// later process of this boot (incarnation 5), the new process takes a
// newer incarnation — at start if it reads the key, or at the first
// conflict that shows it — so that none of its records can be taken for
// that process's (whose renewals it would count as its own landings).
func TestIncarnationNeverGoesBack(t *testing.T) {
	cfg := testConfig()
	old := LeaseRecord{Schema: 1, Host: "h0", BootID: cfg.BootID, State: LeaseActive, Incarnation: 5, Seq: 40, PrevRev: 8, Signer: "Kh0", Sig: "s"}
	a, _, err := NewAgent(cfg, nil, &old, 9, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.record(1).Incarnation; got != 6 {
		t.Fatalf("started over incarnation 5: incarnation %d, want 6", got)
	}
	// NATS unreachable at start: learned at the first conflict.
	h := newHarness(t, cfg, 50, "d1")
	h.conflictWith(RenewResult{Current: &old})
	h.advance(100 * time.Millisecond)
	if h.renew == nil || h.renew.Record.Incarnation != 6 {
		t.Fatalf("after a conflict with incarnation 5: %+v", h.renew)
	}
}

// relayRound: an agent (LyingPeers lying) 4 s without a landed renewal,
// asking at least two peers; h.rev moved on by 5 (the relay's revision).
func relayRound(t *testing.T, lying int) (*harness, *PeerRound) {
	t.Helper()
	cfg := testConfig()
	cfg.LyingPeers = lying
	h := newHarness(t, cfg, 50, "d1")
	h.advance(4 * time.Second)
	rd := h.round
	if rd == nil || len(rd.Peers) < 2 {
		t.Fatalf("no round: %+v", rd)
	}
	h.rev += 5
	return h, rd
}

// TestLyingPeersRelay (issue 11): a cut-off agent counts a relay as a
// landed renewal. One compromised peer can claim a relay that never
// happened; the agent would then hold a lease the controller never saw.
// With LyingPeers 1 a landing counts only when two peers report it — the
// one that relayed, and one whose relay of the same question conflicted
// with it (showing our record at that revision). With LyingPeers 0 a
// single claim counts (the behaviour before).
func TestLyingPeersRelay(t *testing.T) {
	for _, lying := range []int{0, 1} {
		h, rd := relayRound(t, lying)
		h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], PeerAnswer{Kind: PeerRelayed, Revision: h.rev}))
		if got := h.a.State() == StateHealthy; got != (lying == 0) {
			t.Fatalf("lying peers %d: one relay claim: healthy %t", lying, got)
		}
		if lying == 0 {
			continue
		}
		own := rd.Renewal.Record
		h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[1], PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev, Current: &own}))
		h.expectState(StateHealthy)
	}
}

// TestRelayedLandingAsksBeacon: a renewal relayed by a peer, taken as
// landed, asks the shell for its beacon (Ready.Relayed: a relay writes
// none, and the controller takes beacons as the host's signs of life —
// controller/beaconloss.go, companionsChecked) once a second peer
// corroborates it (lying_peers 1). With lying_peers 0 — one claim is a
// landing — none: a liar's made-up revision in a beacon made the
// controller ignore the host's later withdrawal beacon (reviewer X34).
// Mutations.RelayedNoBeacon: none.
func TestRelayedLandingAsksBeacon(t *testing.T) {
	for _, c := range []struct {
		name     string
		lying    int
		mutation bool
	}{{"lying-0", 0, false}, {"lying-1", 1, false}, {"lying-1/RelayedNoBeacon", 1, true}} {
		t.Run(c.name, func(t *testing.T) {
			Mutations.RelayedNoBeacon = c.mutation
			defer func() { Mutations.RelayedNoBeacon = false }()
			h, rd := relayRound(t, c.lying)
			r := h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], PeerAnswer{Kind: PeerRelayed, Revision: h.rev})
			h.take(r)
			if c.lying == 1 {
				if r.Relayed != nil {
					t.Fatalf("an uncorroborated relay claim asked for a beacon: %+v", r.Relayed)
				}
				own := rd.Renewal.Record
				r = h.a.PeerAnswered(h.now, rd.ID, rd.Peers[1], PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev, Current: &own})
				h.take(r)
			}
			switch {
			case (c.mutation || c.lying == 0) && r.Relayed != nil:
				t.Fatalf("a beacon asked for (lying_peers %d, RelayedNoBeacon %t): %+v", c.lying, c.mutation, r.Relayed)
			case c.mutation || c.lying == 0:
			case r.Relayed == nil:
				t.Fatal("a relayed landing asked for no beacon")
			case r.Relayed.Revision != h.rev || r.Relayed.Seq != rd.Renewal.Seq || r.Relayed.Record.Host != h.a.cfg.Host || r.Relayed.Record.State != LeaseActive:
				t.Fatalf("beacon asked for %+v, want revision %d seq %d of %s, active", r.Relayed, h.rev, rd.Renewal.Seq, h.a.cfg.Host)
			}
		})
	}
}
