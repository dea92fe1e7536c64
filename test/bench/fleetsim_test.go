//go:build bench

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// envInt returns the integer in environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// benchHostRecord is the lease record a simulated agent renews: the
// DEFAULT timing (renew 2 s, lease_ttl 15 s, fence deadline 5 s), fencing
// on (pause) with a hardware-watchdog backstop of 10 s — constants the
// controller honours (controller.Config.Grace: 15.505 s with its defaults).
func benchHostRecord(host string, inc uint64) fencing.LeaseRecord {
	return fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: host, BootID: "bench-boot-" + host, State: fencing.LeaseActive,
		Incarnation: inc, FencingEnabled: true, Action: fencing.ActionPause, Backstop: fencing.BackstopWatchdog,
		Timing: fencing.DefaultTiming(), AgentState: fencing.StateHealthy}
}

// renewStats collects the renewals of one phase.
type renewStats struct {
	mu                                sync.Mutex
	lat                               []time.Duration // acknowledged renewals: send → ack
	acked, conflict, timedOut, failed int
	declaredWhileRenewing             int // a conflict with an expired record: a host declared although it renewed
	first, last                       time.Time
}

func (s *renewStats) record(sent time.Time, d time.Duration, res fencing.RenewResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first.IsZero() {
		s.first = sent
	}
	s.last = sent
	switch res.Outcome {
	case fencing.RenewAcked:
		s.acked++
		s.lat = append(s.lat, d)
	case fencing.RenewConflict:
		s.conflict++
		if res.Current != nil && res.Current.State != fencing.LeaseActive {
			s.declaredWhileRenewing++
		}
	case fencing.RenewTimedOut:
		s.timedOut++
	default:
		s.failed++
	}
}

// report reports the phase's renewal figures as <prefix>renew_*.
func (s *renewStats) report(b *testing.B, prefix string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lat := slices.Clone(s.lat)
	reportDist(b, prefix+"renew", lat)
	n := s.acked + s.conflict + s.timedOut + s.failed
	b.ReportMetric(float64(n), prefix+"renewals")
	if el := s.last.Sub(s.first).Seconds(); el > 0 {
		b.ReportMetric(float64(n)/el, prefix+"renewals/s")
	}
	b.ReportMetric(float64(s.conflict+s.timedOut+s.failed), prefix+"renew_failures")
	b.ReportMetric(float64(s.timedOut), prefix+"renew_timeouts")
	b.ReportMetric(float64(s.declaredWhileRenewing), prefix+"false_declarations")
}

// simHost is one simulated agent's lease loop.
type simHost struct {
	name  string
	store *natslease.Store
	stop  context.CancelFunc
	done  chan struct{}

	mu                sync.Mutex
	lastSent, lastAck time.Time
	acks              int
}

// simFleet is n simulated agents renewing their lease records every
// fencing.DefaultRenewInterval by compare-and-set (natslease.Store.Renew,
// the agents' own write), spread over a pool of connections round-robin
// over the cluster's servers — pooled connections, as the reference
// measurement (shared/reference/nats-partitions.md, "Fleet scale") did.
type simFleet struct {
	hosts []*simHost
	stats atomic.Pointer[renewStats]
}

func startFleet(b *testing.B, c *natsCluster, n, conns int) *simFleet {
	b.Helper()
	f := &simFleet{}
	f.stats.Store(&renewStats{})
	var stores []*natslease.Store
	for i := range max(conns, 1) {
		nc := c.connect(b, c.urls[i%len(c.urls)], nats.Name(fmt.Sprintf("bench-fleet-%d", i)))
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		kv, err := js.KeyValue(ctx, fencing.Bucket)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		stores = append(stores, &natslease.Store{KV: kv})
	}
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		h := &simHost{name: fmt.Sprintf("hv%05d", i), store: stores[i%len(stores)], stop: cancel, done: make(chan struct{})}
		f.hosts = append(f.hosts, h)
		go f.renew(ctx, h, uint64(i+1))
	}
	b.Cleanup(func() {
		for _, h := range f.hosts {
			h.stop()
		}
		for _, h := range f.hosts {
			<-h.done
		}
	})
	return f
}

