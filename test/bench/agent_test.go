//go:build bench

package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/proto"
)

// Real-stop latency parameters. The window is 1 s so the run is short: the
// agent's overhead on top of the window (event hand-off, timer, one state
// query, outbox, JetStream publish and store, consumer delivery) does not
// depend on the window's length, which is only the timer's duration.
const (
	stopDomains = 200
	stopWindow  = time.Second
	stopSpacing = 10 * time.Millisecond // 200 destroys spread over 2 s
)

// BenchmarkStopLatency measures, through the real agent (agent.Run on the
// libvirt test driver, embedded JetStream, a JetStream consumer), how long
// after the libvirt call a real stop reaches the consumer, minus the
// window: overhead = consumer receive time of `stopped` − time of the
// Destroy call − window. Each iteration defines 200 running domains, waits
// until the pipeline is idle, then every 10 ms suspends one domain and
// destroys it at once. The `suspended` report is not debounced, so its
// latency (consumer receive − Suspend call) is the pipeline's own cost: the
// baseline, measured on the same domains in the same run.
//
// Run with -benchtime=1x: one iteration is one 200-domain experiment;
// ns/op is meaningless, the _ms metrics are the figures.
func BenchmarkStopLatency(b *testing.B) {
	ns, nc := startNATS(b)
	wl := workload(b, testDriverURI)
	cfg := agentConfig(b, ns.ClientURL(), stopWindow)
	startAgent(b, cfg)
	c := consume(b, nc, cfg.Host)
	var r stopResult
	for i := 0; i < b.N; i++ {
		r.run(b, wl, c)
	}
	b.StopTimer()
	reportDist(b, "stop_overhead", r.overhead)
	reportDist(b, "suspend_latency", r.suspend)
	b.ReportMetric(float64(r.stops)/float64(b.N), "stops/iter")
	b.ReportMetric(float64(r.wrong), "wrong_stops")
	b.ReportMetric(float64(r.missing), "missing_stops")
}

// stopResult accumulates the samples of BenchmarkStopLatency's iterations.
type stopResult struct {
	overhead, suspend     []time.Duration
	stops, wrong, missing int
}

// run is one iteration of BenchmarkStopLatency.
func (res *stopResult) run(b *testing.B, wl *libvirtx.Conn, c *consumer) {
	ctx := context.Background()
	doms := defineDomains(b, wl, "stop", stopDomains)
	c.settle(500*time.Millisecond, 30*time.Second)
	from := c.len()
	suspAt := make(map[string]time.Time, len(doms))
	destroyAt := make(map[string]time.Time, len(doms))
	start := time.Now()
	for j, d := range doms {
		time.Sleep(time.Until(start.Add(time.Duration(j) * stopSpacing)))
		suspAt[d.uuid] = time.Now()
		if err := wl.Suspend(ctx, d.uuid); err != nil {
			b.Fatal(err)
		}
		destroyAt[d.uuid] = time.Now()
		if err := wl.Destroy(ctx, d.uuid); err != nil {
			b.Fatal(err)
		}
	}
	isStop := func(r received) bool {
		_, ok := destroyAt[r.ev.DomainUUID]
		return ok && r.ev.Transition == proto.TransitionStopped
	}
	got := c.waitFor(from, len(doms), isStop, stopWindow+30*time.Second)
	seenStop := map[string]bool{}
	for _, r := range got {
		u := r.ev.DomainUUID
		switch {
		case isStop(r):
			res.stops++
			if seenStop[u] || r.ev.Reason != "off-at-window-end" {
				res.wrong++ // a second stop, or not decided by the state check
			}
			seenStop[u] = true
			res.overhead = append(res.overhead, r.at.Sub(destroyAt[u])-stopWindow)
		case r.ev.Transition == proto.TransitionSuspended:
			if t, ok := suspAt[u]; ok {
				res.suspend = append(res.suspend, r.at.Sub(t))
			}
		}
	}
	res.missing += len(doms) - len(seenStop)
}

// End-to-end throughput parameters: 1000 domains, 4 workload goroutines
// each flapping (suspend/resume) its 250 domains round after round.
const (
	e2eWorkers = 4
	e2eRounds  = 40 // 40 000 events per iteration
)

// flap runs the workload: e2eWorkers goroutines, each owning a slice of
// doms, suspend all its domains, then resume them, e2eRounds times (even,
// so the domains end running). It returns when every call has returned.
func flap(b *testing.B, wl *libvirtx.Conn, doms []dom) { flapAt(b, wl, doms, 0) }

