//go:build bench

package bench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"hvguard/lifecycle"
)

// benchDomains is the node size of every benchmark here: 1000 domains.
const benchDomains = 1000

// debounceEvents builds a repeatable mix of n events over ndom domains, the
// same shape as lifecycle's BenchmarkObserve: Nova soft and hard reboots,
// guest reboots, suspend/resume, panics. In 5% of Nova reboots the start
// events come lateEvents events after the STOPPED, so with 1 ms of simulated
// time per event some windows end and real-state checks happen.
func debounceEvents(ndom, n, lateEvents int, seed uint64) []lifecycle.Event {
	r := rand.New(rand.NewPCG(seed, 1))
	type ed struct {
		k       lifecycle.Kind
		ev, det string
	}
	seqs := [][]ed{
		{{lifecycle.KindShutdown, "SHUTDOWN", "GUEST"}, {lifecycle.KindStopped, "STOPPED", "SHUTDOWN"}, {lifecycle.KindResumed, "RESUMED", "UNPAUSED"}, {lifecycle.KindStarted, "STARTED", "BOOTED"}},
		{{lifecycle.KindShutdown, "SHUTDOWN", "HOST"}, {lifecycle.KindStopped, "STOPPED", "DESTROYED"}, {lifecycle.KindDefined, "DEFINED", "UPDATED"}, {lifecycle.KindResumed, "RESUMED", "UNPAUSED"}, {lifecycle.KindStarted, "STARTED", "BOOTED"}},
		{{lifecycle.KindReboot, "REBOOT", ""}, {lifecycle.KindReboot, "REBOOT", ""}},
		{{lifecycle.KindSuspended, "SUSPENDED", "PAUSED"}, {lifecycle.KindResumed, "RESUMED", "UNPAUSED"}},
		{{lifecycle.KindSuspended, "SUSPENDED", "PAUSED"}, {lifecycle.KindCrashed, "CRASHED", "PANICKED"}, {lifecycle.KindReboot, "REBOOT", ""}, {lifecycle.KindResumed, "RESUMED", "UNPAUSED"}, {lifecycle.KindReboot, "REBOOT", ""}},
	}
	uuids := make([]string, ndom)
	names := make([]string, ndom)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		names[i] = fmt.Sprintf("instance-%08x", i)
	}
	cur := make([][]ed, ndom)
	ready := make([]int, ndom)
	evs := make([]lifecycle.Event, 0, n)
	for len(evs) < n {
		i := r.IntN(ndom)
		if ready[i] > len(evs) {
			continue
		}
		if len(cur[i]) == 0 {
			cur[i] = seqs[r.IntN(len(seqs))]
		}
		e := cur[i][0]
		cur[i] = cur[i][1:]
		if e.k == lifecycle.KindStopped && r.IntN(20) == 0 {
			ready[i] = len(evs) + lateEvents
		}
		evs = append(evs, lifecycle.Event{UUID: uuids[i], Name: names[i], Kind: e.k, Event: e.ev, Detail: e.det})
	}
	return evs
}

// novaDelayOnly is the baseline debouncer: Nova's libvirt driver rule
// (nova/virt/libvirt/host.py _event_emit_delayed) written as cheaply as it
// can be. A STOPPED is held for a fixed delay; any later event of the same
// domain cancels it; when the delay expires the stop is emitted. It never
// reads the domain's real state. Timers are a FIFO (the delay is constant,
// so deadlines are in arrival order), expired every 128 events like the
// hvguard sub-benchmark's Tick.
type novaDelayOnly struct {
	delay   time.Duration
	gen     uint64
	pending map[string]uint64 // uuid -> generation of the armed timer
	fifo    []novaTimer
	head    int
	emitted int
}

type novaTimer struct {
	at   time.Time
	uuid string
	gen  uint64
}

func (n *novaDelayOnly) observe(ev lifecycle.Event, now time.Time) {
	if ev.Kind != lifecycle.KindStopped {
		delete(n.pending, ev.UUID)
		return
	}
	n.gen++
	n.pending[ev.UUID] = n.gen
	n.fifo = append(n.fifo, novaTimer{at: now.Add(n.delay), uuid: ev.UUID, gen: n.gen})
}

