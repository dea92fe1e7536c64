package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX106ListedComebackRebootWhileMemoryWithdrawn (attack on liveness,
// (S): a LIVE host declared; faults needed: the host's beacons lost (its
// beacon subject down / beacons shed) and a controller restart; NO
// attacker action). X102's setting: h3 (boot-1) withdrew in order, its
// beacon handled (Memory.Withdrew: boot-1), the controller restarted and
// listed h3's comeback on boot-2 (trusted: first record, the memory's
// withdrawal restored after it). The memory's withdrawal stands (no
// beacon ends it). X102 spared the trusted active record's own process
// and later incarnations of ITS boot. But the host then REBOOTS again
// (an ordinary reboot, or a kernel-panic reboot): its agent on boot-3
// renews on the key's current state (PrevRev = the trusted record's
// revision, no copy, nothing hidden). otherProcessWhileWithdrawn's last
// line refuses it — rec.BootID (boot-3) != the withdrawal's (boot-1) —
// and every later renewal of boot-3 the same: the trusted record (boot-2's
// active) goes stale and the live, renewing host is declared.
// Receipt check: does NOT stop it — boot-1's withdrawal receipt names the
// revision the trusted boot-2 record was sealed for (PrevRev), not above
// it: SealedBefore is false (logged). Control: reboot=false (boot-2
// renews on) → not declared.
//
// Fixed: a record sealed at or after the trusted comeback's revision is
// not "another process" (otherProcessWhileWithdrawn;
// TestX106SealedAfterMutationReopens).
func TestX106ListedComebackRebootWhileMemoryWithdrawn(t *testing.T) {
	for _, reboot := range []bool{false, true} {
		t.Run(fmt.Sprintf("reboot=%t", reboot), func(t *testing.T) {
			declared, rc, tr := x106ListedComebackReboot(t, reboot)
			if declared != "" {
				t.Errorf("(S) the live h3 (renewing on boot-3 after a reboot, its beacons lost) declared at %s (receipt SealedBefore %t)", declared, tr.SealedBefore("h3", rc))
			}
		})
	}
}

func x106ListedComebackReboot(t *testing.T, reboot bool) (string, fencing.Beacon, *Tracker) {
	b, live := x100Fleet(t)
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	w := b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, true)
	if m := b.mem["h3"].Withdrew; m == nil || m.Boot != "boot-1" {
		t.Fatalf("rig: memory %+v", m)
	}
	rc := fencing.Beacon{Host: "h3", BootID: "boot-1", State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 2, Incarnation: 100, Seq: 4}
	b.stop()
	at = at.Add(time.Second)
	b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", 2, 200, 1, false)
	c2 := b.start(at.Add(100 * time.Millisecond))
	if h := c2.hosts["h3"]; h.trustedRev == 0 || h.beacons.withdrewBoot != "boot-1" {
		t.Fatalf("rig: listed comeback trusted %d, withdrawal of %q", h.trustedRev, h.beacons.withdrewBoot)
	}
	boot, inc, seq := "boot-2", uint64(200), uint64(1)
	for s := 1; s <= 120; s++ {
		now := at.Add(time.Duration(s) * time.Second)
		if reboot && s == 10 {
			boot, inc, seq = "boot-3", 50, 0 // the host rebooted: its agent on the next boot
		}
		seq++
		b.x99Write(now, "h3", fencing.LeaseActive, boot, 2, inc, seq, false)
		for _, hh := range live {
			b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		for _, d := range c2.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h3" {
				return fmt.Sprint(s, "s"), rc, c2
			}
		}
	}
	return "", rc, c2
}

// TestX106ListedComebackRebootWhileMemoryWithdrawn/otherProcessMutation:
// the control showing the refusal is otherProcessWhileWithdrawn's (the
// diff's): with it off, the rebooted host's renewals are trusted.
func TestX106ListedComebackRebootControlOtherProcessMutation(t *testing.T) {
	x32Mutate(t, &otherProcessMutation)
	if declared, _, _ := x106ListedComebackReboot(t, true); declared != "" {
		t.Fatalf("control: with otherProcessMutation the live h3 declared at %s too — not the diff's refusal", declared)
	}
}

