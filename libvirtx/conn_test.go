package libvirtx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"hvguard/lifecycle"
)

// emptyNode is a test-driver node definition without domains.
const emptyNode = `<node>
  <cpu>
    <nodes>1</nodes>
    <sockets>1</sockets>
    <cores>2</cores>
    <threads>1</threads>
    <active>2</active>
    <mhz>2000</mhz>
    <model>x86_64</model>
  </cpu>
  <memory>8388608</memory>
</node>
`

// privateURI returns a test-driver URI whose state is private to one
// connection (test:///default is shared by all connections in the process).
func privateURI(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "node.xml")
	if err := os.WriteFile(p, []byte(emptyNode), 0o644); err != nil {
		t.Fatal(err)
	}
	return "test://" + p
}

// countingHandler counts log records whose message contains substr.
type countingHandler struct {
	slog.Handler
	substr string
	n      *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.substr, h.n}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func dial(t testing.TB, mutate func(*Config)) *Conn {
	t.Helper()
	return dialLog(t, mutate, testLogger(t))
}

func dialLog(t testing.TB, mutate func(*Config), log *slog.Logger) *Conn {
	t.Helper()
	cfg := DefaultConfig(privateURI(t))
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := Dial(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var uuidSeq atomic.Uint64

func newUUID() string {
	return fmt.Sprintf("6a1c0e3e-0000-4000-8000-%012x", uuidSeq.Add(1))
}

func defineAndStart(t *testing.T, c *Conn, ctx context.Context) (uuid, name string) {
	t.Helper()
	uuid = newUUID()
	name = "instance-" + uuid[len(uuid)-6:]
	got, err := c.DefineXML(ctx, TestDomainXML(name, uuid))
	if err != nil {
		t.Fatalf("DefineXML: %v", err)
	}
	if got != uuid {
		t.Fatalf("DefineXML returned %q, want %q", got, uuid)
	}
	if err := c.Start(ctx, uuid); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return uuid, name
}

// expect reads the next event and checks it.
func expect(t *testing.T, c *Conn, uuid, name string, kind lifecycle.Kind, event, detail string) lifecycle.Event {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		if !ok {
			t.Fatalf("Events closed, want %s/%s", event, detail)
		}
		if ev.UUID != uuid || ev.Name != name || ev.Kind != kind || ev.Event != event || ev.Detail != detail {
			t.Fatalf("got event %+v, want %s %s %v %s/%s", ev, uuid, name, kind, event, detail)
		}
		if time.Since(ev.At) > 5*time.Second || ev.At.After(time.Now()) {
			t.Fatalf("event At %v not recent", ev.At)
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatalf("no event, want %s/%s", event, detail)
	}
	return lifecycle.Event{}
}

func expectNoEvent(t *testing.T, c *Conn) {
	t.Helper()
	select {
	case ev := <-c.Events():
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

func expectState(t *testing.T, c *Conn, uuid string, want lifecycle.State) {
	t.Helper()
	got, err := c.State(context.Background(), uuid)
	if err != nil || got != want {
		t.Fatalf("State(%s) = %v, %v; want %v", uuid, got, err, want)
	}
}

func TestDomainLifecycleEvents(t *testing.T) {
	ctx := context.Background()
	c := dial(t, nil)
	uuid, name := newUUID(), "instance-0000002a"

	if _, err := c.DefineXML(ctx, TestDomainXML(name, strings.ToUpper(uuid))); err != nil {
		t.Fatal(err)
	}
	expect(t, c, uuid, name, lifecycle.KindDefined, "DEFINED", "ADDED")
	expectState(t, c, uuid, lifecycle.StateShutoff)

	steps := []struct {
		op            func(context.Context, string) error
		kind          lifecycle.Kind
		event, detail string
		state         lifecycle.State
	}{
		{c.Start, lifecycle.KindStarted, "STARTED", "BOOTED", lifecycle.StateRunning},
		{c.Suspend, lifecycle.KindSuspended, "SUSPENDED", "PAUSED", lifecycle.StatePaused},
		{c.Resume, lifecycle.KindResumed, "RESUMED", "UNPAUSED", lifecycle.StateRunning},
		{c.Destroy, lifecycle.KindStopped, "STOPPED", "DESTROYED", lifecycle.StateShutoff},
		{c.Start, lifecycle.KindStarted, "STARTED", "BOOTED", lifecycle.StateRunning},
		{c.Shutdown, lifecycle.KindStopped, "STOPPED", "SHUTDOWN", lifecycle.StateShutoff},
		{c.Undefine, lifecycle.KindUndefined, "UNDEFINED", "REMOVED", lifecycle.StateGone},
	}
	for _, st := range steps {
		if err := st.op(ctx, uuid); err != nil {
			t.Fatalf("%s/%s: %v", st.event, st.detail, err)
		}
		expect(t, c, uuid, name, st.kind, st.event, st.detail)
		expectState(t, c, uuid, st.state)
	}
	expectNoEvent(t, c)

	// Reboot is accepted by the test driver but emits nothing (measured).
	uuid2, name2 := defineAndStart(t, c, ctx)
	expect(t, c, uuid2, name2, lifecycle.KindDefined, "DEFINED", "ADDED")
	expect(t, c, uuid2, name2, lifecycle.KindStarted, "STARTED", "BOOTED")
	if err := c.Reboot(ctx, uuid2); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	expectNoEvent(t, c)
	expectState(t, c, uuid2, lifecycle.StateRunning)

	st := c.Status()
	if !st.Connected || st.EventsIn != 10 || st.Overflows != 0 || st.Reconnects != 0 {
		t.Errorf("Status = %+v, want connected, 10 events in, no overflow/reconnect", st)
	}
}

func TestListDomains(t *testing.T) {
	ctx := context.Background()
	c := dial(t, nil)
	if got, err := c.ListDomains(ctx); err != nil || len(got) != 0 {
		t.Fatalf("ListDomains on empty node = %v, %v", got, err)
	}
	running, rname := defineAndStart(t, c, ctx)
	paused, pname := defineAndStart(t, c, ctx)
	if err := c.Suspend(ctx, paused); err != nil {
		t.Fatal(err)
	}
	off := newUUID()
	if _, err := c.DefineXML(ctx, TestDomainXML("off", off)); err != nil {
		t.Fatal(err)
	}
	got, err := c.ListDomains(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []lifecycle.DomainSnapshot{
		{UUID: running, Name: rname, State: lifecycle.StateRunning},
		{UUID: paused, Name: pname, State: lifecycle.StatePaused},
		{UUID: off, Name: "off", State: lifecycle.StateShutoff},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ListDomains = %v\nwant %v", got, want)
	}
}

func TestUnknownDomain(t *testing.T) {
	ctx := context.Background()
	c := dial(t, nil)
	unknown := newUUID()
	expectState(t, c, unknown, lifecycle.StateGone)
	for name, op := range map[string]func(context.Context, string) error{
		"Suspend": c.Suspend, "Resume": c.Resume, "Destroy": c.Destroy, "Start": c.Start,
		"Shutdown": c.Shutdown, "Reboot": c.Reboot, "Undefine": c.Undefine,
	} {
		if err := op(ctx, unknown); !errors.Is(err, ErrNoDomain) || !strings.Contains(err.Error(), unknown) {
			t.Errorf("%s(unknown) = %v, want ErrNoDomain naming the UUID", name, err)
		}
	}
	if _, err := c.Metadata(ctx, unknown, "urn:x"); !errors.Is(err, ErrNoDomain) {
		t.Errorf("Metadata(unknown) = %v, want ErrNoDomain", err)
	}
	if _, err := c.State(ctx, "not-a-uuid"); err == nil {
		t.Errorf("State(not-a-uuid) = nil error")
	}

	// Destroying a domain that is not running is refused by libvirt.
	off := newUUID()
	if _, err := c.DefineXML(ctx, TestDomainXML("off", off)); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(ctx, off); !errors.Is(err, ErrInvalidState) {
		t.Errorf("Destroy(shut off) = %v, want ErrInvalidState", err)
	}
	expectState(t, c, off, lifecycle.StateShutoff) // still defined
}

func TestMetadataRoundTrip(t *testing.T) {
	ctx := context.Background()
	c := dial(t, nil)
	const novaNS = "http://openstack.org/xmlns/libvirt/nova/1.1"
	for _, start := range []bool{false, true} {
		t.Run(fmt.Sprintf("running=%v", start), func(t *testing.T) {
			uuid := newUUID()
			if _, err := c.DefineXML(ctx, TestDomainXML("md-"+uuid[len(uuid)-4:], uuid)); err != nil {
				t.Fatal(err)
			}
			if start {
				if err := c.Start(ctx, uuid); err != nil {
					t.Fatal(err)
				}
			}
			got, err := c.Metadata(ctx, uuid, novaNS)
			if !errors.Is(err, ErrNoMetadata) || got != "" {
				t.Fatalf("Metadata before set = %q, %v; want \"\", ErrNoMetadata", got, err)
			}
			in := `<instance><owner><project uuid="p1">demo</project></owner><hvguard fenced="false"/></instance>`
			if err := c.SetMetadata(ctx, uuid, novaNS, "nova", in); err != nil {
				t.Fatalf("SetMetadata: %v", err)
			}
			got, err = c.Metadata(ctx, uuid, novaNS)
			if err != nil {
				t.Fatalf("Metadata: %v", err)
			}
			// libvirt returns the element without the namespace prefix.
			for _, frag := range []string{"<instance>", `<project uuid="p1">demo</project>`, `<hvguard fenced="false"/>`} {
				if !strings.Contains(got, frag) {
					t.Errorf("Metadata = %q, want it to contain %q", got, frag)
				}
			}
			if _, err := c.Metadata(ctx, uuid, "urn:other"); !errors.Is(err, ErrNoMetadata) {
				t.Errorf("Metadata(other ns) = %v, want ErrNoMetadata", err)
			}
		})
	}
}

func TestOverflowRequestsResync(t *testing.T) {
	ctx := context.Background()
	var warns atomic.Int64
	log := slog.New(countingHandler{testLogger(t).Handler(), "buffer full", &warns})
	c := dialLog(t, func(cfg *Config) { cfg.EventBuffer = 2 }, log)
	uuid, _ := defineAndStart(t, c, ctx) // 2 events: buffer now full
	const cycles = 50
	for i := 0; i < cycles; i++ {
		if err := c.Suspend(ctx, uuid); err != nil {
			t.Fatal(err)
		}
		if err := c.Resume(ctx, uuid); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(2 + 2*cycles)
	waitEventsIn(t, c, want)
	st := c.Status()
	if st.EventsIn != want || st.Overflows != want-2 {
		t.Fatalf("Status = %+v, want EventsIn %d, Overflows %d", st, want, want-2)
	}
	select {
	case <-c.ResyncNeeded():
	default:
		t.Fatal("ResyncNeeded not signalled after overflow")
	}
	if n := warns.Load(); n != 1 {
		t.Errorf("overflow warnings logged: %d, want 1 per burst", n)
	}
	// The two buffered events are the first two; later ones were counted, not delivered.
	if ev := <-c.Events(); ev.Event != "DEFINED" {
		t.Fatalf("first event %+v", ev)
	}
	if ev := <-c.Events(); ev.Event != "STARTED" {
		t.Fatalf("second event %+v", ev)
	}
	// Delivery resumes once drained.
	if err := c.Suspend(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	expect(t, c, uuid, c.mustName(t, uuid), lifecycle.KindSuspended, "SUSPENDED", "PAUSED")
	// The consumer's answer to ResyncNeeded:
	snaps, err := c.ListDomains(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].State != lifecycle.StatePaused {
		t.Fatalf("ListDomains = %v, %v", snaps, err)
	}
}

func (c *Conn) mustName(t *testing.T, uuid string) string {
	t.Helper()
	snaps, err := c.ListDomains(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		if s.UUID == uuid {
			return s.Name
		}
	}
	t.Fatalf("no domain %s", uuid)
	return ""
}

func TestCloseIdempotentAndStopsDelivery(t *testing.T) {
	ctx := context.Background()
	before := runtime.NumGoroutine()
	c := dial(t, nil)
	uuid, _ := defineAndStart(t, c, ctx)
	waitEventsIn(t, c, 2)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Buffered events are still readable, then the channel is closed.
	n := 0
	for range c.Events() {
		n++
	}
	if n != 2 {
		t.Errorf("drained %d events after Close, want 2", n)
	}
	if err := c.Suspend(ctx, uuid); !errors.Is(err, ErrNotConnected) {
		t.Errorf("Suspend after Close = %v, want ErrNotConnected", err)
	}
	if _, err := c.ListDomains(ctx); !errors.Is(err, ErrNotConnected) {
		t.Errorf("ListDomains after Close = %v, want ErrNotConnected", err)
	}
	if st := c.Status(); st.Connected {
		t.Errorf("Status after Close = %+v, want not connected", st)
	}
	// No goroutine left behind (the process-wide event loop predates 'before'
	// because other tests ran first; allow it anyway).
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before+1 {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before Dial, %d after Close\n%s", before, g, buf[:runtime.Stack(buf, true)])
	}
}

func TestCallsHonourContext(t *testing.T) {
	c := dial(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.State(ctx, newUUID()); !errors.Is(err, context.Canceled) {
		t.Errorf("State with cancelled ctx = %v, want context.Canceled", err)
	}
}

func TestDialErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Dial(ctx, Config{URI: "test:///default"}, nil); err == nil || !strings.Contains(err.Error(), "CallTimeout") {
		t.Errorf("Dial with invalid config = %v", err)
	}
	cfg := DefaultConfig("test://" + filepath.Join(t.TempDir(), "missing.xml"))
	if _, err := Dial(ctx, cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), "missing.xml") {
		t.Errorf("Dial missing node file = %v, want an error naming it", err)
	}
}

func TestEventLoopHeartbeat(t *testing.T) {
	c := dial(t, nil)
	first := c.Status().EventLoopTick
	if time.Since(first) > 2*eventLoopHeartbeat {
		t.Fatalf("EventLoopTick %v is stale", first)
	}
	deadline := time.Now().Add(3 * eventLoopHeartbeat)
	for !c.Status().EventLoopTick.After(first) {
		if time.Now().After(deadline) {
			t.Fatalf("EventLoopTick did not advance from %v", first)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConnLossClassification checks isConnLoss on the errors measured on
// a lost connection and on ordinary domain errors.
func TestConnLossClassification(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"client socket is closed (measured after daemon death)", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Domain: libvirt.FROM_RPC, Message: "internal error: client socket is closed"}, true},
		{"connect refused while daemon down (measured)", libvirt.Error{Code: libvirt.ERR_NO_CONNECT, Domain: libvirt.FROM_RPC, Message: "Failed to connect socket"}, true},
		{"invalid connection", libvirt.Error{Code: libvirt.ERR_INVALID_CONN, Domain: libvirt.FROM_NONE}, true},
		{"rpc", libvirt.Error{Code: libvirt.ERR_RPC, Domain: libvirt.FROM_REMOTE}, true},
		{"system error in rpc", libvirt.Error{Code: libvirt.ERR_SYSTEM_ERROR, Domain: libvirt.FROM_RPC, Message: "Cannot write data: Broken pipe"}, true},
		{"system error elsewhere", libvirt.Error{Code: libvirt.ERR_SYSTEM_ERROR, Domain: libvirt.FROM_QEMU, Message: "cannot open file"}, false},
		{"wrapped", fmt.Errorf("x: %w", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Domain: libvirt.FROM_RPC, Message: "client socket is closed"}), true},
		{"no domain", libvirt.Error{Code: libvirt.ERR_NO_DOMAIN, Domain: libvirt.FROM_TEST}, false},
		{"operation invalid", libvirt.Error{Code: libvirt.ERR_OPERATION_INVALID, Domain: libvirt.FROM_QEMU, Message: "domain is not running"}, false},
		{"internal error in qemu", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Domain: libvirt.FROM_QEMU, Message: "qemu unexpectedly closed the monitor"}, false},
		{"plain", errors.New("plain"), false},
		{"nil", nil, false},
		{"deadline", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		if got := isConnLoss(tt.err); got != tt.want {
			t.Errorf("%s: isConnLoss(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func waitEventsIn(t *testing.T, c *Conn, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.Status().EventsIn < n {
		if time.Now().After(deadline) {
			t.Fatalf("EventsIn = %d after 5s, want %d", c.Status().EventsIn, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
