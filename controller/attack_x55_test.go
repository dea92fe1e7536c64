package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X55: attacks on the rollback gate and the rollback marker /
// confirmations (rollbackgate.go, rollbackconfirm.go) after X50–X54.

// TestX55ConfirmationRetakenAfterRestart ((S), a rollback (the marker
// stands), an operator's confirmation of a host that was down, the host
// back within ConfirmMaxAge and stopped in order, a controller restart,
// and a compromised node landing an aligned copy of a pre-rollback
// record — X44's technique).
//
// C1 (fresh after the rollback) gates the dead h3. The operator checks
// it is down and confirms at 23 s; h3 is powered on at 23.5 s (new boot:
// incarnation 4) — C1's poll takes the confirmation at 24 s and it is
// spent at once (ownAt after its stamp): correct. h3's agent is then
// stopped in order at 24.5 s ((4,2) withdrawn, beacon received): its
// guests run on. At 25.5 s the node aligns the stream (filler writes,
// garbage on h3's key at the copy's prev_rev) and lands a copy of h3's
// pre-rollback (3,20) on exactly its prev_rev (fresh). C1 is
// restarted at 30 s (crash, upgrade, takeover by a standby started
// after): C2 runs behind the marker's gate, lists the copy, and its first
// poll takes the confirmation again (it names the standing marker, is 8 s
// old; C2's tracker never saw the signs of life that spent it in C1, and
// the listing spends nothing: X53). The confirmation bypasses the whole
// gate: the copy is judged and the withdrawn h3 declared.
// Measured: declared 27.5 s after its withdrawal (lease_ttl + grace
// after C2's start). No attacker: a second restore of the lease bucket
// while no controller runs (a backup holding h3's (4,1)) does the same.
// Controls: no restart (C1 is never fooled); no copy (C2 lists the
// withdrawal).
// Closed: a confirmation written before the tracker's first listing is
// not taken (Tracker.ConfirmTooEarly); with confirmStartMutation C2
// takes it and h3 is declared.
func TestX55ConfirmationRetakenAfterRestart(t *testing.T) {
	for _, c := range []struct {
		name          string
		restart, copy bool
		// restore: no attacker — the lease bucket is restored once more,
		// while no controller runs (29 s), to a backup taken at 23.5 s
		// (h3 active at (4,1), before its withdrawal).
		restore bool
		mut     bool
	}{
		{"restart-retakes-spent-confirmation/copy", true, true, false, false},
		{"restart-retakes-spent-confirmation/second-restore", true, false, true, false},
		{"restart-retakes-spent-confirmation/copy/confirmStartMutation", true, true, false, true},
		{"restart-retakes-spent-confirmation/second-restore/confirmStartMutation", true, false, true, true},
		{"control/no-restart", false, true, false, false},
		{"control/restart-no-copy", true, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &confirmStartMutation)
			}
			b, others, bk, at := x48Rig(t)
			pre := b.keys["h3"] // the pre-rollback (3,20): the node keeps its bytes
			cp := *pre.rec
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			start := at.Add(1500 * time.Millisecond)
			b.detectRollback(at.Add(time.Second), start)
			confirmedAt := start.Add(23 * time.Second)
			var wd time.Time
			var bk2 x47Backup
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				switch {
				case s == 23:
					gatePut(b, w, fencing.LeaseActive, 4, 1) // h3 powered on: a new boot
					bk2 = x47Backup{maps.Clone(b.keys), b.rev}
				case s == 24:
					if b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, taken{"h3", "m1", 7, now.Sub(confirmedAt)})) {
						if hs := b.tr.hosts["h3"]; !b.tr.confirmed["h3"].spent(hs) {
							t.Fatal("rig: C1's confirmation not spent by h3's renewal at 23.5 s")
						}
					}
					gatePut(b, w, fencing.LeaseWithdrawn, 4, 2)
					b.tr.ObserveWithdrawal(w, "h3", b.rev)
					wd = w
				case s == 25 && c.copy:
					// The node's filler writes bring the stream to the
					// copy's prev_rev - 1; garbage on h3's key lands at
					// prev_rev, the copy by a compare-and-set on it.
					if b.rev >= cp.PrevRev {
						t.Fatalf("rig: the stream (%d) is past the copy's prev_rev %d: cannot align", b.rev, cp.PrevRev)
					}
					b.rev = cp.PrevRev - 1
					b.garbage(w, "h3")
					r := cp
					b.land(w.Add(100*time.Millisecond), "h3", x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: r.PrevRev}})
				case s == 29 && c.restore:
					b.stop() // C1 stopped (crash, upgrade); the bucket restored meanwhile
					b.rollBack(maps.Clone(bk2.keys), bk2.rev)
				case s == 30 && c.restart:
					b.stop()
					b.start(now)
					b.tr.SetRollbackGate(MarkerStands, "the controllers' rollback marker m1")
				case s == 31 && c.restart:
					// C2's first poll: written 8 s ago, names the standing marker.
					took := b.tr.ConfirmRollback("h3", "m1", 7, confirmStamp(now, taken{"h3", "m1", 7, now.Sub(confirmedAt)}))
					if took != c.mut {
						t.Fatalf("C2 took the confirmation written before its start: %t", took)
					}
				}
				if b.tr == nil {
					continue
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						if c.mut {
							t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
							return
						}
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) h3 confirmed down at 23 s, back at 23.5 s (the confirmation spent in C1), withdrawn in order at %v; C2 started at 30 s took the same confirmation again and declared the withdrawn h3 %v after its withdrawal — judged by (%d,%d) %s at rev %d",
							wd.Sub(start), now.Sub(wd), hs.rec.Incarnation, hs.rec.Seq, hs.rec.State, hs.trustedRev)
					}
				}
			}
			if c.mut {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared")
		})
	}
}

