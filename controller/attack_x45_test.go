package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X45: attacks on b73a754 (beacons name the record written;
// a rollback's carry raises its bar to the newest: CarriedHost.Wrote,
// barOf).

// x45Run is x11Bucket.run with the runner's missing-beacon check before
// each tick (Runner.Run: BeaconsMissing, then Tick).
func x45Run(b *x11Bucket, from time.Time, secs int, live []string, protect map[string]bool) (string, time.Duration) {
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		for _, h := range live {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		b.tr.BeaconsMissing(now)
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && protect[d.Host] {
				return d.Host, now.Sub(from)
			}
		}
	}
	return "", 0
}

// x45Hidden: host's agent writes a signed record (state st, incarnation
// inc, seq seq) that the compromised node supersedes with garbage before
// the running controller's watch delivers it (a burst makes the watch
// skip at will: reviewer X4); the host's beacon naming it — and, as
// Runner.observeBeacons passes it on, the record it wrote — reaches the
// tracker (a withdrawal's, for st withdrawn). It returns the record (the
// bytes the node keeps).
func x45Hidden(b *x11Bucket, now time.Time, host string, st fencing.LeaseState, inc, seq uint64) fencing.LeaseRecord {
	c1 := b.tr
	b.tr = nil
	r := x38Put(b, now, host, st, inc, seq)
	wRev := b.rev
	b.tr = c1
	b.tr.Skipped(wRev + 1)
	b.garbage(now.Add(100*time.Millisecond), host)
	b.tr.ObserveBeacon(now.Add(100*time.Millisecond), host, wRev)
	b.tr.BeaconWrote(host, wRev, r.Epoch, r.Incarnation, r.Seq)
	if st == fencing.LeaseWithdrawn {
		b.tr.ObserveWithdrawal(now.Add(100*time.Millisecond), host, wRev)
	}
	b.flush()
	return r
}

// x45Align: the compromised node lands a copy of cp after a rollback by
// lining the stream up (X44): filler writes until the next revision is
// cp's prev_rev, garbage on host's key there, then the copy by a
// compare-and-set on it (Written.Fresh passes, prev_rev < rev). above,
// if set: filler writes on other keys between the garbage and the copy,
// so that the copy lands above that revision (the compare-and-set is on
// the key's revision, not the stream's).
func x45Align(b *x11Bucket, now time.Time, host string, cp fencing.LeaseRecord, above uint64) bool {
	if b.rev >= cp.PrevRev {
		return false
	}
	b.rev = cp.PrevRev - 1
	b.garbage(now, host)
	b.rev = max(b.rev, above)
	b.land(now.Add(50*time.Millisecond), host, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: b.keys[host].rev}})
	return true
}

