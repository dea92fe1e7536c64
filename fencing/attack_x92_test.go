package fencing

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestX92ZeroMarkerClaimUnanchorsRelayedCreate (reviewer X92, (c)): the
// change "anchored relayed creates" claims that an upgraded agent hands
// out no relayed create sealed for revision 0 over a marker any more
// (docs/security.md, "Anchored creates": the supply of X84's creates is
// "the creates saved from before the upgrade and creates over a marker
// nobody could read"). But a "key absent" answer naming revision 0 is
// still a revision claim the cut-off asker acts on once more than
// lying_peers peers report it, and acting on it resets the asker to
// revision 0 with no marker (absentAt 0): its next relayed renewal is a
// create sealed for 0 — a record of its current process that the liar,
// asked to relay it, holds, and whose beacon never comes (the asker is cut
// off). Honest peers name 0 although the key ends with a marker:
//
//   - every peer of an earlier release (its conflict reads no marker:
//     Revision 0) — a rolling upgrade;
//   - an upgraded relayer whose marker read lost a race with the
//     compromised node's put: natslease.Store.cas reads the key (deleted:
//     not found), then reads the marker again (Store.absentAt), which
//     finds the put's value and names 0. The compromised node runs a
//     delete/put loop on the cut-off host's key while its relays run;
//   - an upgraded relayer whose marker read failed or timed out.
//
// So one liar (lying_peers 1) answering "key absent, 0" beside any such
// honest peer outvotes the upgraded honest peers naming the marker m
// (separate tallies, and the first to cross decides), and gets a create
// sealed for 0 from the host's current process — two such rounds are
// X84's two newer creates that supersede the write the last beacon named
// (`HVG_X84=1 go test -run TestX84TwoNewerSupersedeThenFoldNamed
// ./controller/`): a dead host kept undeclared, (c), on an upgraded fleet
// (or an upgrading one) the change says is closed.
//
// Fixed: with lying_peers ≥ 1, a peer's "key absent" naming no marker
// (revision 0) is not acted on — it names nothing to seal for, and a
// create sealed for 0 is what the liar wants; the next round asks again,
// and upgraded relayers name the marker (relays on a marker's revision
// work through old peers too). The price: a cut-off host whose key was
// deleted needs more than lying_peers upgraded peers to name the marker
// (a rolling upgrade's first hosts: it fences at the lapse, the put loop's
// lever). Mutations.KeyAbsentZeroActed restores the old handling.
func TestX92ZeroMarkerClaimUnanchorsRelayedCreate(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyAbsentZeroActed=%t", mut), func(t *testing.T) {
			if mut {
				Mutations.KeyAbsentZeroActed = true
				t.Cleanup(func() { Mutations.KeyAbsentZeroActed = false })
			}
			h := x85CutOff(t)
			rd := h.round
			if rd == nil || !h.a.LeaseHeld(h.now) {
				t.Fatalf("want a cut-off h0, lease held, asking peers: %+v", rd)
			}
			m := h.rev + 1 // the compromised node's delete
			if len(rd.Peers) < 4 {
				t.Fatalf("want a round asking 4 peers: %+v", rd)
			}
			// Two upgraded honest relayers name the marker (corroborated:
			// the next renewal would be sealed for m); one old (or racing)
			// honest relayer names 0; the liar answers last, naming 0 too:
			// the last tally to cross decides.
			up1, up2, old, liar := rd.Peers[0], rd.Peers[1], rd.Peers[2], rd.Peers[3]
			for _, a := range []struct {
				p   string
				rev uint64
			}{{up1, m}, {up2, m}, {old, 0}, {liar, 0}} {
				h.take(h.a.PeerAnswered(h.now, rd.ID, a.p, PeerAnswer{Kind: PeerRelayFailed, Revision: a.rev, KeyAbsent: true}))
			}
			for h.round != nil && h.round.ID == rd.ID && h.now.Sub(t0) < time.Minute {
				h.advance(100 * time.Millisecond)
			}
			if h.round == nil {
				t.Fatalf("no next round (state %s): %s", h.a.state, strings.Join(h.log, "; "))
			}
			got := h.round.Renewal
			t.Logf("next round %d: renewal seq %d sealed for revision %d (marker %d, key's last record %d); lease held %t",
				h.round.ID, got.Seq, got.Revision, m, h.rev, h.a.LeaseHeld(h.now))
			if create := got.Revision == 0; create != mut {
				t.Errorf("next relayed renewal sealed for revision %d: a create sealed for 0 %t, want %t (the liar holds it: X84's creates from an upgraded agent)", got.Revision, create, mut)
			}
			if !mut && got.Revision != m {
				t.Errorf("next relayed renewal sealed for revision %d, want the marker %d the upgraded peers named", got.Revision, m)
			}
		})
	}
}

// TestX92SelfDeclarationStaysOnZero (reviewer X92, liveness, no (S) or
// (c)): since a conflict with no record names the delete marker (for
// relayed creates), a self-declaration whose write conflicted with a
// deleted key was retried by a CAS on that marker, a retry interval later
// — lost to any delete in between, where before it was a write on
// revision 0 the store anchors on the marker it reads as it writes. A
// compromised node's delete loop slower than that read-then-write kept a
// fenced host's self-declaration from ever landing. The change's own rule
// ("own writes after a delete stay on revision 0") applies to it too.
// With Mutations.SelfDeclOnNamedMarker the retry is a CAS on the marker.
func TestX92SelfDeclarationStaysOnZero(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("SelfDeclOnNamedMarker=%t", mut), func(t *testing.T) {
			if mut {
				Mutations.SelfDeclOnNamedMarker = true
				t.Cleanup(func() { Mutations.SelfDeclOnNamedMarker = false })
			}
			h := newHarness(t, testConfig(), 50, "d1")
			h.advance(10 * time.Second)
			h.take(h.a.FenceDone(h.now, "d1", nil))
			h.expectState(StateFenced)
			h.advance(20 * time.Second)
			h.conflictAbsent()
			h.expectState(StateAwaitingRelease)
			h.advance(100 * time.Millisecond)
			d := h.renew
			if d == nil || d.Revision != 0 || d.Record.State != LeaseExpired {
				t.Fatalf("want the self-declaration on revision 0, got %+v", d)
			}
			h.renew = nil
			m := h.rev + 7 // the delete loop's marker the conflict names
			h.take(h.a.Renewed(h.now, d.Seq, RenewResult{Outcome: RenewConflict, Revision: m}))
			for h.renew == nil && h.now.Sub(t0) < 2*time.Minute {
				h.advance(100 * time.Millisecond)
			}
			d = h.renew
			if d == nil || d.Record.State != LeaseExpired {
				t.Fatalf("want a second self-declaration, got %+v", d)
			}
			t.Logf("second self-declaration on revision %d (the conflict named marker %d)", d.Revision, m)
			if onMarker := d.Revision == m; onMarker != mut {
				t.Errorf("second self-declaration on revision %d: a CAS on the named marker %d %t, want %t", d.Revision, m, onMarker, mut)
			}
		})
	}
}
