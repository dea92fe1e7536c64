package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X97 (attack, (S)): reviewer X96's fix — no escape from the
// X93 bar while the host is beacon-withdrawn or beaconState.withdrew is
// set — and the X93 bar itself (a record older than h.beacons.wrote is
// not adjacent) live in the tracker's memory only. A controller restart
// between the host's withdrawal beacon and the copy gives the new tracker
// nothing of them: the controllers' memory (Memory) held only Beacons
// (bool) and a pin, and a host with no trusted record has no pin. The new
// tracker's wrote is zero, so every signed record of the host's passes
// the X93 bar and adjacency alone decides.
//
// Preconditions: X96's downward rollback (a restore from a backup older
// than the key's last delivered message; not attacker-caused), the host's
// old-life anchored create R (sealed for the node's marker P) lost in it,
// the host's orderly stop W at a reused revision below P — W's beacon
// reaches the running controller C1 (not lost) — then C1 restarts (an
// upgrade, a crash; a restarted controller finds no rollback: it has no
// delivered revisions to compare) before its rollback check ran. The
// compromised node:
//
//   - overwrites W with garbage before C2's listing (C2 lists garbage:
//     h3 tracked, nothing trusted, NeedsWritten);
//   - while the fleet renews (delivered live to C2), puts garbage on h3's
//     key at exactly P (filler writes to its own key line the revisions
//     up, X44's lever), then its copy of R right after: delivered live
//     with After = P, R.PrevRev = P — adjacent (C2's wrote is zero), so
//     written fresh: trusted active, h3 silent, declared lease_ttl +
//     grace later while its guests run.
//
// The receipt of another agent process (otherProc) does not stop it (X96:
// W's revision is below R's PrevRev, ObserveWithdrawal ignores it, below
// trustedRev); of R's own process SealedBefore does (X89's rule). C1, had
// it not restarted, refuses the copy (X96's test).
//
// cas (the same attack without the restart, nor adjacency: reviewer X97
// too): the node writes its copy by a compare-and-set on its garbage at P
// — written fresh by its stored header, which X93 to X96 assumed refuses
// such a copy ("where a compare-and-set on A, the header's proof, is no
// longer possible"): a rollback moving revisions down hands P out again.
// C1, running throughout, its beacons arrived, X96's withdrew set,
// trusted it and declared h3 21 s later.
//
// Fix: the memory carries the host's withdrawal beacon (its revision and
// the newest write its beacons named: Memory.Withdrew) and RestoreMemory
// hands them to the new tracker's beacon state — withdrew, wrote,
// wroteMax — unless a beacon it handled named a later revision
// (memoryWithdrewMutation); and a first record older than the write the
// host's beacons named is not trusted while its withdrawal stands,
// whatever its header or adjacency says (Tracker.withdrawnBar;
// withdrawnFreshMutation). The cases marked hole are declared.
func TestX97RestartForgetsWithdrawalBeforeAdjacentCopy(t *testing.T) {
	for _, c := range []struct {
		restart   bool
		cas       bool
		otherProc bool
		receipt   bool
		mut       *bool
		wantHole  bool
	}{
		{restart: true, otherProc: true},
		{restart: true, otherProc: true, receipt: true},
		{restart: true, receipt: true},
		{restart: true, cas: true, otherProc: true, receipt: true},
		{restart: true, otherProc: true, receipt: true, mut: &memoryWithdrewMutation, wantHole: true},
		{restart: true, cas: true, otherProc: true, receipt: true, mut: &memoryWithdrewMutation, wantHole: true},
		{cas: true, otherProc: true},
		{cas: true, otherProc: true, receipt: true},
		{cas: true, receipt: true},
		{cas: true, otherProc: true, receipt: true, mut: &withdrawnFreshMutation, wantHole: true},
		{restart: true, cas: true, otherProc: true, receipt: true, mut: &withdrawnFreshMutation, wantHole: true},
		// The adjacent copy (no cas): withdrawnBar is the one layer (X96's
		// rule, first a clause of adjacent, is now this bar).
		{otherProc: true, receipt: true, mut: &withdrawnFreshMutation, wantHole: true},
	} {
		name := fmt.Sprintf("restart=%t/cas=%t/otherProc=%t/receipt=%t", c.restart, c.cas, c.otherProc, c.receipt)
		switch c.mut {
		case &memoryWithdrewMutation:
			name += "/memoryWithdrewMutation"
		case &withdrawnFreshMutation:
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

			// R: h3's anchored create on P, at L+1, never delivered (its
			// beacon lost); then the restore.
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
			if w.rev+1 >= P || !(writeID{epoch: wr.Epoch, inc: wr.Incarnation, seq: wr.Seq}).newer(idOf(*r1.rec)) {
				t.Fatalf("rig: W at %d, want below P-1 = %d and newer than R", w.rev, P-1)
			}
			// W's beacon reaches C1 (the runner's order: ObserveBeacon,
			// BeaconWrote, BeaconVouches, then the withdrawal), and C1
			// writes its memories.
			b.tr = c1
			c1.ObserveBeacon(now, "h3", w.rev)
			c1.BeaconWrote("h3", w.rev, wr.Epoch, wr.Incarnation, wr.Seq)
			c1.BeaconVouches(now, "h3", w.rev, wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq)
			for _, d := range c1.ObserveWithdrawal(now, "h3", w.rev) {
				t.Logf("C1 beacon: %s", d.Reason)
			}
			if !c1.hosts["h3"].beaconWithdrawn() {
				t.Fatalf("rig: W's beacon did not make h3 withdrawn")
			}
			b.flush()
			c2 := c1
			b.stop()
			if c.restart {
				// C1 restarts; the node overwrites W before C2's listing.
				b.garbage(now.Add(200*time.Millisecond), "h3")
				c2 = b.start(now.Add(300 * time.Millisecond))
				if h := c2.hosts["h3"]; h == nil || h.trustedRev != 0 || !c2.NeedsWritten("h3") {
					t.Fatalf("rig: C2 should hold only garbage of h3, nothing trusted")
				}
			}
			// The fleet renews (delivered live to C2; C1 resumed its watch
			// at L+1 and is delivered nothing below it); the node lines its
			// garbage up at exactly P, then puts its copy of R after it.
			for i := 0; b.rev < P-1; i++ {
				b.write(now.Add(400*time.Millisecond), live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
			}
			b.garbage(now.Add(500*time.Millisecond), "h3")
			if b.keys["h3"].rev != P {
				t.Fatalf("rig: garbage at %d, want P = %d", b.keys["h3"].rev, P)
			}
			if !c.restart {
				for i := 0; b.rev < L; i++ {
					b.write(now.Add(500*time.Millisecond), live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
				b.tr = c1
			}
			cp := *r1.rec
			cw := fencing.Written{After: P} // its stored message unread: adjacency
			if c.cas {
				cw = fencing.Written{Known: true, HasExpected: true, Expected: P} // a compare-and-set on P
			}
			b.land(now.Add(600*time.Millisecond), "h3", x11Entry{rec: &cp, w: cw})
			h := c2.hosts["h3"]
			t.Logf("backup %d, P %d, L %d, W %d, copy at %d: C2 judges h3 by %s at %d, withdrew %d, withdrawn %t",
				backupRev, P, L, w.rev, b.keys["h3"].rev, h.rec.State, h.trustedRev, h.beacons.withdrew, h.beaconWithdrawn())

			rc := fencing.Beacon{Host: "h3", BootID: wr.BootID, State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: wr.Epoch, Incarnation: wr.Incarnation, Seq: wr.Seq}
			start := now.Add(time.Second)
			declared := ""
			for s := 1; s <= 120 && declared == ""; s++ {
				tnow := start.Add(time.Duration(s) * time.Second)
				for _, hh := range live {
					b.write(tnow, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c2.Tick(tnow) {
					if d.Op != OpDeclare || d.Host != "h3" {
						continue
					}
					if c.receipt {
						if c2.SealedBefore("h3", rc) {
							continue
						}
						if !c2.ReceiptStale("h3", rc, w.stored) && len(c2.ObserveWithdrawal(tnow, "h3", w.rev)) > 0 {
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
				t.Errorf("(S) h3, withdrawn at %d (its beacon came to C1), declared %s after the copy: R's copy (sealed for %d, older than W) trusted by adjacency", w.rev, declared, P)
			}
			if declared != "" {
				t.Logf("h3 declared %s after start", declared)
			}
		})
	}
}
