package controller

import (
	"hvguard/fencing"
	"testing"
	"time"
)

// Reviewer X53: attacks on the rollback gate (rollbackgate.go) after
// X50–X52's revisions.

// TestX53OperatorClockAheadStampsAtTake ((S), faults only: the operator's
// machine's clock runs 50 s ahead — inside ConfirmClockSkew, so the poll
// takes the confirmation — plus X52's faults: the control bucket's reads
// fail until 90 s; an agent restarted with its state lost, its
// withdrawal's beacon lost).
//
// X52's scenario (TestX52ConfirmationTakenAfterSignsOfLife) with the one
// change that the confirmation's At says 95 s (written at 45 s, clock 50 s
// ahead). The poll at 90 s sees At 5 s in the future: accepted (skew <
// 1 min), age = max(wall-At, 0) = 0, so confirmStamp stamps it at the
// take (90 s) — X52's fix undone: the boot's beacons (50..59 s) and the
// withdrawal (60.5 s) are before c.at, the confirmation is not spent and
// the withdrawn h3 is declared. Control: the same clocks in sync (At 45
// s): spent, not declared.
func TestX53OperatorClockAheadStampsAtTake(t *testing.T) {
	for _, c := range []struct {
		name string
		skew time.Duration
		muts []*bool
	}{
		{"operator-clock-50s-ahead", 50 * time.Second, nil},
		{"operator-clock-5s-ahead", 5 * time.Second, nil},
		{"operator-clock-50s-ahead/confirmCommandClockMutation", 50 * time.Second, []*bool{&confirmCommandClockMutation}},
		{"control/clocks-in-sync", 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, start := gateFresh(t)
			var wd time.Time
			written := start.Add(45 * time.Second)
			claimed := written.Add(c.skew) // RollbackConfirmation.At
			for s := 0; s < 300; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				if x52Boots(b, s, w) {
					wd = w
				}
				if s == 90 {
					// The poll's acceptance and age (wall == now; the server
					// stored it at 45 s).
					if !confirmFresh(now, now, written, claimed) {
						t.Logf("the poll refuses the confirmation (its clock %v ahead)", c.skew)
					} else {
						tk := taken{"h3", "m1", 7, confirmAge(now, now, written, claimed)}
						if !b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, tk)) {
							t.Fatal("the confirmation not taken at 90 s")
						}
					}
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						if len(c.muts) > 0 {
							t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
							return
						}
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) the operator confirmed the dead h3 at 45 s with a clock %v ahead (At %v after the fresh start, accepted: within ConfirmClockSkew); h3 booted, its lost-state agent renewed from 50 s with beacons (beacons.at %v) and withdrew at %v (beacon lost); the poll took it at 90 s with age 0, stamped at the take: declared %v after the withdrawal",
							c.skew, claimed.Sub(start), hs.beacons.at.Sub(start), wd.Sub(start), now.Sub(wd))
					}
				}
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared")
		})
	}
}

// TestX53SkippedGarbageUnfreshensLostStateWithdrawal ((S), attacker plus
// X52's faults: a compromised node writes garbage on h3's key; the
// watch skips it (superseded before delivery: a burst, X4); an agent
// restarted with its state lost withdraws as its first write; that
// beacon is lost).
//
// h3 proves itself after the fresh start ((3,22..26), beacons naming
// each). At 10 s the compromised node writes garbage on h3's key; h3's
// lost-state agent withdraws at (2,1) by a compare-and-set on the
// garbage's revision, before the watch reached the garbage: the watch
// delivers only the withdrawal (Skipped). It is refused below the bar,
// but its prev_rev is the garbage's, not h.rev: not "fresh", so
// barRefused is not called — barRefusedRev stays 0, maxRev == trustedRev,
// (3,26) == beacons.wrote: the gate passes the withdrawn h3. Controls:
// the garbage delivered (fresh: gated), no garbage (X52's case: gated).
func TestX53SkippedGarbageUnfreshensLostStateWithdrawal(t *testing.T) {
	for _, c := range []struct {
		name             string
		garbage, skipped bool
		muts             []*bool
	}{
		{"garbage-skipped", true, true, nil},
		{"garbage-skipped/rollbackUnvouchedMutation+rollbackRefusedMutation", true, true, []*bool{&rollbackUnvouchedMutation, &rollbackRefusedMutation}},
		{"control/garbage-delivered", true, false, nil},
		{"control/no-garbage", false, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x53Proved(t, "its lost-state agent withdrew at (2,1) on the revision of garbage a compromised node wrote, skipped by the watch", c.muts, func(b *x11Bucket, s int, w time.Time) bool {
				if s != 10 {
					return false
				}
				if c.garbage {
					tr := b.tr
					if c.skipped {
						b.tr = nil // superseded before the watch reached it
					}
					b.garbage(w.Add(-100*time.Millisecond), "h3")
					b.tr = tr
					if c.skipped {
						tr.Skipped(b.rev + 1)
					}
				}
				x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 1)
				return true
			})
		})
	}
}

