package controller

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"hvguard/fencing"
)

// missFleet is beaconFleet after the watch's first listing (beacons are
// expected only for records delivered after it), with h3's last renewal
// stored and delivered at at (clock: the server's stamps run skew ahead
// of the controller's clock) and named by its beacon. It returns the
// tracker and the next revision.
func missFleet(t *testing.T, at time.Time, skew time.Duration) (*Tracker, uint64) {
	t.Helper()
	tr, rev := beaconFleet(t)
	tr.WatchStarted(t0)
	missChainOn(tr)
	missRenew(tr, at, skew, &rev, "", "h3")
	rev++
	r3 := rec("h3", fencing.BackstopReset)
	r3.Signer = "h3-key"
	missStored(tr, at, "h3", rev, at.Add(skew))
	tr.Observe(at, "h3", rev, r3)
	tr.ObserveBeacon(at, "h3", rev)
	return tr, rev
}

// missStored: the runner's two calls for a value the watch delivered at
// now, stored (the server's clock) at stored.
func missStored(tr *Tracker, now time.Time, host string, rev uint64, stored time.Time) {
	tr.Stored(host, rev, stored)
	tr.ClockSample(now, rev, stored)
}

// missRenew renews h0..h9 but skip at now (stored skew later by the
// server's clock), each named by its beacon except lose's.
func missRenew(tr *Tracker, now time.Time, skew time.Duration, rev *uint64, lose, skip string) {
	for i := range 10 {
		name := fmt.Sprintf("h%d", i)
		if name == skip {
			continue
		}
		*rev++
		r := rec(name, fencing.BackstopReset)
		r.Signer = name + "-key"
		missStored(tr, now, name, *rev, now.Add(skew))
		tr.Observe(now, name, *rev, r)
		missBeacon(tr, now, name, *rev, name == lose)
	}
}

// missChains: per tracker whose agents chain their beacons (missChainOn;
// the others' agents predate fencing.Beacon.Prev), each host agent's last
// published beacon (missBeacon).
var missChains struct {
	sync.Mutex
	m map[*Tracker]map[string]uint64
}

// missPrevOf: host's agent's last published beacon (missBeacon).
func missPrevOf(tr *Tracker, host string) uint64 {
	missChains.Lock()
	defer missChains.Unlock()
	return missChains.m[tr][host]
}

// missChainOn: tr's agents chain their beacons (missBeacon).
func missChainOn(tr *Tracker) {
	missChains.Lock()
	defer missChains.Unlock()
	if missChains.m == nil {
		missChains.m = map[*Tracker]map[string]uint64{}
	}
	missChains.m[tr] = map[string]uint64{}
}

// missBeacon: host's agent publishes its beacon naming rev, chained to
// its last one (fencing.Beacon.Prev: the fleet's first beacons, then
// those published here); lost: never received.
func missBeacon(tr *Tracker, now time.Time, host string, rev uint64, lost bool) {
	missChains.Lock()
	p := missChains.m[tr]
	if p == nil {
		missChains.Unlock()
		if !lost {
			tr.ObserveBeacon(now, host, rev) // an agent without Prev
		}
		return
	}
	prev := p[host]
	if h := tr.hosts[host]; prev == 0 && h != nil {
		prev = h.beacons.maxRev
	}
	p[host] = rev
	missChains.Unlock()
	if lost {
		return
	}
	if tr.BeaconChain(now, host, rev, prev) {
		tr.RefuseCovered()
	}
	tr.ObserveBeacon(now, host, rev)
}

// missHide: h3's withdrawal at rev+1, hidden by a compromised node's
// garbage at rev+2 (stored 1.5 s after at by the server's clock, skew
// included), delivered after a skip at at+2 s.
func missHide(tr *Tracker, at time.Time, skew time.Duration, rev *uint64) {
	*rev += 2
	tr.Skipped(*rev)
	missStored(tr, at.Add(2*time.Second), "h3", *rev, at.Add(1500*time.Millisecond+skew))
	tr.ObserveInvalid(at.Add(2*time.Second), "h3", *rev, "undecodable value (garbage)", false)
}

