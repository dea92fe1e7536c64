package integration

import (
	"context"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/proto"
)

// TestFullReportsMakeTheViewExact (issue 12): the agent sends a full report
// (proto.TransitionInventory) after its first listing and after every gap
// marker. Here its outbox overflows during a NATS outage (events dropped, a
// gap marker appended when space frees); the controller's fleet view, fed
// the whole stream, goes stale at the gap and ends complete and equal to
// libvirt's truth.
func TestFullReportsMakeTheViewExact(t *testing.T) {
	store := t.TempDir()
	port := deliverytest.FreePort(t)
	ns := deliverytest.StartJetStream(t, store, port)
	wl := workloadConn(t)
	uuid, _ := newDomain(t, wl, "inv")
	host := "it-inventory"
	cfg := agentConfig(t, host, ns.ClientURL(), t.TempDir())
	cfg.Outbox.MaxEvents = 30
	startAgent(t, cfg, agent.Options{})
	nc := natsConn(t, ns.ClientURL())
	waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return hasInventory(evs, 1) })

	deliverytest.StopServer(ns)
	flapDomain(t, wl, uuid, 40) // 80 events into a 30-event outbox: most dropped
	must(t, wl.Suspend(context.Background(), uuid))
	time.Sleep(300 * time.Millisecond)
	ns = deliverytest.StartJetStream(t, store, port)
	nc = natsConn(t, ns.ClientURL())
	// Space frees as the outbox drains: the gap marker is appended, and the
	// full report follows it (the domain paused: its last event was dropped).
	lastGap := func(evs []proto.LifecycleEvent) int {
		gap := -1
		for i, e := range evs {
			if e.Transition == proto.TransitionGap {
				gap = i
			}
		}
		return gap
	}
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		g := lastGap(evs)
		return g >= 0 && hasInventory(evs[g:], 1)
	})
	n := len(evs)
	must(t, wl.Resume(context.Background(), uuid))
	evs = waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(evs) > n && len(byDomain(evs[n:], uuid)) > 0
	})
	f := controller.NewFleet()
	wentStale := false
	for i, e := range evs {
		f.Apply(time.Now(), controller.FleetEventOf(uint64(i+1), e))
		wentStale = wentStale || f.Host(host).Stale && e.Transition == proto.TransitionGap
	}
	h := f.Host(host)
	if !wentStale || h.Stale {
		t.Fatalf("view: stale at the gap %v, stale at the end %v (%s): %v", wentStale, h.Stale, h.StaleReason, summarize(evs))
	}
	if d := h.Domains[uuid]; d == nil || d.State != "running" {
		t.Fatalf("view of the domain after the full report: %+v, want running (libvirt's truth)", d)
	}
}

// hasInventory: evs hold at least n complete full reports.
func hasInventory(evs []proto.LifecycleEvent, n int) bool {
	got := 0
	for _, e := range evs {
		if e.Transition == proto.TransitionInventory && e.InventoryPart == e.InventoryParts {
			got++
		}
	}
	return got >= n
}
