package controller

import (
	"fmt"
	"os"
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
			if c.hole {
				x32Mutate(t, &otherProcessSealedAfterMutation) // X106's layer spares these renewals too
			}
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
	b, live := x100Fleet(t)
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
			if mut == nil && os.Getenv("HVG_X102") == "" {
				t.Skip("open (c), conditional on a controller restart and the host's beacons lost (docs/security.md, reviewer X102); HVG_X102=1 runs it (it fails)")
			}
			x32Mutate(t, mut)
			b, live := x100Fleet(t)
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

// TestX102EarlyWithdrawalBarIgnoresLaterEarlyBeacons (attack, (c);
// faults needed: a controller (re)start whose watch is not up — a
// JetStream outage while core NATS carries beacons, or a slow listing —
// for as long as the host takes to withdraw, reboot, renew and die; no
// attacker action). X101's (3) bars a first record of a host not tracked
// yet by its kept early withdrawal (earlyWithdrawn) — whatever the kept
// beacons of the host said AFTER that withdrawal: h3 (boot-1) withdrew,
// rebooted, and boot-2 renewed five times, every beacon received by the
// starting controller (h3 not tracked: kept, early), then died. The
// listing's value — boot-2's last renewal, written fresh, named by its
// own beacon — is refused (another boot than the kept withdrawal's), and
// the replay then sets the withdrawal standing AFTER boot-2's later
// beacons (replayHost replays the observations first; ObserveWithdrawalBy
// takes a withdrawal whatever revision): no beacon of the dead host will
// ever end it: never trusted, never declared. With earlyBarMutation (as
// before X101) the record is trusted and the dead host declared.
//
// Fixed: a kept beacon naming a later revision than the kept early
// withdrawal ends it, as ObserveBeacon ends a tracked host's
// (earlyObserveEndsMutation reopens it: the mutation case below must
// NOT declare).
func TestX102EarlyWithdrawalBarIgnoresLaterEarlyBeacons(t *testing.T) {
	for _, mut := range []*bool{nil, &earlyBarMutation, &earlyObserveEndsMutation} {
		t.Run(fmt.Sprintf("mut=%t", mut != nil), func(t *testing.T) {
			x32Mutate(t, mut)
			b, live := x100Fleet(t)
			at := t0
			for seq := uint64(1); seq <= 3; seq++ {
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
			}
			b.stop() // the controller restarts; its watch is not up yet
			tr := x10Tracker(t)
			beacon := func(now time.Time, e x11Entry, boot string, inc, seq uint64, withdrawn bool) {
				tr.ObserveBeacon(now, "h3", e.rev)
				tr.BeaconWrote("h3", e.rev, 2, inc, seq)
				tr.BeaconVouches(now, "h3", e.rev, boot, 2, inc, seq)
				if withdrawn {
					tr.ObserveWithdrawalBy(now, "h3", e.rev, boot, inc)
				}
			}
			e := b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, false)
			beacon(at, e, "boot-1", 100, 4, true)
			for seq := uint64(1); seq <= 5; seq++ {
				now := at.Add(time.Duration(60+seq) * time.Second)
				e = b.x99Write(now, "h3", fencing.LeaseActive, "boot-2", 2, 200, seq, false)
				beacon(now, e, "boot-2", 200, seq, false)
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
			}
			// h3 is dead from here; the watch comes up and lists.
			now := at.Add(80 * time.Second)
			names := make([]string, 0, len(b.keys))
			for h := range b.keys {
				names = append(names, h)
			}
			sortByRev(names, b)
			for _, h := range names {
				deliver(tr, now, h, b.keys[h])
			}
			tr.WatchStarted(now)
			for _, h := range tr.Hosts() {
				if m, ok := b.mem[h]; ok {
					tr.RestoreMemory(now, h, m)
				}
			}
			tr.RestoreGuard(b.guard)
			b.tr = tr
			b.flush()
			hs := tr.hosts["h3"]
			t.Logf("h3: trusted %d (key at %d), withdrew %d (%q), maxRev %d", hs.trustedRev, b.keys["h3"].rev, hs.beacons.withdrew, hs.beacons.withdrewBoot, hs.beacons.maxRev)
			host, after := b.run(now, 150, live, map[string]bool{"h3": true})
			if mut == &earlyObserveEndsMutation {
				if host != "" {
					t.Fatalf("mutation: dead h3 declared — the fix is not what declares it")
				}
				return
			}
			if mut != nil {
				if host == "" {
					t.Fatalf("mutation: dead h3 not declared — the rig does not reach the hole")
				}
				return
			}
			if host == "" {
				t.Errorf("(c) dead h3 (its boot-2 beacons, after its boot-1 withdrawal, all received) never declared")
			} else {
				t.Logf("declared %s after the listing", after)
			}
		})
	}
}

// TestX102LaterIncSpareBounds: X102's spare of a later incarnation of the
// trusted active record's boot, bounded: not an earlier incarnation, and
// not the withdrawal's own boot (there X101's order of its processes
// holds: an incarnation between the trusted record's and the
// withdrawal's stays another process's).
func TestX102LaterIncSpareBounds(t *testing.T) {
	tr := x10Tracker(t)
	mk := func(boot string, inc uint64) fencing.LeaseRecord {
		r := rec("h3", fencing.BackstopReset)
		r.State, r.Sig, r.Signer = fencing.LeaseActive, "h3-key genuine-signature", "h3-key"
		r.BootID, r.Epoch, r.Incarnation, r.Seq = boot, 2, inc, 1
		return *r
	}
	for _, c := range []struct {
		trusted, rec      fencing.LeaseRecord
		wBoot             string
		wInc              uint64
		other, otherNoFix bool
	}{
		// the comeback's agent restarted: spared (refused before the fix)
		{trusted: mk("boot-2", 200), rec: mk("boot-2", 300), wBoot: "boot-1", wInc: 100, other: false, otherNoFix: true},
		// an earlier process of the trusted record's boot: refused
		{trusted: mk("boot-2", 200), rec: mk("boot-2", 150), wBoot: "boot-1", wInc: 100, other: true, otherNoFix: true},
		// the withdrawal's boot: an incarnation between the trusted
		// record's and the withdrawal's stays refused
		{trusted: mk("boot-1", 100), rec: mk("boot-1", 200), wBoot: "boot-1", wInc: 300, other: true, otherNoFix: true},
		// the trusted record's own process: spared (X101)
		{trusted: mk("boot-2", 200), rec: mk("boot-2", 200), wBoot: "boot-1", wInc: 100, other: false, otherNoFix: false},
	} {
		h := &hostState{trustedRev: 5, rev: 5, rec: c.trusted}
		h.beacons.withdrew, h.beacons.withdrewBoot, h.beacons.withdrewInc = 9, c.wBoot, c.wInc
		r := c.rec
		if got := tr.otherProcessWhileWithdrawn(h, &r); got != c.other {
			t.Errorf("trusted %s/%d, withdrawal %s/%d, record %s/%d: another process %t, want %t", c.trusted.BootID, c.trusted.Incarnation, c.wBoot, c.wInc, r.BootID, r.Incarnation, got, c.other)
		}
		otherProcessLaterIncMutation = true
		got := tr.otherProcessWhileWithdrawn(h, &r)
		otherProcessLaterIncMutation = false
		if got != c.otherNoFix {
			t.Errorf("mutation: trusted %s/%d, record %s/%d: another process %t, want %t", c.trusted.BootID, c.trusted.Incarnation, r.BootID, r.Incarnation, got, c.otherNoFix)
		}
	}
}
