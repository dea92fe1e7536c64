package controller

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X48: attacks on 17b130b (KeepBar puts the stopped tracker's
// trusted record back over an older LISTED record — a declaration too —
// and judges it).
//
// KeepBar's "older" is the identity order (epoch, incarnation, seq,
// rank), not the host's. An agent that restarts with its durable state
// lost takes its incarnation from the record it reads in its key
// (fencing.NewAgent: max(durable, key's of the same boot) + 1): after a
// lease-stream rollback the key holds the backup's record, so the
// restarted agent writes at an incarnation BELOW what it wrote before
// the rollback. Its records are genuinely the newest, yet "older" than
// the stopped tracker's trusted record: KeepBar puts that old ACTIVE
// record back over the host's listed (genuine, newest) WITHDRAWAL, and
// the fresh tracker declares the withdrawn host (guests running).

// x48Case: how h3's agent comes back after the rollback.
type x48Case struct {
	name string
	// inc: the incarnation h3's agent writes at after the rollback (2:
	// restarted with its durable state lost, taken from the restored
	// key's incarnation 1; 4: its state kept).
	inc uint64
	// beaconsToOld: h3's beacons of those writes reach the running
	// (stopped-to-be) tracker, as they would (its watch does not deliver
	// the records: the rollback reuses revisions below the last one it
	// was delivered, rollback.go).
	beaconsToOld bool
	muts         []*bool
}

// x48Rig: ten hosts; h3 renews at incarnation 1 (the backup taken after
// its third renewal), its agent restarts twice (incarnations 2, 3, state
// kept) and renews at incarnation 3 until the rollback: the running
// controller trusts (incarnation 3, seq 20). It returns the rig, the
// hosts but h3, the backup and the time reached.
func x48Rig(t *testing.T) (b *x11Bucket, others []string, bk x47Backup, at time.Time) {
	t.Helper()
	b, hosts := x11Fleet(t, 10, 5)
	others = x11Without(hosts, "h3")
	at = t0.Add(5 * time.Second)
	for inc := uint64(1); inc <= 3; inc++ {
		n := 5
		if inc == 3 {
			n = 20
		}
		for s := 1; s <= n; s++ {
			now := at.Add(time.Duration(s-1) * time.Second)
			x38PutMod(b, now.Add(500*time.Millisecond), "h3", fencing.LeaseActive, inc, uint64(s), nil)
			b.run(now, 1, others, nil)
			if inc == 1 && s == 3 {
				bk = x47Backup{maps.Clone(b.keys), b.rev}
			}
		}
		at = at.Add(time.Duration(n) * time.Second)
	}
	if r := b.tr.hosts["h3"].rec; r.Incarnation != 3 || r.Seq != 20 || r.State != fencing.LeaseActive {
		t.Fatalf("rig: h3 not trusted at incarnation 3 seq 20: %+v", r)
	}
	return b, others, bk, at
}

// x48Write: h3's agent writes (inc, seq, st) after the rollback, before
// the running controller finds it: the record lands (its watch does not
// deliver it), its beacon reaches that controller if beacons.
func x48Write(b *x11Bucket, now time.Time, inc, seq uint64, st fencing.LeaseState, beacons bool) {
	c1 := b.tr
	b.tr = nil
	r := x38PutMod(b, now, "h3", st, inc, seq, nil)
	b.tr = c1
	if beacons {
		c1.BeaconWrote("h3", b.rev, r.Epoch, r.Incarnation, r.Seq)
		if st == fencing.LeaseWithdrawn {
			c1.ObserveWithdrawal(now, "h3", b.rev)
		} else {
			c1.ObserveBeacon(now, "h3", b.rev)
		}
		b.flush()
	}
}

// TestX48LostStateWithdrawalUnderOldIncarnation (S, needs a rollback, no
// attacker: a fault combination). h3 renews at incarnation 3 (the
// running controller trusts seq 20). The lease stream is restored from a
// backup holding h3's incarnation-1 record. Before the controller's
// check finds it (RollbackCheckInterval, or its reconnect), h3's agent
// is restarted with its durable state lost: it reads its key (the
// backup's incarnation 1, same boot) and writes at incarnation 2 — two
// renewals — then is stopped in order: its withdrawal W (incarnation 2
// seq 3) lands; its guests run on, unprotected. The running controller
// drops W's beacon (revision below its trusted record's: ObserveWithdrawal)
// and never sees W; the fresh tracker lists W — and KeepBar, finding
// the stopped tracker's trusted record (incarnation 3 seq 20, active)
// "newer", puts it back over W: h3 is active again, and is declared
// lease_ttl + grace after the fresh start while its guests run.
//
// "control/state-kept": the agent keeps its state (incarnation 4): W is
// newer than the carried record, stays — never declared.
// "control/listedBarMutation": KeepBar leaves the listed W (as before
// X46's fix) — never declared.
func TestX48LostStateWithdrawalUnderOldIncarnation(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []x48Case{
		{"control/state-kept", 4, true, nil},
		{"control/lost-state/listedBarMutation", 2, true, []*bool{&listedBarMutation}},
		{"fault/lost-state", 2, true, nil},
		{"fault/lost-state/listedHostMutation", 2, true, []*bool{&listedHostMutation}},
		{"fault/lost-state/listedHostMutation/gated", 2, true, []*bool{&listedHostMutation}},
		{"fault/lost-state/no-beacons-to-old", 2, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x48Gated(t, c.name)
			x36Mutate(t, c.muts...)
			b, others, bk, at := x48Rig(t)
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			x48Write(b, at.Add(100*time.Millisecond), c.inc, 1, fencing.LeaseActive, c.beaconsToOld)
			x48Write(b, at.Add(400*time.Millisecond), c.inc, 2, fencing.LeaseActive, c.beaconsToOld)
			x48Write(b, at.Add(700*time.Millisecond), c.inc, 3, fencing.LeaseWithdrawn, c.beaconsToOld)
			if h := b.tr.hosts["h3"]; h.beaconWithdrawn() {
				t.Logf("the running controller took W's beacon (withdrawnRev %d, trustedRev %d)", h.beacons.withdrawnRev, h.trustedRev)
			}
			start := at.Add(1500 * time.Millisecond)
			carry := b.detectRollback(at.Add(time.Second), start)
			for _, w := range carry.withdrawn {
				t.Logf("carried withdrawn: %s (%s)", w.Host, w.Why)
			}
			hs := b.tr.hosts["h3"]
			t.Logf("fresh tracker after the listing: h3 rec %s inc %d seq %d, bar %v, carried %v", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar, hs.carried != nil)
			for s := 0; s < 120; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				if h, d := b.run(now, 1, others, x10Set([]string{"h3"})); h != "" {
					if x48Mutated(c) {
						t.Logf("with listedHostMutation: the withdrawn h3 declared %v after the fresh start", now.Add(d).Sub(start))
						return
					}
					t.Fatalf("the WITHDRAWN h3 (stopped in order at incarnation %d seq 3, guests running, its withdrawal the key's newest genuine record) declared %v after the fresh start: KeepBar put the stopped tracker's incarnation-3 seq-20 ACTIVE record back over the listed withdrawal, its identity \"older\" only because the agent restarted with its state lost after the rollback",
						c.inc, now.Add(d).Sub(start))
				}
			}
			if x48Mutated(c) {
				t.Fatal("with listedHostMutation h3 was not declared: the test no longer shows the hole")
			}
		})
	}
}

