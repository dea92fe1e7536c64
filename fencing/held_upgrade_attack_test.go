package fencing

import (
	"testing"
	"time"
)

// TestAttackUpgradeHeldWithoutHeldUntil (found by the final attack; fixed): a durable state
// written by the previous release carries Held but no held_until (the
// field is new, omitzero). An agent upgraded (restarted, same boot) while
// Held and cut off, long after its last confirmation lapsed, must not
// grant itself a fresh hold of peer_timeout and feed the watchdog on it:
// the unknown hold should count as lapsed (fence, no feed), exactly as a
// known lapsed one does (TestRestartHeldKeepsLastConfirmation).
func TestAttackUpgradeHeldWithoutHeldUntil(t *testing.T) {
	d := Durable{Host: "h1", BootID: "boot", HaveLease: true, Held: true} // no HeldUntil: an older release's file
	cfg := testConfig()
	cfg.Host, cfg.BootID = "h1", "boot"
	now := time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC)
	d.LastAck = now.Add(-30 * time.Second)
	a, _, err := NewAgent(cfg, &d, nil, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	a.SetMembers(members(50), DefaultGuard(50))
	a.Tick(now.Add(100 * time.Millisecond))
	if feeds := a.FeedWatchdog(now.Add(200 * time.Millisecond)); a.State() == StateHeld || feeds {
		t.Fatalf("upgraded Held agent, last confirmation unknown, lease 30 s old: state %s, feeds %v (want fencing, no feed)", a.State(), feeds)
	}
}
