package fencing

import (
	"testing"
	"time"
)

// TestRestartLostFenceStateKeepsDeadlines (reviewer R2; limit (2) of
// docs/fencing.md): cut off at L+1, the agent fences at L+10 (libvirt slow:
// the pause does not complete), crashes at L+14, and fence.json is lost
// (state_dir wiped). systemd restarts it at L+22 — before the watchdog it
// fed until L+14 fires — with NATS still unreachable. Starting as a first
// start (lease age one interval) it armed, i.e. fed, the watchdog, and
// kept feeding until L+35; it fenced again only at L+30, and if that fence
// could not complete the watchdog reset the host at L+45, while the
// controller declares from L+30.5 s. The fix: the durable state is written
// to a per-boot runtime copy too (tmpfs, /run/hvguard), and ChooseDurable
// takes it when state_dir's copy is lost: the restart keeps the lease age
// and carries on fencing; it does not feed the watchdog. Without the copy
// (mutation RuntimeCopyIgnored) the reviewer's failure comes back.
func TestRestartLostFenceStateKeepsDeadlines(t *testing.T) {
	restart := func(mutated bool) (*Agent, time.Time, DurableSource) {
		Mutations.RuntimeCopyIgnored = mutated
		defer func() { Mutations.RuntimeCopyIgnored = false }()
		cfg := testConfig()
		h := newHarness(t, cfg, 50, "d1")
		L := h.a.lastAck
		h.advance(14 * time.Second) // cut: fencing from L+10, the pause never completes
		h.expectState(StateFencing)
		runtime := h.dur // the runtime copy, written with fence.json
		h.now = L.Add(22 * time.Second)
		d, src := ChooseDurable(nil, &runtime, cfg.BootID) // fence.json lost, NATS unreachable
		a, _, err := NewAgent(cfg, d, nil, 0, h.now)
		if err != nil {
			t.Fatal(err)
		}
		return a, L, src
	}
	a, L, src := restart(false)
	if src != DurableRuntime {
		t.Fatalf("source %s, want the runtime copy", src)
	}
	if a.FeedWatchdog(L.Add(22*time.Second)) || a.State() != StateFenced || !a.LeaseExpiry().Equal(L.Add(testConfig().Timing.LeaseTTL)) {
		t.Fatalf("a restart at L+22 s from the runtime copy: feeds %v, state %s, lease expiry L+%s (want no feed, fenced (carried on), L+%s)",
			a.FeedWatchdog(L.Add(22*time.Second)), a.State(), a.LeaseExpiry().Sub(L), testConfig().Timing.LeaseTTL)
	}
	if a, L, _ := restart(true); !a.FeedWatchdog(L.Add(22 * time.Second)) {
		t.Fatal("mutation RuntimeCopyIgnored: the restart does not feed the watchdog (the test does not guard the fix)")
	}
}

// TestChooseDurable: the runtime copy only of this boot; the newer of two;
// state on a tie.
func TestChooseDurable(t *testing.T) {
	st := &Durable{Host: "h", BootID: "b1", Writes: 7}
	for _, c := range []struct {
		name           string
		state, runtime *Durable
		want           DurableSource
	}{
		{"none", nil, nil, DurableNone},
		{"state only", st, nil, DurableState},
		{"runtime only", nil, &Durable{BootID: "b1", Writes: 3}, DurableRuntime},
		{"runtime of another boot", nil, &Durable{BootID: "b0", Writes: 3}, DurableNone},
		{"runtime of another boot, state", st, &Durable{BootID: "b0", Writes: 9}, DurableState},
		{"runtime newer", st, &Durable{BootID: "b1", Writes: 8}, DurableRuntime},
		{"state newer", st, &Durable{BootID: "b1", Writes: 6}, DurableState},
		{"tie", st, &Durable{BootID: "b1", Writes: 7}, DurableState},
		{"state of an earlier boot", &Durable{BootID: "b0", Writes: 50}, &Durable{BootID: "b1", Writes: 2}, DurableRuntime},
	} {
		if _, got := ChooseDurable(c.state, c.runtime, "b1"); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
