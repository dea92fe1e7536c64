package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X23: TestX23RestartedHostStuckWithdrawnAfterBehindRollback
// (liveness of a dead host; (c)'s property, no attacker needed).
//
// KeepWithdrawn (9571cb2) keeps a host the stopped tracker knew withdrawn
// withdrawn "until it writes a trusted record past carry.rev" — the last
// revision the stopped Run was DELIVERED, not the host's withdrawal. After
// a "behind" rollback the stream hands out revisions at or below
// carry.rev again for a while. h3 withdrew in order (trusted, beacon);
// the stream rolls back to a backup with h3's older active record; the
// fresh tracker keeps h3 withdrawn (withdrawnRev = carry.rev). The
// operator restarts h3's agent: it renews with trusted, signed, fresh
// records — all at reused revisions ≤ carry.rev — and its beacons (also ≤
// carry.rev: ObserveBeacon only clears withdrawnRev above it). h3 then
// dies (power loss) before the stream passes carry.rev. It never writes
// again, so it stays "withdrawn" for good: a dead host whose guests ran
// is never declared nor evacuated. The window is carry.rev − the backup's
// revision, i.e. the size of the rollback (a day-old backup: hours of
// fleet writes); nothing bounds "stuck" once the host died inside it.
// The host's own record Seq (signed, monotonic across its agent's
// restarts) proves the restart post-dates the withdrawn record; the
// revision cannot.
//
// "control-renews-past-carry" (passes): h3 renews until the stream passed
// carry.rev, then dies: declared. "hole" FAILS: never declared (120 s).
// Fixed: a host carried by its withdrawn record stays withdrawn until a
// record newer than it comes (Tracker.KeepWithdrawn), not until a revision
// past carry.rev.
func TestX23RestartedHostStuckWithdrawnAfterBehindRollback(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name  string
		renew int // seconds h3's restarted agent renews before it dies
	}{
		{"control-renews-past-carry", 12},
		{"hole", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys) // h3 active
			backupRev := b.rev
			b.run(at, 4, hosts, nil)
			at = at.Add(4 * time.Second)
			now := at.Add(500 * time.Millisecond)
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // orderly stop
			w := b.keys["h3"].rev
			b.tr.ObserveWithdrawal(now, "h3", w)
			b.flush()
			b.run(now, 3, live, nil)
			now = now.Add(3 * time.Second)
			b.rollBack(backup, backupRev)
			start := now.Add(time.Second)
			carry := b.detectRollback(now.Add(500*time.Millisecond), start)
			t.Logf("withdrawal at %d, carry.rev %d, stream back at %d", w, carry.rev, b.rev)
			// The operator restarts h3's agent: it renews with everyone.
			b.run(start, c.renew, hosts, nil)
			start = start.Add(time.Duration(c.renew) * time.Second)
			t.Logf("h3 dies: its last trusted record at %d (carry.rev %d), stream at %d", b.keys["h3"].rev, carry.rev, b.rev)
			host, after := b.run(start, 120, live, map[string]bool{"h3": true})
			if host == "" {
				t.Fatalf("the dead h3 (restarted after the rollback, renewed with trusted records at reused revisions ≤ carry.rev %d, last at %d, then died) was never declared (120 s): KeepWithdrawn keeps it withdrawn until it writes past carry.rev, which a dead host never does",
					carry.rev, b.keys["h3"].rev)
			}
			t.Logf("h3 declared %s after it died", after)
		})
	}
}

// Reviewer X23: TestX23CarriedWithdrawalsHoldGuardForever ((c)'s
// property, liveness; no attacker needed — the compromised node gains
// nothing here but a frozen controller is what (c) protects against).
//
// A host the running tracker knew withdrawn by its trusted withdrawn
// record is NOT counted by the mass-failure guard (tracker.go counted:
// "counting it would let a stopped host hold the controller for good").
// After a rollback KeepWithdrawn marks it withdrawn "as by its own
// beacon" — on the active record the rollback restored — and such a host
// "counts as any host" (the X13 rule for beacon-only withdrawals): silent
// for good, so counted for good. Operators stopped h2, h3, h4 in order for
// maintenance; the stream rolls back (any lag); the fresh tracker counts
// the three stopped hosts silent forever (until each writes past
// carry.rev), the guard holds for good, and h5, which then dies, is held
// back for ever — as is every host that dies later. The stopped tracker
// (control "control-no-rollback/running") and a controller restarted
// without a rollback (control "control-no-rollback/restart") declare h5.
// "detected/fresh-tracker" FAILS: h5 never declared (120 s; the hold
// never ends).
// Fixed: a host carried by its withdrawn record gets that record back
// (uncounted by the guard, as before the rollback).
func TestX23CarriedWithdrawalsHoldGuardForever(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name             string
		rollback, detect bool
		restart          bool
	}{
		{name: "control-no-rollback/running"},
		{name: "control-no-rollback/restart", restart: true},
		{name: "detected/fresh-tracker", rollback: true, detect: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			stopped := []string{"h2", "h3", "h4"}
			up := x11Without(hosts, stopped...)
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys) // everyone active
			backupRev := b.rev
			b.run(at, 4, hosts, nil)
			at = at.Add(4 * time.Second)
			now := at.Add(500 * time.Millisecond)
			for _, h := range stopped { // maintenance: orderly stops, records and beacons seen
				b.write(now, h, fencing.LeaseWithdrawn, b.guard.Ref())
				b.tr.ObserveWithdrawal(now, h, b.keys[h].rev)
				b.flush()
			}
			b.run(now, 3, up, nil)
			now = now.Add(3 * time.Second)
			c1 := b.tr
			if c.rollback {
				b.tr = nil
				b.keys, b.rev = backup, backupRev
				b.tr = c1
			}
			var carry *rollbackCarry
			if c.detect {
				carry = carryOn(nil, c1, now.Add(500*time.Millisecond), b.delivered)
				c1.StreamRolledBack(now.Add(500*time.Millisecond), "test")
				b.flush()
			}
			start := now.Add(time.Second)
			if c.detect || c.restart {
				b.stop()
				b.startCarry(start, carry)
			}
			b.run(start, 30, up, nil) // the fleet runs on; the stopped hosts stay stopped
			start = start.Add(30 * time.Second)
			t.Logf("before h5 dies: silent %d, threshold %d, holding %v", b.tr.Silent(start), b.tr.Threshold(), b.tr.Holding())
			host, after := b.run(start, 120, x11Without(up, "h5"), map[string]bool{"h5": true})
			t.Logf("after: silent %d, threshold %d, holding %v", b.tr.Silent(start.Add(120*time.Second)), b.tr.Threshold(), b.tr.Holding())
			if host == "" {
				t.Fatalf("the dead h5 was never declared (120 s): the three hosts stopped in order before the rollback count silent for good in the fresh tracker (KeepWithdrawn: 'as by its own beacon'), the mass-failure guard holds for ever")
			}
			t.Logf("h5 declared %s after it died", after)
		})
	}
}

