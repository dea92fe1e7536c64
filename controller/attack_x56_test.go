package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X56: attacks on fabe093 (open loss windows, closeOpen) and
// ca7c255 (ConfirmTooEarly, the sticky marker gate).

// TestX56StepThenMeasureClosesOpenWindowShort ((S), faults only: a
// controller clock 2 min behind the NATS server's that NTP steps forward,
// a watch 90 s late, a beacon loss before the first stream info — e.g.
// a controller booted with a bad clock, or stream infos timing out under
// the same JetStream load that lags the watch; plus a compromised node's
// garbage over the withdrawal, or any hidden write).
//
// X28's no-server-time rig: the runner's window around h3's lost
// withdrawal beacon is placed while no stream info measured the server's
// clock, so it is open (fabe093). The controller's clock then steps 2 min
// forward (chrony makestep at boot, an operator fixing it) and the first
// stream info (sent after the step) measures lead ~0. closeOpen ends the
// window at rawTo − lo, lo = min(the new measure 0, the pre-step
// deliveries' −30 s): rawTo + 30 s, although rawTo is a reading of the
// OLD clock, 120 s behind the server's — the window's true end is rawTo +
// 120 s. Deliveries bound the lead only from above, so no sample kept
// says the old lead; "a clock step keeps the old and the new lead" holds
// for measures, not for an open window closed by a post-step measure.
// The hidden write (previous value stored 88 s after the window's closed
// end) is not covered and the withdrawn h3 is declared.
// Control "held/no-step": the same measure with the clock still 2 min
// behind places the end right (covered, never declared).
// Suggested fix: close an open window only with a measure whose lead
// interval overlaps what the window's own time allowed — i.e. keep
// it open unless a measure was taken in the same clock epoch: detect a
// step (a measure's lo above every delivery sample's least of the
// window's minute, or |Δwall − Δmonotonic| between placement and the
// measure, time.Time keeps the monotonic reading) and leave windows
// placed before a step open (refused-due, the (c) side); or close at
// rawTo − min(lo, least delivery sample − maxLag) with an explicit bound.
//
// Closed: the runner tells the tracker of the step (its wall reading moved
// more than its monotonic one: Runner.Run, clockStep) and open windows'
// raw ends move with it (Tracker.ClockStepped); with stepMutation h3 is
// declared.
func TestX56StepThenMeasureClosesOpenWindowShort(t *testing.T) {
	for _, c := range []struct {
		name string
		step time.Duration // the controller's clock steps forward by it before the first measure
		mut  bool
	}{
		{"held/stepped-2m-forward", 2 * time.Minute, false},
		{"stepped-2m-forward/stepMutation", 2 * time.Minute, true},
		{"held/no-step", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &stepMutation)
			}
			// Server time = controller's OLD clock + 120 s; every
			// delivery 90 s late: stored = delivery + 30 s.
			skew := 2*time.Minute - 90*time.Second
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, skew)
			x28Samples(tr, at, skew, 2*time.Minute)
			drop := at.Add(skew + time.Second - 2*time.Minute)
			tr.BeaconsLost(drop.Add(-time.Second), drop.Add(500*time.Millisecond))
			if n := len(tr.lossWindows); n == 0 || !tr.lossWindows[n-1].open {
				t.Fatalf("rig: the window is not open: %v", tr.lossWindows)
			}
			// The step, then the first stream info (sent 1 s after at in
			// the old clock, i.e. server at+121 s): the server's clock
			// reads 2 min − step ahead of the controller's new clock.
			if c.step != 0 {
				tr.ClockStepped(c.step) // the runner's tick after the step
			}
			sent := at.Add(time.Second + c.step)
			tr.ServerTime(sent, sent.Add(10*time.Millisecond), sent.Add(2*time.Minute-c.step+5*time.Millisecond), 0)
			w := tr.lossWindows[len(tr.lossWindows)-1]
			if w.open {
				t.Fatalf("rig: the measure did not close the window")
			}
			// From now the controller's clock reads at' = at + step for
			// the same instants: stamps = now + skew − step.
			at2, skew2 := at.Add(c.step), skew-c.step
			missHide(tr, at2, skew2, &rev)
			hw := tr.hosts["h3"].hidden
			t.Logf("window (server clock) %s..%s; hidden write after %s (server); true window end %s",
				w.from.Sub(at), w.to.Sub(at), time.Unix(0, hw.after).Sub(at), drop.Add(500*time.Millisecond+2*time.Minute).Sub(at))
			declared, refusedDue, _ := missRun(t, tr, at2.Add(2*time.Second), skew2, 180, &rev)
			if c.mut {
				if declared == 0 {
					t.Fatal("with stepMutation h3 was not declared: the test no longer shows the hole")
				}
				t.Logf("with stepMutation: declared %s after its hidden write was delivered", declared+2*time.Second)
				return
			}
			if declared != 0 {
				t.Fatalf("(S) the withdrawn h3 declared %s after its hidden write was delivered (refused-due before: %t): its beacon was lost in a window placed open, then closed by the first stream info after the controller's clock stepped %s forward — closed at %s (server clock) instead of %s",
					declared+2*time.Second, refusedDue, c.step, w.to.Sub(at), drop.Add(500*time.Millisecond+2*time.Minute).Sub(at))
			}
		})
	}
}

