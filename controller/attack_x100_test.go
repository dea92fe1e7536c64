package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X100 (attack, (S), fixed): X97's bar (withdrawnBar) and X93's
// adjacency bar both compare the copy with h.beacons.wrote by writeID
// (epoch, incarnation, seq) — which orders no boots (X94's own finding).
// X97's scenario with one change: the withdrawal W is written by a NEW
// boot of h3 that lost its durable state (X94: it restarts at a lower
// epoch/incarnation/seq), while the copy R is the OLD boot's anchored
// create (higher epoch), lost in the downward rollback. W's beacon sets
// withdrew and wrote = W's id, but wrote.newer(R) is false: neither bar
// applies, R's copy (CAS-aligned on the reused revision P, or adjacent)
// is trusted as h3's first record, and h3 — withdrawn, its guests
// running — is declared once R's lease lapses.
//
// Preconditions are X97's (a downward rollback, not attacker-caused) plus
// X94's (a boot with its durable state lost before the orderly stop).
//
// Fixed: while the withdrawal stands, a first record of another boot than
// the withdrawal's is not trusted (withdrawnBar, withdrawnBootMutation;
// the boot kept across a restart, memoryWithdrewBootMutation), and
// beacons received before the withdrawal vouch for nothing (the named
// cases: R's own beacon came before the rollback, the copy lands at R's
// revision; namedFloorMutation).
func TestX100OldBootCopyRefusedWhileWithdrawn(t *testing.T) {
	type x100Case struct {
		restart, cas, control, named bool
		mut                          *bool
		mutName                      string
	}
	cases := []x100Case{
		{restart: false, cas: true},
		{restart: true, cas: true},
		{restart: true, cas: false},
		// control: W of the same boot, newer by writeID (X97's case):
		// refused by writeID alone.
		{restart: false, cas: true, control: true},
		{restart: true, cas: true, control: true},
		{restart: true, cas: false, control: true},
		// named: R's own beacon reached the running controller before the
		// rollback (the agent beacons every write; the watch, stopped,
		// did not deliver R), and the copy lands at R's revision with no
		// provable header: the vouch path.
		{restart: false, named: true},
		{restart: false, named: true, control: true},
		// The holes, each layer off.
		{restart: false, cas: true, mut: &withdrawnBootMutation, mutName: "withdrawnBootMutation"},
		{restart: true, cas: true, mut: &withdrawnBootMutation, mutName: "withdrawnBootMutation"},
		{restart: true, cas: false, mut: &withdrawnBootMutation, mutName: "withdrawnBootMutation"},
		{restart: true, cas: true, mut: &memoryWithdrewBootMutation, mutName: "memoryWithdrewBootMutation"},
		{restart: false, named: true, mut: &namedFloorMutation, mutName: "namedFloorMutation"},
	}
	for _, c := range cases {
		name := fmt.Sprintf("restart=%t/cas=%t/control=%t/named=%t", c.restart, c.cas, c.control, c.named)
		if c.mut != nil {
			name += "/" + c.mutName
		}
		t.Run(name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			x := x100Rollback(t)
			b, live, backup, backupRev, P := x.b, x.live, x.backup, x.backupRev, x.P
			c1, L, now := x.c1, x.L, x.now

			// R: the OLD boot's anchored create on P (epoch 5), never
			// delivered; then the restore loses it.
			b.tr = nil
			r1 := b.x93Write(now, "h3", fencing.LeaseActive, 40, P)
			old := *r1.rec
			old.BootID, old.Epoch, old.Incarnation, old.Seq = "h3-boot-1", 5, 3, 40
			R := r1.rev
			if c.named {
				c1.ObserveBeacon(now, "h3", R)
				c1.BeaconWrote("h3", R, old.Epoch, old.Incarnation, old.Seq)
				c1.BeaconVouches(now, "h3", R, old.BootID, old.Epoch, old.Incarnation, old.Seq)
			}
			b.rollBack(backup, backupRev)
			b.write(now, live[0], fencing.LeaseActive, b.guard.Ref())
			// W: a NEW boot (durable state lost: epoch 1) withdraws.
			wr := old
			wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq = "h3-boot-2", 1, 1, 1
			if c.control {
				wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq = "h3-boot-1", 5, 3, 41
			}
			wr.State, wr.Reason, wr.PrevRev = fencing.LeaseWithdrawn, "orderly-stop", 0
			b.land(now.Add(100*time.Millisecond), "h3", x11Entry{rec: &wr, w: fencing.Written{Known: true}})
			w := b.keys["h3"]
			if w.rev+1 >= P {
				t.Fatalf("rig: W at %d, want below P-1 = %d", w.rev, P-1)
			}
			b.tr = c1
			c1.ObserveBeacon(now, "h3", w.rev)
			c1.BeaconWrote("h3", w.rev, wr.Epoch, wr.Incarnation, wr.Seq)
			c1.BeaconVouches(now, "h3", w.rev, wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq)
			c1.ObserveWithdrawalBy(now, "h3", w.rev, wr.BootID, 0)
			if !c1.hosts["h3"].beaconWithdrawn() && c1.hosts["h3"].beacons.withdrew == 0 {
				t.Fatalf("rig: W's beacon did not make h3 withdrawn")
			}
			b.flush()
			c2 := c1
			b.stop()
			if c.restart {
				b.garbage(now.Add(200*time.Millisecond), "h3")
				c2 = b.start(now.Add(300 * time.Millisecond))
			}
			for i := 0; b.rev < P-1; i++ {
				b.write(now.Add(400*time.Millisecond), live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
			}
			b.garbage(now.Add(500*time.Millisecond), "h3")
			if b.keys["h3"].rev != P {
				t.Fatalf("rig: garbage at %d, want P = %d", b.keys["h3"].rev, P)
			}
			if c.named {
				for i := 0; b.rev < R-1; i++ {
					b.write(now.Add(500*time.Millisecond), live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
			}
			if !c.restart {
				for i := 0; b.rev < L; i++ {
					b.write(now.Add(500*time.Millisecond), live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
				b.tr = c1
			}
			cp := old
			cw := fencing.Written{After: P}
			if c.cas {
				cw = fencing.Written{Known: true, HasExpected: true, Expected: P}
			}
			if c.named {
				cw = fencing.Written{} // no stored message read, not adjacent
				if b.rev != R-1 {
					t.Fatalf("rig: the copy lands at %d, want R = %d", b.rev+1, R)
				}
			}
			b.land(now.Add(600*time.Millisecond), "h3", x11Entry{rec: &cp, w: cw})
			h := c2.hosts["h3"]
			t.Logf("P %d, L %d, W %d, copy at %d: h3 judged by %v at %d, withdrew %d, withdrawn %t",
				P, L, w.rev, b.keys["h3"].rev, h.rec, h.trustedRev, h.beacons.withdrew, h.beaconWithdrawn())

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
					// The runner's receipt checks (as X97's test).
					if c2.SealedBefore("h3", rc) {
						continue
					}
					if !c2.ReceiptStale("h3", rc, w.stored) && len(c2.ObserveWithdrawalBy(tnow, "h3", w.rev, rc.BootID, 0)) > 0 {
						continue
					}
					declared = tnow.Sub(start).String()
				}
			}
			if c.control && declared != "" {
				t.Fatalf("control: same-boot newer W, h3 declared %s (the rig, not the boot order)", declared)
			}
			if c.mut != nil {
				if declared == "" {
					t.Fatalf("mutation: h3 not declared — the layer it switches off is not what refuses the copy")
				}
				return
			}
			if declared != "" {
				t.Errorf("(S) h3, withdrawn by its new boot at %d (its beacon came), declared %s after the copy of its OLD boot's create (sealed for %d, epoch 5 > W's 1)", w.rev, declared, P)
			}
		})
	}
}

// TestX100NewBootAfterWithdrawalPrice: the price of X100's boot rule,
// shown with no rollback at all. h3 (boot-1) withdrew, its beacon and
// record handled; a controller restart found garbage on its key (nothing
// trusted, Memory.Withdrew restored with boot-1); h3 came back on a new
// boot, its records newer by write identity and by revision. With its
// beacons, the first one (naming a revision above the withdrawal's) ends
// the withdrawal and h3 is trusted — and declared once it dies. With every
// one of them lost, its records are another boot's while the withdrawal
// stands: never trusted, and dead, never declared ((c), documented in
// docs/security.md) — where before the rule they were trusted
// (withdrawnBootMutation).
func TestX100NewBootAfterWithdrawalPrice(t *testing.T) {
	for _, c := range []struct {
		beacons bool
		mut     *bool
		want    bool // declared once dead
	}{
		{beacons: true, want: true},
		{beacons: false, want: false},
		{beacons: false, mut: &withdrawnBootMutation, want: true},
	} {
		t.Run(fmt.Sprintf("beacons=%t/mut=%t", c.beacons, c.mut != nil), func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, live := x100Fleet(t)
			at := t0
			for seq := uint64(1); seq <= 3; seq++ {
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
			}
			w := b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, true)
			if m := b.mem["h3"].Withdrew; m == nil || m.Boot != "boot-1" {
				t.Fatalf("rig: memory %+v, want the withdrawal of boot-1", m)
			}
			b.stop()
			b.garbage(at, "h3")
			c2 := b.start(at.Add(100 * time.Millisecond))
			if h := c2.hosts["h3"]; h.trustedRev != 0 || h.beacons.withdrewBoot != "boot-1" {
				t.Fatalf("rig: restarted controller trusts %d, withdrawal of %q", h.trustedRev, h.beacons.withdrewBoot)
			}
			for s := uint64(1); s <= 3; s++ {
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
				if e := b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", 3, 1, s, c.beacons); e.rev <= w.rev {
					t.Fatalf("rig: new boot's write at %d, want above W %d", e.rev, w.rev)
				}
			}
			h := c2.hosts["h3"]
			t.Logf("new boot: trusted %d, withdrew %d (%q)", h.trustedRev, h.beacons.withdrew, h.beacons.withdrewBoot)
			declared := false
			for i := 1; i <= 120 && !declared; i++ {
				now := at.Add(time.Duration(i) * time.Second)
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c2.Tick(now) {
					declared = declared || d.Op == OpDeclare && d.Host == "h3"
				}
			}
			if declared != c.want {
				t.Errorf("dead h3 declared %t, want %t", declared, c.want)
			}
		})
	}
}