// TestX48LostStateLiveHostRenewsUnderBar (control, passes): as above, but h3 does
// not withdraw: its restarted agent (incarnation 2, state lost) renews on
// after the fresh start, its beacons reaching the fresh tracker. Its
// records are "not newer" than the bar (incarnation 3 seq 20): refused as
// replays, but its beacons name them: the live h3 is not declared.
func TestX48LostStateLiveHostRenewsUnderBar(t *testing.T) {
	for _, c := range []x48Case{
		{"control/state-kept", 4, true, nil},
		{"fault/lost-state", 2, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x48Gated(t, c.name)
			x36Mutate(t, c.muts...)
			b, others, bk, at := x48Rig(t)
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			x48Write(b, at.Add(100*time.Millisecond), c.inc, 1, fencing.LeaseActive, c.beaconsToOld)
			x48Write(b, at.Add(400*time.Millisecond), c.inc, 2, fencing.LeaseActive, c.beaconsToOld)
			start := at.Add(1500 * time.Millisecond)
			b.detectRollback(at.Add(time.Second), start)
			hs := b.tr.hosts["h3"]
			t.Logf("fresh tracker after the listing: h3 rec %s inc %d seq %d, bar %v", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar)
			seq := uint64(2)
			for s := 0; s < 120; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				seq++
				x38PutMod(b, now.Add(500*time.Millisecond), "h3", fencing.LeaseActive, c.inc, seq, nil)
				if h, d := b.run(now, 1, others, x10Set([]string{"h3"})); h != "" {
					hs := b.tr.hosts["h3"]
					t.Fatalf("the LIVE h3 (renewing every second at incarnation %d) declared %v after the fresh start: rec %s inc %d seq %d, bar %v, untrusted %q",
						c.inc, now.Add(d).Sub(start), hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar, hs.untrustedWhy)
				}
			}
		})
	}
}