// TestX56BackStepStaleMeasureClosesWindow ((S), faults only: the
// controller's clock steps 2 min BACK (a bad NTP source, a VM restored),
// a watch 90 s late, a beacon loss in the seconds before the next stream
// info answers — or stream infos timing out under the JetStream load that
// lags the watch — and a hidden write).
//
// fabe093 opens a window only when no stream info of the last 10 minutes
// measured the server's clock (leastMeasured). Measures taken before a
// backward step are still in (minutes ≤ now's), and say lead 0; the new
// lead (−120 s) is bounded only from above by the 90 s late deliveries.
// The window of h3's lost withdrawal beacon, placed 2 s after the step,
// is closed at once at the runner's own reading — 120 s before the
// server's — and a closed window is never revised: the next stream info
// (lead −120 s, added below) moves nothing. h3's hidden write is not
// covered and the withdrawn h3 is declared. Control "held/no-step": the
// clock 2 min behind all along, the measures say so: covered.
// Closed: every runner window stays open until a stream info sent after
// its end measures the server's clock (serverWindow, closeOpen); with
// openWindowMutation h3 is declared.
// Suggested fix: treat a window as open unless a measure was taken after
// the last detected clock step (compare wall and monotonic readings —
// Go's time.Time carries both — or a measure/sample whose lead jumped),
// or keep every window open until the first measure *after* it (a
// measure within 2 s normally: the (c) is tiny), and close it then at
// rawTo − min(lo before, lo after).
func TestX56BackStepStaleMeasureClosesWindow(t *testing.T) {
	for _, c := range []struct {
		name string
		step time.Duration // the controller's clock stepped back by it 2 s before the loss
		mut  bool
	}{
		{"held/stepped-2m-back", 2 * time.Minute, false},
		{"stepped-2m-back/openWindowMutation", 2 * time.Minute, true},
		{"held/no-step", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &openWindowMutation)
			}
			// After the step: server time = controller + 120 s, every
			// delivery 90 s late (stored = delivery + 30 s), as X28.
			skew := 2*time.Minute - 90*time.Second
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, skew)
			drop := at.Add(skew + time.Second - 2*time.Minute) // h3's withdrawal, controller clock (after the step)
			// Before the step the controller read server time −
			// (120 s − step); measures and deliveries every 20 s until
			// 2 s before the loss (server time).
			lead := c.step - 2*time.Minute
			stepAt := drop.Add(-2 * time.Second).Add(2 * time.Minute) // server time of the step
			for s := 9 * time.Minute; s >= 2*time.Second; s -= 20 * time.Second {
				srv := stepAt.Add(-s)
				read := srv.Add(lead) // the controller's clock then
				tr.ClockSample(read, 0, srv.Add(-90*time.Second))
				tr.ServerTime(read, read.Add(10*time.Millisecond), srv.Add(5*time.Millisecond), 1<<40) // the watch lags: its last revision not delivered yet
			}
			tr.BeaconsLost(drop.Add(-time.Second), drop.Add(500*time.Millisecond))
			w := tr.lossWindows[len(tr.lossWindows)-1]
			// The next stream info, 2 s later: the true lead.
			sent := drop.Add(2 * time.Second)
			tr.ServerTime(sent, sent.Add(10*time.Millisecond), sent.Add(2*time.Minute), 1<<40)
			missHide(tr, at, skew, &rev)
			hw := tr.hosts["h3"].hidden
			t.Logf("window (server clock) %s..%s open %t; hidden write after %s (server); true window end %s",
				w.from.Sub(at), w.to.Sub(at), w.open, time.Unix(0, hw.after).Sub(at), drop.Add(500*time.Millisecond+2*time.Minute).Sub(at))
			declared, refusedDue, _ := missRun(t, tr, at.Add(2*time.Second), skew, 600, &rev)
			if c.mut {
				if declared == 0 {
					t.Fatal("with openWindowMutation h3 was not declared: the test no longer shows the hole")
				}
				t.Logf("with openWindowMutation: declared %s after its hidden write was delivered", declared+2*time.Second)
				return
			}
			if declared != 0 {
				t.Fatalf("(S) the withdrawn h3 declared %s after its hidden write was delivered (refused-due before: %t): the controller's clock stepped %s back 2 s before the loss; the window was closed by measures from before the step, at %s (server clock) instead of %s",
					declared+2*time.Second, refusedDue, c.step, w.to.Sub(at), drop.Add(500*time.Millisecond+2*time.Minute).Sub(at))
			}
		})
	}
}

