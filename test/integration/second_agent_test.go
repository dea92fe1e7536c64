package integration

import (
	"context"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/fencing"
	"hvguard/lifecycle"
)

// TestSecondAgentOnSameStateDir (attack): a second hvguard-agent is started
// on a host whose agent runs (by hand while debugging, a container and the
// package, a unit copied under another name) with the same config and
// state_dir. It must refuse before it touches anything shared — the lease,
// the watchdog, the domains — and leave the running agent healthy with
// its domains running; the outbox lock alone came after fencing had
// started, and the refused agent's stop path then acted on the host's lease.
func TestSecondAgentOnSameStateDir(t *testing.T) {
	r := newFenceRig(t, true, fenceDomains(2))
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	err := agent.Run(ctx, r.cfg, quietLog(), r.agentOptions(agent.Options{}))
	if err == nil {
		t.Fatal("a second agent on the same state_dir ran")
	}
	t.Logf("second agent refused after %s: %v", time.Since(began).Round(time.Millisecond), err)
	time.Sleep(3 * time.Second) // long enough for a wrong fence, withdrawal or declaration to show
	if !r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("domains not running after the second agent was refused\n%s", r.history())
	}
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("host declared\n%s", r.history())
	}
	if st := r.state(); st != fencing.StateHealthy {
		t.Fatalf("state %s, want healthy\n%s", st, r.history())
	}
	for _, why := range r.reasons() {
		if why == fencing.ReasonWithdrawn || why == fencing.ReasonRenewFailed {
			t.Fatalf("the refused agent acted on the host's lease (%s)\n%s", why, r.history())
		}
	}
	t.Logf("history:\n%s", r.history())
}
