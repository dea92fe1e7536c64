package integration

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/lifecycle"
)

func (r *fenceRig) decided(op controller.Op) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.decs, func(d timedDecision) bool { return d.d.Op == op && d.d.Host == r.host })
}

// healthyKeyDeleteRig starts a fast rig's agent (two domains) and waits
// until it is healthy and the controller saw it.
func healthyKeyDeleteRig(t *testing.T) *fenceRig {
	t.Parallel()
	r := newFenceRig(t, true, fenceDomains(2))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)
	return r
}

// TestFenceKeyDeletedHealthyKeepsRunning: the whole daemon with fencing on;
// an operator deletes, then purges, its lease key while it is healthy: it
// re-creates the key and keeps renewing, nothing is paused or declared,
// and the controller said lease-deleted. Before the fix its creates were
// rejected by the marker forever: it fenced itself and stayed fenced.
func TestFenceKeyDeletedHealthyKeepsRunning(t *testing.T) {
	r := healthyKeyDeleteRig(t)
	ctx := context.Background()
	for _, erase := range []func() error{
		func() error { return r.ctrl.KV.Delete(ctx, "fence-h0_example_org") },
		func() error { return r.ctrl.KV.Delete(ctx, "fence-h0_example_org") }, // again (a purge is refused: no rollups)
	} {
		if err := erase(); err != nil {
			t.Fatal(err)
		}
		r.waitFor("the key re-created", 5*time.Second, func() bool {
			rec, _, err := r.ctrl.Read(ctx, r.host)
			return err == nil && rec.State == fencing.LeaseActive
		})
		time.Sleep(3 * time.Second) // lease_ttl + grace ≈ 3 s at ×0.1: a wrong fence or declaration shows
		if !r.allDomains(lifecycle.StateRunning) {
			t.Fatalf("a domain was fenced\n%s", r.history())
		}
	}
	if st := r.state(); st != fencing.StateHealthy || slices.Contains(r.reasons(), fencing.ReasonLeaseKeyDeletedWhileFenced) {
		t.Fatalf("state %s\n%s", st, r.history())
	}
	if !slices.Contains(r.reasons(), fencing.ReasonLeaseKeyDeletedRecreated) {
		t.Fatalf("no %s transition\n%s", fencing.ReasonLeaseKeyDeletedRecreated, r.history())
	}
	// Its records name the guard version it acts on (issue 10 item 3):
	// the one the controller published for these 6 hosts.
	rec, _, err := r.ctrl.Read(ctx, r.host)
	g, gerr := r.ctrl.ReadGuard(ctx)
	if err != nil || gerr != nil || rec.Guard == nil || g.Version == 0 || rec.Guard.Version != g.Version || rec.Guard.Threshold != g.Threshold(g.Members) {
		t.Fatalf("record names guard %+v, published %+v (%v %v)", rec.Guard, g, err, gerr)
	}
	if at, _ := r.declared(); !at.IsZero() || !r.decided(controller.OpLeaseDeleted) {
		t.Fatalf("declared at %v / no lease-deleted decision\n%s", at, r.history())
	}
	t.Logf("\n%s", r.history())
}

// TestFenceKeyDeletedWhileFencedStaysFenced: cut off, the agent fences;
// its key is deleted (a delete may erase a declaration) and the link
// heals: the agent does not resume; it writes an expired record of its
// own and waits in awaiting-release. --unfence on the empty key explains
// (ErrNoRecord); on the self-declaration it releases, and the agent takes
// its lease over and resumes nothing.
func TestFenceKeyDeletedWhileFencedStaysFenced(t *testing.T) {
	r := healthyKeyDeleteRig(t)
	ctx := context.Background()
	r.prx.Blackhole(true)
	r.waitFor("all domains paused", 10*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	if err := r.ctrl.KV.Delete(ctx, "fence-h0_example_org"); err != nil {
		t.Fatal(err)
	}
	direct := r.cfg
	direct.NATS.URLs = []string{r.natsURL}
	if _, err := agent.Unfence(ctx, direct, quietLog(), nil); !errors.Is(err, agent.ErrNoRecord) {
		t.Fatalf("unfence on a deleted key: %v, want ErrNoRecord", err)
	}
	r.prx.Blackhole(false)
	r.waitState(fencing.StateAwaitingRelease, 10*time.Second)
	r.waitFor("the agent's own expired record", 5*time.Second, func() bool {
		rec, _, err := r.ctrl.Read(ctx, r.host)
		return err == nil && rec.State == fencing.LeaseExpired
	})
	time.Sleep(2 * time.Second)
	r.assertStaysFenced("after the heal")
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("the controller declared a host whose key was deleted\n%s", r.history())
	}
	msg, err := agent.Unfence(ctx, direct, quietLog(), nil)
	if err != nil {
		t.Fatalf("unfence: %v", err)
	}
	t.Log(msg)
	r.waitFor("released and reconciled", 10*time.Second, func() bool {
		return slices.Contains(r.reasons(), fencing.ReasonReleasedReconciled)
	})
	time.Sleep(500 * time.Millisecond)
	if !r.allDomains(lifecycle.StatePaused) {
		t.Fatalf("a domain was resumed after the self-declaration's release\n%s", r.history())
	}
	t.Logf("\n%s", r.history())
}
