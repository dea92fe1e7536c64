package fencing

import (
	"strings"
	"testing"
	"time"
)

// Reviewer X4 (issue 11, invariant (a)): one compromised peer answering a
// relay question "relay failed" and showing a genuine but OLD record of the
// asker (a replay: any node can read, and keep, every record ever written
// to the bucket; its host signature verifies, agent/fence.go checks only
// that) with a revision of its choosing.

// x4OldRecord returns a genuine earlier record of h0's current process
// (signed: Sig set; written by CAS on revision 1).
func x4OldRecord(h *harness) LeaseRecord {
	rec := h.a.record(1)
	rec.PrevRev, rec.Signer, rec.Sig = 1, "Kh0", "s"
	return rec
}

// TestX4LyingReplayFencesHeldHost: a NATS outage; h0 is Held (enough peers
// confirm "cannot renew", lying_peers 1, the default with `required`), its
// lease lapsed, its domain running — as designed. The compromised peer
// answers h0's question with RelayFailed + a replay of h0's own old record
// at a later revision. PeerAnswered guards a peer's "key absent" and
// "invalid record" claims while the lease is lapsed
// (TestLyingPeerCannotFenceHeldHost), but a replayed record falls through
// to conflict(), whose own untrusted() check calls it a replay and hands it
// to invalidRecord → keyDeleted: lease lapsed → h0 fences and declares
// itself (awaiting --unfence). One compromised node turns the outage into
// fencing of every Held host that asks it.
func TestX4LyingReplayFencesHeldHost(t *testing.T) {
	for _, lying := range []bool{false, true} {
		cfg := testConfig()
		cfg.LyingPeers = DefaultLyingPeers(SigningRequired)
		h := newHarness(t, cfg, 50, "d1")
		h.healthyFor(3 * time.Second)
		old := x4OldRecord(h)
		h.advance(4 * time.Second) // outage: no ack
		h.answer(repeat(PeerCannotRenew, 12)...)
		h.expectState(StateHeld)
		// Held past the lease's end; every round of the Held agent
		// (HeldRecheck) is confirmed again by the silent peers.
		for h.a.LeaseHeld(h.now) {
			first := h.round.ID
			h.advance(100 * time.Millisecond)
			if h.round.ID != first && h.a.LeaseHeld(h.now) {
				h.answer(repeat(PeerCannotRenew, 12)...)
			}
			if h.now.Sub(t0) > 5*time.Minute {
				t.Fatalf("lease never lapsed: %s", strings.Join(h.log, "; "))
			}
		}
		h.expectState(StateHeld)
		rd := h.round
		liar := rd.Peers[len(rd.Peers)-1]
		h.log = nil
		ans := PeerAnswer{Kind: PeerCannotRenew} // control: an honest Held peer
		if lying {
			ans = PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev + 7, Current: &old}
		}
		h.take(h.a.PeerAnswered(h.now, rd.ID, liar, ans))
		h.advance(time.Second)
		if s := h.a.State(); s != StateHeld {
			t.Errorf("lying %t: Held h0 (lease lapsed) is %s after one peer's answer (a replay of its own old record): %s", lying, s, strings.Join(h.log, "; "))
		}
	}
}

