package integration

import (
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/proto"
)

// TestStateDirLostEventsStored (issue 10 item 7): the agent's state
// directory is lost (purge and reinstall, a disk swap, the outbox's own
// advice to remove it) and the agent starts again against the same
// JetStream within the stream's duplicate window. Its sequence numbers
// start again at 1; every event of the new life must still be stored (not
// dropped as a duplicate of the old life's event with the same seq).
func TestStateDirLostEventsStored(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	uuid, _ := newDomain(t, wl, "wiped")
	host := "it-wiped.example.org"
	nc := natsConn(t, ns.ClientURL())
	counts := func(evs []proto.LifecycleEvent) (defined, flaps int) {
		for _, e := range byDomain(evs, uuid) {
			switch {
			case strings.HasPrefix(e, "defined("):
				defined++
			case strings.HasPrefix(e, "suspended(") || strings.HasPrefix(e, "resumed("):
				flaps++
			}
		}
		return defined, flaps
	}
	// Each life: wait for the first listing's announcement of the domain,
	// then 10 events.
	life := func(n int) []proto.LifecycleEvent {
		stop := startAgent(t, agentConfig(t, host, ns.ClientURL(), t.TempDir()), agent.Options{})
		waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { d, _ := counts(evs); return d >= n })
		flapDomain(t, wl, uuid, 5)
		evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { _, f := counts(evs); return f >= 10*n })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	first := life(1)
	evs := life(2) // a new, empty state directory
	if d, f := counts(evs); d != 2 || f != 20 {
		t.Fatalf("stream holds %d announcements and %d events of the domain, want 2 and 20: %v", d, f, summarize(evs))
	}
	// libvirt's truth: the domain ends running (its flaps end resumed).
	if d := checkLives(t, first, evs).Domains[uuid]; d == nil || d.State != "running" {
		t.Fatalf("fleet view of the domain: %+v, want running", d)
	}
}

// checkLives: the stream holds the first life's events, then the second
// life's under another incarnation, each numbered from 1; the controller's
// fleet view (proto's consumer rules) takes the second life as a new
// incarnation (the host's view goes stale until a full report) and drops
// nothing as a duplicate.
func checkLives(t *testing.T, first, all []proto.LifecycleEvent) *controller.HostView {
	t.Helper()
	inc1, inc2 := first[0].Incarnation, all[len(all)-1].Incarnation
	if inc1 == 0 || inc2 == 0 || inc1 == inc2 {
		t.Fatalf("incarnations %s and %s, want two different ones", inc1, inc2)
	}
	checkContiguous(t, all[:len(first)])
	checkContiguous(t, all[len(first):])
	f := controller.NewFleet()
	for i, e := range all {
		v := f.Apply(time.Now(), controller.FleetEventOf(uint64(i+1), e))
		want, wantInc := controller.Applied, inc1
		if i >= len(first) {
			wantInc = inc2
		}
		if i == len(first) {
			want = controller.AppliedNewIncarnation
		}
		if v != want || e.Incarnation != wantInc {
			t.Fatalf("event %d (incarnation %s seq %d): %s, want %s: %v", i, e.Incarnation, e.Seq, v, want, summarize(all))
		}
	}
	// The new life's first listing is followed by a full report: the view
	// went stale at the new incarnation and is complete again.
	h := f.Host(all[0].Host)
	stale := false
	for _, he := range h.History {
		stale = stale || he.Verdict == controller.AppliedNewIncarnation && strings.Contains(he.Note, "new incarnation")
	}
	if !stale || h.Stale || h.Incarnation != uint64(inc2) {
		t.Fatalf("fleet view after the new incarnation: stale then complete = %v, stale now %v (%s), incarnation %d want %s",
			stale, h.Stale, h.StaleReason, h.Incarnation, inc2)
	}
	return h
}
