package controller

import (
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestHiddenWithdrawalBeaconLost (S; docs/security.md, the hidden
// withdrawal whose beacon was lost; the next step the X11/X21 notes
// designed): h0..h9 pinned and beaconing, the controller running. h3's
// agent stops in order: its withdrawal lands at revision R (its guests
// keep running, unfenced) and a compromised node supersedes it with
// garbage before the watch delivers it (the watch skips R, shows R+1).
// h3's withdrawal beacon is lost: the runner's subscription dropped it
// (slow consumer) or its connection was down. Before, h3 was declared
// lease_ttl + grace after its last renewal — its guests evacuated while
// they ran. Now the runner reports the loss window (Tracker.BeaconsLost)
// and h3, whose hidden write falls in it, is refused-due instead:
//   - "lost/noticed-after": the runner notices the loss at its next tick,
//     after the garbage was observed (BeaconsLost walks the hidden writes);
//   - "lost/noticed-before": a loss window already known when the
//     garbage arrives (noteHidden checks the windows);
//   - "lost/long-outage": the beacon connection down for 200 ticks from
//     just before the withdrawal, the garbage delivered after: one merged
//     window (200 separate ones would have evicted the first 136);
//   - "lost/beaconLossMutation": the hole, as before (declared);
//   - "control-loss-long-before": the only loss ended minutes before h3's
//     last renewal was stored: h3 (dead, garbage in its key) is declared
//     as before — a loss does not make every later skip undeclarable
//     (once a stream info measured the server's clock: the runner reads
//     one every 2 s);
//   - "loss-long-before/no-server-time": the same with a server that
//     never says its clock (nats-server before 2.10): the window is open
//     (serverWindow) and h3 is refused-due — the price (c) of X28's fix;
//   - "control-back": after the refusal h3's new agent renews (a trusted
//     record), then dies: declared lease_ttl + grace later.
func TestHiddenWithdrawalBeaconLost(t *testing.T) {
	for _, c := range []struct {
		name           string
		loss           string // "after", "before", "long-before", ""
		mutation, back bool
		wantDeclared   bool
	}{
		{name: "lost/noticed-after", loss: "after"},
		{name: "lost/noticed-before", loss: "before"},
		{name: "lost/long-outage", loss: "outage"},
		{name: "lost/beaconLossMutation", loss: "after", mutation: true, wantDeclared: true},
		{name: "control-loss-long-before", loss: "long-before", wantDeclared: true},
		{name: "loss-long-before/no-server-time", loss: "long-before-unmeasured"},
		{name: "control-back", loss: "after", back: true, wantDeclared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			beaconLossMutation = c.mutation
			defer func() { beaconLossMutation = false }()
			tr, rev := beaconFleet(t)
			at := t0.Add(10 * time.Minute)
			if strings.HasPrefix(c.loss, "long-before") {
				tr.BeaconsLost(t0.Add(time.Minute), t0.Add(time.Minute+time.Second))
			}
			if c.loss == "long-before" {
				// The runner's next rollback check: a stream info with
				// the server's clock (5 ms into a 10 ms round trip) and the
				// stream's last revision then (the pinned fleet's, 10).
				sent := t0.Add(time.Minute + 2*time.Second)
				tr.ServerTime(sent, sent.Add(10*time.Millisecond), sent.Add(5*time.Millisecond), 10)
			}
			// h3's last renewal, stored and delivered at `at`.
			renewOthers(tr, at, &rev)
			rev++
			r3 := rec("h3", fencing.BackstopReset)
			r3.Signer = "h3-key"
			tr.Stored("h3", rev, at)
			tr.Observe(at, "h3", rev, r3)
			tr.ObserveBeacon(at, "h3", rev)
			// Its withdrawal at rev+1 (hidden; its beacons lost), the
			// garbage at rev+2, delivered after a skip.
			if c.loss == "before" {
				tr.BeaconsLost(at.Add(time.Second), at.Add(2*time.Second))
			}
			if c.loss == "outage" {
				for s := range 200 {
					tr.BeaconsLost(at.Add(time.Duration(s+1)*time.Second), at.Add(time.Duration(s+2)*time.Second))
				}
			}
			rev += 2
			tr.Skipped(rev)
			tr.Stored("h3", rev, at.Add(1500*time.Millisecond))
			tr.ObserveInvalid(at.Add(2*time.Second), "h3", rev, "undecodable value (garbage)", false)
			if c.loss == "after" {
				got := tr.BeaconsLost(at.Add(time.Second), at.Add(2500*time.Millisecond))
				if !c.mutation && (len(got) != 1 || got[0] != "h3") {
					t.Fatalf("BeaconsLost refused %v, want [h3]", got)
				}
			}
			var refusedDue bool
			var declared time.Duration
			for s := 3; s <= 180 && declared == 0; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				x26Renew(tr, now, &rev, true, "h3")
				if c.back && s == 60 {
					rev++
					tr.Observe(now, "h3", rev, r3) // its new agent renews once, then dies
					tr.ObserveBeacon(now, "h3", rev)
				}
				for _, d := range tr.Tick(now) {
					switch {
					case d.Op == OpRefusedDue && d.Host == "h3":
						refusedDue = true
					case d.Op == OpDeclare && d.Host == "h3":
						declared = now.Sub(at)
					case d.Op == OpDeclare:
						t.Fatalf("declared the live %s", d.Host)
					}
				}
			}
			switch {
			case c.wantDeclared && declared == 0:
				t.Fatalf("h3 never declared (refused-due said: %t)", refusedDue)
			case !c.wantDeclared && declared != 0:
				t.Fatalf("the withdrawn h3 (its withdrawal hidden, its beacon lost) declared %s after its last renewal", declared)
			case !c.wantDeclared && !refusedDue:
				t.Fatalf("h3 not declared but no refused-due said why")
			case c.back && declared < 60*time.Second:
				t.Fatalf("h3 declared %s after its last renewal, before its new agent's renewal at 60 s had lapsed", declared)
			}
			t.Logf("declared after %s, refused-due said: %t", declared, refusedDue)
		})
	}
}

