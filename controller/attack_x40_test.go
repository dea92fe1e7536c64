package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X40: attacks on the rollback carries (8e8123c).

// x40Rewatch: the running Runner's watch failed and is re-established
// (Runner.Run's outer loop: a new Store.Watch after RewatchDelay): the
// listing delivers every key's current value (Update.Skipped: !live),
// then Update{Listed}, at which Runner.Run calls WatchStarted and — for
// as long as the Runner lives — re-applies r.rolledBack (run.go: `if c :=
// r.rolledBack; c != nil { KeepWithdrawn ...; KeepCounted ... }`).
func x40Rewatch(b *x11Bucket, now time.Time, carry *rollbackCarry) {
	tr := b.tr
	names := sortedKeys(b)
	sortByRev(names, b)
	for _, h := range names {
		tr.Skipped(b.keys[h].rev)
		deliver(tr, now, h, b.keys[h])
	}
	tr.WatchStarted(now)
	carry.applyTo(tr) // as Runner.Run at every u.Listed (once since X40)
	b.flush()
}

// TestX40RewatchReappliesStaleWithdrawalCarry (S1; no attacker needed: a
// lease-stream rollback, then — any time later in the same process — a
// watch failure during a rack cut-off).
//
// Runner.rolledBack is never cleared: "The carry lives as long as the
// Runner" (rollback.go). Runner.Run applies it at EVERY Update{Listed} —
// the fresh tracker's first listing, and every re-watch's listing after a
// watch failure (werr → RewatchDelay → new Store.Watch, same tracker).
// KeepWithdrawn overrides whatever record the tracker holds ("Whatever
// record of the host this tracker listed ... the host is withdrawn as that
// tracker knew it", X37) — including a NEWER record this very tracker
// trusted since and that already ended the carry. So a host that was in
// maintenance at the rollback and came back long ago is set back to its
// OLD withdrawn record at every re-watch: never declared, and — the S1
// part — not counted by the mass-failure guard.
//
// Timeline (x11 rig, 60 hosts, threshold 10, rack h1..h12): backup;
// h1..h5 withdraw for maintenance (W, incarnation 1); the stream rolls
// back to the backup; the fresh tracker keeps h1..h5 withdrawn (right).
// h1..h5 come back (incarnation 2): the carry ends (right). The rack
// h1..h12 is cut off and Held: C holds (12 silent). The lease watch fails
// and is re-established (a NATS hiccup — likely during the very network
// event that cut the rack off): the listing is followed by the stale
// carry: h1..h5 are withdrawn again (their old W), uncounted: 7 ≤ 10, no
// hold; h6..h12, Held with guests running, are declared.
//
// Controls: the same without the re-watch — held; the same re-watch with
// no rollback before (no carry) — held.
// Fix direction: apply the carry once, at the fresh tracker's first
// listing (clear r.rolledBack.withdrawn/counted after applying, keep only
// rev for AfterRollback), or make KeepWithdrawn/KeepCounted refuse a host
// whose trusted record is newer than the carried one and was delivered
// to this tracker live.
func TestX40RewatchReappliesStaleWithdrawalCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name              string
		rollback, rewatch bool
		wantHeld          bool
		mut               *bool
	}{
		{name: "control-rollback-no-rewatch", rollback: true, wantHeld: true},
		{name: "control-rewatch-no-rollback", rewatch: true, wantHeld: true},
		{name: "fault/rollback-then-rewatch-during-hold", rollback: true, rewatch: true},
		{name: "fault/rollback-then-rewatch-during-hold/carryOnceMutation", rollback: true, rewatch: true, mut: &carryOnceMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, hosts := x11Fleet(t, 60, 5)
			maint := x10Names(1, 6)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			others := x11Without(hosts, maint...)
			at := t0.Add(5 * time.Second)
			seq := map[string]uint64{}
			tick := func(secs int, inc uint64, maintOn bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if maintOn {
						for _, h := range maint {
							seq[h]++
							x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, inc, seq[h])
						}
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(3, 1, true) // h1..h5 renew, signed (incarnation 1)
			backup, backupRev := maps.Clone(b.keys), b.rev
			tick(3, 1, true)
			for _, h := range maint { // maintenance: orderly stops
				seq[h]++
				x38Put(b, at, h, fencing.LeaseWithdrawn, 1, seq[h])
			}
			tick(3, 0, false)
			var carry *rollbackCarry
			if c.rollback {
				b.rollBack(backup, backupRev)
				carry = b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
				at = at.Add(time.Second)
				t.Logf("rollback to rev %d: carried %d withdrawals, %d counted; fresh tracker: h1 %q", backupRev, len(carry.withdrawn), len(carry.counted), b.tr.hosts["h1"].rec.State)
				tick(3, 0, false)
			}
			for _, h := range maint { // back: restarted agents (incarnation 2)
				seq[h] = 0
			}
			tick(30, 2, true)
			h1 := b.tr.hosts["h1"]
			if h1.rec.State != fencing.LeaseActive || h1.carried != nil {
				t.Fatalf("rig: h1 back but %q (carried %t)", h1.rec.State, h1.carried != nil)
			}
			if host, _ := b.run(at, 40, live, x10Set(rack)); host != "" || !b.tr.Holding() {
				t.Fatalf("C declared %q / not holding (rig)", host)
			}
			at = at.Add(40 * time.Second)
			t.Logf("rack cut off: holding, silent %d, threshold %d", b.tr.Silent(at), b.tr.Threshold())
			now := at
			if c.rewatch {
				now = now.Add(time.Second) // RewatchDelay
				x40Rewatch(b, now, carry)
				h1 = b.tr.hosts["h1"]
				t.Logf("re-watch at %s: h1 %q (inc %d), counted %t", now.Format("15:04:05"), h1.rec.State, h1.rec.Incarnation, b.tr.counted(h1, now.Add(30*time.Second)))
			}
			host, after := b.run(now, 180, live, x10Set(rack))
			t.Logf("after: silent %d, threshold %d, holding %t", b.tr.Silent(now.Add(after)), b.tr.Threshold(), b.tr.Holding())
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation nothing was declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: %s declared %s after", host, after)
				return
			case c.wantHeld && host != "":
				t.Fatalf("control: the Held %s declared %s after (rig)", host, after)
			case host != "":
				t.Fatalf("the Held %s (rack cut off, guests running) declared %s after a re-watch: Runner.Run re-applied the stale rollback carry, h1..h5 (back since, incarnation 2, cut off) were set to their old withdrawn records and left the guard's count", host, after)
			}
			t.Logf("no Held host declared")
		})
	}
}

