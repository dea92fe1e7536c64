package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestAttackDeleteWhileControllerDownIsForgotten (found by the final attack; fixed): a host's
// key is deleted while the controller is down (a restart, an upgrade of a
// single controller) or before the leader published a guard listing it.
// The published guard has no `deleted` entry for it, and the restarted
// controller's watch shows only the delete marker, which Observe ignores
// for an unknown host: the host counts toward nothing. docs/fencing.md
// ("Key deleted") says a deleted host keeps counting toward the guard
// because its agent may still run cut off, Held and confirming its peers'
// holds (the simulation's rack of two Held hosts, one of them forgotten:
// the other was declared while its domain ran), and that a restarted
// controller "whose watch shows only the delete markers" restores them.
func TestAttackDeleteWhileControllerDownIsForgotten(t *testing.T) {
	tr := newTracker(t, 10)
	published := tr.Guard() // newTracker published it: no deleted hosts
	// The controller is down; h3's key is deleted (rev 60).
	nt, err := NewTracker(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Minute)
	for i := range 10 {
		if i != 3 {
			nt.Observe(now, fmt.Sprintf("h%d", i), 100, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
		}
	}
	nt.Observe(now, "h3", 60, nil) // the watch shows the marker only
	nt.WatchStarted(now)
	nt.RestoreGuard(published)
	if s := nt.Silent(now); s != 1 {
		t.Fatalf("silent %d after a restart that found h3's key deleted, want 1 (h3 counts as a deleted host, as when the delete was seen and published)", s)
	}
}