// x100Fleet: a running controller (signing required, memory on) over
// h0..h9, every host but h3 renewed once at t0, the guard published — the
// setting of reviewers X100 to X105's rigs, h3's records theirs to write.
func x100Fleet(t *testing.T) (*x11Bucket, []string) {
	b := newX11Bucket(t)
	live := x11Without(x10Names(0, 10), "h3")
	b.tr = x10Tracker(t)
	for _, h := range live {
		b.write(t0, h, fencing.LeaseActive, nil)
	}
	b.publish()
	return b, live
}

// x100Setting: reviewer X100's setting (X97's, shared by X101's rigs):
// x100Fleet renewed for 2 s, a backup of the bucket taken (backup,
// backupRev), 5 s more, h3's key deleted at P, 2 s more; c1 is the
// running controller's tracker, L the last revision its watch was
// delivered, now half a second later.
type x100Setting struct {
	b               *x11Bucket
	live            []string
	backup          map[string]x11Entry
	backupRev, P, L uint64
	c1              *Tracker
	now             time.Time
}

func x100Rollback(t *testing.T) x100Setting {
	b, live := x100Fleet(t)
	b.run(t0, 2, live, nil)
	at := t0.Add(2 * time.Second)
	backup, backupRev := maps.Clone(b.keys), b.rev
	b.run(at, 5, live, nil)
	at = at.Add(5 * time.Second)
	b.del(at, "h3")
	P := b.keys["h3"].rev
	b.run(at, 2, live, nil)
	at = at.Add(2 * time.Second)
	return x100Setting{b: b, live: live, backup: backup, backupRev: backupRev, P: P, L: b.rev, c1: b.tr, now: at.Add(500 * time.Millisecond)}
}

