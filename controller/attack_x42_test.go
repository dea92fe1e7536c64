package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X42: attacks on the rollback carries (9dddd57, 8ca7a08).

// TestX42RecentCutOffNotCarriedEndsHold (S1, no attacker: a lease-stream
// rollback to a backup — X25's scenario — with the rack cut off shortly
// before the rollback is found instead of 40 s before).
//
// KeepCounted (X25's fix) carries only the hosts the stopped tracker
// COUNTED silent when it found the rollback (CountedSilent at now). A
// host of a rack cut off less than its suspect_after before that moment
// is silent but not yet counted: not carried. The backup holds the old
// withdrawals of h1..h5 (an earlier maintenance stop; they came back
// since); the fresh tracker lists them withdrawn — never counted — and
// h1..h5, cut off, never write again to end that (keys-gone: h1..h5
// joined after the backup; the fresh tracker does not track them at all). It counts h6..h12 only
// (7 < 10): no hold, and the Held h6..h12 (guests running) are declared
// lease_ttl + grace after its start. The rollback check runs every 2 s
// (RollbackCheckInterval; at once on a reconnect), suspect_after is
// renew_interval + renew_timeout: the window is real.
//
// Controls: the same short cut-off with a backup holding h1..h5 active
// (nothing resurrected) holds; a cut-off 5 s or 40 s (X25) before — the
// hosts counted, so carried — holds. The attack cases: cut off at the
// moment the rollback is found (0 s) or 2 s before.
// Fix direction: carry every host the stopped tracker knew ACTIVE by a
// record newer than the listed one (not only those counted silent) — as
// counted once silent, until a newer record comes — or count a listed
// withdrawal older than a carried active record as that record's host.
func TestX42RecentCutOffNotCarriedEndsHold(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name      string
		withdrawn bool // the backup holds h1..h5's old withdrawals
		cutSecs   int  // the rack cut off this long before the rollback is found
		wantHeld  bool
		gone      bool // the backup holds no key of h1..h5 (they joined since)
		mut       *bool
	}{
		{"control-no-resurrection/cut-2s", false, 2, true, false, nil},
		{"control-X25/cut-40s", true, 40, true, false, nil},
		{"control-counted/resurrected/cut-5s", true, 5, true, false, nil},
		{"attack/resurrected/cut-0s", true, 0, false, false, nil},
		{"attack/resurrected/cut-2s", true, 2, false, false, nil},
		{"attack/keys-gone/cut-2s", false, 2, false, true, nil},
		{"attack/resurrected/cut-2s/countedFromMutation", true, 2, false, false, &countedFromMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, hosts := x11Fleet(t, 60, 5)
			maint := x10Names(1, 6)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			if c.withdrawn {
				for _, h := range maint { // maintenance: orderly stops
					b.write(at, h, fencing.LeaseWithdrawn, b.guard.Ref())
					b.tr.ObserveWithdrawal(at, h, b.keys[h].rev)
					b.flush()
				}
				b.run(at, 3, x11Without(hosts, maint...), nil)
				at = at.Add(3 * time.Second)
			}
			backup, backupRev := maps.Clone(b.keys), b.rev
			if c.gone {
				for _, h := range maint {
					delete(backup, h)
				}
			}
			b.run(at, 30, hosts, nil) // h1..h5 back (their agents restarted)
			at = at.Add(30 * time.Second)
			if host, _ := b.run(at, c.cutSecs, live, x10Set(rack)); host != "" {
				t.Fatalf("C1 declared %q (rig)", host)
			}
			at = at.Add(time.Duration(c.cutSecs) * time.Second)
			detect := at.Add(500 * time.Millisecond)
			t.Logf("rack cut off %d s: C1 counts %d silent (threshold %d), holding %t", c.cutSecs, b.tr.Silent(detect), b.tr.Threshold(), b.tr.Holding())
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(detect, start)
			if h1 := b.tr.hosts["h1"]; h1 != nil {
				t.Logf("carried %d withdrawn, %d counted; fresh tracker: h1 %q", len(carry.withdrawn), len(carry.counted), h1.rec.State)
			} else {
				t.Logf("carried %d withdrawn, %d counted; fresh tracker: h1 not tracked", len(carry.withdrawn), len(carry.counted))
			}
			host, after := b.run(start, 120, live, x10Set(rack))
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation no Held host was declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: the Held %s declared %s after the fresh start", host, after)
				return
			case c.wantHeld && host != "":
				t.Fatalf("control: the Held %s declared %s after the fresh start (rig)", host, after)
			case host != "":
				t.Fatalf("the Held %s (rack cut off %d s before the rollback was found, guests running) declared %s after the fresh tracker's start: h1..h5, silent but not yet counted when the rollback was found, were not carried (CountedSilent/KeepCounted); listed withdrawn (resurrected) or not at all, the fresh tracker never counts them (silent %d, threshold %d)",
					host, c.cutSecs, after, b.tr.Silent(start.Add(after)), b.tr.Threshold())
			}
			t.Logf("no Held host declared; holding %t", b.tr.Holding())
		})
	}
}