// TestX45WithdrawnCarryNotRaised (S, needs a rollback): barOf does not
// raise a withdrawn record. h1 withdraws (W1, incarnation 2, trusted);
// its agent starts again (incarnation 3), renews 20 times and withdraws
// again (W2) — every write superseded by the node's garbage before the
// watch delivers it, every beacon arriving (BeaconWrote: incarnation 3,
// seq 21). The stream rolls back to a backup from before W1. The old
// tracker's Withdrawals carries W1 (h1's last trusted record, withdrawn)
// with Wrote (3, 21); barOf leaves W1 as the bar. The node lands aligned
// copies of h1's incarnation-3 renewals (records h1 genuinely signed, all
// older than what its beacons said it wrote): newer than W1, they end
// the withdrawal carry, and h1 — stopped in order, guests running — is
// declared.
//
// "control/renewals-seen": the same with h1's incarnation-3 renewals
// delivered (only W2 hidden): the carry is h1's active record raised to
// seq 21 and the copies are refused. "control/no-copies": nothing landed.
// Closed by the rollback bar (hostState.rollbackBar, raised from the
// carry's Wrote whatever the record's state): every copy is refused as a
// replay; with rollbackBarMutation h1 is declared 22 s after the start.
func TestX45WithdrawnCarryNotRaised(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name   string
		seen   bool // the incarnation-3 renewals delivered to the old tracker
		copies int  // how many copies the node lands
		muts   []*bool
	}{
		{"control/no-copies", false, 0, nil},
		{"control/renewals-seen", true, 20, nil},
		{"attack/one-copy", false, 1, nil},
		{"attack/copies-over-withdrawn-bar", false, 20, nil},
		{"attack/copies-over-withdrawn-bar/rollbackBarMutation+withdrawnFreshMutation", false, 20, []*bool{&rollbackBarMutation, &withdrawnFreshMutation}}, // X97's layer off too
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 60, 5)
			victim := "h1"
			others := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			var seq uint64
			for s := 0; s < 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 2, seq)
				b.run(now, 1, others, nil)
			}
			at = at.Add(30 * time.Second)
			seq++
			x38Put(b, at.Add(500*time.Millisecond), victim, fencing.LeaseWithdrawn, 2, seq) // W1, trusted
			b.run(at, 5, others, nil)
			at = at.Add(5 * time.Second)
			var hidden []fencing.LeaseRecord
			for s := uint64(1); s <= 20; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				if c.seen {
					hidden = append(hidden, x38Put(b, now, victim, fencing.LeaseActive, 3, s))
				} else {
					hidden = append(hidden, x45Hidden(b, now, victim, fencing.LeaseActive, 3, s))
				}
				b.run(now, 1, others, nil)
			}
			at = at.Add(21 * time.Second)
			x45Hidden(b, at, victim, fencing.LeaseWithdrawn, 3, 21) // W2, hidden; its beacon came
			if h, _ := x45Run(b, at, 10, others, x10Set([]string{victim})); h != "" {
				t.Fatalf("C1 declared %s (rig)", h)
			}
			at = at.Add(10 * time.Second)
			hs := b.tr.hosts[victim]
			t.Logf("C1: %s rec %s inc %d seq %d; wrote %+v", victim, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.beacons.wrote)
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(at.Add(500*time.Millisecond), start)
			for _, w := range carry.withdrawn {
				if w.Host == victim {
					t.Logf("carried withdrawn %s: %s inc %d seq %d, Wrote %+v (%s)", victim, w.Record.State, w.Record.Incarnation, w.Record.Seq, w.Wrote, w.Why)
				}
			}
			now := start
			landed, next := 0, 0
			for s := 0; s < 120; s++ {
				for next < len(hidden) && hidden[next].PrevRev <= b.rev {
					next++ // passed: a later copy
				}
				if landed < c.copies && next < len(hidden) && x45Align(b, now.Add(100*time.Millisecond), victim, hidden[next], carry.rev) {
					landed++
					next++
				}
				h, _ := x45Run(b, now, 1, others, x10Set([]string{victim}))
				now = now.Add(time.Second)
				if h != "" {
					if len(c.muts) > 0 {
						t.Logf("with the mutation: %s declared %v after the fresh start", h, now.Sub(start))
						return
					}
					hs := b.tr.hosts[victim]
					t.Fatalf("the withdrawn %s (orderly stop, guests running) declared %v after the fresh start: %d aligned copies of its incarnation-3 renewals landed over the carried W1 (withdrawn, not raised to the seq its beacons named); rec %s inc %d seq %d carried %t",
						h, now.Sub(start), landed, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.carried != nil)
				}
			}
			hs = b.tr.hosts[victim]
			if len(c.muts) > 0 {
				t.Fatal("with the mutation nothing was declared: the test no longer shows the hole")
			}
			t.Logf("not declared; copies landed %d; rec %s inc %d seq %d carried %t", landed, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.carried != nil)
		})
	}
}