func (n *novaDelayOnly) tick(now time.Time) {
	for n.head < len(n.fifo) && !n.fifo[n.head].at.After(now) {
		t := n.fifo[n.head]
		n.head++
		if g, ok := n.pending[t.uuid]; ok && g == t.gen {
			delete(n.pending, t.uuid)
			n.emitted++
		}
	}
	if n.head > 4096 && n.head*2 > len(n.fifo) { // compact, amortised O(1)
		n.fifo = append(n.fifo[:0], n.fifo[n.head:]...)
		n.head = 0
	}
}

// mallocs returns the process's cumulative heap allocation count.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// reportAllocs reports heap allocations per event with fractions
// (allocs/op of -benchmem is truncated to an integer, so 1 allocation
// per 1000 events would read 0).
func reportAllocs(b *testing.B, before uint64) {
	b.ReportMetric(float64(mallocs()-before)/float64(b.N), "allocs/event")
}

// BenchmarkDebounce runs one pre-built event stream (1000 domains, 2^16
// events cycled, 1 ms of simulated time per event) through three
// debouncers. One op is one event; events/s is per core (the loop is one
// goroutine), allocs/op is allocations per event.
//
//   - hvguard: lifecycle.Debouncer, Observe per event, Tick every 128
//     events, every real-state check it asks for answered at once
//     (alternately running and shut off) through Resolve.
//   - nova-delay-only: the baseline above, same events, same tick rhythm.
//   - map-lookup: the floor of any per-domain debouncer: one map lookup and
//     one map store per event, nothing else.
func BenchmarkDebounce(b *testing.B) {
	evs := debounceEvents(benchDomains, 1<<16, 20000, 42)
	mask := len(evs) - 1
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	b.Run("impl=hvguard", func(b *testing.B) {
		d, err := lifecycle.New(lifecycle.DefaultConfig())
		if err != nil {
			b.Fatal(err)
		}
		snap := make([]lifecycle.DomainSnapshot, 0, benchDomains)
		seen := map[string]bool{}
		for _, ev := range evs {
			if !seen[ev.UUID] {
				seen[ev.UUID] = true
				snap = append(snap, lifecycle.DomainSnapshot{UUID: ev.UUID, Name: ev.Name, State: lifecycle.StateRunning})
			}
		}
		now := t0
		out := make([]lifecycle.Decision, 0, 64)
		tick := make([]lifecycle.Decision, 0, 1024)
		out = d.AppendResync(out[:0], snap, now)
		var reports int
		b.ReportAllocs()
		m0 := mallocs()
		b.ResetTimer()
		for i := range b.N {
			now = now.Add(time.Millisecond)
			ev := evs[i&mask]
			ev.At = now
			out = d.AppendObserve(out[:0], ev, now)
			reports += len(out)
			if i&127 == 0 {
				tick = d.AppendTick(tick[:0], now)
				for _, dc := range tick {
					if dc.Op != lifecycle.OpCheckState {
						continue
					}
					st := lifecycle.StateRunning
					if dc.Check&1 == 0 {
						st = lifecycle.StateShutoff
					}
					out = d.AppendResolve(out[:0], dc.UUID, dc.Check, st, nil, now)
					reports += len(out)
				}
			}
		}
		b.StopTimer()
		reportAllocs(b, m0)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(reports)/float64(b.N), "decisions/event")
	})

	b.Run("impl=nova-delay-only", func(b *testing.B) {
		n := &novaDelayOnly{delay: lifecycle.DefaultWindow, pending: make(map[string]uint64, benchDomains)}
		now := t0
		b.ReportAllocs()
		m0 := mallocs()
		b.ResetTimer()
		for i := range b.N {
			now = now.Add(time.Millisecond)
			ev := evs[i&mask]
			ev.At = now
			n.observe(ev, now)
			if i&127 == 0 {
				n.tick(now)
			}
		}
		b.StopTimer()
		reportAllocs(b, m0)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(n.emitted)/float64(b.N), "stops/event")
	})

	b.Run("impl=map-lookup", func(b *testing.B) {
		m := make(map[string]uint8, benchDomains)
		b.ReportAllocs()
		m0 := mallocs()
		b.ResetTimer()
		for i := range b.N {
			ev := evs[i&mask]
			m[ev.UUID] = m[ev.UUID] + uint8(ev.Kind)
		}
		b.StopTimer()
		reportAllocs(b, m0)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