// TestX53HiddenWithdrawalPassesGate ((S), attacker plus one fault: h3's
// withdrawal beacon is lost; a compromised node overwrites h3's
// withdrawal with garbage before the watch delivers it — Skipped).
//
// h3 proves itself ((3,22..26), beacons naming each), then withdraws in
// order at (3,27), beacon lost; the garbage supersedes it, the watch
// delivers only the garbage after a skip. The gate judges (3,26), which
// equals beacons.wrote, trustedRev == maxRev, no bar-refused write:
// declared while h3's guests run. The gate's premise — "declared only if
// the judged record is the host's newest" — does not look at the
// untrusted value the key holds after it (h.rev > trustedRev). Note: with
// the gate off (gateOff) it is declared the same way — the baseline's
// accepted "hidden write, own beacon missing: declarable" (beaconloss.go);
// the gate does not add this hole, it fails to close it.
func TestX53HiddenWithdrawalPassesGate(t *testing.T) {
	for _, c := range []struct {
		name   string
		hidden bool
		muts   []*bool
	}{
		{"withdrawal-hidden-by-garbage", true, nil},
		{"withdrawal-hidden-by-garbage/rollbackUnvouchedMutation", true, []*bool{&rollbackUnvouchedMutation}},
		{"control/withdrawal-delivered", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x53Proved(t, "it withdrew in order at (3,27), its beacon lost, the withdrawal hidden by garbage the watch delivered after a skip", c.muts, func(b *x11Bucket, s int, w time.Time) bool {
				if s != 10 {
					return false
				}
				tr := b.tr
				if c.hidden {
					b.tr = nil
				}
				x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 3, 27)
				if c.hidden {
					b.garbage(w.Add(100*time.Millisecond), "h3")
					b.tr = tr
					tr.Skipped(b.rev)
					deliver(tr, w.Add(200*time.Millisecond), "h3", b.keys["h3"])
				}
				return true
			})
		})
	}
}

// TestX53DeleteThenLostStateWithdrawalPassesGate ((S), attacker plus
// X52's faults: a compromised node deletes h3's key — a delete is a
// publish any agent may make (keydelete.go) —; h3's agent restarts with
// its state lost and withdraws as its first write; that beacon is lost).
//
// h3 proves itself ((3,22..26), beacons). At 8 s its key is deleted; at
// 10 s its lost-state agent withdraws at (2,1), a create over the marker
// (prev_rev 0). Refused below the bar as a replay, but prev_rev 0 !=
// h.rev (the marker's): not "fresh", barRefused not called. The deleted
// h3 is "declared on the marker's revision once silent" and the gate
// passes (3,26) == beacons.wrote: declared while its guests run. No watch
// skip needed. Control: no delete (X52's case: gated).
func TestX53DeleteThenLostStateWithdrawalPassesGate(t *testing.T) {
	for _, c := range []struct {
		name string
		del  bool
		muts []*bool
	}{
		{"deleted-then-withdrawn", true, nil},
		{"deleted-then-withdrawn/rollbackUnvouchedMutation+rollbackRefusedMutation", true, []*bool{&rollbackUnvouchedMutation, &rollbackRefusedMutation}},
		{"control/not-deleted", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x53Proved(t, "its key deleted at 8 s, its lost-state agent withdrew at (2,1), a create over the marker, its beacon lost", c.muts, func(b *x11Bucket, s int, w time.Time) bool {
				switch {
				case s == 8 && c.del:
					b.del(w, "h3")
				case s == 10:
					if r := x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 1); c.del && r.PrevRev != 0 {
						t.Fatalf("rig: the create over the marker has prev_rev %d", r.PrevRev)
					}
					return true
				}
				return false
			})
		})
	}
}

