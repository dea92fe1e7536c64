package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X82: compactLater folds only non-candidates, and u.holds only
// demotes copies of an identity kept already. A copy of one of the
// host's OLDER records of another agent process (an earlier boot, or an
// earlier incarnation of this boot: vouchable's beacon-process check
// orders only records of the process its beacons named) is vouchable
// while no trusted record is held, and each has an identity of its own:
// every one is a candidate. compute-1 saved 64+ of compute-3's records of
// an earlier process (any renewal it ever read from the key: thousands a
// day) and puts them back, one after another, between compute-3's create
// and its beacon: the 65th drops the kept create (c): compute-3, dead,
// is never declared. Fixed: only the two newest records of each agent
// process stay unfoldable candidates (rankProc; one per process, the
// first fix, reviewer X83 broke); with candidateProcMutation the 70 copies
// drop the create.
func TestX82OldProcessCopiesBeforeBeacon(t *testing.T) {
	for _, tc := range []struct {
		name     string
		boot     string
		inc      uint64
		n        int
		declared bool
		mut      bool
	}{
		{"earlier-boot-70", "boot-0", 2, 70, true, false},
		{"earlier-incarnation-70", "boot-1", 1, 70, true, false},
		{"earlier-boot-60-control", "boot-0", 2, 60, true, false},
		{"earlier-boot-300-with-markers-and-garbage", "boot-0", 2, -300, true, false},
		{"earlier-boot-70/candidateProcMutation", "boot-0", 2, 70, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &candidateProcMutation)
			}
			x := newX71Rig(t)
			old := *x.r
			old.BootID, old.Incarnation, old.PrevRev = tc.boot, tc.inc, 7
			for range 5 {
				R, c := x.create()
				g := R
				n, mixed := tc.n, tc.n < 0
				if mixed {
					n = -n
				}
				for i := range n {
					if mixed {
						g++
						x.del(g) // delete: the copy is a create over the marker
						if i%2 == 0 {
							g++
							x.tr.Stored(x71Host, g, x.now)
							x.keep(x.tr.ObserveInvalid(x.now, x71Host, g, "garbage", true))
							g++
							x.del(g)
						}
					}
					g++
					o := old
					// A saved create of the earlier process (under a delete
					// loop each of its writes was one): a saved renewal,
					// sealed for a revision long before the key's last, is
					// no candidate since landable
					// (TestAnchoredOldRenewalsAreNoCandidates).
					o.Seq = uint64(1000 + i)
					o.PrevRev = 0
					x.value(g, o, fencing.Written{Known: true, HasExpected: true, Expected: g - 1}) // put back: not on its sealed revision
				}
				x.marker = g + 1
				x.del(x.marker)
				x.beacon(R, c)
				x.rev = x.marker
				x.keep(x.tr.Tick(x.now))
			}
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok != tc.declared {
				t.Errorf("compute-3 dead: declared %t, want %t (vouched %d)", ok, tc.declared, x.vouched())
			}
		})
	}
}

// The same with a trusted record held (reviewer X71's restart case): the
// agent restarted (incarnation 3) under compute-1's delete loop; each of
// its creates is another process's create after a delete (otherBootCreate),
// kept for its beacon. compute-1 puts back, each over a marker of its own,
// creates of an earlier boot it saved (under its delete loop every write
// of compute-3 was a create): each another process's create after a
// delete, vouchable, an identity of its own — a candidate. The 65th drops
// the restarted process's create; compute-3, dead, is never declared.
// Fixed as above.
func TestX82OldProcessCreatesAfterRestart(t *testing.T) {
	for _, n := range []int{70, 30} {
		for _, withdraw := range []bool{false, true} {
			t.Run(fmt.Sprintf("copies=%d/withdrawn-before=%t", n, withdraw), func(t *testing.T) {
				x := newX71Rig(t)
				x.rounds("vbm", 3) // trusted (vouched) records of incarnation 2
				if x.vouched() == 0 {
					t.Fatal("setup: compute-3 never vouched")
				}
				if withdraw {
					// orderly stop of the old process (an upgrade): its
					// withdrawal, a create over the marker (X71's case).
					x.withdrawal("upgrade")
					x.marker = x.rev + 1
					x.del(x.marker)
					x.rev = x.marker
				}
				x.r.Incarnation++
				x.r.Seq = 0
				old := *x.r
				old.BootID, old.Incarnation, old.PrevRev = "boot-0", 5, 0
				for range 5 {
					R, c := x.create()
					g := R
					for i := range n {
						g++
						x.del(g)
						g++
						o := old
						o.Seq = uint64(1000 + i) // a saved create of the earlier boot
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
				if !ok {
					t.Errorf("compute-3 dead: not declared within 3 minutes (vouched %d)", x.vouched())
				}
			})
		}
	}
}

// A guard for any fix of the above: a plain cap on candidates (new ones
// demoted once full, x82-proto-candidate-cap.diff) is pre-filled. compute-1
// puts back saved records of an earlier process before compute-3's
// create: the first is kept, 25 more are candidates, and compute-3's
// genuine create comes after them — demoted, its beacon vouches nothing.
// Passed at 4410584 (26 < 64); failed with the naive cap; passes with
// rankProc (another process's records never supersede the create).
func TestX82PrefilledCandidatesBeforeCreate(t *testing.T) {
	x := newX71Rig(t)
	old := *x.r
	old.BootID, old.Incarnation = "boot-0", 2
	for range 5 {
		x.now = x.now.Add(time.Second)
		g := x.rev
		for i := range 26 {
			// Saved creates, each over a marker of compute-1's own (a
			// saved renewal, sealed for a revision long before, is no
			// candidate since landable).
			g++
			x.del(g)
			g++
			o := old
			o.Seq, o.PrevRev = uint64(1000+i), 0
			x.value(g, o, fencing.Written{Known: true, HasExpected: true, Expected: g - 1})
		}
		g++
		x.del(g) // compute-1 deletes; compute-3's create lands over the marker
		x.marker, x.rev = g, g
		R, c := x.create()
		x.marker = R + 1
		x.del(x.marker)
		x.beacon(R, c)
		x.rev = x.marker
		x.keep(x.tr.Tick(x.now))
	}
	_, after, ok := x.tick(3 * time.Minute)
	t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
	if !ok {
		t.Errorf("compute-3 dead: not declared within 3 minutes (vouched %d)", x.vouched())
	}
}
