package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Anchored creates (natslease.Store.marker, docs/security.md): an agent's
// create over a delete marker is sealed for the marker's revision and
// written by a compare-and-set on it, so its stored header equals its
// prev_rev.

// TestAnchoredDeleteLoopNeedsNoBeacon: reviewer X65's delete loop across a
// controller start, compute-3's beacons all lost. Its anchored creates are
// verified written fresh like renewals: trusted, and compute-3, dead, is
// declared. Its creates sealed for revision 0 (an agent before anchoring,
// the "legacy" case) are never verifiable, and with no beacon to vouch for
// one the dead host is never declared — the hole vouching covers.
func TestAnchoredDeleteLoopNeedsNoBeacon(t *testing.T) {
	for _, anchored := range []bool{true, false} {
		t.Run(fmt.Sprintf("anchored=%t", anchored), func(t *testing.T) {
			x := newX71Rig(t)
			for range 5 {
				x.now = x.now.Add(time.Second)
				x.rev += 3
				x.r.Seq++
				x.r.PrevRev = 0
				if anchored {
					x.r.PrevRev = x.marker
				}
				x.value(x.rev, *x.r, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
				x.marker = x.rev + 1
				x.del(x.marker)
				x.rev = x.marker
				x.keep(x.tr.Tick(x.now))
			}
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok != anchored {
				t.Errorf("compute-3 dead, no beacon: declared %t, want %t", ok, anchored)
			}
			if x.vouched() != 0 {
				t.Errorf("vouched %d with no beacon", x.vouched())
			}
		})
	}
}

// TestAnchoredOldRenewalsAreNoCandidates: the open item after reviewer
// X83 — saved renewals of 70 of compute-3's earlier agent processes (one
// each: rankProc's two per process do not fold them) put back between its
// create and the create's beacon. Each was sealed for a revision long
// before the key's last one: it cannot have landed where it is, so it is
// no candidate (landable) and folds like garbage; the create is vouched
// and compute-3, dead, declared. With landableMutation the 65th drops the
// create: never declared.
func TestAnchoredOldRenewalsAreNoCandidates(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("landableMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &landableMutation)
			}
			x := newX71Rig(t)
			for range 3 {
				R, c := x.create()
				g := R
				for i := range 70 {
					g++
					o := *x.r
					o.BootID, o.Incarnation = fmt.Sprintf("boot-old-%d", i), 1
					o.Seq, o.PrevRev = 500, uint64(7+i) // a renewal of that process, sealed long ago
					x.value(g, o, fencing.Written{Known: true, HasExpected: true, Expected: g - 1})
				}
				x.marker = g + 1
				x.del(x.marker)
				x.beacon(R, c)
				x.rev = x.marker
				x.keep(x.tr.Tick(x.now))
			}
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok == mut {
				t.Errorf("compute-3 dead: declared %t, want %t (vouched %d)", ok, !mut, x.vouched())
			}
		})
	}
}

// TestX84AnchoredNewerDoNotSupersede: reviewer X84's case where the two
// newer records of compute-3's process were sealed after the write its
// last beacon names had landed — its own next writes, anchored over the
// loop's markers after it (or renewals over values after it), whose
// beacons were lost, or ones it gave compute-1 to relay — each superseded
// before the controller read it (not verifiable: kept for a beacon). They
// do not count against the named write (supersedes: prev_rev at or above
// its revision), so a flood does not fold it: vouched, the dead host
// declared. With supersedeMutation (every newer record counts) the named
// write is folded: never declared. The named write is itself kept behind
// an older record (x83OldKept) so that it is a candidate that may fold.
func TestX84AnchoredNewerDoNotSupersede(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  bool
	}{{"anchored", false}, {"anchored/supersedeMutation", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &supersedeMutation)
			}
			x := newX71Rig(t)
			x83OldKept(x)
			x.now = x.now.Add(time.Second)
			x.r.Seq++
			x.r.PrevRev = x.marker
			R := x.rev + 3
			c := *x.r
			x.value(R, c, fencing.Written{}) // superseded before it was read
			x.marker = R + 1
			x.del(x.marker)
			rev := x.marker
			for k := uint64(1); k <= 2; k++ {
				n := c
				n.Seq += k
				n.PrevRev = rev // anchored on the marker after the named write
				x.value(rev+1, n, fencing.Written{})
				rev++
				x.marker = rev + 1
				x.del(x.marker)
				rev = x.marker
			}
			for range 70 {
				x.marker++
				x.tr.Stored(x71Host, x.marker, x.now)
				x.keep(x.tr.ObserveInvalid(x.now, x71Host, x.marker, "garbage", true))
			}
			x.marker++
			x.del(x.marker)
			x.rev = x.marker
			x.beacon(R, c)
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s", x.vouched(), ok, after)
			if ok == tc.mut {
				t.Errorf("compute-3 dead: declared %t, want %t (vouched %d)", ok, !tc.mut, x.vouched())
			}
		})
	}
}
