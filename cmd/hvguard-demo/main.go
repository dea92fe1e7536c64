// Command hvguard-demo runs the hvguard agent on embedded defaults — the
// libvirt test driver (in-process) and an embedded NATS server with
// JetStream — while a scripted workload reboots, stops and suspends domains,
// and prints what a controller subscribed to the stream receives.
//
// It is what `make run` starts. Nothing in it is a mock: the agent, libvirt's
// test driver, the NATS server and the consumer are the real components; the
// only addition is a delay on some domains' libvirt events, standing in for
// the event-dispatch lag measured on a loaded compute node (up to 33 s).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/proto"
)

const usage = `hvguard-demo — the hvguard agent on embedded defaults, with a scripted workload.

It starts an embedded NATS server (JetStream), the agent on the libvirt test
driver (test:///default, in-process), a consumer that prints what a controller
receives, and a workload that hard- and soft-reboots, suspends and destroys
domains — including a reboot whose STARTED event libvirt delivers late, the
case Nova's delay-only rule reports as a stop.

Usage:
  hvguard-demo [flags]

Flags:
  --window DURATION   stop debounce window (default 5s for a brisk demo; the agent's default is 15s)
  --lag DURATION      delivery delay of the late domain's events (default: window + 3s)
  --verbose           also print the agent's own structured log
  -h, --help          this help
`

func main() {
	fs := flag.NewFlagSet("hvguard-demo", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	window := fs.Duration("window", 5*time.Second, "")
	lag := fs.Duration("lag", 0, "")
	verbose := fs.Bool("verbose", false, "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *lag == 0 {
		*lag = *window + 3*time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *window, *lag, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "hvguard-demo:", err)
		os.Exit(1)
	}
}

// tally counts what the controller received, to check the promises at the
// end of the demo.
type tally struct {
	mu       sync.Mutex
	byDomain map[string][]proto.LifecycleEvent
	seen     map[string]bool
	dups     int
}