// TestX45EarlyWithdrawalCarriedWithoutBar (S, narrow: needs a rollback
// found while a (re)started controller's watch is still listing — X35's
// window). h1 renews (incarnation 2, seq 1..30), the controller restarts;
// while the fresh tracker lists the fleet, h1 stops in order: W (seq 31)
// lands and its withdrawal beacon — naming W's epoch, incarnation and
// seq — arrives before h1's key is listed: kept early (keepEarly), and
// BeaconWrote drops the record identity (h1 untracked). The rollback
// check finds the stream rolled back (a backup from before h1's last
// renewals): Withdrawals carries h1 as a bare early withdrawal — Record
// {Host: h1}, no signature, no Wrote. The fresh tracker's carry bar is
// epoch 0, incarnation 0, seq 0: an aligned copy of ANY renewal h1 wrote
// before W ends it and the withdrawn h1 is declared.
// Control "beacon-after-listed": the same beacon once h1 is listed: the
// carry is h1's record raised to W's seq and the copy is refused.
// Closed: BeaconWrote keeps an untracked host's newest identity
// (earlyWrote), applied when it is tracked and carried with its early
// withdrawal; with earlyWroteMutation h1 is declared 22 s after the start.
func TestX45EarlyWithdrawalCarriedWithoutBar(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name        string
		afterListed bool
		copies      bool
		muts        []*bool
	}{
		{"control/no-copy", false, false, nil},
		{"control/beacon-after-listed", true, true, nil},
		{"attack/early-beacon-copy", false, true, nil},
		{"attack/early-beacon-copy/earlyWroteMutation", false, true, []*bool{&earlyWroteMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 60, 5)
			victim := "h1"
			others := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			var recs []fencing.LeaseRecord
			var lastRev uint64 // h1's seq-30 revision (its last beacon's)
			for s := uint64(1); s <= 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				recs = append(recs, x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 2, s))
				lastRev = b.rev
				b.run(now, 1, others, nil)
			}
			at = at.Add(31 * time.Second)
			// The controller restarts: a fresh tracker lists the bucket.
			b.stop()
			tr := x10Tracker(t)
			names := x11Without(sortedKeys(b), victim)
			sortByRev(names, b)
			list := func(host string) {
				e := b.keys[host]
				tr.Skipped(e.rev)
				deliver(tr, at, host, e)
				b.delivered = max(b.delivered, e.rev)
			}
			for _, h := range names[:30] {
				list(h)
			}
			beacon := func() {
				// h1 stops in order: W lands (after the listing's
				// snapshot), its beacon arrives (Runner.observeBeacons,
				// then ObserveWithdrawal).
				w := x38Put(b, at.Add(200*time.Millisecond), victim, fencing.LeaseWithdrawn, 2, 31)
				wRev := b.rev
				tr.BeaconChain(at.Add(300*time.Millisecond), victim, wRev, lastRev)
				tr.ObserveBeacon(at.Add(300*time.Millisecond), victim, wRev)
				tr.BeaconWrote(victim, wRev, w.Epoch, w.Incarnation, w.Seq)
				tr.ObserveWithdrawal(at.Add(300*time.Millisecond), victim, wRev)
			}
			if c.afterListed {
				list(victim)
				beacon()
			} else {
				beacon()
			}
			b.tr = tr
			b.flush()
			// The listing is not over; the rollback check answers.
			b.rollBack(backup, backupRev)
			start := at.Add(2 * time.Second)
			carry := b.detectRollback(at.Add(time.Second), start)
			for _, w := range carry.withdrawn {
				if w.Host == victim {
					t.Logf("carried withdrawn %s: %q inc %d seq %d signed %t, Wrote %+v (%s)", victim, w.Record.State, w.Record.Incarnation, w.Record.Seq, w.Record.Sig != "", w.Wrote, w.Why)
				}
			}
			now := start
			landed := false
			for s := 0; s < 120; s++ {
				if c.copies && !landed {
					landed = x45Align(b, now.Add(100*time.Millisecond), victim, recs[25], carry.rev) // seq 26, lost by the rollback; landed past the carried revision
				}
				h, _ := x45Run(b, now, 1, others, x10Set([]string{victim}))
				now = now.Add(time.Second)
				if h != "" {
					if len(c.muts) > 0 {
						t.Logf("with the mutation: %s declared %v after the fresh start", h, now.Sub(start))
						return
					}
					hs := b.tr.hosts[victim]
					t.Fatalf("the withdrawn %s (orderly stop, guests running) declared %v after the fresh start: an aligned copy of its seq-26 renewal (written before W) ended the carry of its early withdrawal beacon, carried with no record and no Wrote; rec %s inc %d seq %d carried %t",
						h, now.Sub(start), hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.carried != nil)
				}
			}
			hs := b.tr.hosts[victim]
			if len(c.muts) > 0 {
				t.Fatal("with the mutation nothing was declared: the test no longer shows the hole")
			}
			t.Logf("not declared; copy landed %t; rec %s seq %d carried %t", landed, hs.rec.State, hs.rec.Seq, hs.carried != nil)
		})
	}
}

