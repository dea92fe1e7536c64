package fencing

import (
	"testing"
	"time"
)

// TestRestartWithNewTimingKeepsOldDeadlines (reviewer R2): the agent is
// restarted with changed timing constants (a configuration change picked
// up by a crash restart: OOM kill, SIGKILL) while NATS is unreachable. The
// controller still knows only the record that landed last, with the OLD
// constants, and declares from it (at the defaults: L + 15 + 15.5 s). The
// new process takes its lease age from the durable state, so it must fence
// by that record's fence_by, escalate by its lease_ttl, and stop feeding
// the watchdog so that a reset comes by its lease_ttl + watchdog_timeout —
// not by the new, longer ones, which the controller never saw.
func TestRestartWithNewTimingKeepsOldDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(c *Config)
	}{
		{"lease_ttl 15s -> 60s", func(c *Config) { c.Timing.LeaseTTL = 60 * time.Second }},
		{"watchdog_timeout 10s -> 30s", func(c *Config) { c.Timing.WatchdogTimeout = 30 * time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := testConfig()
			h := newHarness(t, old, 50, "d1")
			h.healthyFor(time.Second)
			h.advance(100 * time.Millisecond)
			L := h.a.lastAck // send time of the last landed renewal
			d := h.dur
			cfg := testConfig()
			tc.change(&cfg)
			var a *Agent
			for _, at := range []time.Duration{3 * time.Second, 5 * time.Second} {
				// A crash; restarted, NATS unreachable (twice: the second
				// start inherits what the first one persisted).
				h.now = L.Add(at)
				var r Ready
				var err error
				if a, r, err = NewAgent(cfg, &d, nil, 0, h.now); err != nil {
					t.Fatal(err)
				}
				h.a, h.renew, h.round, h.log = a, nil, nil, nil
				h.take(r)
				d = h.dur
			}
			a.SetMembers(members(50), DefaultGuard(50))
			h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
			// The last feed a dead agent may give: the reset must come by
			// the old record's L + lease_ttl + watchdog_timeout.
			lastFeed := L.Add(old.Timing.LeaseTTL + old.Timing.WatchdogTimeout - cfg.Timing.WatchdogTimeout)
			fenceBy := L.Add(old.Timing.FenceBy())
			for h.now.Before(L.Add(old.Timing.LeaseTTL + old.Timing.WatchdogTimeout)) {
				if a.FeedWatchdog(h.now) && !h.now.Before(lastFeed) {
					t.Fatalf("feeds the watchdog (timeout %s) at L+%s: a dead agent resets the host after L+%s, the controller declares from L+%s",
						cfg.Timing.WatchdogTimeout, h.now.Sub(L), h.now.Sub(L)+cfg.Timing.WatchdogTimeout,
						old.Timing.LeaseTTL+old.Timing.FenceDeadline+old.Timing.WatchdogTimeout)
				}
				if !h.now.Before(fenceBy.Add(200*time.Millisecond)) && !slicesContains(h.log, "pause d1") {
					t.Fatalf("not fencing at L+%s (the landed record's fence_by is L+%s); log %v", h.now.Sub(L), old.Timing.FenceBy(), h.log)
				}
				h.advance(100 * time.Millisecond)
			}
		})
	}
}

// TestRestartWithNewTimingReachableDoesNotFence: the same restart with
// NATS reachable: the first renewal (with the new constants) lands at once,
// and the lease is counted from it: nothing is fenced.
func TestRestartWithNewTimingReachableDoesNotFence(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.healthyFor(time.Second)
	d := h.dur
	cfg := testConfig()
	cfg.Timing.LeaseTTL = 60 * time.Second
	cfg.Timing.WatchdogTimeout = 30 * time.Second
	h.now = h.now.Add(3 * time.Second)
	a, r, err := NewAgent(cfg, &d, nil, 0, h.now)
	if err != nil {
		t.Fatal(err)
	}
	h.a, h.renew, h.log = a, nil, nil
	h.take(r)
	a.SetMembers(members(50), DefaultGuard(50))
	h.take(a.Domains(h.now, []Domain{{UUID: "d1", Running: true}}))
	h.take(a.Tick(h.now))
	h.ack()
	h.healthyFor(2 * time.Minute)
	h.expectState(StateHealthy)
	if slicesContains(h.log, "pause d1") || !a.FeedWatchdog(h.now) {
		t.Fatalf("log %v, feed %v", h.log, a.FeedWatchdog(h.now))
	}
	if h.dur.Timing == nil || h.dur.Timing.LeaseTTL != 60*time.Second {
		t.Fatalf("durable timing %+v", h.dur.Timing)
	}
}
