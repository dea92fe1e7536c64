package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X52: attacks on the rollback gate (rollbackgate.go) after
// X50/X51's revisions.

// TestX52LostStateWithdrawsFirst ((S), faults only: X51's faults — an
// agent restarted with its state lost, and one lost beacon — but the
// lost-state agent's first write is its withdrawal (a failed start, or
// an operator stopping the service at once)).
//
// h3 proves itself after the fresh start ((3,22..26), beacons naming
// each). Its agent restarts with its state lost and withdraws as its
// first write, at (2,1): below the bar (3,20), refused as a replay (no
// trusted record, no expectBeacon), its beacon lost. No beacon of the
// lost-state agent came, so beacons.maxRev stays (3,26)'s revision ==
// trustedRev; (3,26) == beacons.wrote, newer than the bar: condition (a)
// holds and h3 is declared while its guests run. X51's fix (maxRev)
// needs at least one beacon of the lost-state agent. Control: the
// withdrawal's beacon arrives (ObserveWithdrawal): never declared.
func TestX52LostStateWithdrawsFirst(t *testing.T) {
	for _, c := range []struct {
		name   string
		beacon bool
		muts   []*bool
	}{
		{name: "withdrawal-beacon-lost"},
		{name: "withdrawal-beacon-lost/rollbackRefusedMutation", muts: []*bool{&rollbackRefusedMutation, &rollbackUnvouchedMutation}},
		{name: "control/withdrawal-beacon-came", beacon: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x53Proved(t, fmt.Sprintf("its agent restarted with its state lost and withdrew in order as its first write, (2,1) (refused below the bar; beacon lost: %t)", !c.beacon), c.muts, func(b *x11Bucket, s int, w time.Time) bool {
				switch {
				case s == 10 && c.beacon:
					gatePut(b, w, fencing.LeaseWithdrawn, 2, 1)
				case s == 10:
					x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 1)
				default:
					return false
				}
				return true
			})
		})
	}
}

// TestX52ConfirmationTakenAfterSignsOfLife ((S), faults only: the
// control bucket's reads fail for half a minute — the poll retries —,
// and X51's faults: an agent restarted with its state lost, its
// withdrawal's beacon lost).
//
// The dead h3 is gated; at 45 s an operator checks it is down and writes
// the confirmation (revision 7). The runner's polls fail to read the
// control bucket (2 s timeout, retried) until 90 s. Meanwhile h3 boots:
// its agent, state lost, renews (2,1..10) from 50 s (refused below the
// bar, its beacons name them: signs of life) and withdraws in order at
// (2,11), 60.5 s, beacon lost. Without the confirmation h3 stays gated
// (X51's maxRev). The poll reads the confirmation at 90 s (written 45 s
// before: within ConfirmMaxAge) and ConfirmRollback stamps it with the
// tracker's now: every sign of life between the operator's check and the
// take is before c.at, so spent() is false and the withdrawn h3 is
// declared. Controls: the same take stamped with the operator's write
// time (45 s) is spent by the beacons (not declared); no confirmation
// (not declared: X51's maxRev).
func TestX52ConfirmationTakenAfterSignsOfLife(t *testing.T) {
	for _, c := range []struct {
		name   string
		takeAt int // 0: never
		muts   []*bool
	}{
		{name: "taken-late", takeAt: 90},
		{name: "taken-late/confirmTakenMutation", takeAt: 90, muts: []*bool{&confirmTakenMutation}},
		{name: "control/no-confirmation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, start := gateFresh(t)
			var wd time.Time
			gatedAt := -1
			for s := 0; s < 300; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				if x52Boots(b, s, w) {
					wd = w
				}
				if s == c.takeAt && c.takeAt > 0 {
					// As the runner: stamped at its write (45 s), by its age.
					stamp := confirmStamp(now, taken{"h3", "m1", 7, now.Sub(start.Add(45 * time.Second))})
					if !b.tr.ConfirmRollback("h3", "m1", 7, stamp) {
						t.Fatalf("the confirmation (written at 45 s) not taken at %d s", s)
					}
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host != "h3" {
						continue
					}
					if d.Op == OpRefusedDue && gatedAt < 0 {
						gatedAt = s
					}
					if d.Op == OpDeclare {
						if len(c.muts) > 0 {
							t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
							return
						}
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) an operator confirmed the dead h3 at 45 s (gated since %d s); it booted, its lost-state agent renewed (2,1..10) from 50 s with beacons and withdrew at (2,11) %v after the fresh start (beacon lost); the poll took the confirmation at %d s: declared %v after the withdrawal — c.at is the take, not the operator's write; beacons.at %v after the fresh start",
							gatedAt, wd.Sub(start), c.takeAt, now.Sub(wd), hs.beacons.at.Sub(start))
					}
				}
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared (gated first at %d s)", gatedAt)
		})
	}
}