// TestX45MergeDropsWrote (S, needs two rollbacks, the second found while
// the fresh tracker is still listing — X40's carryOn union; no hidden
// write, no withdrawal carry). The controller's watch lags 60 s (a burst
// of the node's writes: reviewer X32): every host's beacons come, their
// records not (the guard holds: all silent). The rack h1..h12 renews
// through the lag (seq 31..90; BeaconWrote: seq 90), then is cut off and
// Held. Rollback 1 puts the stream back to 5 s into the lag (h1/h2 at
// seq 35). The fresh tracker T2 lists it — and before its listing ends a
// second rollback (to an older backup) is found. carryOn merges the
// unapplied carry (h1: seq 30, Wrote 90) with T2's CountedSilent (h1:
// listed seq 35, Wrote zero) by mergeCarried, which keeps the entry with
// the newer Record whole and drops the other's Wrote: T3's count-carry
// bar is seq 35, and aligned copies of seq 36..90 (records h1/h2 wrote
// before the cut-off, lost by both rollbacks) end h1's and h2's carries;
// the hold over the rack ends and a Held host is declared.
// Controls: no copies; one rollback only (T2's bar is seq 90: the same
// copies are refused).
// Closed: mergeCarried keeps the newest Wrote (and the dropped record's
// identity) whichever record it keeps; with mergeWroteMutation h10 is
// declared 22 s after the start.
func TestX45MergeDropsWrote(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name   string
		second bool
		copies bool
		muts   []*bool
	}{
		{"control/no-copies", true, false, nil},
		{"control/one-rollback", false, true, nil},
		{"attack/second-rollback-during-listing", true, true, nil},
		{"attack/second-rollback-during-listing/mergeWroteMutation", true, true, []*bool{&mergeWroteMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			targets := []string{"h1", "h2"}
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			var snap map[string]x11Entry
			var snapRev uint64
			late := live[len(live)-5:] // written last before the snapshot: not listed by T2 yet
			lagged := map[string][]fencing.LeaseRecord{}
			for s := 0; s < 90; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq := uint64(s + 1)
				if s < 30 {
					for _, h := range rack {
						x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
					}
					b.run(now, 1, live, nil)
					continue
				}
				// The watch lags: nothing is delivered before the
				// rollback; the beacons are.
				c1 := b.tr
				b.tr = nil
				revs := map[string]uint64{}
				for _, h := range rack {
					r := x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
					revs[h] = b.rev
					if x10Set(targets)[h] {
						lagged[h] = append(lagged[h], r)
					}
				}
				for _, h := range live {
					b.write(now.Add(600*time.Millisecond), h, fencing.LeaseActive, b.guard.Ref())
					revs[h] = b.rev
				}
				if seq == 35 {
					snap, snapRev = maps.Clone(b.keys), b.rev
				}
				b.tr = c1
				for _, h := range hosts {
					b.tr.ObserveBeacon(now.Add(700*time.Millisecond), h, revs[h])
					if rs := lagged[h]; len(rs) > 0 || x10Set(rack)[h] {
						b.tr.BeaconWrote(h, revs[h], 0, 2, seq)
					}
				}
				b.flush()
				b.publish()
				b.tr.BeaconsMissing(now.Add(time.Second))
				for _, d := range b.tr.Tick(now.Add(time.Second)) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s during the lag (rig)", d.Host)
					}
				}
			}
			at = at.Add(90 * time.Second) // the rack is cut off (Held): it writes nothing more
			detect := at.Add(1500 * time.Millisecond)
			h1 := b.tr.hosts["h1"]
			t.Logf("C1 silent %d threshold %d holding %t; h1 seq %d wrote %+v hidden %d", b.tr.Silent(detect), b.tr.Threshold(), b.tr.Holding(), h1.rec.Seq, h1.beacons.wrote, h1.hidden.rev)
			// Rollback 1: back to 5 s into the lag.
			b.rollBack(snap, snapRev)
			var start time.Time
			if !c.second {
				start = detect.Add(500 * time.Millisecond)
				b.detectRollback(detect, start)
			} else {
				carry1 := carryOn(b.carry, b.tr, detect, b.delivered)
				b.carry = carry1
				b.tr.StreamRolledBack(detect, "test")
				b.flush()
				b.stop()
				// T2 lists the rolled-back stream; its listing is not over
				// (the late hosts' keys not delivered yet).
				t2 := x10Tracker(t)
				b.tr = t2
				names := x11Without(sortedKeys(b), late...)
				sortByRev(names, b)
				for _, h := range names {
					t2.Skipped(b.keys[h].rev)
					deliver(t2, detect.Add(300*time.Millisecond), h, b.keys[h])
				}
				b.flush()
				// Rollback 2, found before the listing's end: back to the
				// older backup.
				b.rollBack(backup, backupRev)
				start = detect.Add(time.Second)
				carry := b.detectRollback(detect.Add(700*time.Millisecond), start)
				for _, ch := range carry.counted {
					if ch.Host == "h1" {
						t.Logf("carried counted h1: seq %d Wrote %+v → bar seq %d", ch.Record.Seq, ch.Wrote, barOf(ch.Record, ch.Wrote).Seq)
					}
				}
			}
			if cw := b.tr.hosts["h1"].carried; cw != nil {
				t.Logf("fresh tracker: h1 withdrawal carry bar seq %d", cw.Seq)
			}
			if cc := b.tr.hosts["h1"].countedCarry; cc != nil {
				t.Logf("fresh tracker: h1 count carry bar seq %d", cc.Seq)
			}
			protect := x10Set(rack)
			now := start
			next := map[string]int{}
			landed := map[string]int{}
			for s := 0; s < 120; s++ {
				if c.copies && s%3 == 0 {
					// One copy of each every 3 s (the first before the
					// carries count: From), until the Held hosts are due.
					for _, h := range targets {
						for next[h] < len(lagged[h]) && (lagged[h][next[h]].PrevRev <= b.rev || lagged[h][next[h]].Seq <= 35) {
							next[h]++
						}
						if next[h] < len(lagged[h]) && x45Align(b, now.Add(100*time.Millisecond), h, lagged[h][next[h]], 0) {
							next[h]++
							landed[h]++
						}
					}
				}
				host, _ := x45Run(b, now, 1, live, protect)
				now = now.Add(time.Second)
				if host != "" {
					if len(c.muts) > 0 {
						t.Logf("with the mutation: %s declared %v after the fresh start", host, now.Sub(start))
						return
					}
					t.Fatalf("the Held %s (rack cut off, guests running) declared %v after the fresh start: aligned copies of h1/h2's last renewals (older than the seq 90 their beacons named) ended the count carries, whose bar mergeCarried lowered to the seq-35 record T2 listed (copies landed %v; silent %d threshold %d)", host, now.Sub(start), landed, b.tr.Silent(now), b.tr.Threshold())
				}
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation nothing was declared: the test no longer shows the hole")
			}
			t.Logf("none declared; copies landed %v; holding %t", landed, b.tr.Holding())
		})
	}
}

