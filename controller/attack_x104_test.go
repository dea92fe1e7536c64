package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// x104Seal returns a signed record of host's agent (boot, inc, seq) in
// state st sealed for prev.
func (b *x11Bucket) x104Seal(host string, st fencing.LeaseState, boot string, inc, seq, prev uint64) *fencing.LeaseRecord {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = host + "-key genuine-signature"
	r.BootID, r.Epoch, r.Incarnation, r.Seq = boot, 2, inc, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	r.PrevRev = prev
	return r
}

// x104Beacon: host's beacon for its record r at rev reaches the tracker
// (runner order), with the withdrawal's for a withdrawn record.
func x104Beacon(tr *Tracker, now time.Time, host string, rev uint64, r *fencing.LeaseRecord) {
	tr.ObserveBeacon(now, host, rev)
	tr.BeaconWrote(host, rev, r.Epoch, r.Incarnation, r.Seq)
	tr.BeaconVouches(now, host, rev, r.BootID, r.Epoch, r.Incarnation, r.Seq)
	if r.State == fencing.LeaseWithdrawn {
		tr.ObserveWithdrawalBy(now, host, rev, r.BootID, r.Incarnation)
	}
}

// x104LateWithdrawalBeacon: h3 (boot-1, incarnation 100) trusted at Q;
// it writes its renewal R4 on Q and then its withdrawal W on R4, both
// hidden by the node's burst (R4's beacon arrives). Before W's beacon
// is handled, the node lands a copy of R4 (sealed for Q = h.rev).
// Then W's beacon arrives.
func x104LateWithdrawalBeacon(t *testing.T, beaconFirst bool) (string, time.Duration, *Tracker, fencing.Beacon) {
	b, live := x100Fleet(t)
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	r4 := b.x103HiddenWrite(at, "h3", fencing.LeaseActive, "boot-1", 100, 4)
	b.run(at, 1, live, nil)
	at = at.Add(time.Second)
	wr := b.x104Seal("h3", fencing.LeaseWithdrawn, "boot-1", 100, 5, r4.rev)
	w := b.x103Hide(at, "h3", x11Entry{rec: wr, w: fencing.Written{Known: true, HasExpected: true, Expected: r4.rev}})
	if beaconFirst {
		x104Beacon(b.tr, at, "h3", w.rev, wr)
	}
	b.x103Hide(at, "h3", x11Entry{garbage: true})
	cp := *r4.rec
	b.land(at, "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true}})
	if !beaconFirst {
		x104Beacon(b.tr, at.Add(200*time.Millisecond), "h3", w.rev, wr)
	}
	b.flush()
	hs := b.tr.hosts["h3"]
	t.Logf("after W's beacon: trusted %d (%s seq %d sealed for %d), withdrew %d, withdrawnRev %d", hs.trustedRev, hs.rec.State, hs.rec.Seq, hs.rec.PrevRev, hs.beacons.withdrew, hs.beacons.withdrawnRev)
	host, after := b.x104Run(at, 150, live, "h3")
	rc := fencing.Beacon{Host: "h3", BootID: "boot-1", State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 2, Incarnation: 100, Seq: 5}
	return host, after, b.tr, rc
}

// TestX104LateWithdrawalBeaconAfterCopy (attack, (S): withdrawn host
// declared; faults needed: NONE — W's beacon handled ~200 ms after the
// node's copy: the runner's select takes beacons and watch updates in no
// order, the agent flushes its withdrawal beacon for up to 1 s, and
// reviewer X81 made beacons 141–559 ms late by flooding the node's own
// beacon subject). X103's rules hold only while beaconWithdrawn
// (withdrawnRev > trustedRev); ObserveWithdrawalBy sets withdrawnRev
// only for a withdrawal after the trusted record. h3 (boot-1, 100)
// trusted at Q writes R4 on Q and W on R4; the node's burst hides both
// (R4's beacon arrives), then it lands a copy of R4 (sealed for Q =
// h.rev: not a replay, not held back, no withdrawal standing yet):
// trusted at X > W. W's beacon then comes: withdrew = W, but W < X so
// withdrawnRev stays 0, beaconWithdrawn() is false, and h3 — withdrawn,
// guests running — is declared 22 s later. beaconFirst (the control):
// X103's (a) refuses the copy. Receipt check: W's receipt is
// SealedBefore the trusted copy (sealed for Q < W < X):
// ErrReceiptAfterSeal stops it in the daemon — so there it needs W's
// receipt missing (its write failed) too.
//
// Fixed: ObserveWithdrawalBy takes a withdrawal between the trusted
// record's PrevRev and its revision as standing (withdrawnRev =
// trustedRev + 1, as a rollback's carry); lateWithdrawalMutation
// reopens it.
func TestX104LateWithdrawalBeaconAfterCopy(t *testing.T) {
	for _, c := range []struct {
		name  string
		first bool
		mut   *bool
	}{
		{name: "beaconFirst", first: true},
		{name: "beaconLate"},
		{name: "beaconLate/mut", mut: &lateWithdrawalMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			host, after, tr, rc := x104LateWithdrawalBeacon(t, c.first)
			sealed := tr.SealedBefore("h3", rc)
			t.Logf("declared %q after %s; receipt SealedBefore %t", host, after, sealed)
			if c.mut != nil {
				if host == "" || !sealed {
					t.Fatalf("mutation: withdrawn h3 not declared (or the receipt would not stop it) — the rig does not reach the hole")
				}
				return
			}
			if host != "" {
				t.Errorf("(S) withdrawn h3 declared %s", after)
			}
		})
	}
}