// TestX48LostStateReconfiguredGraceFromOldRecord (S, needs a rollback, no
// attacker: a fault combination). As TestX48LostStateWithdrawalUnderOldIncarnation,
// but h3's agent, restarted after the rollback with its durable state
// lost, was reconfigured too: its backstop is now its hardware watchdog
// (grace 15.5 s at the defaults, against 6.3 s for the agent-dependent
// reset it had). The fresh tracker lists its incarnation-2 renewal
// (watchdog) — and KeepBar puts the stopped tracker's incarnation-3
// record (reset) back over it and judges THAT: grace 6.3 s. h3 renews on
// (refused as replays of the bar, counted by its beacons), then its agent
// hangs: its guests are stopped only by its watchdog. It is declared
// lease_ttl + 6.3 s after its last renewal, ~9 s before lease_ttl + its
// own grace: evacuated while its guests may still run.
//
// "control/state-kept": incarnation 4, newer than the carried record:
// the listed watchdog record stays — declared at lease_ttl + 15.5 s.
func TestX48LostStateReconfiguredGraceFromOldRecord(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []x48Case{
		{"control/state-kept", 4, true, nil},
		{"control/lost-state/listedBarMutation", 2, true, []*bool{&listedBarMutation}},
		{"fault/lost-state", 2, true, nil},
		{"fault/lost-state/listedHostMutation", 2, true, []*bool{&listedHostMutation}},
		{"fault/lost-state/listedHostMutation/gated", 2, true, []*bool{&listedHostMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x48Gated(t, c.name)
			x36Mutate(t, c.muts...)
			b, others, bk, at := x48Rig(t)
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			c1 := b.tr
			b.tr = nil
			x38PutMod(b, at.Add(100*time.Millisecond), "h3", fencing.LeaseActive, c.inc, 1, x47Watchdog)
			b.tr = c1
			c1.ObserveBeacon(at.Add(100*time.Millisecond), "h3", b.rev)
			c1.BeaconWrote("h3", b.rev, 0, c.inc, 1)
			start := at.Add(1500 * time.Millisecond)
			b.detectRollback(at.Add(time.Second), start)
			hs := b.tr.hosts["h3"]
			want := b.tr.cfg.Grace
			g, _ := want(*b.keys["h3"].rec)
			ttl := b.keys["h3"].rec.Timing.LeaseTTL
			t.Logf("fresh tracker after the listing: h3 rec %s inc %d seq %d backstop %q grace %v (its own record's: %v), bar %v", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rec.Backstop, hs.grace, g, hs.rollbackBar)
			var last time.Time
			seq := uint64(1)
			for s := 0; s < 10; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				seq++
				last = now.Add(500 * time.Millisecond)
				x38PutMod(b, last, "h3", fencing.LeaseActive, c.inc, seq, x47Watchdog)
				if h, _ := b.run(now, 1, others, x10Set([]string{"h3"})); h != "" {
					t.Fatalf("h3 declared while renewing")
				}
			}
			from := start.Add(10 * time.Second)
			h, d := b.run(from, 120, others, x10Set([]string{"h3"}))
			if strings.HasSuffix(c.name, "/gated") {
				// Under the gate h3's records (below the bar) never prove
				// themselves: not declared before an operator confirms —
				// not early either.
				if h != "" {
					t.Fatalf("under the rollback gate the hung h3 was declared %v after its last renewal", from.Add(d).Sub(last))
				}
				return
			}
			if h == "" {
				t.Fatal("the hung h3 never declared")
			}
			after := from.Add(d).Sub(last)
			t.Logf("h3 declared %v after its last renewal (lease_ttl %v + its grace %v = %v)", after, ttl, g, ttl+g)
			if x48Mutated(c) {
				if after >= ttl+g {
					t.Fatal("with listedHostMutation h3 was declared no earlier than lease_ttl + grace: the test no longer shows the hole")
				}
				return
			}
			if after < ttl+g {
				t.Fatalf("the hung h3 (watchdog backstop, grace %v) declared %v after its last renewal, %v BEFORE lease_ttl + grace (%v): KeepBar put its pre-rollback incarnation-3 record (reset backstop) back over its listed incarnation-2 one and judged that (grace %v)",
					g, after, ttl+g-after, ttl+g, b.tr.hosts["h3"].grace)
			}
		})
	}
}

