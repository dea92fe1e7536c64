package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX9UndecodableKeysHoldGuardForEverSigningOff: signing off (no
// enrolled set: unenrolled is false for every name), h0..h9 renewing,
// h0 dies. Keys under other names hold values this controller cannot
// decode — a node writing garbage (mode off: nothing stops it), or
// leftovers (a key written by another tool, an agent of a newer schema
// whose host is gone). f43f09c counts each silent from suspect_after on
// until a trusted record or a beacon of it arrives — never, for these:
// they are silent for ever, not members (threshold unchanged), and with
// threshold+1 of them the guard holds for good: h0, and every host that
// dies later, is never declared (liveness). Before f43f09c such keys
// counted for nothing (TestX4FakeKeysRaiseGuardThreshold kept them out of
// N); the delete-marker variant was closed only with signatures required.
func TestX9UndecodableKeysHoldGuardForEverSigningOff(t *testing.T) {
	for _, fakes := range []int{0, 3} {
		t.Run(fmt.Sprintf("undecodable=%d", fakes), func(t *testing.T) {
			tr := newTracker(t, 10)
			rev := uint64(100)
			for s := 1; s <= 300; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for i := 1; i < 10; i++ {
					rev++
					tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
				}
				if s == 1 {
					for i := range fakes {
						rev++
						tr.ObserveInvalid(now, fmt.Sprintf("junk-%d", i), rev, "decode: invalid character", false)
					}
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared at %s", now.Sub(t0))
						return
					}
				}
			}
			t.Errorf("signing off: dead h0 never declared in 300 s after %d undecodable keys under other names: holding %t, silent %d > threshold %d",
				fakes, tr.Holding(), tr.Silent(t0.Add(300*time.Second)), tr.Threshold())
		})
	}
}

// scaledRec is rec with every duration of its timing scaled by f (the
// integration tests' x0.1 timing is one a deployment may configure:
// Timing.Validate accepts it).
func scaledRec(host string, f float64) *fencing.LeaseRecord {
	r := rec(host, fencing.BackstopReset)
	s := func(d *time.Duration) { *d = time.Duration(float64(*d) * f) }
	s(&r.Timing.RenewInterval)
	s(&r.Timing.RenewTimeout)
	s(&r.Timing.LeaseTTL)
	s(&r.Timing.FenceDeadline)
	s(&r.Timing.PeerTimeout)
	s(&r.Timing.WatchdogTimeout)
	s(&r.Timing.ResetBudget)
	return r
}

// TestX9ForgedValuesAtRestartShortTiming: X8's scenario (60 hosts, a rack
// h1..h12 cut off and Held, C1 holds; a compromised node writes a forged
// or garbage value into h11's and h12's keys; the controller restarts),
// with the fleet on a shorter timing than the default (x0.1: suspect_after
// 0.4 s, lease_ttl + grace 3.05 s — valid, and the integration tests'
// own). f43f09c counts h11 and h12 silent from the DEFAULT suspect_after
// (4 s x (1 - 2 drift) = 3.92 s) after C2's start, but h1..h10 are due at
// 3.05 s: then only h1..h10 count (10, not > threshold 10), no hold, and
// the Held h1..h10 are declared ~3.1 s after C2's start while their guests
// run — (b), (S). The silence of a host with no trusted record must not
// start later than the earliest the fleet's hosts may be declared (e.g.
// the smallest silentAft of the trusted records, not the default).
// Control (scale 1): C2 holds.
func TestX9ForgedValuesAtRestartShortTiming(t *testing.T) {
	for _, scale := range []float64{1, 0.1} {
		t.Run(fmt.Sprintf("scale=%g", scale), func(t *testing.T) {
			newTr := func() *Tracker {
				tr, err := NewTracker(resetConfig())
				if err != nil {
					t.Fatal(err)
				}
				tr.SetSigningRequired(true)
				tr.SetEnrolled(enrolledH)
				return tr
			}
			var g fencing.Guard
			rev := uint64(0)
			latest := map[string]uint64{}
			put := func(tr *Tracker, now time.Time, host string) {
				rev++
				r := scaledRec(host, scale)
				r.Signer, r.Guard = host+"-key", g.Ref()
				tr.Observe(now, host, rev, r)
				tr.ObserveBeacon(now, host, rev)
				latest[host] = rev
			}
			hosts := make([]string, 60)
			for i := range hosts {
				hosts[i] = fmt.Sprintf("h%d", i)
			}
			cut := map[string]bool{}
			for i := 1; i <= 12; i++ {
				cut[fmt.Sprintf("h%d", i)] = true
			}
			c1 := newTr()
			for _, h := range hosts {
				put(c1, t0, h)
			}
			g = c1.Guard()
			c1.GuardPublished(g, nil)
			for _, h := range hosts {
				put(c1, t0, h)
			}
			written := map[string]bool{}
			step := 100 * time.Millisecond
			for s := 1; s <= 300; s++ {
				now := t0.Add(time.Duration(s) * step)
				for _, h := range hosts {
					if !cut[h] {
						put(c1, now, h)
					}
				}
				if s == 250 {
					for _, h := range []string{"h11", "h12"} {
						rev++
						latest[h], written[h] = rev, true
						c1.ObserveInvalid(now, h, rev, "undecodable value (garbage)", false)
					}
				}
				c1.GuardPublished(c1.Guard(), nil)
				for _, d := range c1.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s", d.Host)
					}
				}
			}
			if !c1.Holding() {
				t.Fatalf("C1 not holding (silent %d, threshold %d): the test shows nothing", c1.Silent(t0.Add(30*time.Second)), c1.Threshold())
			}
			g = c1.Guard()
			c1.GuardPublished(g, nil)
			restart := t0.Add(32 * time.Second)
			c2 := newTr()
			for _, h := range hosts {
				if written[h] {
					c2.ObserveInvalid(restart, h, latest[h], "undecodable value (garbage)", false)
					continue
				}
				r := scaledRec(h, scale)
				r.Signer, r.Guard = h+"-key", g.Ref()
				c2.Observe(restart, h, latest[h], r)
			}
			c2.WatchStarted(restart)
			c2.RestoreGuard(g)
			for s := 1; s <= 900; s++ {
				now := restart.Add(time.Duration(s) * step)
				for _, h := range hosts {
					if !cut[h] {
						put(c2, now, h)
					}
				}
				c2.GuardPublished(c2.Guard(), nil)
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C2 declared %s %s after its start while h1..h12 were all cut off and Held (guests running): silent %d, threshold %d, members %d",
							d.Host, now.Sub(restart), c2.Silent(now), c2.Threshold(), c2.Members())
					}
				}
			}
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}