// TestX4LyingRevisionPoisonsRenewals: h0's renewal timed out once (a NATS
// blip) and it asks peers while its lease is still held. The compromised
// peer answers RelayFailed with a replay of h0's old record (or simply
// Invalid) at revision current+1000. h0 takes it for an untrusted value in
// its key at that revision (keyDeleted: a.rev = 1000+) and renews by CAS
// on it. NATS is fine again: the store answers every such CAS with a
// conflict showing h0's real, already-landed record at the real revision —
// conflict() keeps a.rev = max(a.rev, real) = the liar's: no renewal ever
// lands again, h0's lease lapses and it fences, although NATS works.
func TestX4LyingRevisionPoisonsRenewals(t *testing.T) {
	for _, tc := range []struct {
		name string
		ans  func(h *harness) PeerAnswer
	}{
		{"control-unreachable", func(*harness) PeerAnswer { return PeerAnswer{Kind: PeerUnreachable} }},
		{"replayed-record", func(h *harness) PeerAnswer {
			old := x4OldRecord(h)
			return PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev + 1000, Current: &old}
		}},
		{"invalid-claim", func(h *harness) PeerAnswer {
			return PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev + 1000, Invalid: "undecodable"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.LyingPeers = DefaultLyingPeers(SigningRequired)
			h := newHarness(t, cfg, 50, "d1")
			// The store: h0's key at h.rev holds cur (what landed last).
			var cur LeaseRecord
			store := func() {
				r := h.renew
				h.renew = nil
				if r.Revision == h.rev {
					h.rev++
					cur = r.Record
					h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewAcked, Revision: h.rev}))
					return
				}
				c := cur
				h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &c}))
			}
			for end := h.now.Add(3 * time.Second); h.now.Before(end); {
				h.now = h.now.Add(100 * time.Millisecond)
				h.take(h.a.Tick(h.now))
				if h.renew != nil {
					store()
				}
			}
			// A blip: renewals unanswered until h0 asks its peers.
			for h.round == nil || h.a.State() != StateAskingPeers {
				h.now = h.now.Add(100 * time.Millisecond)
				h.take(h.a.Tick(h.now))
				if h.now.Sub(t0) > time.Minute {
					t.Fatalf("never asked peers: %s", strings.Join(h.log, "; "))
				}
			}
			rd := h.round
			h.renew = nil // the timed-out one is lost
			h.log = nil
			h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], tc.ans(h)))
			// NATS works again for 30 s.
			for end := h.now.Add(30 * time.Second); h.now.Before(end); {
				h.now = h.now.Add(100 * time.Millisecond)
				h.take(h.a.Tick(h.now))
				if h.renew != nil {
					store()
				}
			}
			if s := h.a.State(); s != StateHealthy {
				t.Errorf("h0 is %s 30 s after one lying answer although NATS answered every renewal: %s", s, strings.Join(h.log, "; "))
			}
		})
	}
}

// TestX4RelayShownDeclarationIgnored: h0 is cut off from NATS, its lease
// still held, renewing through peers' relays (asking peers). The
// controller has declared it (h0's records are unverifiable there and no
// beacon came: docs/security.md "What is left" — "it then fences on the
// declaration its next relay shows it"). An honest peer's relay conflicts
// with the declaration and shows it (RelayFailed, Current: the
// controller-signed expired record of the next epoch, written by CAS on
// h0's last revision: no replay). PeerAnswered has no case for a shown
// record that is not active: the declaration is ignored, h0 learns of it
// only when its lease lapses (and not at all while Held) — the
// contested wait (lease_ttl + grace after the declaration) is then all
// that keeps recovery from racing h0's guests. Low: the lapse fences in
// time unless h0 becomes Held; the docs promise more.
func TestX4RelayShownDeclarationIgnored(t *testing.T) {
	cfg := testConfig()
	cfg.LyingPeers = DefaultLyingPeers(SigningRequired)
	h := newHarness(t, cfg, 50, "d1")
	h.healthyFor(3 * time.Second)
	h.advance(4 * time.Second) // cut off: asking peers, lease held
	if !h.a.LeaseHeld(h.now) || h.round == nil {
		t.Fatalf("want a cut-off h0 asking peers with its lease held: %s", strings.Join(h.log, "; "))
	}
	rd := h.round
	decl := LeaseRecord{Schema: 1, Host: "h0", BootID: "boot-1", Epoch: h.a.Epoch() + 1, State: LeaseExpired, PrevRev: h.rev,
		Signer: "Kctl", Sig: "s", Reason: "no renewal (declared by controller c1, term 1)"}
	h.log = nil
	h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev + 1, Current: &decl}))
	h.advance(500 * time.Millisecond)
	if !h.a.Declared() {
		t.Errorf("h0 (%s) ignored the controller's declaration an honest peer's relay showed it: %s", h.a.State(), strings.Join(h.log, "; "))
	}
}
