package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// x105LateWithdrawalOtherProcessCreate: X104's late withdrawal beacon
// over a create copy, the create of ANOTHER agent process than the
// withdrawal's. h3's agent process A (boot-1, incarnation 100) is trusted
// at Q. The node deletes h3's key (the marker hidden), so A's renewal R4
// is a create over it (prev_rev 0), hidden too (its beacon arrives). A
// then restarts (a crash, systemd's restart, an upgrade: no withdrawal);
// its successor B (boot-1, incarnation 200) stops at once (an orderly
// stop: guests keep running) and writes its withdrawal W on R4, hidden
// by the node's burst. The node deletes the key again (delivered) and
// lands a copy of A's create R4 — newer than the trusted record Q, of the
// trusted record's own process: trusted at X > W. B's withdrawal beacon
// is handled after that copy (~200 ms late).
func x105LateWithdrawalOtherProcessCreate(t *testing.T, beaconFirst bool, wBoot string, wInc uint64) (string, time.Duration, *Tracker, fencing.Beacon) {
	b, live := x100Fleet(t)
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	m := b.x103Hide(at, "h3", x11Entry{}) // the node's delete, hidden
	r4r := b.x104Seal("h3", fencing.LeaseActive, "boot-1", 100, 4, 0)
	r4 := b.x103Hide(at, "h3", x11Entry{rec: r4r, w: fencing.Written{Known: true, HasExpected: true, Expected: m.rev}})
	x104Beacon(b.tr, at, "h3", r4.rev, r4r)
	b.run(at, 1, live, nil)
	at = at.Add(time.Second)
	// A restarted; B (incarnation 200) withdraws on R4 as its first write.
	wr := b.x104Seal("h3", fencing.LeaseWithdrawn, wBoot, wInc, 1, r4.rev)
	w := b.x103Hide(at, "h3", x11Entry{rec: wr, w: fencing.Written{Known: true, HasExpected: true, Expected: r4.rev}})
	if beaconFirst {
		x104Beacon(b.tr, at, "h3", w.rev, wr)
	}
	b.x103Hide(at, "h3", x11Entry{garbage: true})
	b.del(at, "h3")
	cp := *r4r
	b.land(at, "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true}})
	if !beaconFirst {
		x104Beacon(b.tr, at.Add(200*time.Millisecond), "h3", w.rev, wr)
	}
	b.flush()
	hs := b.tr.hosts["h3"]
	t.Logf("after W's beacon: trusted %d (%s inc %d seq %d sealed for %d), withdrew %d (inc %d), withdrawnRev %d", hs.trustedRev, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rec.PrevRev, hs.beacons.withdrew, hs.beacons.withdrewInc, hs.beacons.withdrawnRev)
	host, after := b.x104Run(at, 150, live, "h3")
	rc := fencing.Beacon{Host: "h3", BootID: wBoot, State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 2, Incarnation: wInc, Seq: 1}
	return host, after, b.tr, rc
}

// TestX105LateWithdrawalBeaconOtherProcessCreateCopy (attack, (S):
// withdrawn host declared, guests running; faults needed: NONE in the
// tracker — W's beacon handled ~200 ms after the node's copy, as in
// X104's TestX104LateWithdrawalBeaconAfterCopy — plus an ordinary agent
// restart just before an orderly stop; reboot/: B is the next boot's
// agent, stopped at once — a reboot then a maintenance stop). X104's rule 1 makes a late
// withdrawal stand over a trusted create (prev_rev 0) only when the
// create is of the withdrawal's OWN process (sameProc) and older than
// the newest write the beacons named. Here the copied create is A's
// (incarnation 100) and the withdrawal B's (incarnation 200): over is
// false, withdrawnRev stays 0, beaconWithdrawn() is false, and h3 is
// judged by the copy of A's create — declared. beaconFirst (the
// control): X103's "earlier incarnation than the withdrawal's" refuses
// the copy. Receipt check: SealedBefore's other-process create case
// (A's beacons named nothing above W) stops it in the daemon — there it
// needs W's receipt missing as well (its write failed), as X104's did.
//
// Fixed: a late withdrawal beacon stands over a trusted create of another
// agent process whose beacons named nothing above the withdrawal — the
// receipt check's own rule (ObserveWithdrawalBy; lateOtherCreateMutation
// reopens it).
func TestX105LateWithdrawalBeaconOtherProcessCreateCopy(t *testing.T) {
	for _, c := range []struct {
		name  string
		first bool
		boot  string
		inc   uint64
		mut   bool
	}{
		{name: "beaconFirst", first: true, boot: "boot-1", inc: 200},
		{name: "beaconLate", boot: "boot-1", inc: 200},
		{name: "reboot/beaconFirst", first: true, boot: "boot-2", inc: 50},
		{name: "reboot/beaconLate", boot: "boot-2", inc: 50},
		// Fixed (lateOtherCreateMutation reopens it): the late beacon
		// stands over another process's create its beacons named nothing
		// above. The receipt check stops it either way.
		{name: "beaconLate/lateOtherCreateMutation", boot: "boot-1", inc: 200, mut: true},
		{name: "reboot/beaconLate/lateOtherCreateMutation", boot: "boot-2", inc: 50, mut: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x32Mutate(t, &lateOtherCreateMutation)
			}
			host, after, tr, rc := x105LateWithdrawalOtherProcessCreate(t, c.first, c.boot, c.inc)
			sealed := tr.SealedBefore("h3", rc)
			t.Logf("declared %q after %s; receipt SealedBefore %t", host, after, sealed)
			if c.mut {
				if host == "" || !sealed {
					t.Fatalf("mutation: declared %q, receipt SealedBefore %t — want the tracker's hole, stopped by the receipt", host, sealed)
				}
				return
			}
			if host != "" {
				t.Errorf("(S) withdrawn h3 declared %s (receipt SealedBefore: %t)", after, sealed)
			}
		})
	}
}