// missRun drives tr from `from` for secs seconds: the others renew each
// second (stored skew later), each named by its beacon; a missing-beacon
// check every second. It returns when h3 was declared (0: never), whether
// it was refused-due, and the hosts BeaconsMissing reported.
func missRun(t *testing.T, tr *Tracker, from time.Time, skew time.Duration, secs int, rev *uint64) (time.Duration, bool, []string) {
	t.Helper()
	refused, missing := false, []string(nil)
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		missRenew(tr, now, skew, rev, "", "h3")
		m, _ := tr.BeaconsMissing(now)
		missing = append(missing, m...)
		for _, d := range tr.Tick(now) {
			switch {
			case d.Op == OpRefusedDue && d.Host == "h3":
				refused = true
			case d.Op == OpDeclare && d.Host == "h3":
				return now.Sub(from), refused, missing
			case d.Op == OpDeclare:
				t.Fatalf("declared the live %s", d.Host)
			}
		}
	}
	return 0, refused, missing
}

// TestHiddenWithdrawalMissingBeacon (S; docs/security.md, the hidden
// withdrawal whose beacon was lost where the runner's counters do not
// look). h0..h9 pinned and beaconing; h3's agent stops in order, its
// withdrawal is hidden from the watch by a compromised node's garbage
// (a skip), and its withdrawal beacon is lost on the way — a NATS
// cluster's route or a leaf node's connection closed as a slow consumer
// drops every message it had buffered, while the controller's own
// connection and subscription stay up: no dropped count, no reconnect,
// nothing the runner's loss check (beaconLosses) sees. The same closure
// drops the beacon of h5's renewal made at that moment, which the watch
// delivers: a renewal of a host whose beacons bind it, with no beacon
// naming it BeaconExpectWindow later, is a beacon lost
// (Tracker.BeaconsMissing) — a loss window at the renewal's stored time,
// covering h3's hidden write. Before, h3 was declared lease_ttl + grace
// after its last renewal while its guests ran.
//   - "lost": h5's beacon never comes: h3 refused-due, never declared;
//     BeaconsMissing names h5 once;
//   - "lost/beaconMissMutation": the hole (declared);
//   - "control-all-came": every beacon came: the dead h3 (garbage in
//     its key, nothing lost) is declared as before;
//   - "control-late-beacon": h5's beacon comes 9 s late (within the
//     window): nothing is lost, h3 declared;
//   - "control-long-before": h5's beacon was lost 10 minutes before h3's
//     last renewal: h3 declared;
//   - "lost/clock-behind": the controller's clock 2 minutes behind the
//     server's (stamps skew = +2 min): the window is the renewal's
//     stored time, in the server's clock like the hidden write's — h3
//     refused-due.
func TestHiddenWithdrawalMissingBeacon(t *testing.T) {
	for _, c := range []struct {
		name         string
		lose         string // "now", "late", "long-before", ""
		skew         time.Duration
		mutation     bool
		wantDeclared bool
	}{
		{name: "lost", lose: "now"},
		{name: "lost/beaconMissMutation", lose: "now", mutation: true, wantDeclared: true},
		{name: "control-all-came", wantDeclared: true},
		{name: "control-late-beacon", lose: "late", wantDeclared: true},
		{name: "control-long-before", lose: "long-before", wantDeclared: true},
		{name: "lost/clock-behind", lose: "now", skew: 2 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The hole needs both checks off: the chain (h5's next beacon
			// names the lost one) finds it too.
			beaconMissMutation, beaconChainMutation = c.mutation, c.mutation
			defer func() { beaconMissMutation, beaconChainMutation = false, false }()
			at := t0.Add(20 * time.Minute)
			var tr *Tracker
			var rev uint64
			if c.lose == "long-before" {
				tr, rev = beaconFleet(t)
				tr.WatchStarted(t0)
				missChainOn(tr)
				early := at.Add(-10 * time.Minute)
				missRenew(tr, early, c.skew, &rev, "h5", "")
				if m, _ := tr.BeaconsMissing(early.Add(BeaconExpectWindow)); !slices.Equal(m, []string{"h5"}) {
					t.Fatalf("BeaconsMissing said %v, want [h5]", m)
				}
				missRenew(tr, at, c.skew, &rev, "", "h3")
				rev++
				r3 := rec("h3", fencing.BackstopReset)
				r3.Signer = "h3-key"
				missStored(tr, at, "h3", rev, at.Add(c.skew))
				tr.Observe(at, "h3", rev, r3)
				tr.ObserveBeacon(at, "h3", rev)
			} else {
				tr, rev = missFleet(t, at, c.skew)
			}
			missHide(tr, at, c.skew, &rev)
			// h0..h9 but h3 renew at at+1 s; h5's beacon is lost on the route.
			lose := ""
			if c.lose == "now" || c.lose == "late" {
				lose = "h5"
			}
			renewedAt := at.Add(time.Second)
			prev5 := missPrevOf(tr, "h5")
			missRenew(tr, renewedAt, c.skew, &rev, lose, "h3")
			if c.lose == "late" {
				late := renewedAt.Add(9 * time.Second)
				tr.BeaconChain(late, "h5", rev-4, prev5) // h5's revision in that round (h6..h9 after it)
				tr.ObserveBeacon(late, "h5", rev-4)
			}
			// Checked once the hidden write's expectation (delivered at
			// at+2 s) is due too: h3's own is missing (its withdrawal's
			// beacon, or a dead host's), which counts for others only.
			m, refused := tr.BeaconsMissing(at.Add(2*time.Second + BeaconExpectWindow))
			wantMissing := []string{"h3"}
			if c.mutation {
				wantMissing = nil
			}
			if c.lose == "now" && !c.mutation {
				wantMissing = []string{"h3", "h5"}
				if !slices.Equal(refused, []string{"h3"}) {
					t.Fatalf("BeaconsMissing refused %v, want [h3]", refused)
				}
			}
			if slices.Sort(m); !slices.Equal(m, wantMissing) {
				t.Fatalf("BeaconsMissing said missing %v, want %v", m, wantMissing)
			}
			declared, refusedDue, more := missRun(t, tr, at.Add(2*time.Second+BeaconExpectWindow), c.skew, 180, &rev)
			if len(more) != 0 {
				t.Fatalf("BeaconsMissing later said %v, every beacon came", more)
			}
			switch {
			case c.wantDeclared && declared == 0:
				t.Fatalf("the dead h3 never declared (refused-due said: %t)", refusedDue)
			case !c.wantDeclared && declared != 0:
				t.Fatalf("the withdrawn h3 (its withdrawal hidden, its beacon lost on a route) declared %s after its last renewal", declared+BeaconExpectWindow+time.Second)
			case !c.wantDeclared && !refusedDue:
				t.Fatal("h3 not declared but no refused-due said why")
			}
			t.Logf("declared after %s, refused-due said: %t", declared, refusedDue)
		})
	}
}

