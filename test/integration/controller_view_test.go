package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller/daemon"
)

// TestControllerFleetView (issue 12): the real agent (libvirt test driver)
// and the controller daemon on one embedded JetStream. The controller's
// status (GET /status?host=) follows libvirt's truth through a real stop,
// a poison message on the host's subject (terminated, counted, the events
// behind it applied), NATS restarted mid-stream, and the agent stopped and
// restarted with its state directory wiped (a new incarnation: stale, then
// complete after the new life's full report).
func TestControllerFleetView(t *testing.T) {
	store := t.TempDir()
	port := deliverytest.FreePort(t)
	ns := deliverytest.StartJetStream(t, store, port)
	wl := workloadConn(t)
	a, _ := newDomain(t, wl, "cv")
	b, _ := newDomain(t, wl, "cv")
	host := "it-ctlview"
	stateDir := t.TempDir()
	stopAgent := startAgent(t, agentConfig(t, host, ns.ClientURL(), stateDir), agent.Options{})

	cfg := daemon.DefaultConfig()
	cfg.ID = "ctl-view"
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.NATS.ReadyTimeout = daemon.Duration(5 * time.Second)
	cfg.Metrics.Listen = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	addr := runController(t, cfg)

	status := func(what string, ok func(daemon.Status) bool) daemon.Status {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var st daemon.Status
		for {
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, _ = daemon.FetchStatus(c, addr, host)
			cancel()
			if st.Host != nil && st.Events != nil && ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never; last status host %+v events %+v", what, st.Host, st.Events)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	state := func(st daemon.Status, uuid string) string {
		for _, d := range st.Host.DomainList {
			if d.UUID == uuid {
				return d.State
			}
		}
		return "absent"
	}

	// The first full report: both domains running, the view complete.
	status("first full report", func(st daemon.Status) bool {
		return !st.Host.Stale && state(st, a) == "running" && state(st, b) == "running"
	})
	// A real stop, reported after the window.
	must(t, wl.Destroy(context.Background(), a))
	status("stop of a", func(st daemon.Status) bool { return state(st, a) == "shutoff" })

	// A poison message on the host's subject: terminated and counted; the
	// next events are applied.
	nc := natsConn(t, ns.ClientURL())
	if err := nc.Publish("hvguard.v1.it-ctlview.lifecycle", []byte(`{"schema":1,"host":`)); err != nil {
		t.Fatal(err)
	}
	must(t, wl.Suspend(context.Background(), b))
	st := status("suspend of b after the poison", func(st daemon.Status) bool { return state(st, b) == "paused" })
	if st.Events.Poison != 1 || st.Host.Stale {
		t.Fatalf("poison %d (want 1), stale %v %q", st.Events.Poison, st.Host.Stale, st.Host.StaleReason)
	}

	// NATS restarts mid-stream: the consumer comes back and goes on.
	deliverytest.StopServer(ns)
	must(t, wl.Resume(context.Background(), b))
	ns = deliverytest.StartJetStream(t, store, port)
	status("resume of b across the NATS restart", func(st daemon.Status) bool { return state(st, b) == "running" })

	// The agent stops, its state directory is lost, it starts again: a new
	// incarnation. A domain undefined meanwhile must leave the view.
	if err := stopAgent(); err != nil {
		t.Fatal(err)
	}
	must(t, wl.Undefine(context.Background(), a))
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		must(t, os.RemoveAll(stateDir+"/"+e.Name()))
	}
	startAgent(t, agentConfig(t, host, ns.ClientURL(), stateDir), agent.Options{})
	st = status("the new incarnation's full report", func(st daemon.Status) bool {
		return st.Events.NewIncarnation == 1 && !st.Host.Stale
	})
	if state(st, a) != "absent" || state(st, b) != "running" {
		t.Fatalf("view after the new incarnation: a %s (undefined: want absent), b %s (want running)", state(st, a), state(st, b))
	}
}

// runController runs hvguard-controller's daemon with cfg until the test
// ends and returns its status endpoint's address.
func runController(t *testing.T, cfg daemon.Config) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, cfg, quietLog(), daemon.Options{Listening: func(x string) { addrc <- x }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return <-addrc
}