// x104Run is x11Bucket.run with the runner's missing-beacon check
// (BeaconsMissing) before each tick.
func (b *x11Bucket) x104Run(from time.Time, secs int, live []string, protect string) (string, time.Duration) {
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		for _, h := range live {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		b.tr.BeaconsMissing(now)
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == protect {
				return d.Host, now.Sub(from)
			}
		}
	}
	return "", 0
}

// x104LateWithdrawalCreate: X104's late beacon, the hidden renewal a
// create: the node deleted h3's key (the marker hidden too) so h3's R4 is
// a create over it; W on R4; both hidden; the node deletes the key again
// (delivered) and lands a copy of R4 (a create of the trusted record's
// own process, newer: not a replay). Then W's beacon arrives.
func x104LateWithdrawalCreate(t *testing.T, beaconFirst bool) (string, time.Duration, *Tracker, fencing.Beacon) {
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
	wr := b.x104Seal("h3", fencing.LeaseWithdrawn, "boot-1", 100, 5, r4.rev)
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
	t.Logf("after W's beacon: trusted %d (%s seq %d sealed for %d), withdrew %d, withdrawnRev %d", hs.trustedRev, hs.rec.State, hs.rec.Seq, hs.rec.PrevRev, hs.beacons.withdrew, hs.beacons.withdrawnRev)
	host, after := b.x104Run(at, 150, live, "h3")
	rc := fencing.Beacon{Host: "h3", BootID: "boot-1", State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 2, Incarnation: 100, Seq: 5}
	return host, after, b.tr, rc
}

// TestX104LateWithdrawalBeaconAfterCreateCopy (attack, (S): withdrawn
// host declared). beaconFirst: faults needed NONE — X103's (a) exempts
// creates (PrevRev 0) and (b) spares the withdrawal's own process, so
// the copy of the process's hidden create R4 (made a create by the
// node's delete before it) is trusted above W with W's beacon handled:
// h3 declared 22 s later. beaconLate: the same with W's beacon handled
// after the copy (X104's first case, for a create). Receipt check:
// SealedBefore (same process, W newer than the record) stops both in
// the daemon — there they need W's receipt missing too.
//
// Fixed: while the withdrawal stands, a record of its own process older
// than the newest write the beacons named is refused
// (withdrawalProcessOlderMutation reopens beaconFirst); a late withdrawal
// beacon of the trusted create's process, newer than it, stands
// (lateWithdrawalMutation reopens beaconLate).
func TestX104LateWithdrawalBeaconAfterCreateCopy(t *testing.T) {
	for _, c := range []struct {
		name  string
		first bool
		mut   *bool
	}{
		{name: "beaconFirst", first: true},
		{name: "beaconLate"},
		{name: "beaconFirst/mut", first: true, mut: &withdrawalProcessOlderMutation},
		{name: "beaconLate/mut", mut: &lateWithdrawalMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			host, after, tr, rc := x104LateWithdrawalCreate(t, c.first)
			sealed := tr.SealedBefore("h3", rc)
			t.Logf("declared %q after %s; receipt SealedBefore %t", host, after, sealed)
			if c.mut != nil {
				if host == "" || !sealed {
					t.Fatalf("mutation: withdrawn h3 not declared (or the receipt would not stop it) — the rig does not reach the hole")
				}
				return
			}
			if host != "" {
				t.Errorf("(S) withdrawn h3 declared %s", after)
			}
		})
	}
}
