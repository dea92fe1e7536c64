// Package deliverytest helps tests that need a real JetStream server and a
// view of what hvguard agents published: it starts embedded nats-servers
// and reads the hvguard event stream, deduplicating by Nats-Msg-Id the way
// the controller must.
package deliverytest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/proto"
)

// ReadyTimeout bounds how long StartJetStream waits for the server to accept
// connections (JetStream recovery of a store with many messages is slow on a
// loaded 2-core CI machine).
const ReadyTimeout = 10 * time.Second

// StartJetStream starts an embedded nats-server with JetStream storing in
// storeDir (use t.TempDir(); pass the same dir again to "restart" the
// server with its data) on port (-1: a random port; use FreePort to get a
// port you can reuse across restarts). The server is shut down when the
// test ends; shutting it down earlier is fine.
func StartJetStream(t testing.TB, storeDir string, port int) *server.Server {
	t.Helper()
	return StartWith(t, &server.Options{Port: port, JetStream: true, StoreDir: storeDir})
}

// StartWith starts an embedded nats-server with o on 127.0.0.1 (no logs,
// no signal handlers), shut down when the test ends.
func StartWith(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	o.Host, o.NoLog, o.NoSigs = "127.0.0.1", true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(ReadyTimeout) {
		s.Shutdown()
		t.Fatalf("nats-server on port %d not ready within %s", o.Port, ReadyTimeout)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// JetStream connects to s (closed when the test ends) and returns the
// connection, its JetStream context and a context bounded by ReadyTimeout
// for the test's JetStream API calls.
func JetStream(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream, context.Context) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	t.Cleanup(cancel)
	return nc, js, ctx
}

// PinStreamsDir creates a small stream (PinStream) that the test never
// touches, so the account's store always holds one stream. A test that
// deletes the account's only stream and creates one again at once races
// nats-server v2.15.2: deleting a stream starts a goroutine that removes
// the account's then-empty streams directory (stream.go, "cleanup
// directories after the stream"), and the create fails with
// "error creating store for stream" (10049; the server logs "could not
// create storage directory ... no such file or directory"). Measured:
// 4 runs in 300 of TestX50ControlBucketRestoredAfterBaselineNATS. A real
// deployment always holds other streams (events, leases), as the pinned
// store does.
func PinStreamsDir(ctx context.Context, t testing.TB, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: PinStream, Subjects: []string{"deliverytest.pin"}, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatalf("pin stream: %v", err)
	}
}

// PinStream is the stream PinStreamsDir creates.
const PinStream = "DELIVERYTEST_PIN"

// StopServer shuts s down and waits until it has released its port and
// store, so a new server can be started on them.
func StopServer(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Collected is what Collect read from the stream for one host.
type Collected struct {
	// Events are the decoded events in stream order, each Nats-Msg-Id once.
	Events []proto.LifecycleEvent
	// Duplicates counts stream messages whose Nats-Msg-Id was seen before
	// (0 when JetStream's duplicate window caught every re-send).
	Duplicates int
	// StreamMsgs is the number of stream messages read for the host.
	StreamMsgs int
}

// Seqs returns the seqs of c.Events in order.
func (c Collected) Seqs() []uint64 {
	out := make([]uint64, len(c.Events))
	for i, e := range c.Events {
		out[i] = e.Seq
	}
	return out
}

// Collect reads the host's lifecycle subject in the proto.StreamName stream
// from the beginning with an ordered consumer until it has want distinct
// events (by Nats-Msg-Id) and the stream has no more messages for the host,
// or until timeout (then it fails the test, reporting what it got). Every
// message must decode with proto.DecodeLifecycle and carry the Msg-Id
// proto.MsgID(host, incarnation, seq).
func Collect(t testing.TB, nc *nats.Conn, host string, want int, timeout time.Duration) Collected {
	t.Helper()
	subject, err := proto.LifecycleSubject(host)
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	var (
		c    Collected
		seen = map[string]bool{}
		cons jetstream.Consumer
		// lastStreamSeq is the stream sequence of the last message read.
		lastStreamSeq uint64
	)
	for ctx.Err() == nil {
		if cons == nil {
			// The stream may not exist yet, or the server may be restarting.
			// After a reset, continue after the last message read.
			cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}
			if lastStreamSeq > 0 {
				cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
				cfg.OptStartSeq = lastStreamSeq + 1
			}
			cons, err = js.OrderedConsumer(ctx, proto.StreamName, cfg)
			if err != nil {
				cons = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			cons = nil
			continue
		}
		n := 0
		for m := range batch.Messages() {
			n++
			c.StreamMsgs++
			if md, err := m.Metadata(); err == nil {
				lastStreamSeq = md.Sequence.Stream
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if seen[id] {
				c.Duplicates++
				continue
			}
			seen[id] = true
			ev, err := proto.DecodeLifecycle(m.Data())
			if err != nil {
				t.Fatalf("collect: stream message %q: %v", id, err)
			}
			if ev.Host != host || id != proto.MsgID(host, ev.Incarnation, ev.Seq) {
				t.Fatalf("collect: message with Msg-Id %q has host %q incarnation %q seq %d", id, ev.Host, ev.Incarnation, ev.Seq)
			}
			c.Events = append(c.Events, ev)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			cons = nil
			continue
		}
		if len(c.Events) >= want && n == 0 {
			return c
		}
		if n == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Fatalf("collect %s: got %d distinct events (%d stream messages), want %d within %s",
		host, len(c.Events), c.StreamMsgs, want, timeout)
	return c
}

// ReconcileEvents reads host's reconcile subject from the HVGUARD_EVENTS
// stream (retrying while the stream does not exist yet) until want events
// arrived or timeout, and returns what it read; an undecodable event fails
// the test.
func ReconcileEvents(t testing.TB, nc *nats.Conn, host string, want int, timeout time.Duration) []proto.ReconcileEvent {
	t.Helper()
	subj, err := proto.ReconcileSubject(host)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []proto.ReconcileEvent
	for ctx.Err() == nil && len(out) < want {
		cons, err := js.OrderedConsumer(ctx, proto.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
		if err != nil { // the stream may not exist yet
			time.Sleep(100 * time.Millisecond)
			continue
		}
		out = out[:0]
		for len(out) < want {
			msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				break
			}
			ev, err := proto.DecodeReconcile(msg.Data())
			if err != nil {
				t.Fatalf("undecodable reconcile event: %v: %s", err, msg.Data())
			}
			out = append(out, ev)
		}
	}
	return out
}