func run(ctx context.Context, window, lag time.Duration, verbose bool) error {
	tmp, err := os.MkdirTemp("", "hvguard-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(tmp, "jetstream"), NoLog: true, NoSigs: true,
	})
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("embedded nats did not start")
	}

	var logOut io.Writer = io.Discard
	if verbose {
		logOut = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelInfo}))

	cfg := agent.DefaultConfig()
	cfg.Host = "demo-node1"
	cfg.StateDir = filepath.Join(tmp, "state")
	cfg.Libvirt.URI = "test:///default"
	cfg.Lifecycle.Window = agent.Duration(window)
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.Status.Socket = ""
	// Nova-aware stop classification against an OpenStack that is not
	// there (its keystone refuses connections): every real stop is
	// reported after the window as without Nova, classification unknown.
	clouds, err := absentCloud(tmp)
	if err != nil {
		return err
	}
	cfg.Classification.Enabled = true
	cfg.OpenStack.Cloud = "absent"
	cfg.OpenStack.CloudsFile = clouds
	if err := cfg.Validate(); err != nil {
		return err
	}

	say := func(format string, a ...any) {
		fmt.Printf("%s  %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, a...))
	}
	fmt.Printf("hvguard demo: NATS %s, libvirt %s, stop window %s (agent default 15s),\n", ns.ClientURL(), cfg.Libvirt.URI, window)
	fmt.Printf("              stop classification on, its OpenStack absent (Nova unreachable: stops are classified unknown)\n\n")

	// The workload's own connection to the same in-process test driver:
	// test:///default is shared by every connection of this process.
	wl, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("test:///default"), log)
	if err != nil {
		return fmt.Errorf("workload libvirt: %w", err)
	}
	defer wl.Close()

	lagged := &laggedDomains{names: map[string]bool{}, lag: lag, window: window}
	ready := make(chan struct{})
	agentCtx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	agentDone := make(chan error, 1)
	go func() {
		agentDone <- agent.Run(agentCtx, cfg, log, agent.Options{
			Ready:          ready,
			WrapHypervisor: lagged.wrap,
		})
	}()
	select {
	case <-ready:
	case err := <-agentDone:
		return fmt.Errorf("agent: %w", err)
	case <-time.After(30 * time.Second):
		return errors.New("agent not ready after 30s")
	}

	// The controller's view: every message on the stream.
	t := &tally{byDomain: map[string][]proto.LifecycleEvent{}, seen: map[string]bool{}}
	stopConsumer, err := consume(ctx, ns.ClientURL(), func(ev proto.LifecycleEvent, msgID string) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.seen[msgID] {
			t.dups++
			return
		}
		t.seen[msgID] = true
		if ev.Transition == proto.TransitionInventory {
			var doms []string
			for _, d := range ev.Domains {
				doms = append(doms, d.Name+"="+d.State)
			}
			fmt.Printf("%s  CONTROLLER <- seq=%-3d FULL REPORT (%s, part %d/%d): %s\n",
				time.Now().Format("15:04:05.0"), ev.Seq, ev.Reason, ev.InventoryPart, ev.InventoryParts, strings.Join(doms, " "))
			return
		}
		t.byDomain[ev.DomainName] = append(t.byDomain[ev.DomainName], ev)
		cl := ""
		if ev.Classification != "" {
			cl = fmt.Sprintf(" classification=%s/%s", ev.Classification, ev.ClassificationReason)
		}
		fmt.Printf("%s  CONTROLLER <- seq=%-3d %-8s %-10s reason=%s state=%s (libvirt %s/%s)%s%s\n",
			time.Now().Format("15:04:05.0"), ev.Seq, ev.DomainName, strings.ToUpper(string(ev.Transition)),
			ev.Reason, ev.State, ev.LibvirtEvent, ev.LibvirtDetail, cl, explain(ev))
	})
	if err != nil {
		return err
	}
	defer stopConsumer()

	w := workload{c: wl, say: say}
	names := []string{"web-1", "db-1", "cache-1", "batch-1"}
	uuids := map[string]string{}
	for i, n := range names {
		u := fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i+1)
		if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(n, u)); err != nil {
			return fmt.Errorf("define %s: %w", n, err)
		}
		uuids[n] = u
	}
	for _, n := range names {
		w.do(ctx, "start "+n, func(c context.Context) error { return wl.Start(c, uuids[n]) })
	}
	pause(ctx, 1*time.Second)

	fmt.Println()
	say("WORKLOAD hard reboot of web-1 (destroy, then start at once) — Nova's hard reboot")
	w.do(ctx, "destroy web-1", func(c context.Context) error { return wl.Destroy(c, uuids["web-1"]) })
	w.do(ctx, "start web-1", func(c context.Context) error { return wl.Start(c, uuids["web-1"]) })
	pause(ctx, 1*time.Second)

	say("WORKLOAD soft reboot of db-1 (guest shutdown, start 2 s later) — Nova's soft reboot")
	w.do(ctx, "shutdown db-1", func(c context.Context) error { return wl.Shutdown(c, uuids["db-1"]) })
	pause(ctx, 2*time.Second)
	w.do(ctx, "start db-1", func(c context.Context) error { return wl.Start(c, uuids["db-1"]) })
	pause(ctx, 1*time.Second)

	say("WORKLOAD reboot of cache-1 whose STARTED event libvirt delivers %s late (longer than the %s window):", lag, window)
	say("         Nova's rule (hold STOPPED, cancel on the next event) would report it STOPPED; hvguard checks the real state")
	lagged.set("cache-1")
	w.do(ctx, "destroy cache-1", func(c context.Context) error { return wl.Destroy(c, uuids["cache-1"]) })
	pause(ctx, 1*time.Second)
	w.do(ctx, "start cache-1", func(c context.Context) error { return wl.Start(c, uuids["cache-1"]) })
	pause(ctx, 1*time.Second)

	say("WORKLOAD suspend and resume batch-1")
	w.do(ctx, "suspend batch-1", func(c context.Context) error { return wl.Suspend(c, uuids["batch-1"]) })
	pause(ctx, 500*time.Millisecond)
	w.do(ctx, "resume batch-1", func(c context.Context) error { return wl.Resume(c, uuids["batch-1"]) })
	pause(ctx, 500*time.Millisecond)

	say("WORKLOAD real stop: destroy batch-1 and leave it off — reported once, after the window")
	w.do(ctx, "destroy batch-1", func(c context.Context) error { return wl.Destroy(c, uuids["batch-1"]) })

	say("waiting %s for windows and late events to play out…", window+lag)
	pause(ctx, window+lag+2*time.Second)

	stopAgent()
	if err := <-agentDone; err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	pause(ctx, 500*time.Millisecond)
	return t.verdict(uuids)
}

