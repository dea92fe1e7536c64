package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X21: attacks on reviewer X20's fix (MemoryPin.KeyStored: a pin
// is taken only while the key's value at KeyRev has the stored stamp the
// pin names).

// x21Rollback is the lease stream rolling back WHILE the leader C1 runs
// (rather than while it is down, X20's case).
//
// What C1's watch sees: natslease.Store.Watch sits on nats.go's ordered
// consumer (jetstream KV WatchAll). When the server goes away and comes
// back, nats.go re-creates that consumer at the last stream sequence it
// delivered + 1 (nats.go v1.55.0 js.go: resetOrderedConsumer(jsi.sseq+1),
// DeliverByStartSequencePolicy). So after a rollback to below L (the last
// revision C1 was delivered), the reused revisions up to L are never
// delivered to C1, and the first value at L+1 arrives as the successor of
// L: no skip (Store.Watch: e.Revision() == last+1), no lower revision (no
// revision-regressed alert, so nobody is told to restart anything).
// Checked on a real nats-server (passes): TestX21WatchAcrossRollbackNATS
// (attack_x21_nats_test.go) — after the rollback only L+1 was delivered,
// Skipped false.
//
// The attack (compromised node; it sees the stream's sequences in its own
// writes' acks and may watch the bucket):
//  1. Before the rollback: h3's link is briefly down; the compromised node
//     writes garbage into h3's key (R1); C1 pins h3 {active record, R1,
//     stamp s1}. The fleet renews on, C1 is delivered up to L.
//  2. The stream rolls back to R1-2 (a NATS failure / restore from backup;
//     same creation time). h3 comes back and stops in order: its signed
//     withdrawn record lands at R1-1 — below L, never delivered to C1.
//  3. The compromised node pads the stream to L (its own key) and writes
//     garbage into h3's key at L+1: delivered to C1 as the next revision,
//     no skip. C1 still holds h3's pre-rollback active record: pin()
//     "moves the pin along" (seen: no skip since the record) and writes a
//     NEW pin {the pre-rollback active record, TrustedRev T, KeyRev L+1,
//     KeyStored = L+1's genuine, post-rollback stamp}. The stamp is
//     exactly what the fix asks for: the fix binds the pin to the message
//     at KeyRev, but the pin's Record is C1's stale view.
//  4. h3's withdrawal beacon arrives at C1 after that (ObserveWithdrawal):
//     C1 now declares nothing — but ObserveWithdrawal leaves h.pin alone and
//     does not rewrite the memory: the laundered pin stays.
//  5. Any later restart of the controllers (upgrade, crash, the runbook's
//     "restart the controllers" after a rollback): C2 lists h3's key at
//     L+1 with the pin's very stamp, takes the pin, and declares the
//     withdrawn h3 (orderly stop, guests running unprotected) by CAS on
//     L+1 — which holds: h3 writes nothing more. (S) broken.
//
// "beacon-lost/running": the same with the withdrawal beacon lost (the
// agent's connection broke at its stop): C1 itself declares h3 — the
// class docs/security.md already lists ("a withdrawal hidden from the
// controller ... whose withdrawal beacon was lost too"), reached here
// without any watch lag the compromised node causes; listed for
// completeness.
//
// "control-x20-garbage-on-R1-only": X20's own variant under a running
// C1 (garbage on the reused R1, never delivered; nothing at L+1): the
// restarted C2 refuses the stale pin — the fix holds there.
//
// Controls (pass): no rollback (C1 is delivered h3's withdrawal: trusted,
// the pin dropped); the beacon arriving before the garbage at L+1
// (pin() refuses: beaconWithdrawn, the pin is dropped and rewritten); the
// late beacon with C1 kept running (C1 declares nothing).
//
// Fixed: a withdrawal beacon drops the host's pin and rewrites its memory
// (ObserveWithdrawal; "late-beacon/restart/withdrawalPinMutation" shows
// the hole), and the runner finds a rollback (rollback.go: the stream's
// last revision, the stamps of the last values delivered;
// TestRunnerStopsOnRollbackNATS) and stops after dropping every pin
// (Tracker.StreamRolledBack): "beacon-lost/detected" — C1 finds it only
// after the garbage at L+1 re-stamped the pin, the restarted C2 declares
// nothing. "beacon-lost/undetected/running" is the hole when the check
// does not find it (all of its samples superseded: docs/security.md,
// What is left).
func TestX21PinLaunderedByRollbackWhileRunning(t *testing.T) {
	for _, c := range []struct {
		name     string
		rollback bool
		beacon   string // "late", "early", "lost"
		restart  bool
		// detect: C1's runner finds the rollback (rollback.go) after the
		// garbage at L+1 was delivered (the later of its chances):
		// Tracker.StreamRolledBack, its memories written, it stops; C2
		// starts (restart implied).
		detect   bool
		mutation bool // withdrawalPinMutation
		wantHole bool
		onR1     bool // X20's garbage on R1 only (undelivered): no laundering
	}{
		{name: "late-beacon/restart", rollback: true, beacon: "late", restart: true},
		{name: "late-beacon/restart/withdrawalPinMutation", rollback: true, beacon: "late", restart: true, mutation: true, wantHole: true},
		{name: "beacon-lost/detected", rollback: true, beacon: "lost", detect: true},
		{name: "beacon-lost/undetected/running", rollback: true, beacon: "lost", wantHole: true},
		{name: "control-late-beacon/running", rollback: true, beacon: "late"},
		{name: "control-early-beacon/restart", rollback: true, beacon: "early", restart: true},
		{name: "control-no-rollback/late-beacon/restart", beacon: "late", restart: true},
		{name: "control-no-rollback/beacon-lost/running", beacon: "lost"},
		{name: "control-x20-garbage-on-R1-only/late-beacon/restart", rollback: true, beacon: "late", restart: true, onR1: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			withdrawalPinMutation = c.mutation
			defer func() { withdrawalPinMutation = false }()
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			b.run(at, 3, live, nil) // h3's link is briefly down (3 s: not due)
			at = at.Add(3 * time.Second)
			backup := maps.Clone(b.keys) // the stream as the rollback leaves it
			backupRev := b.rev
			b.write(at, "h9", fencing.LeaseActive, b.guard.Ref())
			b.garbage(at, "h3") // R1: the compromised node
			r1 := b.keys["h3"].rev
			if p := b.mem["h3"].Pin; p == nil || p.KeyRev != r1 {
				t.Fatalf("C1 did not pin h3 at %d (rig): %+v", r1, p)
			}
			for _, h := range live { // the fleet renews on: C1 delivered up to L
				b.write(at.Add(500*time.Millisecond), h, fencing.LeaseActive, b.guard.Ref())
			}
			last := b.rev // L
			c1 := b.tr
			now := at.Add(time.Second)
			if c.rollback {
				b.tr = nil // the reused revisions up to L never reach C1's watch
				b.keys, b.rev = backup, backupRev
			}
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // h3's orderly stop
			w := b.keys["h3"].rev
			if c.rollback {
				if w != r1-1 || w > last {
					t.Fatalf("withdrawal at %d, R1 %d, L %d (rig)", w, r1, last)
				}
				if c.onR1 {
					b.garbage(now, "h3") // R1 again (X20): never delivered to C1
				}
				for i := 0; b.rev < last; i++ { // padding (the compromised node's own key, or renewals)
					b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
				b.tr = c1 // L+1 on is delivered, as L's successor: no skip
			}
			if c.beacon == "early" {
				c1.ObserveWithdrawal(now, "h3", w)
				b.flush()
			}
			if !c.onR1 {
				b.garbage(now, "h3") // L+1 (after a rollback): the compromised node
			}
			if c.beacon == "late" {
				c1.ObserveWithdrawal(now.Add(10*time.Millisecond), "h3", w)
				b.flush()
			}
			if c.rollback {
				if p := b.mem["h3"].Pin; c.beacon != "early" && (p == nil || p.KeyRev != last+1 || p.Record.State != fencing.LeaseActive) {
					t.Logf("no laundered pin: %+v", p)
				}
			}
			start := now.Add(2 * time.Second)
			host, after := b.x21After(c1, now.Add(time.Second), start, c.detect, c.restart, live)
			switch {
			case c.wantHole && host == "":
				t.Fatalf("the hole is not reached (h3 not declared): the case shows nothing")
			case !c.wantHole && host != "":
				t.Fatalf("the withdrawn h3 (orderly stop at revision %d, guests running) declared %s after %s: its pin was re-stamped onto revision %d after the lease stream rolled back under the running C1 (memory pin %+v)",
					w, after, map[bool]string{true: "a controller restart", false: "the rollback (C1 running)"}[c.restart || c.detect], last+1, b.mem["h3"].Pin)
			}
		})
	}
}

// TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon (S): the same
// running-leader model as above (C1's watch resumes at L+1 after the
// rollback), with a rollback that goes below the host's last renewal C1
// saw (a restore from a backup older than a few seconds: the usual case).
//
// C1 holds h3's active record at T (its last renewal before the
// rollback). The stream rolls back below T. h3's agent takes the
// conflict on its own older record and renews on (fencing/agent.go
// conflict: same boot/epoch, "only the revision is news"), at reused
// revisions below T — never delivered to C1 (≤ L), and its beacons name
// revisions ≤ C1's trustedRev, which ObserveBeacon does not count. h3 then
// stops in order: withdrawn record at W < T (undelivered); its withdrawal
// beacon reaches C1 — and ObserveWithdrawal drops it (rev <= trustedRev).
// The compromised node writes garbage into h3's key at L+1: delivered as
// L's successor (no skip), h.rev = L+1, the declaration clock kept (no
// beacon names it), and the pin moves along with L+1's genuine stamp. C1
// declares the withdrawn h3 by CAS on L+1 (which holds); so does any
// controller restarted later (it takes the pin: same stream, same stamp).
// No beacon is lost, no watch lag is caused: the withdrawal is hidden by
// the rollback, and the beacon that should reveal it is dropped because
// the rollback reused revisions below what C1 trusted.
//
// Control: no rollback (h3's renewals and withdrawal are delivered).
//
// Fixed by the runner's rollback check ("detected": C1 finds the rollback
// after the garbage and stops, its pins dropped; C2 declares nothing);
// "undetected/*" is the hole when the check does not find it.
func TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon(t *testing.T) {
	for _, c := range []struct {
		name     string
		rollback bool
		restart  bool
		detect   bool // as in TestX21PinLaunderedByRollbackWhileRunning
		wantHole bool
	}{
		{name: "detected", rollback: true, detect: true},
		{name: "undetected/running", rollback: true, wantHole: true},
		{name: "undetected/restart", rollback: true, restart: true, wantHole: true},
		{name: "control-no-rollback/running"},
		{name: "control-no-rollback/restart", restart: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys) // the backup the stream is restored from
			backupRev := b.rev
			b.run(at, 4, hosts, nil) // everyone renews, h3 too (T)
			at = at.Add(4 * time.Second)
			trusted := b.keys["h3"].rev
			last := b.rev // L: C1 was delivered everything
			c1 := b.tr
			now := at.Add(500 * time.Millisecond)
			if c.rollback {
				b.tr = nil // reused revisions up to L never reach C1's watch
				b.keys, b.rev = backup, backupRev
			}
			for i := 0; i < 2; i++ { // h3 renews on after the conflict (beacons: C1 ignores revisions ≤ T)
				b.write(now, "h3", fencing.LeaseActive, b.guard.Ref())
				c1.ObserveBeacon(now, "h3", b.keys["h3"].rev)
			}
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // orderly stop
			w := b.keys["h3"].rev
			for _, d := range c1.ObserveWithdrawal(now, "h3", w) { // its beacon is NOT lost
				t.Logf("C1: %s", d.Reason)
			}
			tr := b.tr
			b.tr = c1
			b.flush() // C1 writes its memories (its watch may still be blind)
			b.tr = tr
			if c.rollback {
				if w >= trusted {
					t.Fatalf("withdrawal at %d, trusted %d (rig)", w, trusted)
				}
				for i := 0; b.rev < last; i++ {
					b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
				b.tr = c1 // L+1 on: delivered, no skip
			}
			b.garbage(now, "h3") // the compromised node (at L+1 after a rollback)
			start := now.Add(time.Second)
			host, after := b.x21After(c1, now.Add(500*time.Millisecond), start, c.detect, c.restart, live)
			switch {
			case c.wantHole && host == "":
				t.Fatalf("the hole is not reached (h3 not declared): the case shows nothing")
			case !c.wantHole && host != "":
				t.Fatalf("the withdrawn h3 (withdrawal at %d below C1's trusted %d, its beacon delivered) declared %s after %s (rollback %v; memory pin %+v)",
					w, trusted, after, map[bool]string{true: "a restart", false: "the garbage"}[c.restart || c.detect], c.rollback, b.mem["h3"].Pin)
			}
		})
	}
}