// TestX45ListedWithdrawalDropsBar (S, needs a rollback; no garbage: a
// lagging watch). KeepWithdrawn's "withdrawn here already" branch sets
// the bar only when the listed withdrawal is not newer than the carried
// record — compared with the carried record, not with what the beacons
// said (Wrote). The watch lags (a burst of the node's writes: reviewer
// X32): nothing is delivered for 30 s, every beacon comes. Meanwhile h1
// stops in order (W_L, incarnation 2 seq 31), its agent starts again
// (incarnation 3, seq 1..20) and stops again (W2, seq 21). The old
// tracker trusts h1's seq 30 and knows it withdrawn by its beacon (Wrote:
// 3/21). The stream rolls back to a moment h1's key held W_L (a leader
// losing its last acknowledged writes). The fresh tracker lists W_L —
// newer than the carried seq 30 — so no bar is set at all, and an
// aligned copy of one of h1's incarnation-3 renewals (newer than W_L,
// older than W2) is trusted: h1, stopped in order with its guests
// running, is declared.
// Controls: no copies; "rollback-before-W_L" (the key lists seq 25: the
// carried record raised to 3/21 refuses the copies).
// Closed by the rollback bar (KeepWithdrawn raises it from the carry
// before any branch); with rollbackBarMutation h1 is declared 22 s after
// the start.
func TestX45ListedWithdrawalDropsBar(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name   string
		snapAt int // lag second whose state the rollback restores
		copies bool
		muts   []*bool
	}{
		{"control/no-copies", 2, false, nil},
		{"control/rollback-before-W_L", -1, true, nil},
		{"attack/listed-W_L-newer-than-carried", 2, true, nil},
		{"attack/listed-W_L-newer-than-carried/rollbackBarMutation+withdrawnFreshMutation", 2, true, []*bool{&rollbackBarMutation, &withdrawnFreshMutation}}, // X97's layer off too
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 60, 5)
			victim := "h1"
			others := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			var early map[string]x11Entry
			var earlyRev uint64
			for s := uint64(1); s <= 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 2, s)
				if s == 25 {
					early, earlyRev = maps.Clone(b.keys), b.rev
				}
				b.run(now, 1, others, nil)
			}
			at = at.Add(31 * time.Second)
			var snap map[string]x11Entry
			var snapRev uint64
			var inc3 []fencing.LeaseRecord
			for s := 0; s < 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				c1 := b.tr
				b.tr = nil // the watch lags: nothing delivered
				revs := map[string]uint64{}
				var w *fencing.LeaseRecord
				switch {
				case s == 0:
					r := x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseWithdrawn, 2, 31) // W_L
					w, revs[victim] = &r, b.rev
				case s >= 4 && s < 24:
					r := x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 3, uint64(s-3))
					inc3 = append(inc3, r)
					w, revs[victim] = &r, b.rev
				case s == 24:
					r := x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseWithdrawn, 3, 21) // W2
					w, revs[victim] = &r, b.rev
				}
				for _, h := range others {
					b.write(now.Add(600*time.Millisecond), h, fencing.LeaseActive, b.guard.Ref())
					revs[h] = b.rev
				}
				if s == c.snapAt {
					snap, snapRev = maps.Clone(b.keys), b.rev
				}
				b.tr = c1
				for _, h := range hosts {
					if revs[h] == 0 {
						continue
					}
					b.tr.ObserveBeacon(now.Add(700*time.Millisecond), h, revs[h])
					if h == victim {
						b.tr.BeaconWrote(h, revs[h], w.Epoch, w.Incarnation, w.Seq)
						if w.State == fencing.LeaseWithdrawn {
							b.tr.ObserveWithdrawal(now.Add(700*time.Millisecond), h, revs[h])
						}
					}
				}
				b.flush()
				b.publish()
				b.tr.BeaconsMissing(now.Add(time.Second))
				for _, d := range b.tr.Tick(now.Add(time.Second)) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s during the lag (rig)", d.Host)
					}
				}
			}
			at = at.Add(30 * time.Second)
			hs := b.tr.hosts[victim]
			t.Logf("C1: %s rec %s inc %d seq %d beaconWithdrawn %t; wrote %+v", victim, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.beaconWithdrawn(), hs.beacons.wrote)
			if c.snapAt < 0 {
				snap, snapRev = early, earlyRev
			}
			b.rollBack(snap, snapRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(at.Add(500*time.Millisecond), start)
			for _, w := range carry.withdrawn {
				if w.Host == victim {
					t.Logf("carried withdrawn %s: %s inc %d seq %d, Wrote %+v (%s)", victim, w.Record.State, w.Record.Incarnation, w.Record.Seq, w.Wrote, w.Why)
				}
			}
			hs = b.tr.hosts[victim]
			if hs.carried != nil {
				t.Logf("fresh tracker: listed %s %d/%d; bar %d/%d", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.carried.Incarnation, hs.carried.Seq)
			} else {
				t.Logf("fresh tracker: listed %s %d/%d; no bar", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq)
			}
			now := start
			landed, next := 0, 0
			for s := 0; s < 120; s++ {
				for next < len(inc3) && inc3[next].PrevRev <= b.rev {
					next++
				}
				if c.copies && landed == 0 && next < len(inc3) && x45Align(b, now.Add(100*time.Millisecond), victim, inc3[next], carry.rev) {
					landed++
					next++
				}
				h, _ := x45Run(b, now, 1, others, x10Set([]string{victim}))
				now = now.Add(time.Second)
				if h != "" {
					if len(c.muts) > 0 {
						t.Logf("with the mutation: %s declared %v after the fresh start", h, now.Sub(start))
						return
					}
					hs := b.tr.hosts[victim]
					t.Fatalf("the withdrawn %s (stopped in order, guests running) declared %v after the fresh start: the rollback listed W_L, newer than the carried seq 30, so KeepWithdrawn set no bar, and an aligned copy of an incarnation-3 renewal (older than the 3/21 its beacons named) was trusted; rec %s %d/%d",
						h, now.Sub(start), hs.rec.State, hs.rec.Incarnation, hs.rec.Seq)
				}
			}
			hs = b.tr.hosts[victim]
			if len(c.muts) > 0 {
				t.Fatal("with the mutation nothing was declared: the test no longer shows the hole")
			}
			t.Logf("not declared; copies landed %d; rec %s %d/%d carried %t", landed, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.carried != nil)
		})
	}
}