// TestBeaconBoxKeepsWithdrawalBoot: the runner's box hands the tracker the
// newest withdrawal beacon of a host with the boot that wrote it
// (ObserveWithdrawalBy; reviewer X100's rule needs it).
func TestBeaconBoxKeepsWithdrawalBoot(t *testing.T) {
	box := newBeaconBox()
	for _, b := range []fencing.Beacon{
		{Host: "h3", BootID: "boot-1", Revision: 5, State: fencing.LeaseWithdrawn},
		{Host: "h3", BootID: "boot-0", Revision: 3, State: fencing.LeaseWithdrawn}, // late: older
	} {
		if err := box.put("h3", b, true); err != nil {
			t.Fatal(err)
		}
	}
	_, w := box.take()
	if got := w["h3"]; got != (withdrawalRef{rev: 5, boot: "boot-1"}) {
		t.Fatalf("withdrawal %+v, want revision 5 of boot-1", got)
	}
	if err := box.put("h3", fencing.Beacon{Host: "h3", BootID: "boot-2", Revision: 9}, true); err != nil {
		t.Fatal(err)
	}
	if _, w = box.take(); w["h3"] != (withdrawalRef{rev: 9, boot: "boot-2"}) {
		t.Fatalf("withdrawal %+v, want revision 9 of boot-2", w["h3"])
	}
}