// flapAt is flap paced at rate calls (= events) per second in total, or as
// fast as libvirt answers if rate is 0.
func flapAt(b *testing.B, wl *libvirtx.Conn, doms []dom, rate float64) {
	ctx := context.Background()
	var wg sync.WaitGroup
	per := (len(doms) + e2eWorkers - 1) / e2eWorkers
	start := time.Now()
	for w := 0; w < e2eWorkers; w++ {
		mine := doms[min(w*per, len(doms)):min((w+1)*per, len(doms))]
		wg.Go(func() {
			k := 0
			for r := 0; r < e2eRounds; r++ {
				op := wl.Suspend
				if r%2 == 1 {
					op = wl.Resume
				}
				for _, d := range mine {
					if rate > 0 {
						// This worker's k-th call is due at k·workers/rate.
						due := start.Add(time.Duration(float64(k) * e2eWorkers / rate * float64(time.Second)))
						if ahead := time.Until(due); ahead > time.Millisecond {
							time.Sleep(ahead)
						}
						k++
					}
					if err := op(ctx, d.uuid); err != nil {
						b.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkEndToEnd drives events as fast as the test driver produces them
// (4 goroutines flapping 1000 domains) and measures the rate at which they
// arrive at the consumer and their latency from libvirt's event callback
// (the event's occurred_at, stamped by libvirtx in the callback) to the
// consumer's receipt, p50/p99/max. Sub-benchmarks, same workload, same
// process, same run:
//
//   - pipeline=agent-jetstream/offered=max: the real agent (agent.Run:
//     libvirtx, debouncer, outbox with fsync, JetStream publisher), an
//     embedded JetStream server and a JetStream ordered consumer, the
//     workload as fast as the test driver goes: the saturated throughput.
//   - pipeline=agent-jetstream/offered=10000 and =20000: the same with the
//     workload paced at 10 000 or 20 000 events/s (the target): does the
//     agent keep up (lost_events 0, events/s = offered) and with what
//     latency when it is not saturated.
//   - pipeline=testdriver-only (baseline): no agent; one more libvirt
//     connection whose events are drained — the test driver's own event
//     rate and hand-off latency, the ceiling for the agent on this machine.
//
// The publisher alone (outbox → JetStream, no libvirt) is
// agent/delivery's BenchmarkPublish, run by the same `make bench`.
// events/s = events received / (last receipt − workload start).
// lost_events counts events that never reached the consumer (replaced by a
// resync after a hand-off overflow); it should be 0.
func BenchmarkEndToEnd(b *testing.B) {
	agentRun := func(b *testing.B, rate float64) {
		ns, nc := startNATS(b)
		wl := workload(b, testDriverURI)
		doms := defineDomains(b, wl, "e2e", benchDomains)
		cfg := agentConfig(b, ns.ClientURL(), 15*time.Second)
		startAgent(b, cfg)
		c := consume(b, nc, cfg.Host)
		want := len(doms) * e2eRounds
		isFlap := func(r received) bool {
			return r.ev.Reason == "event" && (r.ev.Transition == proto.TransitionSuspended || r.ev.Transition == proto.TransitionResumed)
		}
		var lat []time.Duration
		var got, lost int
		var elapsed time.Duration
		for i := 0; i < b.N; i++ {
			c.settle(500*time.Millisecond, 60*time.Second)
			from := c.len()
			start := time.Now()
			flapAt(b, wl, doms, rate)
			rs := c.waitFor(from, want, nil, 3*time.Second)
			n := 0
			var last time.Time
			for _, r := range rs {
				if isFlap(r) {
					n++
					lat = append(lat, r.at.Sub(r.ev.OccurredAt))
					last = r.at
				}
			}
			got += n
			lost += want - n
			elapsed += last.Sub(start)
		}
		b.StopTimer()
		b.ReportMetric(float64(got)/elapsed.Seconds(), "events/s")
		reportDist(b, "latency", lat)
		b.ReportMetric(float64(lost), "lost_events")
	}
	b.Run("pipeline=agent-jetstream/offered=max", func(b *testing.B) { agentRun(b, 0) })
	b.Run("pipeline=agent-jetstream/offered=10000", func(b *testing.B) { agentRun(b, 10000) })
	b.Run("pipeline=agent-jetstream/offered=20000", func(b *testing.B) { agentRun(b, 20000) })
	b.Run("pipeline=testdriver-only", func(b *testing.B) {
		wl := workload(b, testDriverURI)
		doms := defineDomains(b, wl, "raw", benchDomains)
		rx, err := libvirtx.Dial(context.Background(), libvirtx.DefaultConfig(testDriverURI), quietLog())
		if err != nil {
			b.Fatal(err)
		}
		defer rx.Close()
		time.Sleep(200 * time.Millisecond)
		for len(rx.Events()) > 0 {
			<-rx.Events()
		}
		want := len(doms) * e2eRounds
		var lat []time.Duration
		var got, lost int
		var elapsed time.Duration
		for i := 0; i < b.N; i++ {
			type rcv struct{ occurred, at time.Time }
			done := make(chan []rcv)
			go func() {
				rs := make([]rcv, 0, want)
				for len(rs) < want {
					select {
					case ev := <-rx.Events():
						rs = append(rs, rcv{ev.At, time.Now()})
					case <-time.After(10 * time.Second):
						done <- rs
						return
					}
				}
				done <- rs
			}()
			start := time.Now()
			flap(b, wl, doms)
			rs := <-done
			for _, r := range rs {
				lat = append(lat, r.at.Sub(r.occurred))
			}
			got += len(rs)
			lost += want - len(rs)
			if len(rs) > 0 {
				elapsed += rs[len(rs)-1].at.Sub(start)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(got)/elapsed.Seconds(), "events/s")
		reportDist(b, "latency", lat)
		b.ReportMetric(float64(lost), "lost_events")
		b.ReportMetric(float64(rx.Status().Overflows), "overflows")
	})
}
