package controller

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// observeAll has hosts h0..h(n-1) renew at now, naming guard version v
// with threshold th (v 0: no guard named).
func observeAll(tr *Tracker, now time.Time, rev uint64, from, n int, v uint64, th int) {
	for i := from; i < n; i++ {
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		if v > 0 {
			r.Guard = &fencing.GuardVersion{Version: v, Threshold: th}
		}
		tr.Observe(now, fmt.Sprintf("h%d", i), rev, r)
	}
}

// grownTo50 returns a tracker that published version 1 for 20 hosts
// (threshold 4) and now sees 50, all naming version 1, and its proposal of
// version 2 (threshold 10), not published yet.
func grownTo50() (*Tracker, fencing.Guard) {
	tr, _ := NewTracker(DefaultConfig())
	observeAll(tr, t0, 1, 0, 20, 0, 0)
	tr.GuardPublished(tr.Guard(), nil)
	observeAll(tr, t0, 2, 0, 50, 1, 4)
	return tr, tr.Guard()
}

// TestGuardGrowthWaitsForEveryMember: 20 hosts (threshold 4) grow to 50
// (10). The controller publishes version 2, but holds with 4 as long as
// one member still names version 1 (cut off before it read version 2),
// and with 10 once every member names 2. A shrink to 10 hosts lowers the
// threshold at once. Before guard versions the controller used 10 as soon
// as it had tried to publish the 50-host guard.
func TestGuardGrowthWaitsForEveryMember(t *testing.T) {
	tr, _ := NewTracker(DefaultConfig())
	observeAll(tr, t0, 1, 0, 20, 0, 0)
	g1 := tr.Guard()
	tr.GuardPublished(g1, nil)
	if g1.Version != 1 || tr.Threshold() != 4 {
		t.Fatalf("v%d threshold %d, want v1 4", g1.Version, tr.Threshold())
	}
	observeAll(tr, t0, 2, 0, 20, 1, 4)
	observeAll(tr, t0, 2, 20, 50, 1, 4) // 30 join, having read version 1
	g2 := tr.Guard()
	tr.GuardPublished(g2, nil)
	if g2.Version != 2 || g2.Threshold(g2.Members) != 10 {
		t.Fatalf("guard %+v", g2)
	}
	if again := tr.Guard(); again.Version != 2 {
		t.Fatalf("unchanged guard got a new version: %+v", again)
	}
	observeAll(tr, t0, 3, 0, 49, 2, 10) // all but h49 read version 2
	if th := tr.Threshold(); th != 4 {
		t.Fatalf("threshold %d with a member still on version 1, want 4", th)
	}
	observeAll(tr, t0, 4, 49, 50, 2, 10)
	if th := tr.Threshold(); th != 10 {
		t.Fatalf("threshold %d once every member named version 2, want 10", th)
	}
	for i := 10; i < 50; i++ {
		tr.Observe(t0, fmt.Sprintf("h%d", i), 100, nil)
	}
	if th := tr.Threshold(); th != 2 {
		t.Fatalf("threshold %d after the shrink to 10 hosts, want 2 at once", th)
	}
}

// TestGuardFailedPublishNotAdopted: the 50-host guard cannot be
// published: the controller keeps holding with 4 (every agent still acts
// on version 1), retries with the same version, and a later success is
// adopted. Before, Guard() recorded 50 members even when the publish
// failed: threshold 10.
func TestGuardFailedPublishNotAdopted(t *testing.T) {
	tr, g2 := grownTo50()
	tr.GuardPublished(g2, errors.New("timeout"))
	if th := tr.Threshold(); th != 4 {
		t.Fatalf("threshold %d after a failed publish, want 4", th)
	}
	retry := tr.Guard()
	if retry.Version != g2.Version {
		t.Fatalf("retry version %d, want %d", retry.Version, g2.Version)
	}
	tr.GuardPublished(retry, nil)
	observeAll(tr, t0, 3, 0, 50, 2, 10)
	if th := tr.Threshold(); th != 10 {
		t.Fatalf("threshold %d once published and named by all, want 10", th)
	}
}

// TestGuardRestoredAfterRestart: a new controller (restart, new leader)
// restores the published guard's history: members still naming version 1
// keep the threshold at 4, and versions go on from the restored one.
func TestGuardRestoredAfterRestart(t *testing.T) {
	tr, g2 := grownTo50()
	tr.GuardPublished(g2, nil)

	b, err := fencing.EncodeGuard(g2)
	if err != nil {
		t.Fatal(err)
	}
	published, err := fencing.DecodeGuard(b)
	if err != nil {
		t.Fatal(err)
	}
	nt, _ := NewTracker(DefaultConfig())
	nt.RestoreGuard(published)
	observeAll(nt, t0, 2, 0, 50, 0, 0) // agents from before versions: any kept version
	if th := nt.Threshold(); th != 4 {
		t.Fatalf("restored threshold %d, want 4 (history %v)", th, nt.GuardVersions())
	}
	observeAll(nt, t0, 3, 0, 50, 2, 10)
	if th := nt.Threshold(); th != 10 {
		t.Fatalf("threshold %d, want 10", th)
	}
	nt.Observe(t0, "h50", 1, rec("h50", fencing.BackstopReset))
	if g := nt.Guard(); g.Version != 3 {
		t.Fatalf("next version %d, want 3", g.Version)
	}
}

// TestGuardHistoryBounded: a member that never names a version keeps
// every version in force; the history stays bounded and never less
// conservative (merged entries keep the smaller threshold).
func TestGuardHistoryBounded(t *testing.T) {
	tr, _ := NewTracker(DefaultConfig())
	tr.Observe(t0, "old", 1, rec("old", fencing.BackstopReset)) // names no version
	for n := 1; n <= 60; n++ {
		observeAll(tr, t0, uint64(n+1), 0, n, 0, 0)
		tr.GuardPublished(tr.Guard(), nil)
	}
	if k := len(tr.GuardVersions()); k > maxGuardHistory {
		t.Fatalf("%d versions kept", k)
	}
	if th := tr.Threshold(); th != 0 {
		t.Fatalf("threshold %d: the 1-host version (threshold 0) must stay in force", th)
	}
}

// TestGuardEmptyBucket: with no host yet the proposal is an invalid guard
// (agents ignore it), and nothing breaks.
func TestGuardEmptyBucket(t *testing.T) {
	tr, _ := NewTracker(DefaultConfig())
	g := tr.Guard()
	tr.GuardPublished(g, nil)
	if g.Valid() || len(tr.GuardVersions()) != 0 {
		t.Fatalf("guard %+v, kept %v", g, tr.GuardVersions())
	}
}
