package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// BenchmarkTrackerFleet: the controller's tracker under the fleet
// benchmark's load (docs/BENCHMARKS.md, issue 12): n hosts renewing every
// 2 s (unsigned, as the bench's simulated agents), one Tick per 250 ms
// tick. One op is one second of the fleet: n/2 renewals and 4 ticks.
// ns/op divided by 1e9 is the tracker's share of a core at that load.
func BenchmarkTrackerFleet(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				b.Fatal(err)
			}
			hosts := make([]string, n)
			recs := make([]fencing.LeaseRecord, n)
			for i := range hosts {
				hosts[i] = fmt.Sprintf("bench-%05d.example.org", i)
				recs[i] = *rec(hosts[i], fencing.BackstopReset)
			}
			now, rev := t0, uint64(0)
			observe := func(i int) {
				rev++
				tr.Stored(hosts[i], rev, now)
				r := recs[i]
				tr.Observe(now, hosts[i], rev, &r)
			}
			runFleet(b, tr, &now, n, observe, nil)
		})
	}
}

// BenchmarkTrackerFleetBeacons is BenchmarkTrackerFleet with signatures
// required and every renewal named by its beacon, as the runner feeds
// them: the delivery's clock sample and beacon expectation, the beacon's
// chain check (Prev), ObserveBeacon, BeaconWrote and BeaconVouches, and
// BeaconsMissing at each tick (beaconloss.go). One op is one second of
// the fleet. The baseline, in
// the same run: the same load on the commit before the missing-beacon
// and chain checks (docs/BENCHMARKS.md).
func BenchmarkTrackerFleetBeacons(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				b.Fatal(err)
			}
			tr.SetSigningRequired(true)
			hosts := make([]string, n)
			recs := make([]fencing.LeaseRecord, n)
			prev := make([]uint64, n)
			for i := range hosts {
				hosts[i] = fmt.Sprintf("bench-%05d.example.org", i)
				recs[i] = *rec(hosts[i], fencing.BackstopReset)
				recs[i].Signer = hosts[i] + "-key"
				recs[i].BootID, recs[i].Epoch, recs[i].Incarnation = "boot-1", 1, 1
			}
			now, rev := t0, uint64(0)
			observe := func(i int) {
				rev++
				tr.Stored(hosts[i], rev, now)
				tr.ClockSample(now, 0, now)
				recs[i].Seq++
				r := recs[i]
				tr.Observe(now, hosts[i], rev, &r)
				// The runner's beacon path (observeBeacons).
				tr.BeaconChain(now, hosts[i], rev, prev[i])
				tr.ObserveBeacon(now, hosts[i], rev)
				tr.BeaconWrote(hosts[i], rev, r.Epoch, r.Incarnation, r.Seq)
				tr.BeaconVouches(now, hosts[i], rev, r.BootID, r.Epoch, r.Incarnation, r.Seq)
				prev[i] = rev
			}
			runFleet(b, tr, &now, n, observe, func(now time.Time) { tr.BeaconsMissing(now) })
		})
	}
}

// runFleet observes every host once (the first listing), then drives the
// benchmark: one op is one second of the fleet — four ticks (each after
// tick, if set), n/2 renewals (observe) — and reports the cores it took.
func runFleet(b *testing.B, tr *Tracker, now *time.Time, n int, observe func(int), tick func(time.Time)) {
	for i := range n {
		observe(i)
	}
	tr.WatchStarted(*now)
	next := 0
	b.ResetTimer()
	for b.Loop() {
		for range 4 { // one second: four ticks, n/2 renewals
			*now = now.Add(TickInterval)
			for range n / 8 {
				observe(next)
				next = (next + 1) % n
			}
			if tick != nil {
				tick(*now)
			}
			tr.Tick(*now)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e9, "cores")
}
