package controller

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X28: attacks on BeaconsMissing (beacons lost on a route) and
// the clock-offset estimate (serverWindow). Helpers: beaconmiss_test.go.

// x28Round renews h0..h9 at now (stored at now+skew) except the hosts in
// skip; lose: hosts whose beacon is lost; hide: hosts whose renewal a
// compromised node overwrites with garbage before the watch delivers it
// (the garbage is delivered after a skip, 300 ms later).
func x28Round(tr *Tracker, now time.Time, skew time.Duration, rev *uint64, skip, lose, hide map[string]bool) {
	for i := range 10 {
		name := fmt.Sprintf("h%d", i)
		if skip[name] {
			continue
		}
		if hide[name] {
			*rev++ // its renewal: never delivered (superseded)
			*rev++ // the garbage over it
			tr.Skipped(*rev)
			missStored(tr, now.Add(300*time.Millisecond), name, *rev, now.Add(200*time.Millisecond+skew))
			tr.ObserveInvalid(now.Add(300*time.Millisecond), name, *rev, "undecodable value (garbage)", false)
			missBeacon(tr, now, name, *rev-1, lose[name])
			continue
		}
		*rev++
		r := rec(name, fencing.BackstopReset)
		r.Signer = name + "-key"
		missStored(tr, now, name, *rev, now.Add(skew))
		tr.Observe(now, name, *rev, r)
		missBeacon(tr, now, name, *rev, lose[name])
	}
}

func set(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// TestX28HideCoincidentRenewal (S). The route closure that drops h3's
// withdrawal beacon drops h5's renewal beacon too (the fix's premise). But
// the compromised node that hides h3's withdrawal (garbage over it before
// the watch delivers it) can hide the renewals written at that moment the
// same way — h5's among them: a renewal never delivered expects no beacon,
// so nothing is "missing", no loss window, and h3 is declared while its
// guests run. The attacker need not know whose beacon was lost: it
// overwrites every key written around the withdrawal (the same capability
// it uses on h3's key). h5 is alive and renews a second later: its hidden
// write clears.
//   - "h5-renewal-hidden": FAILED (h3 declared); closed: a hidden write
//     of a host whose beacons bind it expects a beacon of the write it
//     hid (Tracker.expectHidden) — h5's never comes, a window by h5;
//   - "held/h5-renewal-delivered": the fix's own case (h3 refused-due).
func TestX28HideCoincidentRenewal(t *testing.T) {
	for _, c := range []struct {
		name   string
		hideH5 bool
	}{{"h5-renewal-hidden", true}, {"held/h5-renewal-delivered", false}} {
		t.Run(c.name, func(t *testing.T) {
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, 0)
			missHide(tr, at, 0, &rev)
			now := at.Add(time.Second)
			hide := set()
			if c.hideH5 {
				hide = set("h5")
			}
			x28Round(tr, now, 0, &rev, set("h3"), set("h5"), hide)
			m, refused := tr.BeaconsMissing(now.Add(BeaconExpectWindow))
			declared, refusedDue, _ := missRun(t, tr, now.Add(BeaconExpectWindow), 0, 180, &rev)
			t.Logf("missing %v refused %v; declared after %s, refused-due %t", m, refused, declared, refusedDue)
			if declared != 0 {
				t.Fatalf("the withdrawn h3 (withdrawal hidden, its beacon and h5's lost on a route; h5's renewal hidden too) declared %s after the check", declared)
			}
		})
	}
}

// TestX28ExpectingFlood (S). The compromised node h9 signs its own
// renewals: it writes maxExpecting of them within BeaconExpectWindow
// (CAS on its own key, ~6 600/s), each named by its own beacon *after*
// the watch delivered it. Each one queues an expectation; at the bound
// the oldest are dropped unchecked — h5's, whose beacon the route lost
// with h3's withdrawal beacon. No window, h3 declared. (h9's entries are
// dead: their beacons came; dropping them first, or counting a dropped
// live entry as missing, holds.)
func TestX28ExpectingFlood(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
	}{{"flood-65536", 1 << 16}, {"held/flood-below-65436", 1<<16 - 100}} {
		t.Run(c.name, func(t *testing.T) {
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, 0)
			missHide(tr, at, 0, &rev)
			now := at.Add(time.Second)
			x28Round(tr, now, 0, &rev, set("h3"), set("h5"), nil)
			flood := now.Add(2 * time.Second)
			for range c.n {
				rev++
				r := rec("h9", fencing.BackstopReset)
				r.Signer = "h9-key"
				missStored(tr, flood, "h9", rev, flood)
				tr.Observe(flood, "h9", rev, r)
				tr.ObserveBeacon(flood, "h9", rev)
			}
			m, refused := tr.BeaconsMissing(now.Add(BeaconExpectWindow))
			declared, refusedDue, _ := missRun(t, tr, now.Add(BeaconExpectWindow), 0, 180, &rev)
			t.Logf("missing %v refused %v; declared after %s, refused-due %t", m, refused, declared, refusedDue)
			if declared != 0 {
				t.Fatalf("the withdrawn h3 declared: h9's flood of %d self-beaconed renewals evicted h5's expectation unchecked", c.n)
			}
		})
	}
}

