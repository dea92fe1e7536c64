package fencing

import (
	"fmt"
	"testing"
	"time"
)

// TestRelayedCreateAnchored: a cut-off h0 whose key was deleted learns of
// it from its peers' "key absent" answers, which name the delete marker's
// revision m (the relayer's conflict read it: natslease.Store.absentAt).
// Corroborated (more than lying_peers peers), its next relayed renewal is
// sealed for m — an anchored create, verifiable as written fresh like a
// renewal — and not for 0, the unanchored create only beacons could vouch
// for (docs/security.md, "Anchored creates"). Its own store's conflict
// naming m does the same for its relayed renewals; its own next write
// stays on revision 0, which the store anchors on the marker it reads as
// it writes. With Mutations.KeyAbsentRevisionIgnored the relayed ones are
// creates sealed for 0, as before.
func TestRelayedCreateAnchored(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyAbsentRevisionIgnored=%t", mut), func(t *testing.T) {
			if mut {
				Mutations.KeyAbsentRevisionIgnored = true
				t.Cleanup(func() { Mutations.KeyAbsentRevisionIgnored = false })
			}
			want := func(what string, m, got uint64) {
				t.Helper()
				t.Logf("%s: sealed for revision %d (marker %d)", what, got, m)
				if anchored := got == m; anchored == mut {
					t.Errorf("%s: sealed for revision %d, the marker is at %d: anchored %t, want %t", what, got, m, anchored, !mut)
				}
			}

			h := x85CutOff(t)
			rd := h.round
			if rd == nil || len(rd.Peers) < 2 {
				t.Fatalf("want a round asking 2 peers: %+v", rd)
			}
			m := h.rev + 1 // the delete's marker
			for _, p := range rd.Peers[:2] {
				h.take(h.a.PeerAnswered(h.now, rd.ID, p, PeerAnswer{Kind: PeerRelayFailed, Revision: m, KeyAbsent: true}))
			}
			for h.round != nil && h.round.ID == rd.ID && h.now.Sub(t0) < time.Minute {
				h.advance(100 * time.Millisecond)
			}
			if h.round == nil {
				t.Fatalf("no next round (state %s)", h.a.state)
			}
			want("next relayed renewal", m, h.round.Renewal.Revision)

			// Its own store's conflict with no record, naming the marker:
			// its own next write stays on revision 0 (the store reads the
			// marker as it writes: a delete loop's newest), and once it is
			// cut off its relayed renewal is sealed for the marker.
			o := newHarness(t, testConfig(), 50, "d1")
			o.healthyFor(3 * time.Second)
			if o.renew == nil {
				o.advance(2 * time.Second)
			}
			r := o.renew
			o.renew = nil
			m = o.rev + 1
			o.take(o.a.Renewed(o.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: m}))
			o.advance(100 * time.Millisecond)
			if o.renew == nil || o.renew.Record.State != LeaseActive || o.renew.Revision != 0 {
				t.Fatalf("after the delete: want an active record on revision 0 (the store anchors it), got %+v", o.renew)
			}
			o.renew = nil
			o.advance(4 * time.Second)
			if o.round == nil {
				t.Fatalf("no peer round after 4 s cut off (state %s)", o.a.state)
			}
			want("relayed renewal after its own conflict", m, o.round.Renewal.Revision)
		})
	}
}
