// Package integration runs the whole agent against real components: the
// libvirt test driver (in-process, test:///default, shared by every
// connection of the process) and an embedded nats-server with JetStream.
package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// testWindow is short so the suite stays fast; the logic does not depend on
// the window's length (the lifecycle tests cover 15 s).
const testWindow = 400 * time.Millisecond

var uuidCounter atomic.Uint64

// newDomain defines and starts a test-driver domain with a unique name.
func newDomain(t *testing.T, wl *libvirtx.Conn, prefix string) (uuid, name string) {
	t.Helper()
	n := uuidCounter.Add(1)
	name = fmt.Sprintf("%s-%d", prefix, n)
	uuid = fmt.Sprintf("5e1d7c3a-%04x-4000-8000-%012d", os.Getpid()&0xffff, n)
	ctx := context.Background()
	if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(name, uuid)); err != nil {
		t.Fatalf("define %s: %v", name, err)
	}
	if err := wl.Start(ctx, uuid); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	waitDispatched(t, wl, uuid, "STARTED")
	t.Cleanup(func() {
		_ = wl.Destroy(context.Background(), uuid)
		_ = wl.Undefine(context.Background(), uuid)
	})
	return uuid, name
}

// waitDispatched waits until wl's own event callback received the domain's
// event (libvirt name, e.g. "STARTED"): the in-process test driver queues
// events and dispatches them to the callbacks registered when its queue is
// flushed, so an agent started right after a define/start could otherwise
// receive them as if they had just happened (seen: a domain defined, started
// and destroyed before the agent started was reported defined(event),
// started(event), then stopped). Nothing else reads wl's events.
func waitDispatched(t *testing.T, wl *libvirtx.Conn, uuid, event string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-wl.Events():
			if ev.UUID == uuid && ev.Event == event {
				return
			}
		case <-deadline:
			t.Fatalf("the test driver never dispatched %s of %s", event, uuid)
		}
	}
}

// flapDomain suspends and resumes the domain n times (2n events).
func flapDomain(t *testing.T, wl *libvirtx.Conn, uuid string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if err := wl.Suspend(ctx, uuid); err != nil {
			t.Fatal(err)
		}
		if err := wl.Resume(ctx, uuid); err != nil {
			t.Fatal(err)
		}
	}
}

func workloadConn(t *testing.T) *libvirtx.Conn {
	t.Helper()
	wl, err := libvirtx.Dial(context.Background(), libvirtx.DefaultConfig("test:///default"), quietLog())
	if err != nil {
		t.Fatalf("workload libvirt: %v", err)
	}
	t.Cleanup(func() { wl.Close() })
	return wl
}