// x28Samples feeds ClockSample every 20 s over the 9 minutes before at
// (stored = delivery + d).
func x28Samples(tr *Tracker, at time.Time, d time.Duration, until time.Duration) {
	for s := 9 * time.Minute; s >= until; s -= 20 * time.Second {
		now := at.Add(-s)
		tr.ClockSample(now, 0, now.Add(d))
	}
}

// TestX28LaggingWatchSkew (S, conditional). The controller's clock 2 min
// behind the server's, and the watch's deliveries all ~90 s late for the
// last 10 minutes (a backlog a compromised node keeps up with writes, or
// a slow controller): the estimate (least now − stored) is −30 s, not
// −120 s: it bounds the lead only from above, and a controller BEHIND the
// server needs the window moved later — by at least the true lag. The
// runner's window (its clock, at the real drop) then ends ~60 s before
// h3's hidden write (server clock) and misses it: declared.
//   - "no-server-time": FAILED so (a server whose stream info has no
//     "ts": the runner has deliveries only); held since: a window placed
//     without a measure of the server's clock is open (serverWindow) —
//     with openWindowMutation it is declared;
//   - "held/watch-90s-late": fixed: the runner's rollback checks read the
//     server's clock from the stream info every 2 s (Tracker.ServerTime,
//     a bound on both sides: here 10 ms round trips);
//   - "held/watch-prompt": the fix's case (refused-due).
func TestX28LaggingWatchSkew(t *testing.T) {
	for _, c := range []struct {
		name       string
		delay      time.Duration
		serverTime bool
		mut        bool
	}{
		{"held/no-server-time", 90 * time.Second, false, false},
		{"no-server-time/openWindowMutation", 90 * time.Second, false, true},
		{"held/watch-90s-late", 90 * time.Second, true, false},
		{"held/watch-prompt", 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				x36Mutate(t, &openWindowMutation)
			}
			// Stamps: stored = delivery + 120 s − delay.
			skew := 2*time.Minute - c.delay
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, skew)
			x28Samples(tr, at, skew, 2*time.Minute)
			if c.serverTime {
				for s := 9 * time.Minute; s >= 0; s -= 20 * time.Second {
					sent := at.Add(-s)
					tr.ServerTime(sent, sent.Add(10*time.Millisecond), sent.Add(2*time.Minute+5*time.Millisecond), 0)
				}
			}
			// The drop happened (controller clock) when h3 withdrew:
			// server time at+skew+1 s, i.e. controller at+skew+1−120 s.
			drop := at.Add(skew + time.Second - 2*time.Minute)
			tr.BeaconsLost(drop.Add(-time.Second), drop.Add(500*time.Millisecond))
			missHide(tr, at, skew, &rev)
			declared, refusedDue, _ := missRun(t, tr, at.Add(2*time.Second), skew, 180, &rev)
			t.Logf("windows %v; declared after %s, refused-due %t", tr.lossWindows, declared, refusedDue)
			if c.mut {
				if declared == 0 {
					t.Fatal("with openWindowMutation the withdrawn h3 was not declared: the test no longer shows the hole")
				}
				return
			}
			if declared != 0 {
				t.Fatalf("the withdrawn h3 declared: controller 2 min behind, watch %s late: the estimated lead %s moved nothing", c.delay, -skew)
			}
		})
	}
}