// x53Proved: after the fresh start h3 proves itself ((3,22..26), its
// beacons naming each), then step runs each second from 5 s (it reports
// the second h3 withdrew in). h3 must not be declared in 200 s — with
// muts (the fixes undone) it must be.
func x53Proved(t *testing.T, what string, muts []*bool, step func(b *x11Bucket, s int, w time.Time) bool) {
	t.Helper()
	x36Mutate(t, muts...)
	b, others, start := gateFresh(t)
	var wd time.Time
	for s := 0; s < 200; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		w := now.Add(500 * time.Millisecond)
		if s < 5 {
			gatePut(b, w, fencing.LeaseActive, 3, uint64(22+s))
		} else if step(b, s, w) {
			wd = w
		}
		gateOthers(b, now, others)
		for _, d := range b.tr.Tick(now) {
			if d.Host != "h3" || d.Op != OpDeclare {
				continue
			}
			if len(muts) > 0 {
				t.Logf("with the mutations: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
				return
			}
			hs := b.tr.hosts["h3"]
			t.Fatalf("(S) h3 proved itself at (3,22..26); %s at %v: declared %v after the withdrawal — barRefusedRev %d, trustedRev %d, maxRev %d, h.rev %d, deleted %t, judged (%d,%d)",
				what, wd.Sub(start), now.Sub(wd), hs.barRefusedRev, hs.trustedRev, hs.beacons.maxRev, hs.rev, hs.deleted, hs.rec.Incarnation, hs.rec.Seq)
		}
	}
	if len(muts) > 0 {
		t.Fatal("with the mutations h3 was not declared: the test no longer shows the hole")
	}
}

// TestX53DeleteThenCreateDoesNotSpendConfirmation ((S), attacker plus
// X52's faults: a compromised node deletes h3's key; h3's agent, its
// state lost, withdraws as its first write; that beacon is lost).
//
// The dead h3 is gated; an operator checks it is down and confirms at 45
// s; the control bucket's reads fail until 90 s (X52's fault), the take
// is stamped 45 s (its age; clocks in sync). The key is deleted at 48 s; h3 boots
// and its lost-state agent withdraws at (2,1) at 50.5 s, a create over
// the marker (prev_rev 0): refused below the bar, not "fresh", so ownAt
// does not move and the confirmation is not spent — a sign of life of
// the host's own that spent() cannot see. The withdrawn h3 is declared.
// Control: no delete (the withdrawal lands on the key's revision: fresh,
// spent, not declared).
func TestX53DeleteThenCreateDoesNotSpendConfirmation(t *testing.T) {
	for _, c := range []struct {
		name string
		del  bool
	}{
		{"deleted-then-create-withdrawal", true},
		{"control/not-deleted", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, others, start := gateFresh(t)
			var wd time.Time
			for s := 0; s < 300; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				switch {
				case s == 90:
					// Written at 45 s; the control bucket unreadable until 90 s (X52's fault): stamped at 45 s by its age.
					if !b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, taken{"h3", "m1", 7, now.Sub(start.Add(45 * time.Second))})) {
						t.Fatal("confirmation not taken")
					}
				case s == 48 && c.del:
					b.del(w, "h3")
				case s == 50:
					x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 1)
					wd = w
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) the dead h3 confirmed at 45 s; key deleted at 48 s (%t); its lost-state agent withdrew at (2,1) at %v (create, beacon lost): declared %v after the withdrawal — ownAt %v, barRefusedRev %d, h.rev %d",
							c.del, wd.Sub(start), now.Sub(wd), hs.ownAt.Sub(start), hs.barRefusedRev, hs.rev)
					}
				}
			}
			t.Logf("not declared after the withdrawal")
		})
	}
}

// TestConfirmationBeforeStartNotTaken (reviewer X53's (c), reversed by
// X55's (S)). X53: the operator confirms the dead h3 5 s before the
// fresh tracker starts; the start's listing counted as a sign of life
// and spent it — the operator had to confirm again. Fixed then (the
// first listing sets no ownAt); X55 then showed that a controller started
// after the host's signs of life — which it cannot see — takes a spent
// confirmation again. Now a confirmation written before the first
// listing ended is not taken at all (ConfirmTooEarly): the operator
// confirms again after a controller's start, as docs/monitoring.md says.
// A confirmation written after the start is taken and h3 declared.
func TestConfirmationBeforeStartNotTaken(t *testing.T) {
	for _, c := range []struct {
		name    string
		written time.Duration // before (<0) or after the start
		want    bool
	}{
		{"before-start", -5 * time.Second, false},
		{"after-start", 15 * time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, others, start := gateFresh(t)
			var declared bool
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				if s == 30 {
					// This controller's poll takes it now.
					if took := b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, taken{"h3", "m1", 7, now.Sub(start.Add(c.written))})); took != c.want {
						t.Fatalf("a confirmation written %v after the start taken: %t", c.written, took)
					}
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						declared = true
					}
				}
			}
			if declared != c.want {
				t.Fatalf("the dead h3, confirmed %v after this controller started: declared %t", c.written, declared)
			}
		})
	}
}
