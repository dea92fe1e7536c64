//go:build bench

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/libvirtx"
	"hvguard/proto"
)

// testDriverURI is libvirt's in-process test driver; every connection of
// the process shares its one node.
const testDriverURI = "test:///default"

var (
	domainCounter atomic.Uint64
	hostCounter   atomic.Uint64
)

// dom is one test-driver domain defined by a benchmark.
type dom struct{ uuid, name string }

// benchLog is the agent's logger in the in-process benchmarks: the
// production format and level (JSON, info — one line per report) written to
// io.Discard, so formatting costs what it costs in production but no
// terminal or journal is in the measurement. HVGUARD_BENCH_LOG=1 shows it.
func benchLog() *slog.Logger {
	var w io.Writer = io.Discard
	if os.Getenv("HVGUARD_BENCH_LOG") != "" {
		w = os.Stderr
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// workload opens a test-driver connection for the benchmark's libvirt calls
// and drains (discards) its own copy of the events, as a second libvirt
// client on a real node would not slow libvirt down either.
func workload(b *testing.B, uri string) *libvirtx.Conn {
	b.Helper()
	wl, err := libvirtx.Dial(context.Background(), libvirtx.DefaultConfig(uri), quietLog())
	if err != nil {
		b.Fatalf("workload libvirt: %v", err)
	}
	go func() {
		for range wl.Events() {
		}
	}()
	b.Cleanup(func() { wl.Close() })
	return wl
}

// defineDomains defines and starts n test-driver domains with unique
// UUIDs; they are destroyed and undefined when the benchmark ends.
func defineDomains(b *testing.B, wl *libvirtx.Conn, prefix string, n int) []dom {
	b.Helper()
	ctx := context.Background()
	out := make([]dom, n)
	for i := range out {
		k := domainCounter.Add(1)
		d := dom{
			uuid: fmt.Sprintf("b3c4d5e6-%04x-4000-8000-%012d", os.Getpid()&0xffff, k),
			name: fmt.Sprintf("%s-%d", prefix, k),
		}
		if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(d.name, d.uuid)); err != nil {
			b.Fatalf("define %s: %v", d.name, err)
		}
		if err := wl.Start(ctx, d.uuid); err != nil {
			b.Fatalf("start %s: %v", d.name, err)
		}
		out[i] = d
	}
	b.Cleanup(func() {
		for _, d := range out {
			_ = wl.Destroy(context.Background(), d.uuid)
			_ = wl.Undefine(context.Background(), d.uuid)
		}
	})
	return out
}

// startNATS starts an embedded JetStream server (file storage in a temp
// dir) and returns it with a client connection for the consumer.
func startNATS(b *testing.B) (*server.Server, *nats.Conn) {
	b.Helper()
	ns := deliverytest.StartJetStream(b, b.TempDir(), -1)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatalf("consumer nats: %v", err)
	}
	b.Cleanup(nc.Close)
	return ns, nc
}

// agentConfig is the production default configuration except: the test
// driver, the given NATS URL and window, metrics on a free port, a temp state
// directory and a unique host name.
func agentConfig(b *testing.B, natsURL string, window time.Duration) agent.Config {
	b.Helper()
	cfg := agent.DefaultConfig()
	cfg.Host = fmt.Sprintf("bench-%d-%d", os.Getpid(), hostCounter.Add(1))
	cfg.StateDir = b.TempDir()
	cfg.Libvirt.URI = testDriverURI
	cfg.Lifecycle.Window = agent.Duration(window)
	cfg.NATS.URLs = []string{natsURL}
	cfg.Metrics.Listen = "127.0.0.1:0" // a free port: the metrics code runs as in production
	cfg.Status.Socket = ""
	if err := cfg.Validate(); err != nil {
		b.Fatalf("agent config: %v", err)
	}
	return cfg
}

// startAgent runs agent.Run (the daemon's real code path) until the
// benchmark ends and waits until it is ready.
func startAgent(b *testing.B, cfg agent.Config) {
	b.Helper()
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, benchLog(), agent.Options{Ready: ready}) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		b.Fatalf("agent exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		b.Fatal("agent not ready after 30s")
	}
	b.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("agent: %v", err)
			}
		case <-time.After(30 * time.Second):
			b.Error("agent did not stop within 30s")
		}
	})
}