// TestMissingBeaconsSaidOncePerEpisode: a host whose beacons stop while
// its renewals still arrive (it relays through peers, cut off from NATS;
// its beacons cannot leave) is named once, not at every renewal, until
// one of its beacons comes; each renewal still makes a loss window.
// Records delivered by the watch's first listing (their beacons were
// sent before the subscription) and controller-written records expect
// no beacon.
func TestMissingBeaconsSaidOncePerEpisode(t *testing.T) {
	tr, rev := beaconFleet(t)
	// The first listing's records: no beacon expected.
	at := t0.Add(time.Minute)
	missRenew(tr, at, 0, &rev, "h1", "")
	tr.WatchStarted(at)
	if m, _ := tr.BeaconsMissing(at.Add(time.Hour)); len(m) != 0 {
		t.Fatalf("missing %v for records listed before the watch started", m)
	}
	var said []string
	for s := range 20 {
		now := at.Add(time.Duration(s*3) * time.Second)
		missRenew(tr, now, 0, &rev, "h1", "")
		m, _ := tr.BeaconsMissing(now)
		said = append(said, m...)
	}
	if !slices.Equal(said, []string{"h1"}) {
		t.Fatalf("said %v, want h1 once", said)
	}
	if n := len(tr.lossWindows); n != 1 {
		t.Fatalf("%d loss windows, want 1 (merged)", n)
	}
	w := tr.lossWindows[0]
	if got := w.to.Sub(w.from); got != 45*time.Second {
		t.Fatalf("the window spans %s, want the 16 checked missing renewals' (45 s)", got)
	}
	// h1's beacon comes back; a later loss is said again.
	now := at.Add(2 * time.Minute)
	tr.BeaconsMissing(now) // the rest of the episode
	missRenew(tr, now, 0, &rev, "", "")
	tr.BeaconsMissing(now.Add(BeaconExpectWindow))
	missRenew(tr, now.Add(time.Minute), 0, &rev, "h1", "")
	if m, _ := tr.BeaconsMissing(now.Add(time.Minute + BeaconExpectWindow)); !slices.Equal(m, []string{"h1"}) {
		t.Fatalf("after its beacons came back, then stopped: said %v, want [h1]", m)
	}
	// A declaration (controller-signed) expects no beacon of the host.
	rev++
	d := rec("h2", fencing.BackstopReset)
	d.State, d.Signer = fencing.LeaseExpired, "controller-key"
	missStored(tr, now, "h2", rev, now)
	tr.Observe(now.Add(2*time.Minute), "h2", rev, d)
	if m, _ := tr.BeaconsMissing(now.Add(time.Hour)); len(m) != 0 {
		t.Fatalf("missing %v for a controller-written record", m)
	}
}