// Reviewer X23: TestX23ReplayOnReusedPrevRevEndsKeepWithdrawn (S).
//
// KeepWithdrawn ends when the host has "a trusted record past
// carry.rev". The only replay check on a known key is PrevRev
// (fencing.StaleRecord: a signed record written on a revision below the
// key's last). After a rollback revisions are handed out again, so a
// compromised node that kept one of h3's genuine signed active records
// from before the rollback (it reads messages by sequence; R, written on
// revision P > the backup's) can (1) time garbage into h3's key so it
// lands exactly at the reused revision P (it sees sequences in its acks
// and pads with renewals of its own key, h9), then (2) once the stream
// passed carry.rev, re-put R's bytes: R was "written on P", the key's
// last revision is P — not stale, trusted, at a revision past carry.rev.
// h3's carried withdrawal ends, its (replayed, never renewed) record goes
// silent, and the fresh tracker declares h3 — which stopped in order and
// whose guests run (S). The record's own Seq/incarnation are not compared
// with what the stopped tracker saw (the carry holds only names and one
// revision).
//
// "control-no-rollback" (passes): the same garbage and replay against the
// running tracker — R's PrevRev is below the key's revision, a replay.
// "attack" FAILS: h3 declared. "attack-replay-only" FAILS too: no garbage
// is needed — after the rollback h3's key is back at the backup's
// revision, below P, so R is not stale as it stands.
// Fixed: a signed record not newer than the carried one is a replay
// (replay: h.carried).
func TestX23ReplayOnReusedPrevRevEndsKeepWithdrawn(t *testing.T) {
	for _, c := range []struct {
		name      string
		rollback  bool
		noGarbage bool // the replay alone: the key is back at the backup's revision, below P
	}{
		{"control-no-rollback", false, false},
		{"attack", true, false},
		{"attack-replay-only", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys)
			backupRev := b.rev
			b.run(at, 2, hosts, nil)
			at = at.Add(2 * time.Second)
			// The compromised node keeps h3's genuine signed renewal R
			// (every record is signed in production: Sig set here so the
			// tracker's PrevRev replay check applies, as to the real ones).
			at = at.Add(100 * time.Millisecond)
			b.write(at, "h3", fencing.LeaseActive, b.guard.Ref())
			r := *b.keys["h3"].rec
			r.Sig = "h3-key genuine-signature"
			p := r.PrevRev
			b.run(at, 2, hosts, nil)
			at = at.Add(2 * time.Second)
			now := at.Add(500 * time.Millisecond)
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // orderly stop; guests run on
			w := b.keys["h3"].rev
			b.tr.ObserveWithdrawal(now, "h3", w)
			b.flush()
			b.run(now, 3, live, nil)
			now = now.Add(3 * time.Second)
			if c.rollback {
				b.rollBack(backup, backupRev)
				carry := b.detectRollback(now.Add(500*time.Millisecond), now.Add(time.Second))
				now = now.Add(time.Second)
				if p <= b.rev || p > carry.rev {
					t.Fatalf("rig: R written on %d, stream back at %d, carry.rev %d", p, b.rev, carry.rev)
				}
				t.Logf("R written on %d; stream back at %d; carry.rev %d; withdrawal was at %d", p, b.rev, carry.rev, w)
			}
			// (1) garbage into h3's key at exactly P (or, without a
			// rollback, just garbage): the compromised node pads with its
			// own renewals (h9).
			if !c.noGarbage {
				for b.rev+1 < p {
					now = now.Add(10 * time.Millisecond)
					b.write(now, "h9", fencing.LeaseActive, b.guard.Ref())
				}
				now = now.Add(10 * time.Millisecond)
				b.garbage(now, "h3")
				t.Logf("garbage over h3 at %d", b.keys["h3"].rev)
			}
			// The fleet renews until the stream is well past carry.rev.
			b.run(now, 8, live, nil)
			now = now.Add(8 * time.Second)
			// (2) the replay of R's bytes (a plain put).
			cur := b.keys["h3"]
			b.land(now, "h3", x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			t.Logf("replayed R (written on %d) at %d", p, b.keys["h3"].rev)
			host, after := b.run(now, 120, live, map[string]bool{"h3": true})
			if host != "" {
				t.Fatalf("the withdrawn h3 (orderly stop at %d, guests running) declared %s after a replay of its own pre-rollback record R (written on %d) over garbage timed onto the reused revision %d: the replay is not stale, it is 'a trusted record past carry.rev', KeepWithdrawn ends",
					w, after, p, p)
			}
		})
	}
}
