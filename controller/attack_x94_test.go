package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X94 (probe, (c) side): Tracker.adjacent refuses a record older
// than a write the host's beacons named (h.beacons.wrote, reviewer X93).
// writeID has no boot ID, and its first key is the epoch: an agent that
// boots with its durable state lost while its key shows no record (a
// compromised node's delete) starts at a lower epoch than its earlier
// boot, which may have been declared and released. If a beacon of the
// earlier boot reached this tracker (naming a write the watch never
// delivered: the node's flood made it skip), every record of the new boot
// is "older" and never adjacent: under the delete loop faster than the
// stored-message read (reviewer X85) with the new boot's beacons lost the
// host never gets a trusted record and, dead, is never declared.
//
// Fix: the block holds only while the beacons named a revision above the
// one the record was sealed for (Tracker.adjacent, b.maxRev). With
// adjacentBootMutation (the condition as before) the subtest
// oldBootBeacon=true fails: never declared.
func TestX94EarlierBootBeaconBlocksAdjacency(t *testing.T) {
	for _, tc := range []struct {
		oldBeacon bool
		mut       *bool
		want      bool
	}{
		{oldBeacon: false, want: true},
		{oldBeacon: true, want: true},
		{oldBeacon: true, mut: &adjacentBootMutation, want: false},
	} {
		oldBeacon := tc.oldBeacon
		name := fmt.Sprintf("oldBootBeacon=%t", oldBeacon)
		if tc.mut != nil {
			name += "/adjacentBootMutation"
		}
		t.Run(name, func(t *testing.T) {
			x32Mutate(t, tc.mut)
			x := newX71Rig(t)
			if oldBeacon {
				// The earlier boot (declared and released once: epoch 2)
				// wrote at 101; its beacon came, the value was skipped.
				old := *x.r
				old.BootID, old.Epoch, old.Incarnation, old.Seq = "boot-0", 2, 9, 500
				x.beacon(101, old)
				x.marker = 102
				x.del(x.marker)
			}
			// The new boot, its durable state lost, key deleted: epoch 1.
			x.r.BootID, x.r.Epoch = "boot-2", 1
			for range 5 {
				x.now = x.now.Add(time.Second)
				x.r.Seq++
				x.r.PrevRev = x.marker
				R := x.marker + 1
				x.value(R, *x.r, fencing.Written{After: x.marker})
				x.marker = R + 1
				x.del(x.marker)
				x.rev = x.marker
				x.keep(x.tr.Tick(x.now))
			}
			_, after, ok := x.tick(5 * time.Minute)
			t.Logf("declared %t %s after death", ok, after)
			for _, d := range x.said {
				if d.Op != OpInvalid {
					continue
				}
				t.Logf("%s %d: %s", d.Op, d.Revision, d.Reason)
			}
			if ok != tc.want {
				t.Errorf("compute-3 dead: declared %t, want %t", ok, tc.want)
			}
		})
	}
}