// TestStepWatch: the runner's step detection (Tracker.ClockStepped's
// input): a wall clock moving with the monotonic one is no step; one
// moving 2 min more is a 2-minute step, one moving back a negative one.
func TestStepWatch(t *testing.T) {
	var s stepWatch
	w := t0
	if d := s.observe(w, 10*time.Second); d != 0 {
		t.Fatalf("first reading: %v", d)
	}
	if d := s.observe(w.Add(time.Second), 11*time.Second); d != 0 {
		t.Fatalf("no step: %v", d)
	}
	if d := s.observe(w.Add(2*time.Second+2*time.Minute), 12*time.Second); d != 2*time.Minute {
		t.Fatalf("forward step: %v", d)
	}
	if d := s.observe(w.Add(3*time.Second), 13*time.Second); d != -2*time.Minute {
		t.Fatalf("backward step: %v", d)
	}
}

// TestForwardStepMovesNextWindowStart (reviewer X57's note on X56's
// fix): a window placed after a forward step of the runner's clock and
// before the next measure of the server's starts as much earlier — its
// start, read on the new clock, less the old lead, came out late by the
// step; without ClockStepped it starts at the old lead only.
func TestForwardStepMovesNextWindowStart(t *testing.T) {
	for _, step := range []bool{false, true} {
		tr, _ := beaconFleet(t)
		at := t0.Add(10 * time.Minute)
		tr.ServerTime(at, at.Add(10*time.Millisecond), at.Add(5*time.Millisecond), 10) // lead ~0
		from := at.Add(30 * time.Second)
		if step {
			tr.ClockStepped(2 * time.Minute)
		}
		w := tr.serverWindow(from, from.Add(time.Second))
		want := from.Add(-5 * time.Millisecond) // the measure's upper bound on the lead
		if step {
			want = from.Add(-2*time.Minute - 5*time.Millisecond)
		}
		if w.from.After(want) {
			t.Fatalf("stepped %t: the window starts %s before the raw start, want at least %s", step, from.Sub(w.from), from.Sub(want))
		}
		if !step && w.from.Before(from.Add(-time.Second)) {
			t.Fatalf("no step: the window starts %s early", from.Sub(w.from))
		}
	}
}
