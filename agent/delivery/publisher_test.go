package delivery

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/proto"
)

// testTimeout bounds waits for delivery in tests: generous, since the
// 2-core machine is shared.
const testTimeout = 60 * time.Second

func connectTest(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := Connect(s.ClientURL(), "hvguard-test", testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func ensureStream(t testing.TB, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureStream(ctx, js, true); err != nil {
		t.Fatal(err)
	}
}

// runPublisher runs a publisher until the test ends.
func runPublisher(t testing.TB, nc *nats.Conn, o *Outbox, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(nc, o, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed) {
			t.Errorf("Run = %v", err)
		}
	})
	return p
}

func flush(t testing.TB, p *Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func checkInOrder(t testing.TB, c deliverytest.Collected, first, last uint64) {
	t.Helper()
	seqs := c.Seqs()
	if uint64(len(seqs)) != last-first+1 {
		t.Fatalf("got %d events, want %d (seqs %d..%d)", len(seqs), last-first+1, first, last)
	}
	for i, s := range seqs {
		if s != first+uint64(i) {
			t.Fatalf("event %d has seq %d, want %d (order or loss)", i, s, first+uint64(i))
		}
	}
}

func TestPublishEndToEnd(t *testing.T) {
	s := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc := connectTest(t, s)
	ensureStream(t, nc)
	o := openTest(t, t.TempDir(), OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p := runPublisher(t, nc, o, PublisherConfig{})

	const n = 2000
	appendN(t, o, 0, n)
	flush(t, p)
	c := deliverytest.Collect(t, nc, testHost, n, testTimeout)
	checkInOrder(t, c, 1, n)
	if c.Duplicates != 0 {
		t.Errorf("%d duplicates in the stream", c.Duplicates)
	}
	if !reflect.DeepEqual(c.Events[41], *withSeq(testEvent(41), o.Stats().Incarnation, 42, c.Events[41].ObservedAt)) {
		t.Errorf("event 42 = %+v", c.Events[41])
	}
	st := p.Stats()
	if st.Published != n || st.Acked != n || st.Depth != 0 || st.Appended != n {
		t.Errorf("stats = %+v", st)
	}
}

func withSeq(ev *proto.LifecycleEvent, inc proto.Incarnation, seq uint64, observed time.Time) *proto.LifecycleEvent {
	ev.Schema, ev.Host, ev.Incarnation, ev.Seq, ev.ObservedAt = 1, testHost, inc, seq, observed
	return ev
}

func TestPublishSurvivesServerRestart(t *testing.T) {
	storeDir, port := t.TempDir(), deliverytest.FreePort(t)
	s := deliverytest.StartJetStream(t, storeDir, port)
	nc := connectTest(t, s)
	ensureStream(t, nc)
	o := openTest(t, t.TempDir(), OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p := runPublisher(t, nc, o, PublisherConfig{})

	// Appends run flat out, so the server stops with publishes in flight.
	const n, stopAt, restartAt = 20000, 5000, 15000
	var wg sync.WaitGroup
	stopped, restart := make(chan struct{}), make(chan struct{})
	wg.Go(func() {
		for i := 0; i < n; i++ {
			switch i {
			case stopAt:
				close(stopped)
			case restartAt:
				<-restart
			}
			if err := o.Append(testEvent(i)); err != nil {
				t.Errorf("Append %d: %v", i, err)
				return
			}
			if i > stopAt && i < restartAt && i%1000 == 0 {
				time.Sleep(20 * time.Millisecond) // spread appends over the outage
			}
		}
	})
	<-stopped
	deliverytest.StopServer(s)
	time.Sleep(500 * time.Millisecond)
	if st := p.Stats(); st.Depth == 0 {
		t.Logf("outbox empty during the outage: %+v", st)
	}
	close(restart)
	s = deliverytest.StartJetStream(t, storeDir, port)
	wg.Wait()
	flush(t, p)

	c := deliverytest.Collect(t, nc, testHost, n, testTimeout)
	checkInOrder(t, c, 1, n)
	if c.Duplicates != 0 || c.StreamMsgs != n {
		t.Errorf("stream holds %d messages with %d duplicates; JetStream dedup should keep it at %d", c.StreamMsgs, c.Duplicates, n)
	}
	st := p.Stats()
	t.Logf("stats after restart: %+v", st)
	if st.Acked != n || st.Depth != 0 || st.LastError == "" {
		t.Errorf("stats = %+v", st)
	}
}

func TestPublishAfterOutboxReopen(t *testing.T) {
	s := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc := connectTest(t, s)
	ensureStream(t, nc)
	dir := t.TempDir()

	// First agent run: NATS "unreachable" (no publisher), then killed.
	o := openTest(t, dir, OutboxConfig{})
	appendN(t, o, 0, 100)
	o.crash()

	// Second run: the unacked events go out first, and seq continues.
	o = openTest(t, dir, OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	if st := o.Stats(); st.Depth != 100 {
		t.Fatalf("replayed depth = %d, want 100", st.Depth)
	}
	p := runPublisher(t, nc, o, PublisherConfig{})
	if got := appendN(t, o, 100, 50); got[0] != 101 {
		t.Fatalf("seq after restart = %d, want 101", got[0])
	}
	flush(t, p)
	checkInOrder(t, deliverytest.Collect(t, nc, testHost, 150, testTimeout), 1, 150)
}

func TestPublishResendIsDeduplicated(t *testing.T) {
	// A restart after publishing but before the ack cursor was persisted
	// re-sends; the stream must not hold the events twice. The events are
	// signed with the host key (PublisherConfig.Signer): the re-sent ones
	// carry the same signature, and every stored event verifies against
	// the host's key on its subject.
	signer, ring := testSigner()
	s := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc := connectTest(t, s)
	ensureStream(t, nc)
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	p, err := NewPublisher(nc, o, PublisherConfig{Signer: signer}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	appendN(t, o, 0, 20)
	flush(t, p)
	cancel()
	<-done
	o.mu.Lock()
	o.acked = 5 // as if the cursor had been persisted long ago
	o.mu.Unlock()
	o.crash()

	o = openTest(t, dir, OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p = runPublisher(t, nc, o, PublisherConfig{Signer: signer})
	flush(t, p)
	c := deliverytest.Collect(t, nc, testHost, 20, testTimeout)
	checkInOrder(t, c, 1, 20)
	if c.StreamMsgs != 20 {
		t.Errorf("stream holds %d messages, want 20", c.StreamMsgs)
	}
	if st := p.Stats(); st.DupAcks == 0 {
		t.Errorf("no duplicate acks after re-send: %+v", st)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel = context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	str, err := js.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 20; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if err := ring.VerifyEvent(testHost, m.Subject, m.Data, m.Header.Get(proto.EventSignerHeader), m.Header.Get(proto.EventSigHeader)); err != nil {
			t.Errorf("stream seq %d: %v (headers %v)", seq, err, m.Header)
		}
	}
}

// testSigner returns a host key for testHost and a keyring requiring it.
func testSigner() (fencing.Signer, *fencing.Keyring) {
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	pub := fencing.PublicKey{ID: "Ktest", Key: priv.Public().(ed25519.PublicKey)}
	return fencing.Signer{ID: pub.ID, Key: priv}, &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{testHost: {pub}}}
}

func TestFlushTimeoutReportsRemaining(t *testing.T) {
	o := openTest(t, t.TempDir(), OutboxConfig{})
	defer o.Close()
	appendN(t, o, 0, 7)
	// A publisher whose connection never reaches a server.
	nc, err := nats.Connect("nats://127.0.0.1:1", ConnOptions(testLogger(t))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p := runPublisher(t, nc, o, PublisherConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = p.Flush(ctx)
	if err == nil || !strings.Contains(err.Error(), "7 events not yet acked") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush = %v", err)
	}
}

func TestEnsureStream(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	_, err := EnsureStream(ctx, js, false)
	if err == nil || !strings.Contains(err.Error(), "nats stream add HVGUARD_EVENTS --subjects 'hvguard.v1.*.lifecycle,hvguard.v1.*.reconcile'") {
		t.Fatalf("EnsureStream(no stream, create=false) = %v", err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: proto.StreamName, Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, create := range []bool{false, true} {
		_, err = EnsureStream(ctx, js, create)
		if err == nil || !strings.Contains(err.Error(), "do not capture") ||
			!strings.Contains(err.Error(), "nats stream edit HVGUARD_EVENTS --subjects 'other.>,hvguard.v1.*.lifecycle,hvguard.v1.*.reconcile'") {
			t.Fatalf("EnsureStream(wrong subjects, create=%v) = %v", create, err)
		}
	}
	// A stream provisioned before reconcile events existed (lifecycle
	// only) is still usable (an upgrade must not stop lifecycle delivery),
	// with or without create, and is not changed: the missing subject is
	// reported as drift with its risk and the command that adds it.
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: proto.StreamName, Subjects: []string{proto.LifecycleWildcard}}); err != nil {
		t.Fatal(err)
	}
	for _, create := range []bool{false, true} {
		drift, err := EnsureStream(ctx, js, create)
		if err != nil {
			t.Fatalf("EnsureStream(lifecycle only, create=%v) = %v", create, err)
		}
		i := slices.IndexFunc(drift, func(d StreamDrift) bool { return d.Setting == "subjects" })
		if i < 0 || !strings.Contains(drift[i].Risk, proto.ReconcileWildcard) ||
			drift[i].Fix != "nats stream edit HVGUARD_EVENTS --subjects 'hvguard.v1.*.lifecycle,hvguard.v1.*.reconcile'" {
			t.Fatalf("EnsureStream(lifecycle only, create=%v): drift %+v", create, drift)
		}
	}
	info, err := js.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := info.CachedInfo().Config; !slices.Equal(cfg.Subjects, []string{proto.LifecycleWildcard}) {
		t.Fatalf("subjects after EnsureStream = %v, want the operator's unchanged", cfg.Subjects)
	}
	// Missing: create makes it with the recommended config, no drift.
	deliverytest.PinStreamsDir(ctx, t, js)
	if err := js.DeleteStream(ctx, proto.StreamName); err != nil {
		t.Fatal(err)
	}
	if drift, err := EnsureStream(ctx, js, true); err != nil || len(drift) != 0 {
		t.Fatalf("EnsureStream(create, missing) = %+v, %v", drift, err)
	}
	if drift, err := EnsureStream(ctx, js, false); err != nil || len(drift) != 0 {
		t.Fatalf("EnsureStream(after create) = %+v, %v", drift, err)
	}
	info, err = js.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.CachedInfo().Config
	if !slices.Equal(cfg.Subjects, proto.StreamSubjects()) {
		t.Fatalf("subjects after create = %v", cfg.Subjects)
	}
	if cfg.Storage != jetstream.FileStorage || cfg.Duplicates != proto.StreamDuplicatesWindow {
		t.Fatalf("stream config = %+v", cfg)
	}
}

func TestSubjectCovers(t *testing.T) {
	tests := []struct {
		pattern, want string
		ok            bool
	}{
		{"hvguard.v1.*.lifecycle", "hvguard.v1.*.lifecycle", true},
		{"hvguard.>", "hvguard.v1.*.lifecycle", true},
		{"hvguard.v1.>", "hvguard.v1.*.lifecycle", true},
		{">", "hvguard.v1.*.lifecycle", true},
		{"hvguard.*.*.lifecycle", "hvguard.v1.*.lifecycle", true},
		{"hvguard.v1.h1.lifecycle", "hvguard.v1.*.lifecycle", false},
		{"hvguard.v1.*", "hvguard.v1.*.lifecycle", false},
		{"hvguard.v1.*.lifecycle.x", "hvguard.v1.*.lifecycle", false},
		{"hvguard.v1.*.*", "hvguard.v1.>", false},
	}
	for _, tt := range tests {
		if got := subjectCovers(tt.pattern, tt.want); got != tt.ok {
			t.Errorf("subjectCovers(%q, %q) = %v, want %v", tt.pattern, tt.want, got, tt.ok)
		}
	}
}

func TestReconnectDelay(t *testing.T) {
	for a, want := range map[int]time.Duration{1: ReconnectWaitMin, 2: 2 * ReconnectWaitMin, 100: ReconnectWaitMax} {
		d := ReconnectDelay(a)
		if d < want*8/10 || d > want*12/10 {
			t.Errorf("ReconnectDelay(%d) = %s, want %s +-20%%", a, d, want)
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	s := deliverytest.StartJetStream(b, b.TempDir(), -1)
	nc := connectTest(b, s)
	ensureStream(b, nc)
	o, err := OpenOutbox(filepath.Join(b.TempDir(), "outbox"), OutboxConfig{Host: testHost, MaxEvents: 1 << 30, MaxBytes: 1 << 40}, slogDiscard())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	p, err := NewPublisher(nc, o, PublisherConfig{}, slogDiscard())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	ev := testEvent(1)
	b.ResetTimer()
	start := time.Now()
	n := 0
	for b.Loop() {
		e := *ev
		if err := o.Append(&e); err != nil {
			b.Fatal(err)
		}
		n++
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer fcancel()
	if err := p.Flush(fctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
	if st := p.Stats(); st.Acked != uint64(n) {
		b.Fatalf("acked %d of %d: %+v", st.Acked, n, st)
	}
	_ = fmt.Sprint()
}

func TestPublishWhenNATSStartsLate(t *testing.T) {
	// The agent starts while NATS is down: Connect still returns a
	// connection (RetryOnFailedConnect), events wait in the outbox, and go
	// out once the server is up.
	port := deliverytest.FreePort(t)
	nc, err := Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), "hvguard-test", testLogger(t), nil)
	if err != nil {
		t.Fatalf("Connect with NATS down: %v", err)
	}
	t.Cleanup(nc.Close)
	o := openTest(t, t.TempDir(), OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p := runPublisher(t, nc, o, PublisherConfig{CreateStream: true})
	appendN(t, o, 0, 100)
	time.Sleep(300 * time.Millisecond)
	if st := p.Stats(); st.Depth != 100 || st.LastError == "" {
		t.Fatalf("with NATS down: %+v, want depth 100 and an error", st)
	}
	deliverytest.StartJetStream(t, t.TempDir(), port)
	flush(t, p)
	checkInOrder(t, deliverytest.Collect(t, nc, testHost, 100, testTimeout), 1, 100)
}

func TestPublishWaitsForProvisionedStream(t *testing.T) {
	s := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc := connectTest(t, s)
	o := openTest(t, t.TempDir(), OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p := runPublisher(t, nc, o, PublisherConfig{CreateStream: false})
	appendN(t, o, 0, 10)
	time.Sleep(300 * time.Millisecond)
	if st := p.Stats(); st.Depth != 10 || !strings.Contains(st.LastError, "nats stream add") {
		t.Fatalf("without stream: %+v, want depth 10 and provisioning advice", st)
	}
	select {
	case <-p.StreamReady():
		t.Fatal("StreamReady closed without a stream")
	default:
	}
	ensureStream(t, nc) // the operator provisions it
	select {
	case <-p.StreamReady():
	case <-time.After(testTimeout):
		t.Fatalf("StreamReady not closed within %v of the stream's creation", testTimeout)
	}
	flush(t, p)
	checkInOrder(t, deliverytest.Collect(t, nc, testHost, 10, testTimeout), 1, 10)
}