// TestX28ClockStepForward (S, conditional). The controller's clock agreed
// with the server's for 9 minutes, then stepped 2 min forward (a bad NTP
// source, a VM resumed, an operator). The estimate is the least of the
// last 10 minutes: ~0 (the old samples) for up to 10 minutes, though the
// new samples say +120 s. The runner's window is not moved back: h3's
// hidden write, 2 min earlier by the server's clock, is declared.
//   - "stepped": FAILS;
//   - "held/no-history": the fix's controller-ahead-2m case.
func TestX28ClockStepForward(t *testing.T) {
	for _, c := range []struct {
		name    string
		history bool
	}{{"stepped", true}, {"held/no-history", false}} {
		t.Run(c.name, func(t *testing.T) {
			skew := -2 * time.Minute
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, skew)
			if c.history {
				x28Samples(tr, at, 50*time.Millisecond, 30*time.Second)
			}
			missHide(tr, at, skew, &rev)
			tr.BeaconsLost(at.Add(time.Second), at.Add(2500*time.Millisecond))
			declared, refusedDue, _ := missRun(t, tr, at.Add(2*time.Second), skew, 180, &rev)
			t.Logf("windows %v; declared after %s, refused-due %t", tr.lossWindows, declared, refusedDue)
			if declared != 0 {
				t.Fatalf("the withdrawn h3 declared after the controller's clock stepped 2 min forward")
			}
		})
	}
}

// TestX28WithheldBeaconsKeepDeadHost (c). The compromised h9 simply stops
// beaconing its renewals (it keeps renewing): every renewal is a missing
// beacon, a loss window each second, and any host whose key it fills
// with garbage after a skip — here the DEAD h3 — is refused-due for ever.
// Before (beaconMissMutation) it had to make the runner drop beacons
// (flooding, a dropped count every tick); now withholding its own beacons
// suffices, said once ("missing h9") until one of its beacons comes.
//   - "withheld": FAILS (h3 never declared);
//   - "held/before-the-change" (beaconMissMutation): declared.
func TestX28WithheldBeaconsKeepDeadHost(t *testing.T) {
	for _, c := range []struct {
		name     string
		mutation bool
	}{{"withheld", false}, {"held/before-the-change", true}} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.HasPrefix(c.name, "held/") {
				t.Skip("open (c): a compromised node withholding its own beacons makes a loss window at will — docs/security.md, \"Losses the runner's counters do not see\"")
			}
			beaconMissMutation = c.mutation
			defer func() { beaconMissMutation = false }()
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, 0)
			said := 0
			declared := time.Duration(0)
			for s := 1; s <= 180 && declared == 0; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				x28Round(tr, now, 0, &rev, set("h3"), set("h9"), nil)
				if s%5 == 0 { // garbage into the dead h3's key after a skip
					rev += 2
					tr.Skipped(rev)
					missStored(tr, now, "h3", rev, now)
					tr.ObserveInvalid(now, "h3", rev, "undecodable value (garbage)", false)
				}
				m, _ := tr.BeaconsMissing(now)
				said += len(m)
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						declared = now.Sub(at)
					}
				}
			}
			t.Logf("missing said %d times; declared after %s", said, declared)
			if declared == 0 {
				t.Fatal("the dead h3 never declared: h9 withholding its own beacons made a loss window every second")
			}
		})
	}
}