// absentCloud writes a clouds.yaml whose keystone is a local port nothing
// listens on (taken, then released), so every Nova query is refused.
func absentCloud(dir string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	p := filepath.Join(dir, "clouds.yaml")
	y := fmt.Sprintf("clouds:\n  absent:\n    auth:\n      auth_url: http://%s/v3\n      username: admin\n      password: demo\n      project_name: admin\n      user_domain_name: Default\n      project_domain_name: Default\n    region_name: RegionOne\n    identity_api_version: 3\n", addr)
	return p, os.WriteFile(p, []byte(y), 0o600)
}

// explain annotates the reports a newcomer should notice.
func explain(ev proto.LifecycleEvent) string {
	switch {
	case ev.Transition == proto.TransitionRebooted && ev.Reason == "running-at-window-end":
		return "\n             ↳ SUPPRESSED STOP: libvirt said STOPPED, no start event came within the window, but the domain was running when hvguard checked"
	case ev.Transition == proto.TransitionRebooted && ev.Reason != "reboot-event":
		return "\n             ↳ SUPPRESSED STOP: libvirt said STOPPED, then the domain started again within the window"
	case ev.Transition == proto.TransitionStopped && ev.Classification == proto.ClassificationUnknown:
		return "\n             ↳ REAL STOP: still off when the window ended — reported once; Nova could not be asked, so classification unknown"
	case ev.Transition == proto.TransitionStopped:
		return "\n             ↳ REAL STOP: still off when the window ended — reported once"
	}
	return ""
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type workload struct {
	c   *libvirtx.Conn
	say func(string, ...any)
}

func (w workload) do(ctx context.Context, what string, f func(context.Context) error) {
	if err := f(ctx); err != nil {
		w.say("workload: %s failed: %v", what, err)
	}
}

// verdict prints what the controller saw per domain and checks the
// promises: no reboot reported as a stop, the real stop reported once.
func (t *tally) verdict(uuids map[string]string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Println("\nWhat the controller received, per domain:")
	var problems []string
	count := func(n string, tr proto.Transition) int {
		c := 0
		for _, ev := range t.byDomain[n] {
			if ev.Transition == tr {
				c++
			}
		}
		return c
	}
	for _, n := range []string{"web-1", "db-1", "cache-1", "batch-1"} {
		var parts []string
		for _, ev := range t.byDomain[n] {
			p := fmt.Sprintf("%s(%s)", ev.Transition, ev.Reason)
			if ev.Classification != "" {
				p += "[" + string(ev.Classification) + "/" + ev.ClassificationReason + "]"
			}
			parts = append(parts, p)
		}
		fmt.Printf("  %-8s %s\n", n, strings.Join(parts, " → "))
	}
	for _, n := range []string{"web-1", "db-1", "cache-1"} {
		if c := count(n, proto.TransitionStopped); c != 0 {
			problems = append(problems, fmt.Sprintf("%s: reboot reported as %d stop(s)", n, c))
		}
		if count(n, proto.TransitionRebooted) == 0 {
			problems = append(problems, n+": no reboot reported")
		}
	}
	if c := count("batch-1", proto.TransitionStopped); c != 1 {
		problems = append(problems, fmt.Sprintf("batch-1: real stop reported %d times, want once", c))
	}
	for _, ev := range t.byDomain["batch-1"] {
		if ev.Transition == proto.TransitionStopped && ev.Classification != proto.ClassificationUnknown {
			problems = append(problems, fmt.Sprintf("batch-1: stop classified %q, want unknown (Nova absent)", ev.Classification))
		}
	}
	if t.dups > 0 {
		fmt.Printf("  (%d duplicate deliveries dropped by message ID)\n", t.dups)
	}
	fmt.Println()
	if len(problems) > 0 {
		return errors.New("demo expectations failed: " + strings.Join(problems, "; "))
	}
	fmt.Println("OK: 3 reboots, none reported as a stop (one of them only thanks to the real-state check);")
	fmt.Println("    the real stop of batch-1 reported exactly once, after the window, classified unknown (Nova absent).")
	return nil
}

// consume reads the hvguard stream from the start with an ordered consumer
// and calls f for each decoded event.
func consume(ctx context.Context, url string, f func(proto.LifecycleEvent, string)) (func(), error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	// The agent creates the stream as soon as it reaches NATS; wait for it.
	var cons jetstream.Consumer
	for i := 0; ; i++ {
		cons, err = js.OrderedConsumer(ctx, proto.StreamName, jetstream.OrderedConsumerConfig{})
		if err == nil || !errors.Is(err, jetstream.ErrStreamNotFound) || i == 100 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev, err := proto.DecodeLifecycle(m.Data())
		if err != nil {
			fmt.Printf("CONTROLLER: undecodable message on %s: %v\n", m.Subject(), err)
			return
		}
		f(ev, m.Headers().Get(jetstream.MsgIDHeader))
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return func() { cc.Stop(); nc.Close() }, nil
}

// laggedDomains delays delivery of the events of chosen domains, standing in
// for libvirt's event-dispatch lag under load. Each domain's events keep
// their order (all are delayed by the same amount).
type laggedDomains struct {
	mu     sync.Mutex
	names  map[string]bool
	lag    time.Duration
	window time.Duration
}

func (l *laggedDomains) set(name string) {
	l.mu.Lock()
	l.names[name] = true
	l.mu.Unlock()
}

func (l *laggedDomains) lagged(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.names[name]
}

// wrap delays the start events of the chosen domains: their stop was
// delivered promptly, their start late, as in the Nova incident.
func (l *laggedDomains) wrap(hv agent.Hypervisor) agent.Hypervisor {
	hv = agent.DelayEvents(hv, func(ev lifecycle.Event) time.Duration {
		if l.lagged(ev.Name) && (ev.Kind == lifecycle.KindStarted || ev.Kind == lifecycle.KindResumed) {
			return l.lag
		}
		return 0
	})
	return novaWatch(hv, l.window)
}

// novaWatch shows, beside hvguard's decisions, what Nova's delay-only rule
// does with the same event stream: hold STOPPED for the window, cancel it on
// any later event of the domain, otherwise report the stop. It only prints.
func novaWatch(hv agent.Hypervisor, window time.Duration) agent.Hypervisor {
	var (
		mu   sync.Mutex
		held = map[string]*time.Timer{}
	)
	return agent.DelayEvents(hv, func(ev lifecycle.Event) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if t := held[ev.UUID]; t != nil {
			t.Stop()
			delete(held, ev.UUID)
		}
		if ev.Kind == lifecycle.KindStopped {
			name := ev.Name
			held[ev.UUID] = time.AfterFunc(window, func() {
				fmt.Printf("%s  NOVA'S RULE (hold STOPPED, cancel on the next event) reports %s STOPPED now: no event for it within %s\n",
					time.Now().Format("15:04:05.0"), name, window)
			})
		}
		return 0
	})
}
