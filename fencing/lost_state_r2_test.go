package fencing

import (
	"testing"
	"time"
)

// TestRestartLostFenceStateKeepsDeadlines (reviewer R2, OPEN; limit (2) of
// docs/fencing.md): cut off at L+1, the agent fences at L+10 (libvirt slow:
// the pause does not complete), crashes at L+14, and fence.json is lost
// (state_dir wiped). systemd restarts it at L+22 — before the watchdog it
// fed until L+14 fires — with NATS still unreachable. Starting as a first
// start (lease age one interval) it arms, i.e. feeds, the watchdog, and
// keeps feeding until L+35; it fences again only at L+30, and if that fence
// cannot complete the watchdog resets the host at L+45. The controller
// declares from L+30.5 s. The record in the bucket (same boot id) shows a
// previous process of this boot held the lease; only NATS being unreachable
// hides it here.
func TestRestartLostFenceStateKeepsDeadlines(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	L := h.a.lastAck
	h.advance(14 * time.Second) // cut: fencing from L+10, the pause never completes
	h.expectState(StateFencing)
	h.now = L.Add(22 * time.Second)
	a, _, err := NewAgent(testConfig(), nil, nil, 0, h.now) // fence.json lost, NATS unreachable
	if err != nil {
		t.Fatal(err)
	}
	if a.FeedWatchdog(h.now) {
		t.Fatalf("a restart at L+22 s with its fence state lost feeds the watchdog (last allowed feed: L+%s)", testConfig().Timing.LeaseTTL)
	}
}
