package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestRevisionRegressedNotDeclared: the lease stream's revisions go down
// for h0 (the stream deleted and re-created, or rolled back by a NATS
// failure: sequences restart). Before, the tracker dropped every lower
// revision as a stale delivery, so h0's genuine renewals (revisions 1,
// 2, …) were never seen, h0 looked silent and was declared by a CAS on
// its old revision 100 — which the new stream's key may hold again: a
// live host declared (a). Now the first lower revision raises
// OpRevisionRegressed (once) and h0 is not declared until a revision
// above 100 arrives (then it is tracked as usual again).
func TestRevisionRegressedNotDeclared(t *testing.T) {
	tr, rev := regressFleet(t)
	low, regressed := uint64(0), 0
	for s := 1; s <= 120; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		var ds []Decision
		low++ // h0's genuine renewal in the re-created stream
		ds = append(ds, tr.Observe(now, "h0", low, rec("h0", fencing.BackstopReset))...)
		for i := 1; i < 10; i++ {
			rev++
			ds = append(ds, tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))...)
		}
		ds = append(ds, tr.Tick(now)...)
		for _, d := range ds {
			switch d.Op {
			case OpDeclare:
				t.Fatalf("the live h0 declared %ds after its revisions went down (CAS on revision %d; regression alarms: %d)", s, d.Revision, regressed)
			case OpRevisionRegressed:
				regressed++
				t.Logf("%s: %s", d.Host, d.Reason)
			}
		}
	}
	if regressed != 1 {
		t.Fatalf("%d revision-regressed decisions, want 1", regressed)
	}
	// Once h0's revisions pass the last one seen, it is tracked again: a
	// death is declared.
	now := t0.Add(121 * time.Second)
	tr.Observe(now, "h0", 200, rec("h0", fencing.BackstopReset))
	for s := 1; s <= 60; s++ {
		at := now.Add(time.Duration(s) * time.Second)
		for i := 1; i < 10; i++ {
			rev++
			tr.Observe(at, fmt.Sprintf("h%d", i), rev+1000, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
		}
		for _, d := range tr.Tick(at) {
			if d.Op == OpDeclare && d.Host == "h0" && d.Revision == 200 {
				t.Logf("h0 dead at revision 200: declared %ds later", s)
				return
			}
		}
	}
	t.Fatal("h0, dead after its revisions passed the old ones, never declared")
}

// regressFleet: a tracker watching h0 at revision 100 and h1..h9 at 101..109
// at t0; it returns the last revision.
func regressFleet(t *testing.T) (*Tracker, uint64) {
	t.Helper()
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	rev := uint64(100)
	tr.Observe(t0, "h0", rev, rec("h0", fencing.BackstopReset))
	for i := 1; i < 10; i++ {
		rev++
		tr.Observe(t0, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
	}
	tr.WatchStarted(t0)
	return tr, rev
}
