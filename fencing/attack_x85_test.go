package fencing

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestX85LiarChoosesPrevRevOfRelayedRenewal (reviewer X85): h0 is cut off
// from NATS, its lease held, asking peers. A compromised peer answers
// "relay failed" showing a record h0 will not trust (here: another host's
// record; agent/fence.go turns it into Invalid) at a revision R of its
// choosing, far ahead of the key's. keyDeleted sets a.rev = R exactly, so
// h0's next round hands every asked peer — the liar among them — a
// genuine active renewal sealed for prev_rev R (agent/fence.go askPeers
// seals for pr.Renewal.Revision). Once the lease stream reaches R, the
// liar puts any value at exactly R on h0's key (a publish with
// Nats-Expected-Last-Sequence R-1) and then the renewal by a CAS on R: a
// genuine record written fresh on its prev_rev, trusted by every
// controller — a lease for a host that may be dead by then
// (controller TestX85FutureSealedRenewalKeepsDeadHost).
//
// Fixed: a revision only one peer reports (an invalid record, or an active
// record not ours, shown at it) is counted like a relayed landing — acted
// on once more than LyingPeers peers report it. With
// Mutations.PeerRevisionTrusted the liar's revision is taken at once.
func TestX85LiarChoosesPrevRevOfRelayedRenewal(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("PeerRevisionTrusted=%t", mut), func(t *testing.T) {
			if mut {
				Mutations.PeerRevisionTrusted = true
				t.Cleanup(func() { Mutations.PeerRevisionTrusted = false })
			}
			x85Liar(t, mut)
		})
	}
}

// x85CutOff: h0 (lying_peers at its default for required signing)
// healthy, then cut off from NATS: asking peers, its lease held.
func x85CutOff(t *testing.T) *harness {
	cfg := testConfig()
	cfg.LyingPeers = DefaultLyingPeers(SigningRequired)
	h := newHarness(t, cfg, 50, "d1")
	h.healthyFor(3 * time.Second)
	h.renew = nil
	h.advance(4 * time.Second)
	return h
}

func x85Liar(t *testing.T, mut bool) {
	h := x85CutOff(t)
	if !h.a.LeaseHeld(h.now) || h.round == nil {
		t.Fatalf("want a cut-off h0 asking peers with its lease held: %s", strings.Join(h.log, "; "))
	}
	rd := h.round
	R := h.rev + 100000
	h.take(h.a.PeerAnswered(h.now, rd.ID, rd.Peers[0], PeerAnswer{Kind: PeerRelayFailed, Revision: R, Invalid: "record of host \"h7\""}))
	for h.round.ID == rd.ID && h.now.Sub(t0) < time.Minute {
		h.advance(100 * time.Millisecond)
	}
	got := h.round.Renewal
	t.Logf("next round %d: renewal seq %d sealed for revision %d (key's last %d); lease held %t; %s", h.round.ID, got.Seq, got.Revision, h.rev, h.a.LeaseHeld(h.now), strings.Join(h.log, "; "))
	if (got.Revision == R) != mut {
		t.Errorf("h0's next relayed renewal is sealed for revision %d, the liar's choice (the key is at %d): a genuine renewal the liar can land fresh once the stream reaches it", R, h.rev)
	}
}