// received is one message as the consumer saw it.
type received struct {
	ev   proto.LifecycleEvent // decoded lazily (see consumer)
	at   time.Time            // when the consumer's callback got it
	data []byte
	ok   bool // ev is decoded
}

// consumer is what a controller does: a JetStream ordered consumer on the
// host's lifecycle subject, stamping each message when it arrives. The
// callback only stamps and keeps the message (deduplicated by Nats-Msg-Id);
// messages are decoded when the benchmark looks at them, so that a real
// controller's work, which runs on another machine, does not take CPU from
// the agent during the measurement.
type consumer struct {
	b    *testing.B
	mu   sync.Mutex
	got  []received
	dups int
	seen map[string]bool
	cc   jetstream.ConsumeContext
}

// consume starts a consumer of host's events; it waits (bounded) for the
// agent to create the stream.
func consume(b *testing.B, nc *nats.Conn, host string) *consumer {
	b.Helper()
	subject, err := proto.LifecycleSubject(host)
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cons jetstream.Consumer
	for {
		cons, err = js.OrderedConsumer(ctx, proto.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			b.Fatalf("consumer: stream %s never appeared: %v", proto.StreamName, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := &consumer{b: b, seen: map[string]bool{}}
	c.cc, err = cons.Consume(func(m jetstream.Msg) {
		at := time.Now()
		id := m.Headers().Get(jetstream.MsgIDHeader)
		c.mu.Lock()
		if c.seen[id] {
			c.dups++
		} else {
			c.seen[id] = true
			c.got = append(c.got, received{at: at, data: m.Data()})
		}
		c.mu.Unlock()
	})
	if err != nil {
		b.Fatalf("consume: %v", err)
	}
	b.Cleanup(c.cc.Stop)
	return c
}

// decodeLocked decodes message i if it is not yet; c.mu is held.
func (c *consumer) decodeLocked(i int) {
	r := &c.got[i]
	if r.ok {
		return
	}
	ev, err := proto.DecodeLifecycle(r.data)
	if err != nil {
		c.b.Errorf("consumer: undecodable message %q: %v", r.data, err)
	}
	r.ev, r.ok, r.data = ev, true, nil
}

// len returns how many distinct messages arrived so far.
func (c *consumer) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// since returns a copy of the messages from index i on, decoded.
func (c *consumer) since(i int) []received {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := i; k < len(c.got); k++ {
		c.decodeLocked(k)
	}
	return slices.Clone(c.got[i:])
}

// waitFor waits until at least want messages from index from on satisfy
// ok (nil: any message; then nothing is decoded while waiting), or until
// nothing new arrived for idle; it returns the messages from index from
// on. It scans each message once and copies only at the end, so that
// polling does not compete with the agent for the CPU.
func (c *consumer) waitFor(from, want int, ok func(received) bool, idle time.Duration) []received {
	n, scanned := 0, from
	last, lastChange := -1, time.Now()
	for {
		c.mu.Lock()
		for ; scanned < len(c.got); scanned++ {
			if ok == nil {
				n++
				continue
			}
			c.decodeLocked(scanned)
			if ok(c.got[scanned]) {
				n++
			}
		}
		total := len(c.got)
		c.mu.Unlock()
		if n >= want {
			return c.since(from)
		}
		if total != last {
			last, lastChange = total, time.Now()
		} else if time.Since(lastChange) > idle {
			return c.since(from)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits until no message has arrived for quiet (the pipeline is
// idle), bounded by max.
func (c *consumer) settle(quiet, max time.Duration) {
	deadline := time.Now().Add(max)
	last, lastChange := c.len(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if n := c.len(); n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) >= quiet {
			return
		}
	}
}

// pct returns the p-quantile (0..1, nearest rank) of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(p*float64(len(ds))+0.5) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// ms converts d to float milliseconds for b.ReportMetric.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// reportDist reports p50, p99 and max of ds (sorted in place) as
// <prefix>_p50_ms etc.
func reportDist(b *testing.B, prefix string, ds []time.Duration) {
	slices.Sort(ds)
	b.ReportMetric(ms(pct(ds, 0.50)), prefix+"_p50_ms")
	b.ReportMetric(ms(pct(ds, 0.99)), prefix+"_p99_ms")
	if len(ds) > 0 {
		b.ReportMetric(ms(ds[len(ds)-1]), prefix+"_max_ms")
	}
}