func quietLog() *slog.Logger {
	if os.Getenv("HVGUARD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func agentConfig(t *testing.T, host, natsURL, stateDir string) agent.Config {
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.Host = host
	cfg.StateDir = stateDir
	cfg.Fence.RuntimeDir = t.TempDir() // never the machine's /run/hvguard
	cfg.Status.Socket = ""             // nor its status socket (the status tests set one)
	cfg.Libvirt.URI = "test:///default"
	cfg.Lifecycle.Window = agent.Duration(testWindow)
	cfg.Lifecycle.RecheckInterval = agent.Duration(100 * time.Millisecond)
	cfg.NATS.URLs = []string{natsURL}
	cfg.NATS.ReadyTimeout = agent.Duration(2 * time.Second)
	cfg.Metrics.Listen = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startAgent runs agent.Run until the test ends and waits until it is
// ready and its event loop has applied the first domain listing: READY may
// come before that listing, and a test acting on a domain in between races
// it (the agent learns the domain from the listing or from the events,
// whichever comes first, and reports differently).
func startAgent(t *testing.T, cfg agent.Config, opts agent.Options) (stop func() error) {
	t.Helper()
	return startAgentLog(t, cfg, opts, quietLog())
}

// startAgentLog is startAgent with the agent's logger.
func startAgentLog(t *testing.T, cfg agent.Config, opts agent.Options, log *slog.Logger) (stop func() error) {
	t.Helper()
	ready := make(chan struct{})
	opts.Ready = ready
	listed := firstListing(&opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, log, opts) }()
	for _, w := range []struct {
		what string
		ch   <-chan struct{}
	}{{"ready", ready}, {"done with its first domain listing", listed}} {
		select {
		case <-w.ch:
		case err := <-done:
			cancel()
			t.Fatalf("agent exited before %s: %v", w.what, err)
		case <-time.After(20 * time.Second):
			cancel()
			t.Fatalf("agent not %s after 20s", w.what)
		}
	}
	var stopped atomic.Bool
	stop = func() error {
		if !stopped.CompareAndSwap(false, true) {
			return nil
		}
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("agent did not stop within 30s")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// firstListing chains opts.OnResync with a channel closed once the event
// loop has applied its first domain listing.
func firstListing(opts *agent.Options) <-chan struct{} {
	listed := make(chan struct{})
	var once sync.Once
	next := opts.OnResync
	opts.OnResync = func(domains int) {
		if next != nil {
			next(domains)
		}
		once.Do(func() { close(listed) })
	}
	return listed
}

func natsConn(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// byDomain groups the received events of one domain: "transition(reason)".
func byDomain(evs []proto.LifecycleEvent, uuid string) []string {
	var out []string
	for _, e := range evs {
		if e.DomainUUID == uuid {
			out = append(out, string(e.Transition)+"("+e.Reason+")")
		}
	}
	return out
}

func count(evs []string, prefix string) int {
	n := 0
	for _, e := range evs {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// waitFor polls until the host's stream holds a message satisfying ok.
func waitFor(t *testing.T, nc *nats.Conn, host string, ok func([]proto.LifecycleEvent) bool) []proto.LifecycleEvent {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := deliverytest.Collect(t, nc, host, 0, 5*time.Second)
		if ok(c.Events) {
			return c.Events
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met; stream holds %d events: %v", len(c.Events), summarize(c.Events))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func summarize(evs []proto.LifecycleEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%d:%s:%s(%s)", e.Seq, e.DomainName, e.Transition, e.Reason)
	}
	return out
}

// checkContiguous fails unless seqs are exactly 1..n in order: a hole means
// an event was lost, a repeat means it was delivered twice.
func checkContiguous(t *testing.T, evs []proto.LifecycleEvent) {
	t.Helper()
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d, want %d (lost or duplicated events): %v", i, e.Seq, i+1, summarize(evs))
		}
	}
}

// TestRebootsAreNotStops: the agent end to end — libvirt events through the
// debouncer, the outbox and JetStream to a consumer. A hard reboot, a soft
// reboot and a reboot whose start events arrive after the window are
// reported as reboots; a real stop is reported once; suspend/resume pass.
func TestRebootsAreNotStops(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	hard, _ := newDomain(t, wl, "hard")
	soft, _ := newDomain(t, wl, "soft")
	late, lateName := newDomain(t, wl, "late")
	real, _ := newDomain(t, wl, "real")
	host := "it-node1.example.org"
	cfg := agentConfig(t, host, ns.ClientURL(), t.TempDir())
	lag := testWindow + 600*time.Millisecond
	startAgent(t, cfg, agent.Options{WrapHypervisor: func(hv agent.Hypervisor) agent.Hypervisor {
		return agent.DelayEvents(hv, func(ev lifecycle.Event) time.Duration {
			if ev.Name == lateName && (ev.Kind == lifecycle.KindStarted || ev.Kind == lifecycle.KindResumed) {
				return lag
			}
			return 0
		})
	}})
	nc := natsConn(t, ns.ClientURL())
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(wl.Destroy(ctx, hard))
	must(wl.Start(ctx, hard))
	must(wl.Shutdown(ctx, soft))
	time.Sleep(testWindow / 2)
	must(wl.Start(ctx, soft))
	must(wl.Destroy(ctx, late))
	time.Sleep(testWindow / 4)
	must(wl.Start(ctx, late)) // its STARTED reaches the agent after the window
	must(wl.Suspend(ctx, real))
	must(wl.Resume(ctx, real))
	must(wl.Destroy(ctx, real))

	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return count(byDomain(evs, real), "stopped") >= 1 && count(byDomain(evs, late), "rebooted") >= 1
	})
	// Let late events and any wrong second report arrive before judging.
	time.Sleep(lag + testWindow)
	evs = deliverytest.Collect(t, nc, host, len(evs), 5*time.Second).Events
	checkContiguous(t, evs)

	for _, c := range []struct {
		uuid, want string
	}{
		{hard, "rebooted(started-within-window)"},
		{soft, "rebooted(started-within-window)"},
		{late, "rebooted(running-at-window-end)"},
	} {
		got := byDomain(evs, c.uuid)
		if count(got, "stopped") != 0 {
			t.Errorf("domain %s: reboot reported as a stop: %v", c.uuid, got)
		}
		if !slices.Contains(got, c.want) {
			t.Errorf("domain %s: got %v, want it to contain %s", c.uuid, got, c.want)
		}
	}
	got := byDomain(evs, real)
	if count(got, "stopped") != 1 || !slices.Contains(got, "stopped(off-at-window-end)") {
		t.Errorf("real stop: got %v, want exactly one stopped(off-at-window-end)", got)
	}
	if i, j := slices.Index(got, "suspended(event)"), slices.Index(got, "resumed(event)"); i < 0 || j < i {
		t.Errorf("suspend/resume: got %v, want suspended then resumed", got)
	}
	for _, e := range evs {
		if e.Host != host || e.Schema != proto.SchemaVersion || e.ObservedAt.Before(e.OccurredAt) {
			t.Errorf("malformed event %+v", e)
		}
		// Classification off (the default): the debouncer's reports only.
		if e.Classification != "" || e.ClassificationReason != "" {
			t.Errorf("classified event with classification disabled: %+v", e)
		}
	}
}

// TestNATSOutageLosesNothing: the NATS server stops mid-stream and comes
// back on the same port with the same store; every event reaches the
// consumer exactly once, in order.
func TestNATSOutageLosesNothing(t *testing.T) {
	store := t.TempDir()
	port := deliverytest.FreePort(t)
	ns := deliverytest.StartJetStream(t, store, port)
	url := ns.ClientURL()
	wl := workloadConn(t)
	uuid, _ := newDomain(t, wl, "flap")
	host := "it-node2"
	cfg := agentConfig(t, host, url, t.TempDir())
	startAgent(t, cfg, agent.Options{})
	flap := func(n int) { flapDomain(t, wl, uuid, n) }
	flap(50) // 100 events while NATS is up
	time.Sleep(200 * time.Millisecond)
	deliverytest.StopServer(ns)
	flap(100) // 200 events while NATS is down: they wait in the outbox
	time.Sleep(500 * time.Millisecond)
	ns = deliverytest.StartJetStream(t, store, port)
	flap(50) // 100 more after it is back

	nc := natsConn(t, ns.ClientURL())
	flaps := func(evs []proto.LifecycleEvent) []string {
		var out []string
		for _, e := range byDomain(evs, uuid) {
			if !strings.HasPrefix(e, "defined(") { // the agent's first resync announces it
				out = append(out, e)
			}
		}
		return out
	}
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(flaps(evs)) >= 400
	})
	checkContiguous(t, evs)
	got := flaps(evs)
	if len(got) != 400 {
		t.Fatalf("got %d events for the flapping domain, want exactly 400", len(got))
	}
	for i, e := range got {
		want := "suspended(event)"
		if i%2 == 1 {
			want = "resumed(event)"
		}
		if e != want {
			t.Fatalf("event %d of the domain is %s, want %s (order broken)", i, e, want)
		}
	}
}

// The NATS server type is referenced so the import stays when tests change.
var _ *server.Server

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func stateDir(t *testing.T) string { return filepath.Join(t.TempDir(), "state") }
