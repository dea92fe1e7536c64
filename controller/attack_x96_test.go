package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X96 (attack, (S)): reviewer X94's escape from the X93 bar
// (Tracker.adjacent: a record older than h.beacons.wrote is adjacent
// anyway when sealed for a revision at or above every revision the
// host's beacons named, adjacentBar) argues "without a rollback a
// genuine record sealed above every named revision was sealed after
// those writes". The X93 bar exists for the undetected rollback, and a
// rollback that moves the stream's revisions DOWN (a restore from a
// backup older than the key's last delivered message, a leader lost to a
// follower far behind) breaks that argument: the host's newest write,
// its withdrawal, lands at a reused revision below the older record's
// PrevRev, and its beacon names only that low revision.
//
// The scenario, on the x11 rig (pure tracker), C1 running throughout:
//
//   - Old life. A backup of the stream is taken (h3's key absent). The
//     fleet renews on; a compromised node deletes h3's key at P (C1
//     delivers the marker: h3 tracked, nothing trusted, NeedsWritten).
//     h3's agent writes R, an anchored create sealed for P, at L+1; the
//     stream rolls back (restored from the backup) before C1's watch
//     delivered it, and R's beacon was lost (the node's flood, or the
//     runner's queue) — C1 delivered up to L.
//   - New life, at reused revisions below P (never delivered: nats.go
//     resumes C1's watch at L+1): h3's agent stops in order — W,
//     withdrawn, newer than R (same process, seq 2; or, otherproc, a
//     restarted agent: incarnation 2). W's beacon reaches C1: withdrawn
//     (withdrawnRev w), wrote = W's identity, maxRev = wroteMax = w < P.
//   - The fleet refills the stream to L. The node puts its copy of R at
//     L+1: delivered with After = P (the watch's last message of the
//     key), stored message unread. rec.PrevRev P == h.rev, R older than
//     wrote — the X93 bar — but adjacentBar() = w <= P: the X94 escape
//     makes it adjacent, so written fresh, trusted at L+1 > w: the
//     withdrawal the host's own beacon named is over, h3 is silent and
//     declared lease_ttl + grace later while its guests run.
//
// The receipt (Runner.checkReceipt emulated as in X93) stops it when W
// is of R's process (SealedBefore, reviewer X89's rule); of another
// process (otherproc) it does not (W's revision is below R's PrevRev,
// ObserveWithdrawal ignores w <= trustedRev). Undetected rollback: the
// residual every rollback case shares — but X93's docs say that with
// the beacons arrived adjacency itself refuses the copy; here they
// arrived and it does not.
//
// lateBeacon: a late beacon of an earlier write of h3's (its value
// skipped) named a revision between W's and P before W's beacon came:
// ObserveWithdrawal ignores W's beacon (below maxRev), h3 is not even
// beacon-withdrawn, and the copy escaped all the same.
//
// Fix: no escape while the host's beacon state says withdrawn
// (h.beaconWithdrawn(): a withdrawal its own beacon named, not
// superseded by a trusted record or a later beacon-named write) or a
// withdrawal beacon came that no beacon naming a later revision followed
// (beaconState.withdrew, set even when ObserveWithdrawal ignores it).
// With withdrawnFreshMutation (X96's rule, now Tracker.withdrawnBar) the
// cases marked hole are declared.
func TestX96DownwardRollbackEscapesAdjacencyBar(t *testing.T) {
	for _, c := range []struct {
		otherProc bool
		receipt   bool
		// lateBeacon: a beacon of an earlier write of h3's (skipped by
		// the watch, its value overwritten) names a revision between W's
		// and P: ObserveWithdrawal ignores W's (below maxRev).
		lateBeacon bool
		mut        *bool
		wantHole   bool
	}{
		{},
		{receipt: true},
		{otherProc: true},
		{otherProc: true, receipt: true},
		{mut: &withdrawnFreshMutation, wantHole: true},
		{otherProc: true, receipt: true, mut: &withdrawnFreshMutation, wantHole: true},
		{otherProc: true, receipt: true, lateBeacon: true},
		{otherProc: true, receipt: true, lateBeacon: true, mut: &withdrawnFreshMutation, wantHole: true},
	} {
		name := fmt.Sprintf("otherProc=%t/receipt=%t/lateBeacon=%t", c.otherProc, c.receipt, c.lateBeacon)
		if c.mut != nil {
			name += "/withdrawnFreshMutation"
		}
		t.Run(name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b := newX11Bucket(t)
			hosts := x10Names(0, 10)
			live := x11Without(hosts, "h3")
			b.tr = x10Tracker(t)
			for _, h := range live {
				b.write(t0, h, fencing.LeaseActive, nil)
			}
			b.publish()
			b.run(t0, 2, live, nil)
			at := t0.Add(2 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev // h3 absent
			b.run(at, 5, live, nil)
			at = at.Add(5 * time.Second)
			b.del(at, "h3") // the node's delete: C1 tracks h3 by its marker
			P := b.keys["h3"].rev
			b.run(at, 2, live, nil)
			at = at.Add(2 * time.Second)
			c1 := b.tr
			L := b.rev
			if h := c1.hosts["h3"]; h == nil || h.rev != P || h.trustedRev != 0 || !c1.NeedsWritten("h3") {
				t.Fatalf("rig: C1 should hold only h3's marker at %d, nothing trusted", P)
			}
			now := at.Add(500 * time.Millisecond)
			if c.lateBeacon {
				c1.ObserveBeacon(at, "h3", P-5)
				c1.BeaconWrote("h3", P-5, 1, 0, 7)
			}

			// R: h3's anchored create on P, at L+1, never delivered
			// (its beacon lost); then the restore.
			b.tr = nil
			r1 := b.x93Write(now, "h3", fencing.LeaseActive, 1, P)
			if r1.rev != L+1 {
				t.Fatalf("rig: R at %d, want L+1 = %d", r1.rev, L+1)
			}
			b.rollBack(backup, backupRev)
			b.write(now, live[0], fencing.LeaseActive, b.guard.Ref())
			// W: the orderly stop, a create on the restored (absent) key.
			wr := *r1.rec
			wr.State, wr.Reason, wr.PrevRev, wr.Seq = fencing.LeaseWithdrawn, "orderly-stop", 0, 2
			if c.otherProc {
				wr.Incarnation, wr.Seq = 2, 1
			}
			b.land(now.Add(100*time.Millisecond), "h3", x11Entry{rec: &wr, w: fencing.Written{Known: true}})
			w := b.keys["h3"]
			if w.rev >= P || !(writeID{epoch: wr.Epoch, inc: wr.Incarnation, seq: wr.Seq}).newer(idOf(*r1.rec)) {
				t.Fatalf("rig: W at %d, want below P = %d and newer than R", w.rev, P)
			}
			c1.ObserveBeacon(now, "h3", w.rev)
			c1.BeaconWrote("h3", w.rev, wr.Epoch, wr.Incarnation, wr.Seq)
			c1.BeaconVouches(now, "h3", w.rev, wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq)
			for _, d := range c1.ObserveWithdrawal(now, "h3", w.rev) {
				t.Logf("C1 beacon: %s", d.Reason)
			}
			if !c1.hosts["h3"].beaconWithdrawn() && !c.lateBeacon {
				t.Fatalf("rig: W's beacon did not make h3 withdrawn")
			}
			for i := 0; b.rev < L; i++ {
				b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
			}
			b.tr = c1

			cp := *r1.rec
			copyAt := now.Add(400 * time.Millisecond)
			b.land(copyAt, "h3", x11Entry{rec: &cp, w: fencing.Written{After: P}})
			h := c1.hosts["h3"]
			t.Logf("backup %d, P %d, L %d, W %d, copy at %d: h3 judged by %s at %d, bar %d, withdrawn %t",
				backupRev, P, L, w.rev, b.keys["h3"].rev, h.rec.State, h.trustedRev, h.beacons.adjacentBar(), h.beaconWithdrawn())

			rc := fencing.Beacon{Host: "h3", BootID: wr.BootID, State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: wr.Epoch, Incarnation: wr.Incarnation, Seq: wr.Seq}
			start := now.Add(time.Second)
			declared := ""
			for s := 1; s <= 120 && declared == ""; s++ {
				tnow := start.Add(time.Duration(s) * time.Second)
				for _, hh := range live {
					b.write(tnow, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c1.Tick(tnow) {
					if d.Op != OpDeclare || d.Host != "h3" {
						continue
					}
					if c.receipt {
						if c1.SealedBefore("h3", rc) {
							continue
						}
						if !c1.ReceiptStale("h3", rc, w.stored) && len(c1.ObserveWithdrawal(tnow, "h3", w.rev)) > 0 {
							continue
						}
					}
					declared = tnow.Sub(start).String()
				}
			}
			switch {
			case c.wantHole && declared == "":
				t.Fatalf("the hole is not reached: h3 not declared")
			case !c.wantHole && declared != "":
				t.Errorf("(S) h3, withdrawn at %d (its beacon came), declared %s after start: R's copy (sealed for %d, older than W) trusted by adjacency", w.rev, declared, P)
			}
			if declared != "" {
				t.Logf("h3 declared %s after start", declared)
			}
		})
	}
}
