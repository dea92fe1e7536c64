package fencing

import (
	"testing"
	"time"
)

// TestGuardNeverOlderAndNamed: the agent names the guard version and
// threshold it acts on in its records, and never goes back to an older
// version (a lagging read, a late-landing old publish): the controller
// may have stopped keeping it. An invalid guard is ignored too.
func TestGuardNeverOlderAndNamed(t *testing.T) {
	h := newHarness(t, testConfig(), 50)
	v2 := DefaultGuard(50)
	v2.Version = 2
	h.a.SetMembers(members(50), v2)
	v1 := DefaultGuard(20)
	v1.Version = 1
	h.a.SetMembers(members(50), v1)
	h.a.SetMembers(members(50), Guard{})
	if g := h.a.Guard(); g.Version != 2 || g.Members != 50 {
		t.Fatalf("guard %+v, want version 2 kept", g)
	}
	h.healthyFor(3 * time.Second)
	h.advance(2 * time.Second)
	if h.renew == nil || h.renew.Record.Guard == nil || *h.renew.Record.Guard != (GuardVersion{Version: 2, Threshold: 10}) {
		t.Fatalf("record names %+v, want version 2 threshold 10", h.renew)
	}
}