// TestLossWindowControllerClockSkew (S): the runner's loss windows are
// in its own clock, a hidden write's times in the server's stamps. With
// the controller's clock 2 minutes behind the server's (or ahead), a
// beacon loss noticed at the hidden withdrawal's time no longer covered
// it (BeaconLossSlack is 30 s) and the withdrawn h3 was declared. The
// tracker now estimates the offset from the deliveries (the least of
// delivery time − stored time) and places each window in the server's
// clock too. Controls: no skew; and "no loss": the dead h3 is declared.
func TestLossWindowControllerClockSkew(t *testing.T) {
	for _, c := range []struct {
		name         string
		skew         time.Duration
		loss         bool
		wantDeclared bool
	}{
		{name: "no-skew", loss: true},
		{name: "controller-behind-2m", skew: 2 * time.Minute, loss: true},
		{name: "controller-ahead-2m", skew: -2 * time.Minute, loss: true},
		{name: "controller-behind-2m/no-loss", skew: 2 * time.Minute, wantDeclared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			at := t0.Add(20 * time.Minute)
			tr, rev := missFleet(t, at, c.skew)
			missHide(tr, at, c.skew, &rev)
			if c.loss {
				// The runner's tick at at+2.5 s (its clock) saw its
				// subscription's dropped count grow since at+1 s.
				tr.BeaconsLost(at.Add(time.Second), at.Add(2500*time.Millisecond))
			}
			declared, refusedDue, _ := missRun(t, tr, at.Add(2*time.Second), c.skew, 180, &rev)
			switch {
			case c.wantDeclared && declared == 0:
				t.Fatalf("the dead h3 never declared (refused-due said: %t)", refusedDue)
			case !c.wantDeclared && declared != 0:
				t.Fatalf("the withdrawn h3 declared %s after the hidden write (controller clock %s off the server's)", declared, c.skew)
			case !c.wantDeclared && !refusedDue:
				t.Fatal("h3 not declared but no refused-due said why")
			}
		})
	}
}