// TestX42HeldListedOlderWithdrawalCarriedActive (HELD, passes): X41's
// scenario with the stopped tracker knowing h3's second withdrawal W1 by
// its beacon only (W1 overwritten by garbage before the watch delivered
// it): the carry is h3's last trusted ACTIVE record R10, the rollback lists
// the older W0. KeepWithdrawn (9dddd57) sets the bar (h.carried = R10),
// h.rec stays W0: copies of R5 and of R10 itself (a tie) are refused;
// h3 is not declared. "alive": h3 instead was alive (only possibly
// withdrawn) and renews after the fresh start: its records are trusted
// (newer than the bar) and, once it dies, it is declared.
// listedWithdrawnBarMutation: the copy of R5 gets the withdrawn h3
// declared (the bar is what holds).
func TestX42HeldListedOlderWithdrawalCarriedActive(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name  string
		alive bool
		copy  uint64
		mut   *bool
	}{
		{name: "copy-R5", copy: 5},
		{name: "copy-R10-tie", copy: 10},
		{name: "alive-renews-then-dies", alive: true},
		{name: "copy-R5/listedWithdrawnBarMutation", copy: 5, mut: &listedWithdrawnBarMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.mut != nil {
				x32Mutate(t, &rollbackBarMutation) // the rollback bar refuses the copy too (X24's reused-revision replays)
			}
			if c.mut != nil { // X43's checks refuse the copy too
				x32Mutate(t, &prevRevMutation)
				x32Mutate(t, &carryWrittenMutation)
			}
			b, hosts := x11Fleet(t, 60, 5)
			const target = "h3"
			others := x11Without(hosts, target)
			at := t0.Add(5 * time.Second)
			var seq uint64
			inc := uint64(1)
			kept := map[uint64]fencing.LeaseRecord{}
			tick := func(secs int, on bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if on {
						seq++
						r := x38Put(b, now.Add(500*time.Millisecond), target, fencing.LeaseActive, inc, seq)
						if inc == 2 {
							kept[seq] = r
						}
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(3, true)
			seq++
			x38Put(b, at, target, fencing.LeaseWithdrawn, inc, seq) // W0
			tick(5, false)
			backup, backupRev := maps.Clone(b.keys), b.rev // h3: W0
			inc, seq = 2, 0
			tick(10, true)
			if !c.alive {
				// W1, overwritten by garbage before the watch delivered it;
				// its beacon comes.
				c1 := b.tr
				b.tr = nil
				seq++
				x38Put(b, at, target, fencing.LeaseWithdrawn, inc, seq)
				wRev := b.rev
				b.tr = c1
				b.tr.Skipped(wRev + 1)
				b.garbage(at, target)
				b.tr.ObserveBeacon(at, target, wRev)
				b.tr.ObserveWithdrawal(at, target, wRev)
				b.flush()
				tick(3, false)
			}
			var carry *rollbackCarry
			if c.alive {
				// Possibly withdrawn (beacons lost, X26): carried as the
				// runner would hand it on.
				c1 := b.tr
				b.rollBack(maps.Clone(backup), backupRev)
				carry = &rollbackCarry{withdrawn: []CarriedHost{{Host: target, Record: kept[10], Why: "it may have withdrawn: beacons were lost"}}, counted: c1.CountedSilent(at), rev: b.delivered}
				c1.StreamRolledBack(at, "test")
				b.stop()
				b.startCarry(at.Add(time.Second), carry)
			} else {
				b.rollBack(maps.Clone(backup), backupRev)
				carry = b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
			}
			at = at.Add(time.Second)
			for _, w := range carry.withdrawn {
				if w.Host == target {
					t.Logf("carried h3 inc %d seq %d %q (%s)", w.Record.Incarnation, w.Record.Seq, w.Record.State, w.Why)
				}
			}
			h := b.tr.hosts[target]
			t.Logf("fresh tracker: h3 %q inc %d seq %d, bar set %t", h.rec.State, h.rec.Incarnation, h.rec.Seq, h.carried != nil)
			now := at
			if c.alive {
				for i := 0; i < 5; i++ {
					seq++
					x38Put(b, now, target, fencing.LeaseActive, inc, seq)
					b.run(now, 1, others, nil)
					now = now.Add(time.Second)
				}
				h := b.tr.hosts[target]
				if h.rec.State != fencing.LeaseActive || h.rec.Seq != seq {
					t.Fatalf("the alive h3's renewals not trusted: %q seq %d (want seq %d)", h.rec.State, h.rec.Seq, seq)
				}
				host, after := b.run(now, 120, others, map[string]bool{target: true})
				if host == "" {
					t.Fatalf("the alive h3, dead after renewing, never declared")
				}
				t.Logf("alive h3 trusted; dead, declared %s later", after)
				return
			}
			for i := 0; i < 25; i++ {
				b.run(now, 1, others, nil)
				now = now.Add(time.Second)
			}
			cp := kept[c.copy]
			cur := b.keys[target]
			b.land(now, target, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			h = b.tr.hosts[target]
			t.Logf("copy of inc 2 seq %d put back: h3 %q seq %d", c.copy, h.rec.State, h.rec.Seq)
			host, after := b.run(now, 120, others, map[string]bool{target: true})
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation h3 was not declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: h3 declared %s after the copy", after)
			case host != "":
				t.Fatalf("the withdrawn h3 declared %s after the copy", after)
			}
		})
	}
}