// TestX55MarkerLossOpensRestartedGate ((S), faults only, no attacker: a
// rollback that lost a withdrawal, a controller restarted while the marker
// stands, then the control bucket re-created or restored from a backup
// taken before the marker — X51's "re-created control bucket", before the
// operator writes the marker again by hand).
//
// h3 withdraws in order at (3,21) (beacon received); the lease stream is
// restored from a backup holding h3's older ACTIVE (1,3). C1 finds the
// rollback (carries the withdrawal: not declared) and writes the marker.
// C1 is restarted (C2: no carry, no bar — only the marker's gate): C2
// lists (1,3), h3 is gated, NOT DECLARED. At 60 s the control bucket is
// re-created (or restored) without the marker: C2's recheck
// (MarkerRecheckInterval) reads "no marker" and Runner.Run calls
// SetRollbackGate(false) — the gate of a controller that did not find
// the rollback itself is turned off by the marker's absence, and the
// withdrawn h3, due for long, is declared at the next tick. Controls: the
// marker stays (never declared); C1 (AfterRollback: the gate stays on)
// never declares it either.
// Closed: a gate a standing marker turned on stays on for the tracker's
// life (SetRollbackGate); with markerStickyMutation h3 is declared when
// the marker goes.
func TestX55MarkerLossOpensRestartedGate(t *testing.T) {
	for _, c := range []struct {
		name           string
		restart, loses bool
		mut            bool
	}{
		{"restarted/marker-lost", true, true, false},
		{"restarted/marker-lost/markerStickyMutation", true, true, true},
		{"control/restarted-marker-stays", true, false, false},
		{"control/after-rollback-marker-lost", false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &markerStickyMutation)
			}
			b, others, bk, at := x48Rig(t)
			w := at.Add(500 * time.Millisecond)
			x38Put(b, w, "h3", fencing.LeaseWithdrawn, 3, 21)
			b.tr.ObserveWithdrawal(w, "h3", b.rev)
			wd := w
			b.run(at, 1, others, nil)
			at = at.Add(time.Second)
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			start := at.Add(1500 * time.Millisecond)
			b.detectRollback(at.Add(time.Second), start)
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				switch {
				case s == 10 && c.restart:
					b.stop()
					b.start(now)
					b.tr.SetRollbackGate(MarkerUnread, "the controllers' rollback marker (control bucket) is not read yet")
				case s == 12 && c.restart:
					b.tr.SetRollbackGate(MarkerStands, "the controllers' rollback marker m1") // its first poll
				case s == 60 && c.loses:
					// The recheck after the control bucket was re-created:
					// res.known && !res.marker (run.go).
					if kept := b.tr.SetRollbackGate(MarkerAbsent, ""); kept != (c.restart && !c.mut) {
						t.Fatalf("SetRollbackGate reported the gate kept: %t", kept)
					}
					if b.tr.SetRollbackGate(MarkerAbsent, "") {
						t.Fatal("the kept gate reported twice")
					}
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						if c.mut {
							t.Logf("with the mutation: the withdrawn h3 declared %v after the fresh start", now.Sub(start))
							return
						}
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) h3 withdrew in order (3,21) %v before the fresh start; the rollback put back (1,3); C2 (restarted at 10 s) gated it until the marker vanished at 60 s: declared at %v (%v after its withdrawal), judged by (%d,%d) %s",
							start.Sub(wd), now.Sub(start), now.Sub(wd), hs.rec.Incarnation, hs.rec.Seq, hs.rec.State)
					}
				}
			}
			if c.mut {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared in 200 s")
		})
	}
}