// TestX56ControllerBehindTakesConfirmationBeforeListing ((S),
// conditional: a controller clock more than ConfirmClockSkew (10 s)
// behind the NATS server's and the command's — otherwise X55's faults:
// a rollback (the marker stands), an operator's confirmation of a dead
// host, the host back and stopped in order, a controller restart, a
// compromised node's aligned copy of the pre-rollback record).
//
// ConfirmTooEarly compares the confirmation's stamp with listedAt, the
// controller's clock at its first listing. The stamp is lastPoll − age −
// 10 s with age = wall − min(created, At): lastPoll and wall are the same
// reading of the controller's clock, so the stamp is created − 10 s — a
// SERVER/command time — compared with a controller time. A controller d
// behind takes confirmations written up to d − 10 s before its listing.
// Here the controller runs 20 s behind: the operator confirms h3 at 23 s
// (rig = controller clock), h3 is powered on at 23.5 s and withdrawn in
// order at 24.5 s (guests run), the node lands the copy at 25.5 s; C2
// starts at 30 s (listedAt 30 s, i.e. 7 s AFTER the confirmation in real
// time), the confirmation looks "in the future" until 33 s, then its
// stamp is 33 s ≥ 30 s: taken, and the withdrawn h3 is declared.
// Controls: the clocks agree (X55's case: never taken), 10 s behind (the
// documented skew: never taken).
// Suggested fix: compare like with like — stamp the listing in the same
// terms (listedAt from the wall clock AND less the lead ServerTime
// measured, i.e. in the server's clock: listedAt − lo, lo the least lead
// of the last 10 minutes), or require created ≥ (server time at listing,
// from the first stream info after it) + ConfirmClockSkew; and/or refuse
// confirmations while the measured lead is below −ConfirmClockSkew.
//
// Closed: the confirmation's age is measured in the server's clock (the
// control bucket's stream info at the poll: confirmAge); with
// serverAgeMutation h3 is declared.
func TestX56ControllerBehindTakesConfirmationBeforeListing(t *testing.T) {
	for _, c := range []struct {
		name   string
		behind time.Duration // the controller's clock behind the server's and the command's
		mut    bool
	}{
		{"held/controller-20s-behind", 20 * time.Second, false},
		{"controller-20s-behind/serverAgeMutation", 20 * time.Second, true},
		{"held/clocks-agree", 0, false},
		{"held/10s-behind", 10 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &serverAgeMutation)
			}
			b, others, bk, at := x48Rig(t)
			pre := b.keys["h3"]
			cp := *pre.rec
			b.rollBack(maps.Clone(bk.keys), bk.rev)
			start := at.Add(1500 * time.Millisecond)
			b.detectRollback(at.Add(time.Second), start)
			confirmedAt := start.Add(23 * time.Second) // controller clock
			written := confirmedAt.Add(c.behind)       // server's stored time, command's At
			var wd, tookAt time.Time
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				switch {
				case s == 23:
					gatePut(b, w, fencing.LeaseActive, 4, 1) // h3 powered on
				case s == 24:
					gatePut(b, w, fencing.LeaseWithdrawn, 4, 2) // stopped in order: guests run
					b.tr.ObserveWithdrawal(w, "h3", b.rev)
					wd = w
				case s == 25:
					if b.rev >= cp.PrevRev {
						t.Fatalf("rig: the stream (%d) is past the copy's prev_rev %d", b.rev, cp.PrevRev)
					}
					b.rev = cp.PrevRev - 1
					b.garbage(w, "h3")
					r := cp
					b.land(w.Add(100*time.Millisecond), "h3", x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: r.PrevRev}})
				case s == 30:
					b.stop()
					b.start(now) // C2: listedAt = now
					b.tr.SetRollbackGate(MarkerStands, "the controllers' rollback marker m1")
				case s > 30 && tookAt.IsZero() && confirmFresh(now.Add(c.behind), now, written, written):
					// C2's poll (Runner.Run): wall = lastPoll = now; the
					// control bucket's stream info says the server's clock,
					// c.behind ahead.
					stamp := confirmStamp(now, taken{"h3", "m1", 7, confirmAge(now.Add(c.behind), now, written, written)})
					if !b.tr.ConfirmTooEarly(stamp) && b.tr.ConfirmRollback("h3", "m1", 7, stamp) {
						tookAt = now
					}
				}
				if b.tr == nil {
					continue
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						if c.mut {
							t.Logf("with serverAgeMutation: the withdrawn h3 declared %s after its withdrawal", now.Sub(wd))
							return
						}
						t.Fatalf("(S) controller %s behind: C2 (listed at 30 s) took at %s a confirmation written at 23 s (before h3 came back at 23.5 s and withdrew at 24.5 s) and declared the withdrawn h3 %s after its withdrawal",
							c.behind, tookAt.Sub(start), now.Sub(wd))
					}
				}
			}
			if c.mut {
				t.Fatal("with serverAgeMutation h3 was not declared: the test no longer shows the hole")
			}
			t.Logf("not declared (taken: %t)", !tookAt.IsZero())
		})
	}
}