// TestX42HeldBeaconBranchCounting (HELD, passes; a probe of 9dddd57's
// beacon-withdrawn branch): the fresh tracker lists h3's older ACTIVE
// record R3 (the backup), h3's withdrawal beacon arrives during the
// listing (as the runner hands it: ObserveBeacon, then ObserveWithdrawal),
// and the carry is h3's withdrawn record W (seq 7). KeepWithdrawn now sets
// h.rec = W (h.trustedRev stays R3's): a withdrawn record is not counted
// unless a beacon named a later write — and the withdrawal beacon itself
// did (corroboratedRev > trustedRev), so h3 counts silent from
// suspect_after on, as before the change (then by the beacon-only X13
// rule): counting is the same with and without the mutation.
func TestX42HeldBeaconBranchCounting(t *testing.T) {
	for _, mut := range []bool{false, true} {
		name := "current"
		if mut {
			name = "listedWithdrawnBarMutation"
		}
		t.Run(name, func(t *testing.T) {
			if mut {
				x32Mutate(t, &listedWithdrawnBarMutation)
			}
			b, hosts := x11Fleet(t, 60, 5)
			const target = "h3"
			others := x11Without(hosts, target)
			at := t0.Add(5 * time.Second)
			kept := map[uint64]fencing.LeaseRecord{}
			var seq uint64
			put := func(st fencing.LeaseState) {
				seq++
				kept[seq] = x38Put(b, at, target, st, 1, seq)
				b.run(at, 1, others, nil)
				at = at.Add(time.Second)
			}
			for i := 0; i < 3; i++ {
				put(fencing.LeaseActive)
			}
			backup, backupRev := maps.Clone(b.keys), b.rev
			for i := 0; i < 3; i++ {
				put(fencing.LeaseActive)
			}
			put(fencing.LeaseWithdrawn) // W, seq 7
			b.run(at, 3, others, nil)
			at = at.Add(3 * time.Second)
			c1 := b.tr
			carry := carryOn(nil, c1, at, b.delivered)
			c1.StreamRolledBack(at, "test")
			b.stop()
			b.rollBack(maps.Clone(backup), backupRev)
			start := at.Add(time.Second)
			tr := x46List(t, b, start)
			wr := b.keys[target].rev + 100 // h3's withdrawal beacon, during the listing
			tr.ObserveBeacon(start, target, wr)
			tr.ObserveWithdrawal(start, target, wr)
			tr.WatchStarted(start)
			tr.AfterRollback(carry.rev)
			carry.applyTo(tr)
			tr.RestoreGuard(b.guard)
			b.tr = tr
			h := tr.hosts[target]
			t.Logf("fresh: h3 %q seq %d trustedRev %d corroboratedRev %d beaconWithdrawn %t bar %t", h.rec.State, h.rec.Seq, h.trustedRev, h.beacons.corroboratedRev, h.beaconWithdrawn(), h.carried != nil)
			t.Logf("h3 counted: at start %t, +10s %t, +60s %t", tr.counted(h, start), tr.counted(h, start.Add(10*time.Second)), tr.counted(h, start.Add(60*time.Second)))
			if !tr.counted(h, start.Add(60*time.Second)) {
				t.Fatalf("h3 not counted 60 s on (the branch changed counting)")
			}
		})
	}
}
