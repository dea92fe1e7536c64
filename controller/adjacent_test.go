package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// The watch's adjacency (natslease.Update.After, fencing.Written.After,
// Tracker.adjacent): a value delivered directly after the key's previous
// message, nothing of the bucket missed since, was written while the key
// ended there — a record sealed for that revision is verified at delivery,
// without its stored message (reviewer X85's race: a delete loop
// supersedes it before the runner reads it).

// TestAdjacentCreateVerifiedWithoutStoredMessage: compute-3's anchored
// create over the loop's marker, its stored message superseded before it
// was read (Written not Known), is trusted when the watch delivered it
// directly after the marker it was sealed for — and not otherwise.
func TestAdjacentCreateVerifiedWithoutStoredMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     *bool
		gate    bool
		regress bool
		older   bool // sealed for an older marker than the one before it
		header  bool // the stored message read: its header says otherwise
		trusted bool
	}{
		{name: "adjacent", trusted: true},
		{name: "adjacent/adjacentMutation", mut: &adjacentMutation},
		{name: "sealed-for-an-older-marker", older: true},
		{name: "header-read-says-otherwise", header: true},
		{name: "rollback-gate-on", gate: true},
		{name: "revisions-regressed", regress: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x32Mutate(t, tc.mut)
			x := newX71Rig(t)
			if tc.gate {
				x.tr.SetRollbackGate(MarkerStands, "test")
			}
			if tc.regress {
				x.del(x.marker + 1)
				x.marker++
				x.del(x.marker - 1) // a delivery below h.rev: regressed
			}
			old := x.marker
			x.marker += 2
			x.del(x.marker)
			x.now = x.now.Add(time.Second)
			x.r.Seq++
			x.r.PrevRev = x.marker
			if tc.older {
				x.r.PrevRev = old
			}
			R := x.marker + 1
			w := fencing.Written{After: x.marker}
			if tc.header {
				w = fencing.Written{Known: true, HasExpected: true, Expected: old, After: x.marker}
			}
			x.said = nil
			x.value(R, *x.r, w)
			invalid := false
			for _, d := range x.said {
				invalid = invalid || d.Op == OpInvalid && d.Revision == R
				t.Logf("%s %d: %s", d.Op, d.Revision, d.Reason)
			}
			if invalid == tc.trusted {
				t.Errorf("create at %d sealed for %d, delivered after %d (%+v): trusted %t, want %t", R, x.r.PrevRev, x.marker, w, !invalid, tc.trusted)
			}
		})
	}
}

// TestAdjacentDeleteLoopNeedsNoBeacon: reviewer X65's delete loop across
// a controller start, every beacon of compute-3 lost, and every anchored
// create's stored message superseded before it was read (the loop deletes
// at once: X85's race). Delivered directly after the marker each was
// sealed for, they are trusted, and compute-3, dead, is declared. With
// adjacentMutation none is verified and, no beacon vouching, the dead host
// is never declared.
func TestAdjacentDeleteLoopNeedsNoBeacon(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("adjacentMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &adjacentMutation)
			}
			x := newX71Rig(t)
			for range 5 {
				x.now = x.now.Add(time.Second)
				x.r.Seq++
				x.r.PrevRev = x.marker
				R := x.marker + 1 // directly after the marker
				x.value(R, *x.r, fencing.Written{After: x.marker})
				x.marker = R + 1
				x.del(x.marker)
				x.rev = x.marker
				x.keep(x.tr.Tick(x.now))
			}
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok == mut {
				t.Errorf("compute-3 dead, no beacon, stored messages gone: declared %t, want %t", ok, !mut)
			}
		})
	}
}