// TestHiddenWriteWaitsForMissingBeacons (S): with short leases (×0.1
// timing: lease_ttl + grace ≈ 3 s, below BeaconExpectWindow) h3, its
// withdrawal hidden and its beacon lost on a route with h5's, fell due
// before h5's missing beacon could be found, and was declared. A host
// with a hidden write now waits HiddenWriteWait after it was noted:
// BeaconsMissing then refuses it. "beaconMissMutation": the hole
// (declared at once when due). Control "no-loss": the dead h3 is
// declared once the wait is over.
func TestHiddenWriteWaitsForMissingBeacons(t *testing.T) {
	for _, c := range []struct {
		name             string
		lose, mutation   bool
		wantDeclared     bool
		declaredNotAfter time.Duration
	}{
		{name: "lost", lose: true},
		{name: "lost/beaconMissMutation", lose: true, mutation: true, wantDeclared: true},
		{name: "no-loss", wantDeclared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			beaconMissMutation, beaconChainMutation = c.mutation, c.mutation // the chain finds it too
			defer func() { beaconMissMutation, beaconChainMutation = false, false }()
			at := t0.Add(2 * time.Second) // the fleet renewing since t0: no hold
			tr, rev, r3 := shortFleet(t)
			missChainOn(tr)
			rev++
			missStored(tr, at, "h3", rev, at)
			tr.Observe(at, "h3", rev, r3)
			tr.ObserveBeacon(at, "h3", rev)
			lose := ""
			if c.lose {
				lose = "h5"
			}
			missRenew(tr, at.Add(100*time.Millisecond), 0, &rev, lose, "h3") // h5's beacon lost with h3's withdrawal beacon
			missHide(tr, at, 0, &rev)                                        // the garbage delivered at at+2 s
			var declared time.Duration
			refused := false
			for ms := 2100; ms <= 180000 && declared == 0; ms += 100 {
				now := at.Add(time.Duration(ms) * time.Millisecond)
				if ms%1000 == 0 {
					missRenew(tr, now, 0, &rev, "", "h3")
				}
				if _, r := tr.BeaconsMissing(now); slices.Contains(r, "h3") {
					refused = true
				}
				for _, d := range tr.Tick(now) {
					switch {
					case d.Op == OpDeclare && d.Host == "h3":
						declared = now.Sub(at)
					case d.Op == OpDeclare:
						t.Fatalf("declared the live %s", d.Host)
					}
				}
			}
			switch {
			case c.wantDeclared && declared == 0:
				t.Fatal("the dead h3 never declared")
			case !c.wantDeclared && declared != 0:
				t.Fatalf("the withdrawn h3 declared %s after its last renewal (its lease_ttl + grace ≈ 3 s), before h5's missing beacon was found", declared)
			case !c.wantDeclared && !refused:
				t.Fatal("h3 not declared, but BeaconsMissing never refused it")
			case c.name == "no-loss" && declared < HiddenWriteWait:
				t.Fatalf("declared %s after its last renewal, before the wait (%s) was over", declared, HiddenWriteWait)
			}
			t.Logf("declared %s after its last renewal; refused: %t", declared, refused)
		})
	}
}

// chainFleet renews h0..h9 (but skip) at now like missRenew, each beacon
// passed through BeaconChain with its Prev (prev: per host, the revision
// its last published beacon named) unless lost (published, never
// received) or the renewal hidden (garbage over it before the watch
// delivered it, after a skip). It returns the hosts refused.
func chainRound(tr *Tracker, now time.Time, rev *uint64, prev map[string]uint64, skip, lose, hide map[string]bool) []string {
	gap := false
	for i := range 10 {
		name := fmt.Sprintf("h%d", i)
		if skip[name] {
			continue
		}
		*rev++
		own := *rev
		if hide[name] {
			*rev++ // the garbage over it
			tr.Skipped(*rev)
			missStored(tr, now.Add(300*time.Millisecond), name, *rev, now.Add(200*time.Millisecond))
			tr.ObserveInvalid(now.Add(300*time.Millisecond), name, *rev, "undecodable value (garbage)", false)
		} else {
			r := rec(name, fencing.BackstopReset)
			r.Signer = name + "-key"
			missStored(tr, now, name, own, now)
			tr.Observe(now, name, own, r)
		}
		if !lose[name] {
			gap = tr.BeaconChain(now, name, own, prev[name]) || gap
			tr.ObserveBeacon(now, name, own)
		}
		prev[name] = own
	}
	if gap { // as the runner: once for the batch
		return tr.RefuseCovered()
	}
	return nil
}