// TestX28WindowsNeverNarrowHeld (held): windows added in any order (older
// than the last, overlapping, past maxLossWindows) are each still covered
// by some kept window.
func TestX28WindowsNeverNarrowHeld(t *testing.T) {
	rng := rand.New(rand.NewSource(28))
	for trial := range 200 {
		tr, _ := beaconFleet(t)
		var added []lossWindow
		for range 150 {
			f := t0.Add(time.Duration(rng.Intn(3600)) * time.Second)
			w := lossWindow{from: f, to: f.Add(time.Duration(rng.Intn(20)) * time.Second)}
			tr.addWindow(w)
			added = append(added, w)
		}
		for _, w := range added {
			ok := false
			for _, k := range tr.lossWindows {
				if !k.from.After(w.from) && !k.to.Before(w.to) {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("trial %d: window %v no longer covered by %v", trial, w, tr.lossWindows)
			}
		}
	}
}

// TestX28DeleteRecreateKeepsExpectationHeld (held): the compromised node
// deletes h5's key right after h5's renewal (whose beacon the route lost)
// was delivered; h5's agent re-creates it. recreated() copies the
// beacons, the expectation with them: the window stands, h3 refused-due.
func TestX28DeleteRecreateKeepsExpectationHeld(t *testing.T) {
	at := t0.Add(20 * time.Minute)
	tr, rev := missFleet(t, at, 0)
	missHide(tr, at, 0, &rev)
	now := at.Add(time.Second)
	x28Round(tr, now, 0, &rev, set("h3"), set("h5"), nil)
	rev++
	tr.Observe(now.Add(200*time.Millisecond), "h5", rev, nil)
	rev++
	r := rec("h5", fencing.BackstopReset)
	r.Signer = "h5-key"
	missStored(tr, now.Add(400*time.Millisecond), "h5", rev, now.Add(400*time.Millisecond))
	tr.Observe(now.Add(400*time.Millisecond), "h5", rev, r)
	tr.ObserveBeacon(now.Add(400*time.Millisecond), "h5", rev)
	tr.BeaconsMissing(now.Add(BeaconExpectWindow))
	declared, refusedDue, _ := missRun(t, tr, now.Add(BeaconExpectWindow), 0, 180, &rev)
	if declared != 0 || !refusedDue {
		t.Fatalf("declared after %s (refused-due %t)", declared, refusedDue)
	}
}

// TestX28BigFleetEvictsExpectations (S, no attacker flood). maxExpecting
// (65 536) is sized for "4 renewals of 10 000 hosts within 10 s", i.e. a
// renew_interval of 2.5 s; renew_interval is any positive value (the
// default is 2 s: 50 000 per 10 s at 10 000 hosts, 1 s: 100 000). Here
// 7 000 hosts renew every second: 70 000 records within
// BeaconExpectWindow, the oldest expectations are dropped unchecked,
// every one of them — h5's whose beacon the route lost with h3's
// withdrawal beacon. h3 is declared; nothing is said.
//   - "7000-hosts-1s": FAILS;
//   - "held/5000-hosts-1s": 50 000 within the window, below the bound.
func TestX28BigFleetEvictsExpectations(t *testing.T) {
	if testing.Short() {
		t.Skip("big fleet")
	}
	for _, c := range []struct {
		name string
		n    int
	}{{"7000-hosts-1s", 7000}, {"held/5000-hosts-1s", 5000}} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			tr.SetEnrolled(enrolledH)
			recs := make([]*fencing.LeaseRecord, c.n)
			for i := range c.n {
				r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
				r.Timing.RenewInterval = time.Second
				r.Signer = fmt.Sprintf("h%d-key", i)
				recs[i] = r
				tr.Observe(t0, r.Host, uint64(1+i), r)
				tr.ObserveBeacon(t0, r.Host, uint64(1+i))
			}
			tr.GuardPublished(tr.Guard(), nil)
			tr.WatchStarted(t0)
			rev := uint64(c.n + 100)
			at := t0.Add(20 * time.Minute)
			round := func(now time.Time, skip3 bool, lose string) {
				for i := range c.n {
					if skip3 && i == 3 {
						continue
					}
					rev++
					r := recs[i]
					missStored(tr, now, r.Host, rev, now)
					tr.Observe(now, r.Host, rev, r)
					if r.Host != lose {
						tr.ObserveBeacon(now, r.Host, rev)
					}
				}
			}
			for s := 10; s >= 1; s-- {
				round(at.Add(-time.Duration(s)*time.Second), false, "")
			}
			round(at, false, "") // h3's last renewal
			missHide(tr, at, 0, &rev)
			declared := time.Duration(0)
			refusedDue := false
			for s := 1; s <= 90 && declared == 0; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				lose := ""
				if s == 1 {
					lose = "h5"
				}
				round(now, true, lose)
				tr.BeaconsMissing(now)
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
			t.Logf("declared after %s, refused-due %t", declared, refusedDue)
			if declared != 0 {
				t.Fatalf("the withdrawn h3 declared: %d hosts renewing every second overflowed maxExpecting; h5's missing beacon was dropped unchecked", c.n)
			}
		})
	}
}

// BenchmarkX28RefuseCovered (perf): every BeaconsMissing that adds a
// window (each tick while any host's beacons are withheld) walks every
// host, sorted (t.Hosts()), though only hosts with a hidden write matter.
func BenchmarkX28RefuseCovered(b *testing.B) {
	tr, err := NewTracker(resetConfig())
	if err != nil {
		b.Fatal(err)
	}
	tr.SetSigningRequired(true)
	tr.SetEnrolled(enrolledH)
	for i := range 10000 {
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		r.Signer = fmt.Sprintf("h%d-key", i)
		tr.Observe(t0, r.Host, uint64(1+i), r)
	}
	for i := range maxLossWindows {
		tr.addWindow(lossWindow{from: t0.Add(time.Duration(i) * time.Hour), to: t0.Add(time.Duration(i) * time.Hour)})
	}
	b.ResetTimer()
	for range b.N {
		tr.RefuseCovered()
	}
}
