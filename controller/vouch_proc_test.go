package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// vouchProcRecreated: vouchable's check of the host's current agent
// process (vouchProcMutation) across two lives of a re-created lease
// bucket, where a revision number repeats (docs/security.md, "Vouched by
// the host's beacon": "a record sealed in the old life names an identity
// the host's current process has passed").
//
// Life 1: the controller starts under reviewer X65's delete loop
// (x71Rig: compute-3's key deleted at 100, no trusted record). compute-3's
// agent (boot-1, incarnation 2) creates its record O (seq 6, active) over
// the marker at 103 and its beacon naming (103, O) is handled; the lease
// bucket is deleted before the watch delivered 103.
//
// Life 2: the bucket is re-created, revisions restart at 1. compute-3's
// same agent process writes on: a create at 1 (seq 7), renewals at 2, 3
// (seq 8, 9), then it stops in order — its withdrawal W at 4 (seq 10) —
// and its guests run on. The watch delivers these below the key's last
// revision 100 (stale: revision-regressed); their beacons are handled
// (a new chain: Prev 0 at 1), the withdrawal's too — ObserveWithdrawal
// ignores it, since a beacon of the host named 103 already (maxRev).
// compute-1 (compromised, read O in life 1) writes filler into its own
// keys up to 102 and puts a copy of O on compute-3's key at 103: the
// revision and identity compute-3's own beacon named in life 1.
//
// The copy is not verified as written fresh (a plain put); named(103, O)
// holds. Without the check it is vouched: compute-3 is judged by a stale
// active record of its process (W, seq 10, was named since) and declared
// while withdrawn — its guests running. It returns whether the copy was
// vouched and whether compute-3 was declared within 3 minutes.
func vouchProcRecreated(t *testing.T) (vouched, declared bool, x *x71Rig) {
	t.Helper()
	x = newX71Rig(t)
	x.r.Seq = 6
	x.r.PrevRev = 0
	o := *x.r // life 1's create over the marker
	const oRev = 103
	beacon := func(rev, prev uint64, c fencing.LeaseRecord) {
		x.tr.BeaconChain(x.now, x71Host, rev, prev)
		x.tr.ObserveBeacon(x.now, x71Host, rev)
		x.tr.BeaconWrote(x71Host, rev, c.Epoch, c.Incarnation, c.Seq)
		x.keep(x.tr.BeaconVouches(x.now, x71Host, rev, c.BootID, c.Epoch, c.Incarnation, c.Seq))
		if c.State == fencing.LeaseWithdrawn {
			x.keep(x.tr.ObserveWithdrawalBy(x.now, x71Host, rev, c.BootID, 0))
		}
	}
	x.now = x.now.Add(time.Second)
	beacon(oRev, 0, o) // the watch has not delivered 103 yet: the bucket goes

	// Life 2: the watch re-established on the re-created bucket.
	x.now = x.now.Add(2 * time.Second)
	x.tr.WatchStarted(x.now)
	c := o
	var prevBeacon uint64 = oRev
	for rev := uint64(1); rev <= 4; rev++ {
		x.now = x.now.Add(time.Second)
		c.Seq++
		w := fencing.Written{Known: true, HasExpected: true, Expected: rev - 1}
		c.PrevRev = rev - 1
		if rev == 4 {
			c.State, c.Reason = fencing.LeaseWithdrawn, "stopped"
		}
		x.value(rev, c, w) // stale: below the key's last revision (100)
		p := prevBeacon
		if rev <= p {
			p = 0 // the agent's publishBeacon: not after its last, a new chain
		}
		beacon(rev, p, c)
		prevBeacon = rev
		x.keep(x.tr.Tick(x.now))
	}
	if x.tr.hosts[x71Host].beacons.proc.newest.seq != 10 {
		t.Fatalf("compute-3's process's newest named record: seq %d, want 10 (its withdrawal)", x.tr.hosts[x71Host].beacons.proc.newest.seq)
	}
	// compute-1: filler up to 102 elsewhere, then the copy of O at 103, a
	// plain put over the withdrawal.
	x.now = x.now.Add(time.Second)
	x.value(oRev, o, fencing.Written{Known: true})
	for _, d := range x.said {
		if d.Op == OpVouched && d.Revision == oRev {
			vouched = true
		}
	}
	_, _, declared = x.tick(3 * time.Minute)
	return vouched, declared, x
}

// TestVouchProcRecreatedBucketCopyNotVouched: see vouchProcRecreated.
func TestVouchProcRecreatedBucketCopyNotVouched(t *testing.T) {
	t.Run("vouchProcMutation", func(t *testing.T) {
		x32Mutate(t, &vouchProcMutation)
		x32Mutate(t, &namedFloorMutation) // reviewer X100's layer off too
		vouched, declared, x := vouchProcRecreated(t)
		for _, d := range x.said {
			if d.Op == OpVouched || d.Op == OpDeclare {
				t.Logf("%s at %d: %s", d.Op, d.Revision, d.Reason)
			}
		}
		if !vouched || !declared {
			t.Errorf("vouchProcMutation: copy vouched %t, withdrawn compute-3 declared %t (want both): the test no longer shows the hole", vouched, declared)
		}
	})
	// Either layer alone refuses the copy: the process check, or the
	// named floor (beacons received before the withdrawal's vouch for
	// nothing while it stands, reviewer X100).
	for _, mut := range []*bool{nil, &vouchProcMutation} {
		name := "fixed"
		if mut != nil {
			name = "namedFloorOnly"
		}
		t.Run(name, func(t *testing.T) {
			x32Mutate(t, mut)
			vouched, declared, x := vouchProcRecreated(t)
			if vouched {
				t.Errorf("a copy of compute-3's old record (seq 6) at the revision its beacon named in the bucket's earlier life vouched, though its agent process named its withdrawal (seq 10) since")
			}
			if declared {
				h := x.tr.hosts[x71Host]
				t.Errorf("the withdrawn compute-3 declared (trusted %s seq %d at %d)", h.rec.State, h.rec.Seq, h.trustedRev)
			}
		})
	}
}