// TestX52HoldDefersConfirmationPastSignsOfLife ((S), faults only: X51's
// faults — an agent restarted with its state lost, its withdrawal's
// beacon lost — during a mass-failure hold, with no control-bucket
// trouble: the poll as run.go drives it).
//
// The dead h3 is gated at 22 s (OpRefusedDue names the command). Four
// other hosts go silent at 25 s (the incident's rack; back at 40 s): the
// guard holds. While held, h3's Tick case is "held", not "gated", so
// saidGate is false and RollbackGated — the only hosts the runner's poll
// reads confirmations of — omits h3. The operator, answering the 22 s
// alert, checks h3 is down and confirms it at 45 s: nobody reads it.
// h3 boots; its lost-state agent renews (2,1..10) from 50 s (beacons:
// signs of life, refused records) and withdraws at (2,11), beacon lost.
// The hold ends; h3 is due and gated again, the poll reads the 45 s
// confirmation (within ConfirmMaxAge) and ConfirmRollback stamps it now:
// the signs of life are before it, not spent — the withdrawn h3 is
// declared. Control: no confirmation (gated: X51's maxRev).
func TestX52HoldDefersConfirmationPastSignsOfLife(t *testing.T) {
	for _, c := range []struct {
		name    string
		confirm bool
		muts    []*bool
	}{
		{"confirmed-during-hold", true, nil},
		{"confirmed-during-hold/confirmTakenMutation", true, []*bool{&confirmTakenMutation}},
		{"control/no-confirmation", false, nil},
	} {
		confirm := c.confirm
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, start := gateFresh(t)
			rack := map[string]bool{"h0": true, "h1": true, "h2": true, "h4": true}
			var wd time.Time
			gatedAt, heldAt, takenAt, endAt := -1, -1, -1, -1
			for s := 0; s < 400; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				if x52Boots(b, s, w) {
					wd = w
				}
				// run.go's poll: every 2 s, the confirmations of the
				// hosts RollbackGated lists; the operator's is written at 45 s.
				if confirm && s >= 45 && s%2 == 0 && takenAt < 0 {
					for _, g := range b.tr.RollbackGated() {
						if g == "h3" && b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, taken{"h3", "m1", 7, now.Sub(start.Add(45 * time.Second))})) {
							takenAt = s
						}
					}
				}
				for _, h := range others {
					if rack[h] && s >= 25 && s < 40 {
						continue
					}
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					switch {
					case d.Op == OpHoldStarted && heldAt < 0:
						heldAt = s
					case d.Op == OpHoldEnded:
						endAt = s
					case d.Host != "h3":
					case d.Op == OpRefusedDue && gatedAt < 0:
						gatedAt = s
					case d.Op == OpDeclare && len(c.muts) > 0:
						t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
						return
					case d.Op == OpDeclare:
						t.Fatalf("(S) h3 gated at %d s; hold %d..%d s; the operator confirmed it at 45 s (unread: held hosts are not polled); its lost-state agent renewed (2,1..10) from 50 s with beacons and withdrew at (2,11) %v after the fresh start (beacon lost); the poll took the 45 s confirmation at %d s, stamped then: the withdrawn h3 declared %v after its withdrawal (%d s)",
							gatedAt, heldAt, endAt, wd.Sub(start), takenAt, now.Sub(wd), s)
					}
				}
			}
			if heldAt < 0 {
				t.Fatal("rig: no hold")
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared: gated %d s, hold %d..%d s, taken %d s", gatedAt, heldAt, endAt, takenAt)
		})
	}
}

// x52Boots: the dead h3 boots at 50 s, its agent's state lost: it renews
// (2,1..10), its beacons naming each, and withdraws in order at (2,11) at
// 60 s, that beacon lost. It reports whether s is the withdrawal's second.
func x52Boots(b *x11Bucket, s int, w time.Time) bool {
	switch {
	case s >= 50 && s < 60:
		gatePut(b, w, fencing.LeaseActive, 2, uint64(s-49))
	case s == 60:
		x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 11)
		return true
	}
	return false
}
