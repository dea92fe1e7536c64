package libvirtx

import (
	"context"
	"testing"
	"time"

	"hvguard/lifecycle"
)

// BenchmarkEventHandoff measures end-to-end event throughput with the
// in-process test driver: Suspend/Resume calls (each through the bounded
// call path) produce events on the libvirt event loop goroutine, the
// callbacks hand them off, a consumer drains Events. Reports events/s and
// the mean delay from the call's start to the consumer receiving the event.
func BenchmarkEventHandoff(b *testing.B) {
	ctx := context.Background()
	c := dial(b, nil)
	uuid := newUUID()
	if _, err := c.DefineXML(ctx, TestDomainXML("bench", uuid)); err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx, uuid); err != nil {
		b.Fatal(err)
	}
	for range 2 { // DEFINED, STARTED
		<-c.Events()
	}
	var latency time.Duration
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		op := c.Suspend
		if i%2 == 1 {
			op = c.Resume
		}
		t0 := time.Now()
		if err := op(ctx, uuid); err != nil {
			b.Fatal(err)
		}
		ev := <-c.Events()
		latency += time.Since(t0)
		if ev.Kind != lifecycle.KindSuspended && ev.Kind != lifecycle.KindResumed {
			b.Fatalf("unexpected event %+v", ev)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(latency.Microseconds())/float64(b.N), "µs/call+event")
	if st := c.Status(); st.Overflows != 0 {
		b.Fatalf("overflows: %+v", st)
	}
}

// BenchmarkEventHandoffBurst issues operations without waiting for their
// events, with a concurrent consumer, as a reset-looping guest would: it
// measures how fast the event loop, the callbacks and the hand-off move
// events when calls are not the bottleneck of each single event.
func BenchmarkEventHandoffBurst(b *testing.B) {
	ctx := context.Background()
	c := dial(b, nil)
	uuid := newUUID()
	if _, err := c.DefineXML(ctx, TestDomainXML("burst", uuid)); err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx, uuid); err != nil {
		b.Fatal(err)
	}
	for range 2 {
		<-c.Events()
	}
	got := make(chan int)
	go func() {
		n := 0
		for uint64(n)+c.Status().Overflows < uint64(b.N) {
			select {
			case <-c.Events():
				n++
			case <-time.After(10 * time.Millisecond):
			}
		}
		got <- n
	}()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		op := c.Suspend
		if i%2 == 1 {
			op = c.Resume
		}
		if err := op(ctx, uuid); err != nil {
			b.Fatal(err)
		}
	}
	n := <-got
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(c.Status().Overflows), "overflows")
}

// BenchmarkDeliver measures the hand-off alone (deliver with a draining
// consumer), without libvirt. Events that find the buffer full are counted
// as overflows (reported), never waited for.
func BenchmarkDeliver(b *testing.B) {
	c := dial(b, nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	delivered := 0
	go func() {
		defer close(done)
		for {
			select {
			case <-c.events:
				delivered++
			case <-stop:
				for {
					select {
					case <-c.events:
						delivered++
					default:
						return
					}
				}
			}
		}
	}()
	ev := lifecycle.Event{UUID: "6a1c0e3e-0000-4000-8000-000000000000", Kind: lifecycle.KindStopped, Event: "STOPPED", Detail: "DESTROYED"}
	b.ResetTimer()
	for range b.N {
		c.deliver(ev)
	}
	b.StopTimer()
	close(stop)
	<-done
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "offered/s")
	b.ReportMetric(float64(delivered)/b.Elapsed().Seconds(), "delivered/s")
	b.ReportMetric(float64(c.Status().Overflows)/float64(b.N), "overflow-ratio")
}
