package fencing

import (
	"testing"
	"time"
)

// TestRestartHeldKeepsLastConfirmation: a Held agent restarted (a crash
// loop) carries Held over from its durable state, but never holds longer
// than its last confirmation allowed: a start after that moment fences
// and does not feed the watchdog on the strength of the hold. Found by the
// simulation: an agent crash-looping while Held, cut off and with libvirt
// down, gave itself a fresh hold at every start and fed the watchdog for
// ever while the controller declared it.
func TestRestartHeldKeepsLastConfirmation(t *testing.T) {
	for _, mutate := range []bool{false, true} {
		Mutations.RestartRefreshesHold = mutate
		d := Durable{Host: "h1", BootID: "boot", HaveLease: true, Held: true}
		cfg := testConfig()
		cfg.Host, cfg.BootID = "h1", "boot"
		now := time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC)
		d.LastAck = now.Add(-30 * time.Second)
		d.HeldUntil = now.Add(-2 * time.Second) // the last confirmation's hold is over
		a, _, err := NewAgent(cfg, &d, nil, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		a.SetMembers(members(50), DefaultGuard(50))
		a.Tick(now.Add(100 * time.Millisecond))
		feeds := a.FeedWatchdog(now.Add(200 * time.Millisecond))
		held := a.State() == StateHeld
		if !mutate && (held || feeds) {
			t.Fatalf("restart after the hold lapsed: state %s, feeds %v (want fencing, no feed)", a.State(), feeds)
		}
		if mutate && !(held && feeds) {
			t.Fatalf("mutation RestartRefreshesHold: state %s feeds %v — the test cannot see the bug", a.State(), feeds)
		}
	}
	Mutations.RestartRefreshesHold = false
}
