package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X102 (attack, (S), live host declared; faults needed: the
// live host's beacons lost, plus a controller restart — no attacker
// action at all). TestX101ListedComebackRenewalsWhileMemoryWithdrawn's
// setting: h3 (boot-1) withdrew (Memory.Withdrew{boot-1}), the controller
// went down, h3 came back on boot-2 (every beacon of it lost; the fleet's
// arrive, so beacons bind) and renews; the restarted controller lists
// boot-2's record and trusts it, then restores the memory's withdrawal of
// boot-1, which stands. X101 spared the trusted active record's own
// process. But h3's agent then restarts (a crash and systemd's restart,
// durable state kept: same boot, a later incarnation, its records
// compare-and-set renewals on the key's last revision — the most
// ordinary event): the new process is neither the withdrawal's (boot-1)
// nor the trusted active record's (boot-2, incarnation 200), so
// otherProcessWhileWithdrawn refuses every renewal of it; unverifiable
// values whose beacons never come do not restart the bound clock, and
// the live host — guests running — is declared lease_ttl + grace later.
// With otherProcessMutation (the rule off) its renewals are trusted (the
// restart's renewals are ordered on the key's revision as any).
//
// control: no agent restart (X101's own case): not declared.
//
// Fixed: a later incarnation of the trusted active record's boot is
// spared as that record's own process is (otherProcessLaterIncMutation
// reopens it).
func TestX102ListedComebackAgentRestartWhileMemoryWithdrawn(t *testing.T) {
	for _, c := range []struct {
		restart, hole bool
		mut           *bool
	}{
		{restart: true},
		{restart: false},
		{restart: true, mut: &otherProcessMutation},
		{restart: true, mut: &otherProcessLaterIncMutation, hole: true},
	} {
		t.Run(fmt.Sprintf("restart=%t/mut=%t", c.restart, c.mut != nil), func(t *testing.T) {
			x32Mutate(t, c.mut)
			declared := x102ListedComeback(t, c.restart)
			if c.hole {
				if declared == "" {
					t.Fatalf("mutation: the live h3 not declared — the rig does not reach the hole")
				}
				return
			}
			if declared != "" {
				t.Errorf("(S) the live h3 (renewing on boot-2, agent restarted=%t, its beacons lost) declared at %s", c.restart, declared)
			}
		})
	}
}

func x102ListedComeback(t *testing.T, restart bool) string {
	b := newX11Bucket(t)
	live := x11Without(x10Names(0, 10), "h3")
	b.tr = x10Tracker(t)
	for _, h := range live {
		b.write(t0, h, fencing.LeaseActive, nil)
	}
	b.publish()
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, true)
	if m := b.mem["h3"].Withdrew; m == nil || m.Boot != "boot-1" {
		t.Fatalf("rig: memory %+v", m)
	}
	b.stop()
	at = at.Add(time.Second)
	b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", 2, 200, 1, false)
	c2 := b.start(at.Add(100 * time.Millisecond))
	if h := c2.hosts["h3"]; h.trustedRev == 0 || h.beacons.withdrewBoot != "boot-1" {
		t.Fatalf("rig: listed comeback trusted %d, withdrawal of %q", h.trustedRev, h.beacons.withdrewBoot)
	}
	inc, seq := uint64(200), uint64(1)
	for s := 1; s <= 120; s++ {
		now := at.Add(time.Duration(s) * time.Second)
		if restart && s == 5 {
			inc, seq = 300, 0 // the agent crashed and systemd restarted it: a later incarnation of boot-2
		}
		seq++
		b.x99Write(now, "h3", fencing.LeaseActive, "boot-2", 2, inc, seq, false)
		for _, hh := range live {
			b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		for _, d := range c2.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h3" {
				return fmt.Sprint(s, "s")
			}
		}
	}
	return ""
}

// TestX102ListedComebackOrderlyRestartWhileMemoryWithdrawn (probe, (c);
// faults needed: the host's beacons lost, a controller restart; no
// attacker action): X102's first setting, but h3's boot-2 agent restarts
// in order — it withdraws (W2, trusted: the trusted active record's own
// process) and the next process of boot-2 takes the lease back. The
// memory's withdrawal of boot-1 still stands (no beacon ends it), the
// trusted record is W2 (withdrawn: not spared), and every record of the
// new process is refused as another process's: never trusted, and once
// h3 dies it is never declared. With otherProcessMutation (as before
// X101) its records are trusted and the dead host declared.
func TestX102ListedComebackOrderlyRestartWhileMemoryWithdrawn(t *testing.T) {
	for _, mut := range []*bool{nil, &otherProcessMutation} {
		t.Run(fmt.Sprintf("mut=%t", mut != nil), func(t *testing.T) {
			x32Mutate(t, mut)
			b := newX11Bucket(t)
			live := x11Without(x10Names(0, 10), "h3")
			b.tr = x10Tracker(t)
			for _, h := range live {
				b.write(t0, h, fencing.LeaseActive, nil)
			}
			b.publish()
			at := t0
			for seq := uint64(1); seq <= 3; seq++ {
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
			}
			b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, true)
			b.stop()
			at = at.Add(time.Second)
			b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", 2, 200, 1, false)
			c2 := b.start(at.Add(100 * time.Millisecond))
			if h := c2.hosts["h3"]; h.trustedRev == 0 || h.beacons.withdrewBoot != "boot-1" {
				t.Fatalf("rig: listed comeback trusted %d, withdrawal of %q", h.trustedRev, h.beacons.withdrewBoot)
			}
			inc, seq := uint64(200), uint64(1)
			var trusted []int
			declared := ""
			for s := 1; s <= 150 && declared == ""; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				switch {
				case s == 5:
					seq++
					b.x99Write(now, "h3", fencing.LeaseWithdrawn, "boot-2", 2, inc, seq, false)
					inc, seq = 300, 0
				case s < 20:
					seq++
					b.x99Write(now, "h3", fencing.LeaseActive, "boot-2", 2, inc, seq, false)
					if c2.hosts["h3"].trustedRev == b.keys["h3"].rev {
						trusted = append(trusted, s)
					}
				}
				// from 20 s on h3 is dead
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						declared = fmt.Sprint(s, "s")
					}
				}
			}
			t.Logf("renewals trusted at %v; declared %q", trusted, declared)
			if mut != nil {
				if declared == "" {
					t.Fatalf("mutation: dead h3 not declared — the rig does not reach the hole")
				}
				return
			}
			if declared == "" {
				t.Errorf("(c) h3 (boot-2 agent restarted in order, its beacons lost) died and was never declared")
			}
		})
	}
}
