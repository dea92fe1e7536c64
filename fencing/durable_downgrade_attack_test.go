package fencing

import (
	"testing"
	"time"
)

// TestAttackStaleRuntimeCopyAfterDowngrade (found by the final attack; fixed): within one boot
// the agent is upgraded, rolled back, and upgraded again. The new release
// stopped orderly (withdrawn) and left a runtime copy of this boot with
// writes 40; the older release (no runtime copy, no writes counter: its
// state_dir copy says writes 0) then ran with a real lease, got cut off
// from NATS and was replaced before its lease ran out. The re-upgraded
// agent starts with NATS unreachable: ChooseDurable prefers the runtime
// copy (40 > 0) although it is older (incarnation 6 < 7), restarts
// "from withdrawn" with a fresh lease age of one interval, and feeds the
// watchdog past L + lease_ttl (L: the last landed renewal, the older
// release's), while the controller declares the host at L + lease_ttl +
// grace with its domains running. FeedWatchdog's own contract: a restarted
// agent feeds on the lease only before L + lease_ttl.
func TestAttackStaleRuntimeCopyAfterDowngrade(t *testing.T) {
	cfg := testConfig()
	cfg.Host, cfg.BootID = "h1", "boot"
	tm := cfg.Timing
	now := time.Date(2026, 12, 1, 0, 10, 0, 0, time.UTC)
	L := now.Add(-(tm.FenceBy() - 2*time.Second)) // not fencing yet when the old release stopped
	state := &Durable{Host: "h1", BootID: "boot", Epoch: 3, Incarnation: 7, HaveLease: true, LastAck: L}
	runtime := &Durable{Host: "h1", BootID: "boot", Epoch: 3, Incarnation: 6, Writes: 40,
		HaveLease: true, LastAck: L.Add(-10 * time.Minute), Withdrawn: true, KeyWithdrawn: true, Timing: &tm}
	d, src := ChooseDurable(state, runtime, "boot")
	a, _, err := NewAgent(cfg, d, nil, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	a.SetMembers(members(50), DefaultGuard(50))
	for at := now; at.Before(L.Add(tm.LeaseTTL)); at = at.Add(100 * time.Millisecond) {
		a.Tick(at)
	}
	past := L.Add(tm.LeaseTTL + 100*time.Millisecond)
	a.Tick(past)
	if a.FeedWatchdog(past) {
		t.Fatalf("source %s (incarnation %d): feeds the watchdog %s after L + lease_ttl, state %s — the real lease (L = the older release's last renewal) is over",
			src, d.Incarnation, 100*time.Millisecond, a.State())
	}
}