// TestBeaconChainFindsHiddenCompanion (S; reviewer X28's
// TestX28HideCoincidentRenewal, closed): h3's withdrawal is hidden and its
// beacon lost on a route; the same loss drops h5's renewal beacon, and
// the compromised node hides h5's renewal too, so no record expects a
// beacon (BeaconsMissing finds nothing). h5's next beacon names the lost
// one as its Prev (fencing.Beacon.Prev): BeaconChain finds the gap and
// refuses h3. "beaconChainMutation": the hole (declared). Control
// "nothing-lost": h5's beacon came; the dead h3 is declared.
func TestBeaconChainFindsHiddenCompanion(t *testing.T) {
	for _, c := range []struct {
		name           string
		lose, mutation bool
		wantDeclared   bool
	}{
		{name: "lost", lose: true},
		{name: "lost/beaconChainMutation", lose: true, mutation: true, wantDeclared: true},
		{name: "nothing-lost", wantDeclared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			beaconChainMutation = c.mutation
			defer func() { beaconChainMutation = false }()
			at := t0.Add(20 * time.Minute)
			tr, rev := beaconFleet(t)
			tr.WatchStarted(t0)
			prev := map[string]uint64{}
			chainRound(tr, at.Add(-2*time.Second), &rev, prev, nil, nil, nil)
			chainRound(tr, at, &rev, prev, nil, nil, nil) // h3's last renewal among them
			missHide(tr, at, 0, &rev)
			lose := set()
			if c.lose {
				lose = set("h5")
			}
			now := at.Add(time.Second)
			if r := chainRound(tr, now, &rev, prev, set("h3"), lose, set("h5")); len(r) != 0 {
				t.Fatalf("refused %v before the loss could be known", r)
			}
			if m, _ := tr.BeaconsMissing(now.Add(BeaconExpectWindow)); len(m) != 0 {
				t.Fatalf("BeaconsMissing said %v: h5's renewal was hidden, none expected", m)
			}
			refused := chainRound(tr, now.Add(time.Second), &rev, prev, set("h3"), nil, nil)
			if !c.mutation && c.lose && !slices.Equal(refused, []string{"h3"}) {
				t.Fatalf("h5's next beacon refused %v, want [h3]", refused)
			}
			var declared time.Duration
			for s := 3; s <= 180 && declared == 0; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				chainRound(tr, now, &rev, prev, set("h3"), nil, nil)
				for _, d := range tr.Tick(now) {
					switch {
					case d.Op == OpDeclare && d.Host == "h3":
						declared = now.Sub(at)
					case d.Op == OpDeclare:
						t.Fatalf("declared the live %s", d.Host)
					}
				}
			}
			switch {
			case c.wantDeclared && declared == 0:
				t.Fatal("the dead h3 never declared")
			case !c.wantDeclared && declared != 0:
				t.Fatalf("the withdrawn h3 declared %s after its last renewal: h5's renewal hidden, its beacon lost with h3's", declared)
			}
			t.Logf("declared %s after its last renewal", declared)
		})
	}
}

// shortFleet is beaconFleet after the first listing with h3 on ×0.1
// leases from t0 (lease_ttl + grace ≈ 3 s; a lease shortened later keeps
// the longer one for a while), and h3's record.
func shortFleet(t *testing.T) (*Tracker, uint64, *fencing.LeaseRecord) {
	t.Helper()
	r3 := rec("h3", fencing.BackstopReset)
	r3.Signer = "h3-key"
	r3.Timing.RenewInterval, r3.Timing.RenewTimeout, r3.Timing.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	r3.Timing.FenceDeadline, r3.Timing.LeaseTTL, r3.Timing.WatchdogTimeout = 500*time.Millisecond, 1500*time.Millisecond, time.Second
	tr, rev := beaconFleet(t)
	tr.Observe(t0, "h3", rev, r3)
	tr.ObserveBeacon(t0, "h3", rev)
	tr.WatchStarted(t0)
	return tr, rev, r3
}