// TestX106OneTakeWithdrawalThenReboots (attack on liveness, (S): a LIVE
// host declared; faults needed: NO controller restart, NO attacker — h3's
// withdrawal beacon and its comeback's first beacon land in ONE beacon
// take (an orderly stop then a quick start/reboot within the runner's take
// interval, or the withdrawal beacon ~a take late), then the host's
// beacons lost (as X102's), then a further reboot). Runner.Run handles a
// take's beacons first (observeBeacons: ObserveBeacon of the comeback's
// revision) and its withdrawals after (ObserveWithdrawalBy): the
// withdrawal, below maxRev, is ignored for withdrawnRev but its
// withdrew/withdrewBoot (boot-1) are set and stand — no later beacon comes
// to end them. The comeback (boot-2), trusted, renews on as the trusted
// record's own process (spared). The host reboots again: boot-3's
// renewals, written on the key's state, are refused by
// otherProcessWhileWithdrawn's last line (boot-3 != boot-1) and the live
// host is declared. Receipt check: does not stop it (boot-1's receipt
// names the trusted record's PrevRev, not above: SealedBefore false,
// logged). Control: reboot=false → not declared.
//
// comeback=boot-1: the comeback is the SAME boot's next agent process
// (an orderly agent restart: package upgrade) — one reboot afterwards
// suffices.
//
// Fixed as TestX106ListedComebackRebootWhileMemoryWithdrawn is.
func TestX106OneTakeWithdrawalThenReboots(t *testing.T) {
	for _, cb := range []struct {
		boot string
		inc  uint64
	}{{"boot-2", 50}, {"boot-1", 200}} {
		for _, reboot := range []bool{false, true} {
			t.Run(fmt.Sprintf("comeback=%s/reboot=%t", cb.boot, reboot), func(t *testing.T) { x106OneTake(t, cb.boot, cb.inc, reboot) })
		}
	}
}

func x106OneTake(t *testing.T, cbBoot string, cbInc uint64, reboot bool) {
	{
		{
			b, live := x100Fleet(t)
			at := t0
			for seq := uint64(1); seq <= 3; seq++ {
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
			}
			w := b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, false)
			c := b.x99Write(at.Add(500*time.Millisecond), "h3", fencing.LeaseActive, cbBoot, 2, cbInc, 1, false)
			// One take (Runner.Run): its beacons first, its withdrawals after.
			now := at.Add(600 * time.Millisecond)
			for _, e := range []struct {
				rev, inc, seq uint64
				boot          string
			}{{w.rev, 100, 4, "boot-1"}, {c.rev, cbInc, 1, cbBoot}} {
				b.tr.ObserveBeacon(now, "h3", e.rev)
				b.tr.BeaconWrote("h3", e.rev, 2, e.inc, e.seq)
				b.tr.BeaconVouches(now, "h3", e.rev, e.boot, 2, e.inc, e.seq)
			}
			b.tr.ObserveWithdrawalBy(now, "h3", w.rev, "boot-1", 100)
			b.flush()
			hs := b.tr.hosts["h3"]
			t.Logf("after the take: trusted %d (%s %s), withdrew %d (%s), withdrawnRev %d", hs.trustedRev, hs.rec.State, hs.rec.BootID, hs.beacons.withdrew, hs.beacons.withdrewBoot, hs.beacons.withdrawnRev)
			rc := fencing.Beacon{Host: "h3", BootID: "boot-1", State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 2, Incarnation: 100, Seq: 4}
			boot, inc, seq := cbBoot, cbInc, uint64(1)
			for s := 1; s <= 120; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				if reboot && s == 10 {
					boot, inc, seq = "boot-3", 70, 0 // the host rebooted
				}
				seq++
				b.x99Write(now, "h3", fencing.LeaseActive, boot, 2, inc, seq, false) // beacons lost
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						t.Fatalf("(S) the live h3 (renewing on %s, beacons lost) declared at %ds (receipt SealedBefore %t)", boot, s, b.tr.SealedBefore("h3", rc))
					}
				}
			}
		}
	}
}

// TestX106OneTakeControlOtherProcessMutation: with otherProcessWhileWithdrawn
// off, TestX106OneTakeWithdrawalThenReboots' live host is not declared
// (the refusal is the diff's).
func TestX106OneTakeControlOtherProcessMutation(t *testing.T) {
	x32Mutate(t, &otherProcessMutation)
	t.Run("", func(t *testing.T) { TestX106OneTakeWithdrawalThenReboots(t) })
}

// TestX106SealedAfterMutationReopens: the fix of reviewer X106's break —
// a record sealed at or after the trusted comeback's revision is not
// "another process" — is what keeps the rebooted live host trusted: with
// otherProcessSealedAfterMutation its renewals are refused again and,
// beacons lost, it is declared.
func TestX106SealedAfterMutationReopens(t *testing.T) {
	x32Mutate(t, &otherProcessSealedAfterMutation)
	if declared, _, _ := x106ListedComebackReboot(t, true); declared == "" {
		t.Fatalf("mutation: the rebooted live h3 not declared — the layer is not what keeps it trusted")
	}
}