// TestX48HiddenWithdrawalBeaconToStoppedTracker (S, needs a rollback + a
// compromised node). TestKeepBarAfterHiddenWithdrawal's scenario with
// W2's beacon where it goes: W2 lands 200 ms after the rollback, 1.3 s
// before the running controller finds it — its beacon reaches THAT
// controller (the fresh one is not started yet), not the fresh one's
// listing. The running controller drops the withdrawal (its revision is
// below its trusted record's: ObserveWithdrawal) but takes its identity
// (BeaconWrote: incarnation 2 seq 21): Bars carries Wrote (seq 21) newer
// than Record (seq 20, active). KeepBar checks only the FRESH tracker's
// beacons (none) — not c.Wrote — and puts the active seq-20 record back
// over the listed copy of W1: the withdrawn h3 is declared.
//
// "control/beacon-to-fresh": the beacon reaches the fresh tracker during
// its listing (X46's case) — not declared.
func TestX48HiddenWithdrawalBeaconToStoppedTracker(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name    string
		toFresh bool
		muts    []*bool
	}{
		{"control/beacon-to-fresh", true, nil},
		{"attack/beacon-to-stopped", false, nil},
		{"attack/beacon-to-stopped/listedHostMutation", false, []*bool{&listedHostMutation}},
		{"attack/beacon-to-stopped/listedHostMutation/gated", false, []*bool{&listedHostMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x48Gated(t, c.name)
			x36Mutate(t, c.muts...)
			b, others, backup, backupRev, seq, w1, at := x46Maintained(t)
			const victim = "h3"
			seq, at = x46Back(b, others, at)
			b.rollBack(backup, backupRev)
			c1 := b.tr
			b.tr = nil // none of these records reaches the stopped tracker's watch
			seq++
			w2 := x38Put(b, at.Add(200*time.Millisecond), victim, fencing.LeaseWithdrawn, 2, seq)
			w2Rev := b.rev
			b.tr = c1
			if !c.toFresh { // its beacon, sent as it lands, reaches the running controller (as Runner.observeBeacons)
				if c1.BeaconChain(at.Add(200*time.Millisecond), victim, w2Rev, w2.PrevRev) {
					t.Logf("running controller: a chain gap (RefuseCovered: %v)", c1.RefuseCovered())
				}
				c1.ObserveBeacon(at.Add(200*time.Millisecond), victim, w2Rev)
				c1.BeaconWrote(victim, w2Rev, w2.Epoch, w2.Incarnation, w2.Seq)
				c1.ObserveWithdrawal(at.Add(200*time.Millisecond), victim, w2Rev)
				hs := c1.hosts[victim]
				t.Logf("running controller: withdrawnRev %d trustedRev %d (beacon-withdrawn %t), beacons.wrote %v", hs.beacons.withdrawnRev, hs.trustedRev, hs.beaconWithdrawn(), hs.beacons.wrote)
			}
			b.tr = nil
			if !x45Align(b, at.Add(400*time.Millisecond), victim, w1, 0) {
				t.Fatalf("rig: copy not landed (stream at %d, W1's prev_rev %d)", b.rev, w1.PrevRev)
			}
			b.tr = c1
			start := at.Add(2 * time.Second)
			carry := carryOn(b.carry, c1, at.Add(1500*time.Millisecond), b.delivered)
			b.carry = carry
			for _, w := range carry.withdrawn {
				t.Logf("carried withdrawn: %s (%s)", w.Host, w.Why)
			}
			for _, w := range carry.bars {
				if w.Host == victim {
					t.Logf("bar carried: record %s inc %d seq %d, wrote %v", w.Record.State, w.Record.Incarnation, w.Record.Seq, w.Wrote)
				}
			}
			c1.StreamRolledBack(at.Add(1500*time.Millisecond), "test")
			b.flush()
			b.stop()
			tr := x46List(t, b, start)
			if c.toFresh {
				tr.ObserveBeacon(start, victim, w2Rev)
				tr.BeaconWrote(victim, w2Rev, w2.Epoch, w2.Incarnation, w2.Seq)
				tr.ObserveWithdrawal(start, victim, w2Rev)
			}
			tr.WatchStarted(start)
			tr.AfterRollback(carry.rev)
			carry.applyTo(tr)
			tr.RestoreGuard(b.guard)
			b.tr = tr
			b.flush()
			hs := tr.hosts[victim]
			t.Logf("fresh tracker: %s rec %s inc %d seq %d, bar %v, beacon-withdrawn %t", victim, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar, hs.beaconWithdrawn())
			h, after := b.run(start, 120, others, x10Set([]string{victim}))
			if len(c.muts) > 0 && !strings.HasSuffix(c.name, "/gated") {
				if h == "" {
					t.Fatal("with listedHostMutation h3 was not declared: the test no longer shows the hole")
				}
				t.Logf("with listedHostMutation: the withdrawn %s declared %v after the fresh start", h, after)
				return
			}
			if h != "" {
				t.Fatalf("the withdrawn %s (stopped in order after the rollback, W2 inc 2 seq %d, guests running) declared %v after the fresh start: its withdrawal's beacon reached the running controller, which carried its identity (Wrote, newer than the record) — KeepBar still put the older active record back over the listed copy of W1",
					h, w2.Seq, after)
			}
		})
	}
}

// x48Mutated: the case runs with listedHostMutation (KeepBar puts the
// record back over the host's own listed one, as be52f8c did).
func x48Mutated(c x48Case) bool {
	return slices.Contains(c.muts, &listedHostMutation) && !strings.HasSuffix(c.name, "/gated")
}

// x48Gated: a "/gated" case runs with the rollback gate on: it alone
// must hold the hole the case's mutation reopens.
func x48Gated(t *testing.T, name string) {
	if strings.HasSuffix(name, "/gated") {
		gateOn(t)
	}
}