// TestX40SecondRollbackDowngradesBeaconCarry (S1: a compromised node
// that kept a copy of one of the victim's genuine records; two lease-
// stream rollbacks in one process — no forgery).
//
// docs/security.md: "a second rollback hands on the carried record, not
// the listed one". True for CountedSilent (countedCarry) and for a host
// carried by its withdrawn record (KeepWithdrawn sets h.rec = last). NOT
// for a host carried as withdrawn by its own BEACON (or "may have
// withdrawn": lostBeacon, hidden, lateSkip): KeepWithdrawn keeps the
// carried record only in h.carried, h.rec stays the LISTED record, and
// Withdrawals hands on `Record: h.rec` — the older listed record. After
// the second rollback the third tracker's carry (its replay bar, replay():
// `notNewer(*rec, *h.carried)`) is the old listed record L, no longer the
// victim's last trusted record C: a copy of any genuine record in (L, C]
// — refused by the second tracker — is trusted, ends the beacon
// withdrawal (trustedRev past withdrawnRev) and the withdrawn host,
// guests running, is declared lease_ttl + grace later.
//
// Not X24's class: with one rollback every active record of the victim
// is at or below the carried C (it withdrew after C) — no copy helps; it
// is the second rollback's downgrade of the carry that opens them.
//
// Timeline (x11 rig, 60 hosts): h3 renews signed records (incarnation 1,
// seq 1..13); backup B at seq 3 (L). h3 withdraws (orderly stop, guests
// run on): W is acked, its beacon reaches C1, but the leader loses W
// before C1's watch delivers it (C1 knows the withdrawal by beacon only).
// Rollback 1 to B: C2 lists L, carries C (seq 13) by beacon. The stream
// refills; rollback 2 (to B again: the same restore, or a leader losing
// writes once more): C3 is handed L (seq 3). The compromised node, once
// the stream passes the carried revision, puts back its copy of seq 8.
//
// Controls: the same copy after one rollback (C2: refused as a replay)
// — not declared; two rollbacks, no copy — not declared.
// Fix direction: Withdrawals must hand on h.carried when set (the newer
// of h.carried and h.rec), as CountedSilent hands on countedCarry.
func TestX40SecondRollbackDowngradesBeaconCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name      string
		rollbacks int
		attack    bool
		wantHeld  bool
		mut       *bool
	}{
		{name: "control-one-rollback-copy-refused", rollbacks: 1, attack: true, wantHeld: true},
		{name: "control-two-rollbacks-no-copy", rollbacks: 2, wantHeld: true},
		{name: "attack/two-rollbacks-copy", rollbacks: 2, attack: true},
		{name: "attack/two-rollbacks-copy/carriedRecordMutation", rollbacks: 2, attack: true, mut: &carriedRecordMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.mut != nil {
				// The rollback bar refuses the copy too (X24's reused-revision
				// replays), and the second rollback hands the first one's bar
				// on (CarriedHost.Wrote, wroteBar) to the carry's bar.
				x36Mutate(t, &rollbackBarMutation, &beaconBarMutation)
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
			kept := map[uint64]fencing.LeaseRecord{}
			tick := func(secs int, on bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if on {
						seq++
						kept[seq] = x38Put(b, now.Add(500*time.Millisecond), target, fencing.LeaseActive, 1, seq)
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(3, true)
			backup, backupRev := maps.Clone(b.keys), b.rev // L: seq 3
			tick(10, true)                                 // C: seq 13
			// The withdrawal: acked and beaconed, lost with the leader
			// before the watch delivered it.
			tr := b.tr
			b.tr = nil
			seq++
			x38Put(b, at, target, fencing.LeaseWithdrawn, 1, seq)
			wRev := b.rev
			b.tr = tr
			tr.ObserveWithdrawal(at, target, wRev)
			if !tr.hosts[target].beaconWithdrawn() {
				t.Fatalf("rig: C1 does not know h3 withdrawn by its beacon")
			}
			b.rollBack(maps.Clone(backup), backupRev)
			carry := b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
			at = at.Add(time.Second)
			for _, w := range carry.withdrawn {
				if w.Host == target {
					t.Logf("rollback 1 (to rev %d): h3 carried with seq %d (%s)", backupRev, w.Record.Seq, w.Why)
				}
			}
			tick(20, false)
			if c.rollbacks == 2 {
				b.rollBack(maps.Clone(backup), backupRev)
				carry = b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
				at = at.Add(time.Second)
				for _, w := range carry.withdrawn {
					if w.Host == target {
						t.Logf("rollback 2 (to rev %d): h3 carried with seq %d (%s)", backupRev, w.Record.Seq, w.Why)
					}
				}
			}
			h := b.tr.hosts[target]
			t.Logf("fresh tracker: h3 listed seq %d, carried seq %d, beacon-withdrawn %t", h.rec.Seq, h.carried.Seq, h.beaconWithdrawn())
			now := at
			if c.attack {
				for b.rev <= carry.rev+1 { // past the carried revision (withdrawnRev)
					b.run(now, 1, others, nil)
					now = now.Add(time.Second)
				}
				cp := kept[8]
				cur := b.keys[target]
				b.land(now, target, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
				h = b.tr.hosts[target]
				t.Logf("%s: copy of h3's seq 8 (prev_rev %d) put back at rev %d: h3 %q seq %d, beacon-withdrawn %t", now.Format("15:04:05"), cp.PrevRev, b.rev, h.rec.State, h.rec.Seq, h.beaconWithdrawn())
			}
			host, after := b.run(now, 120, others, map[string]bool{target: true})
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation nothing was declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: %s declared %s after", host, after)
				return
			case c.wantHeld && host != "":
				t.Fatalf("control: the withdrawn h3 declared %s after (rig)", after)
			case host != "":
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the copy: the second rollback handed on its LISTED record (Withdrawals: Record h.rec), not the carried one, and a copy of a record between them ended the withdrawal", after)
			}
			t.Logf("h3 not declared")
		})
	}
}

// TestX40RollbackDuringCarriedListingDropsCarry (S1, no attacker: two
// lease-stream rollbacks, the second found while the fresh tracker's
// first listing is still running).
//
// Runner.Run applies r.rolledBack (KeepWithdrawn, KeepCounted) only at the
// listing's end (u.Listed). Its rollback check runs during the listing
// too (a tick launches it once ring.maxRv > 0; `!watching` skips only
// what follows), and when it finds the stream rolled back again it
// REPLACES r.rolledBack with the half-listed tracker's Withdrawals() and
// CountedSilent() — which know nothing of the carry not applied yet — and
// rev with that Run's ring.maxRv (lower than the carry's: the stream
// rolled back). The first rollback's carry is gone: the host whose
// withdrawal it lost is listed active by the third tracker and declared.
// (X35 found the same for the early-beacon kept during a listing; this is
// the carry itself.)
//
// Timeline (x11 rig, 60 hosts): backups B0 (h3 at seq 2) and B1 (seq 3);
// h3 renews to seq 10 and withdraws (orderly stop, guests run on): C1
// knows its withdrawn record W. Rollback 1 to B1 (W lost): C2 starts,
// carrying h3 withdrawn. While C2 lists (30 of 60 keys, h3's among them),
// the stream rolls back again, to B0 (a second restore, or a leader that
// lost writes again during the same incident) and C2's check finds it.
// C3 lists B0: h3 active (seq 2), no carry: declared.
//
// Control: the second rollback found after C2's listing ended (carry
// applied): C3 carries h3 withdrawn — not declared.
// Fix direction: when a rollback is found before u.Listed, hand on the
// union of the unapplied r.rolledBack and the tracker's own carries (and
// the max of the revs); or apply the carry before/while listing
// (KeepWithdrawn already copes with untracked hosts via carriedEarly).
func TestX40RollbackDuringCarriedListingDropsCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name       string
		midListing bool
		wantHeld   bool
		mut        *bool
	}{
		{name: "control-second-rollback-after-listing", wantHeld: true},
		{name: "fault/second-rollback-during-listing", midListing: true},
		{name: "fault/second-rollback-during-listing/carryUnionMutation", midListing: true, mut: &carryUnionMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, hosts := x11Fleet(t, 60, 5)
			const target = "h3"
			others := x11Without(hosts, target)
			at := t0.Add(5 * time.Second)
			var seq uint64
			tick := func(secs int, on bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if on {
						seq++
						x38Put(b, now.Add(500*time.Millisecond), target, fencing.LeaseActive, 1, seq)
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(2, true)
			backup0, backup0Rev := maps.Clone(b.keys), b.rev
			tick(1, true)
			backup1, backup1Rev := maps.Clone(b.keys), b.rev
			tick(7, true)
			seq++
			x38Put(b, at, target, fencing.LeaseWithdrawn, 1, seq)
			tick(3, false)
			if b.tr.hosts[target].rec.State != fencing.LeaseWithdrawn {
				t.Fatalf("rig: C1 does not know h3 withdrawn")
			}
			// Rollback 1: found by C1's check; the Run stops.
			b.rollBack(maps.Clone(backup1), backup1Rev)
			c1 := b.tr
			carry1 := carryOn(nil, c1, at, b.delivered)
			c1.StreamRolledBack(at, "test")
			b.flush()
			b.stop()
			at = at.Add(time.Second)
			// C2 (Runner.Run again): AfterRollback, then the listing.
			c2 := x10Tracker(t)
			c2.AfterRollback(carry1.rev)
			names := sortedKeys(b)
			sortByRev(names, b)
			upto := len(names)
			if c.midListing {
				upto = 30
			}
			var maxRv uint64
			for _, h := range names[:upto] {
				c2.Skipped(b.keys[h].rev)
				deliver(c2, at, h, b.keys[h])
				maxRv = max(maxRv, b.keys[h].rev)
			}
			if c2.hosts[target] == nil {
				t.Fatalf("rig: h3 not among the first %d listed", upto)
			}
			if !c.midListing { // u.Listed: as Runner.Run
				c2.WatchStarted(at)
				carry1.applyTo(c2)
			}
			t.Logf("C2 (listed %d of %d keys): h3 %q seq %d", upto, len(names), c2.hosts[target].rec.State, c2.hosts[target].rec.Seq)
			// Rollback 2, found by C2's check (run.go: r.rolledBack replaced).
			at = at.Add(500 * time.Millisecond)
			b.rollBack(maps.Clone(backup0), backup0Rev)
			carry2 := carryOn(carry1, c2, at, maxRv) // run.go
			c2.StreamRolledBack(at, "test")
			in := false
			for _, w := range carry2.withdrawn {
				in = in || w.Host == target
			}
			t.Logf("rollback 2 (to rev %d) found: carry rev %d (was %d), h3 carried %t", backup0Rev, carry2.rev, carry1.rev, in)
			at = at.Add(500 * time.Millisecond)
			b.startCarry(at, carry2)
			h := b.tr.hosts[target]
			t.Logf("C3: h3 %q seq %d, carried %t", h.rec.State, h.rec.Seq, h.carried != nil)
			host, after := b.run(at, 120, others, map[string]bool{target: true})
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation nothing was declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: %s declared %s after", host, after)
				return
			case c.wantHeld && host != "":
				t.Fatalf("control: the withdrawn h3 declared %s after C3's start (rig)", after)
			case host != "":
				t.Fatalf("the withdrawn h3 (guests running) declared %s after C3's start: the second rollback, found during C2's listing, replaced the unapplied carry of the first", after)
			}
			t.Logf("h3 not declared")
		})
	}
}