// x21After: C1 (b.tr) finds the rollback at detectAt (detect: its runner's
// check — Tracker.StreamRolledBack, its memories written — and it
// stops) and/or the controllers restart at start; the running controller
// then runs 120 s. It returns the first declaration of h3, if any.
func (b *x11Bucket) x21After(c1 *Tracker, detectAt, start time.Time, detect, restart bool, live []string) (string, time.Duration) {
	switch {
	case detect:
		b.tr = c1
		b.detectRollback(detectAt, start)
	case restart:
		b.stop()
		b.x19Start(start)
	}
	return b.run(start, 120, live, map[string]bool{"h3": true})
}

// detectRollback: the running controller finds the rollback at detectAt
// (its runner's check: Tracker.StreamRolledBack, its memories written)
// and the runner starts a fresh tracker at start, as Runner.Run does
// after ErrLeaseStreamRolledBack (startCarry). It returns the carry.
func (b *x11Bucket) detectRollback(detectAt, start time.Time) *rollbackCarry {
	c1 := b.tr
	carry := carryOn(b.carry, c1, detectAt, b.delivered) // as Runner.Run
	b.carry = carry
	c1.StreamRolledBack(detectAt, "test")
	b.flush()
	b.stop()
	b.startCarry(start, carry)
	return carry
}

// rollBack puts the lease bucket back to keys at revision rev (a restore
// from a backup): the running controller's watch sees none of it
// (rollback.go); what lands later is delivered as the successor of the
// last revision it was delivered.
func (b *x11Bucket) rollBack(keys map[string]x11Entry, rev uint64) { b.keys, b.rev = keys, rev }