// renew is host h's loop: a renewal every interval (first at a random
// phase), CAS on the revision of its last landed record.
func (f *simFleet) renew(ctx context.Context, h *simHost, inc uint64) {
	defer close(h.done)
	t := fencing.DefaultTiming()
	rec := benchHostRecord(h.name, inc)
	var rev uint64
	timer := time.NewTimer(time.Duration(rand.Int64N(int64(t.RenewInterval))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		rec.Seq++
		sent := time.Now()
		res := h.store.Renew(ctx, fencing.RenewRequest{Seq: rec.Seq, Revision: rev, Record: rec}, t.RenewTimeout)
		if ctx.Err() != nil {
			return // silenced during the write: not counted
		}
		d := time.Since(sent)
		switch {
		case res.Outcome == fencing.RenewAcked:
			rev = res.Revision
			h.mu.Lock()
			h.lastSent, h.lastAck = sent, sent.Add(d)
			h.acks++
			h.mu.Unlock()
		case res.Outcome == fencing.RenewConflict && res.Current != nil && res.Current.State == fencing.LeaseActive && res.Current.Host == h.name:
			rev = res.Revision // our own late write landed
		}
		f.stats.Load().record(sent, d, res)
		timer.Reset(time.Until(sent.Add(t.RenewInterval)))
	}
}

// phase starts a new renewal statistics phase and returns the previous.
func (f *simFleet) phase() *renewStats { return f.stats.Swap(&renewStats{}) }

// waitAllRenewed waits until every host has landed a renewal.
func (f *simFleet) waitAllRenewed(b *testing.B, within time.Duration) {
	b.Helper()
	end := time.Now().Add(within)
	for {
		missing := 0
		for _, h := range f.hosts {
			h.mu.Lock()
			if h.acks == 0 {
				missing++
			}
			h.mu.Unlock()
		}
		if missing == 0 {
			return
		}
		if time.Now().After(end) {
			b.Fatalf("%d of %d hosts never renewed within %s", missing, len(f.hosts), within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// silence stops host h's renewals and returns the send and ack times of
// its last landed renewal.
func (h *simHost) silence() (sent, acked time.Time) {
	h.stop()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSent, h.lastAck
}

// watchDeclared watches host's key and sends the time the first record
// that is not active arrives (the controller's declaration), with the
// record.
type declared struct {
	at  time.Time
	rec fencing.LeaseRecord
}

func watchDeclared(b *testing.B, kv jetstream.KeyValue, host string) <-chan declared {
	b.Helper()
	key, err := proto.HostToken(host)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	w, err := kv.Watch(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	out := make(chan declared, 1)
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			at := time.Now()
			if r, err := fencing.DecodeRecord(e.Value()); err == nil && r.State != fencing.LeaseActive {
				out <- declared{at, r}
				return
			}
		}
	}()
	return out
}

// eventSource publishes valid lifecycle events (proto.LifecycleEvent) at a
// fixed total rate, round-robin over hosts: each host's first message is
// a full report of its one domain, then the domain stops and starts;
// per-host seq from 1 under a random incarnation, Nats-Msg-Id proto.MsgID,
// published asynchronously to proto.LifecycleSubject like the agents'
// publisher.
type eventSource struct {
	published, failed atomic.Uint64
	stop              context.CancelFunc
	done              chan struct{}
}

type evHost struct {
	name, subject, uuid string
	inc                 proto.Incarnation
	seq                 uint64
	running             bool
}

func startEvents(b *testing.B, c *natsCluster, hosts []*simHost, rate int) *eventSource {
	b.Helper()
	es := &eventSource{done: make(chan struct{})}
	if rate <= 0 {
		close(es.done)
		es.stop = func() {}
		return es
	}
	nc := c.connect(b, c.urls[0], nats.Name("bench-events"))
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { es.failed.Add(1) }))
	var evs []*evHost
	for i, h := range hosts {
		subj, err := proto.LifecycleSubject(h.name)
		if err != nil {
			b.Fatal(err)
		}
		inc, err := proto.NewIncarnation()
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, &evHost{name: h.name, subject: subj, inc: inc, running: true,
			uuid: fmt.Sprintf("00000000-0000-4000-8000-%012x", i)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	es.stop = cancel
	go func() {
		defer close(es.done)
		const tick = 10 * time.Millisecond
		tk := time.NewTicker(tick)
		defer tk.Stop()
		start, sent, next := time.Now(), 0, 0
		for {
			select {
			case <-ctx.Done():
				ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx2.Done():
				}
				cancel2()
				return
			case now := <-tk.C:
				want := int(now.Sub(start).Seconds() * float64(rate))
				for ; sent < want; sent++ {
					h := evs[next]
					next = (next + 1) % len(evs)
					msg, err := h.next()
					if err != nil {
						panic(err)
					}
					if _, err := js.PublishMsgAsync(msg, jetstream.WithRetryAttempts(0)); err != nil {
						es.failed.Add(1)
						continue
					}
					es.published.Add(1)
				}
			}
		}
	}()
	b.Cleanup(func() { es.stop(); <-es.done })
	return es
}

// next returns h's next event as a message.
func (h *evHost) next() (*nats.Msg, error) {
	h.seq++
	now := time.Now().UTC()
	e := proto.LifecycleEvent{Schema: proto.SchemaVersion, Host: h.name, Incarnation: h.inc, Seq: h.seq,
		OccurredAt: now, ObservedAt: now}
	switch {
	case h.seq == 1:
		e.Transition, e.Reason = proto.TransitionInventory, "full-listing"
		e.InventoryPart, e.InventoryParts = 1, 1
		e.Domains = []proto.InventoryDomain{{UUID: h.uuid, Name: "instance-" + h.uuid[24:], State: "running"}}
	case h.running:
		h.running = false
		e.Transition, e.Reason, e.State = proto.TransitionStopped, "off-at-window-end", "shutoff"
		e.LibvirtEvent, e.LibvirtDetail = "STOPPED", "DESTROYED"
	default:
		h.running = true
		e.Transition, e.Reason, e.State = proto.TransitionStarted, "running", "running"
		e.LibvirtEvent, e.LibvirtDetail = "STARTED", "BOOTED"
	}
	if e.Transition != proto.TransitionInventory {
		e.DomainUUID, e.DomainName = h.uuid, "instance-"+h.uuid[24:]
	}
	data, err := e.Encode()
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: h.subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, proto.MsgID(h.name, h.inc, h.seq))
	return msg, nil
}

// cpuMeter measures processes' CPU time (user+system, /proc/<pid>/stat)
// over an interval.
type cpuMeter struct {
	pids  []int
	start []time.Duration
	t0    time.Time
}

func newCPUMeter(b *testing.B, pids ...int) *cpuMeter {
	m := &cpuMeter{pids: pids, t0: time.Now()}
	for _, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			b.Fatal(err)
		}
		m.start = append(m.start, c)
	}
	return m
}

// cores returns the CPU used since the meter started, summed over its
// processes, in cores (CPU seconds per second).
func (m *cpuMeter) cores(b *testing.B) float64 {
	var used time.Duration
	for i, p := range m.pids {
		c, err := procCPU(p)
		if err != nil {
			b.Fatal(err)
		}
		used += c - m.start[i]
	}
	return used.Seconds() / time.Since(m.t0).Seconds()
}

// memSum returns the summed memory of pids.
func memSum(b *testing.B, pids ...int) mem {
	var m mem
	for _, p := range pids {
		x, err := procMem(p)
		if err != nil {
			b.Fatal(err)
		}
		m.add(x)
	}
	return m
}
