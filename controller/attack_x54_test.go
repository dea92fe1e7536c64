package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X54: attacks on the rollback gate (rollbackgate.go) after
// X50–X53's revisions.

// TestX54DeleteDropsBarRefused ((S), attacker plus X52's faults: a
// compromised node deletes h3's key and overwrites h3's create with
// garbage before the watch delivers it (Skipped); h3's agent restarts
// with its state lost and withdraws in order, that beacon lost).
//
// h3 proves itself ((3,22..26), beacons). At 5 s the node deletes h3's
// key; h3's agent re-creates it with (3,27) (prev_rev 0, its beacon
// naming it: beacons.wrote = (3,27)); the node's garbage supersedes it
// before the watch delivers it. At 50 s h3 boots, its agent's state lost:
// (2,1..10) with beacons, refused below the bar (barRefusedRev), and
// withdraws at (2,11) at 60 s, beacon lost: gated (barRefusedRev >
// trustedRev). At 62 s the node deletes the key and lands its copy of
// (3,27) — a create, newer than the trusted (3,26): not a replay.
// recreated() starts a new hostState without barRefusedRev (nor ownAt);
// beacons (maxRev of the (2,10) renewal) are below the create's revision,
// (3,27) == beacons.wrote, above the bar (3,20): the gate passes the
// withdrawn h3. Control: no second delete/copy: never declared.
// Note: carrying barRefusedRev over the delete would not close it — the
// copy lands above it (trustedRev 669 > 649). The judged record is a
// create over a marker, which Written.Fresh cannot verify; no beacon
// names the revision it landed at (its genuine beacon named rev27).
func TestX54DeleteDropsBarRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		copy bool
		muts []*bool
	}{
		{"delete-then-copy-of-hidden-create", true, nil},
		{"delete-then-copy-of-hidden-create/rollbackLandedMutation", true, []*bool{&rollbackLandedMutation}},
		{"control/no-copy", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r27 fencing.LeaseRecord
			x53Proved(t, "its lost-state agent withdrew at (2,11) (beacon lost); the node deleted the key and landed a copy of h3's hidden create (3,27)", c.muts, func(b *x11Bucket, s int, w time.Time) bool {
				switch {
				case s == 5:
					b.del(w.Add(-200*time.Millisecond), "h3")
					tr := b.tr
					b.tr = nil // h3's create superseded before the watch reached it
					r := x38Rec(b, "h3", fencing.LeaseActive, 3, 27)
					r.PrevRev = 0
					mk := b.keys["h3"].rev
					b.land(w, "h3", x11Entry{rec: r, w: fencing.Written{Known: true, HasExpected: true, Expected: mk}})
					rev27 := b.rev
					r27 = *r
					b.tr = tr
					tr.Skipped(b.rev + 1)
					b.garbage(w.Add(100*time.Millisecond), "h3")
					tr.ObserveBeacon(w.Add(50*time.Millisecond), "h3", rev27)
					tr.BeaconWrote("h3", rev27, r.Epoch, r.Incarnation, r.Seq)
				case s >= 50 && s <= 60:
					return x52Boots(b, s, w)
				case s == 62 && c.copy:
					if hs := b.tr.hosts["h3"]; hs.barRefusedRev <= hs.trustedRev {
						t.Fatalf("before the copy h3 was not gated by barRefusedRev (%d, trusted %d): the rig is wrong", hs.barRefusedRev, hs.trustedRev)
					} else {
						t.Logf("before the second delete: barRefusedRev %d > trustedRev %d (gated)", hs.barRefusedRev, hs.trustedRev)
					}
					b.del(w, "h3")
					cp := r27
					mk := b.keys["h3"].rev
					b.land(w.Add(100*time.Millisecond), "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: mk}})
					hs := b.tr.hosts["h3"]
					t.Logf("after the copy: trustedRev %d h.rev %d barRefusedRev %d maxRev %d rec (%d,%d) state %s deleted %t", hs.trustedRev, hs.rev, hs.barRefusedRev, hs.beacons.maxRev, hs.rec.Incarnation, hs.rec.Seq, hs.rec.State, hs.deleted)
				}
				return false
			})
		})
	}
}
