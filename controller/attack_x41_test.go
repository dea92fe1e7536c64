package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X41: attacks on the rollback carries (8ca7a08).

// TestX41ListedOlderWithdrawalDropsReplayBar (S1: a compromised node that
// kept a copy of one of the victim's genuine records; one lease-stream
// rollback — no forgery).
//
// KeepWithdrawn returns early when the fresh tracker's LISTED record is
// already withdrawn (`h.rec.State == fencing.LeaseWithdrawn ||
// h.beaconWithdrawn()`): it neither sets h.rec to the carried (newer)
// withdrawn record nor h.carried — the replay bar (replay(): notNewer
// against h.carried). docs/security.md says "only records older than a
// carried one are refused"; here none is. The rollback may well list an
// OLDER withdrawal of the host: the backup was taken during an earlier
// maintenance stop (W0, incarnation 1). The host came back (incarnation
// 2, renewals R1..R10) and stopped in order again (W1, guests run on);
// the stream rolls back to the backup. The fresh tracker lists W0 and
// drops the carry of W1. The compromised node puts back its copy of R5
// (incarnation 2, prev_rev above the backup's revision: not stale by
// StaleRecord): trusted, h3 active, and — silent — declared
// lease_ttl + grace later while its guests run. Withdrawals then hands on
// W0 (h.carried nil), so a second rollback carries the older record too.
//
// Controls: no rollback, same copy (stale prev_rev) — not declared; the
// backup taken while h3 was active (listed active: carried W1 set, the
// copy refused as not newer) — not declared.
// Fix direction: KeepWithdrawn must set h.carried (and h.rec) to the
// newer of the listed and carried records also when the listed one is
// withdrawn / beacon-withdrawn.
func TestX41ListedOlderWithdrawalDropsReplayBar(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name         string
		rollback     bool
		backupActive bool
		wantHeld     bool
		mut          *bool
	}{
		{name: "control-no-rollback", wantHeld: true},
		{name: "control-backup-while-active", rollback: true, backupActive: true, wantHeld: true},
		{name: "attack/backup-during-earlier-withdrawal", rollback: true},
		{name: "attack/backup-during-earlier-withdrawal/listedWithdrawnBarMutation", rollback: true, mut: &listedWithdrawnBarMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.mut != nil {
				x32Mutate(t, &rollbackBarMutation) // the rollback bar refuses the copy too (X24's reused-revision replays)
			}
			b, hosts := x11Fleet(t, 60, 5)
			const target = "h3"
			others := x11Without(hosts, target)
			at := t0.Add(5 * time.Second)
			var seq uint64
			inc := uint64(1)
			kept := map[uint64]fencing.LeaseRecord{}
			tick := func(secs int, on bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if on {
						seq++
						r := x38Put(b, now.Add(500*time.Millisecond), target, fencing.LeaseActive, inc, seq)
						if inc == 2 {
							kept[seq] = r
						}
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(3, true)
			var backup map[string]x11Entry
			var backupRev uint64
			if c.backupActive {
				backup, backupRev = maps.Clone(b.keys), b.rev
			}
			seq++
			x38Put(b, at, target, fencing.LeaseWithdrawn, inc, seq) // W0: maintenance stop
			tick(5, false)
			if !c.backupActive {
				backup, backupRev = maps.Clone(b.keys), b.rev // h3: W0
			}
			inc, seq = 2, 0 // back (agent restarted)
			tick(10, true)
			seq++
			x38Put(b, at, target, fencing.LeaseWithdrawn, inc, seq) // W1: stopped in order again, guests run on
			tick(3, false)
			if b.tr.hosts[target].rec.State != fencing.LeaseWithdrawn {
				t.Fatalf("rig: h3 not withdrawn")
			}
			if c.rollback {
				b.rollBack(maps.Clone(backup), backupRev)
				carry := b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
				at = at.Add(time.Second)
				for _, w := range carry.withdrawn {
					if w.Host == target {
						t.Logf("rollback (to rev %d): h3 carried inc %d seq %d (%s)", backupRev, w.Record.Incarnation, w.Record.Seq, w.Why)
					}
				}
				h := b.tr.hosts[target]
				t.Logf("fresh tracker: h3 %q inc %d seq %d, carried set %t", h.rec.State, h.rec.Incarnation, h.rec.Seq, h.carried != nil)
				for _, w := range b.tr.Withdrawals() { // what a second rollback would hand on
					if w.Host == target {
						t.Logf("a second rollback now would carry h3 as inc %d seq %d", w.Record.Incarnation, w.Record.Seq)
					}
				}
			}
			now := at
			for i := 0; i < 25; i++ { // the stream refills past the copy's prev_rev
				b.run(now, 1, others, nil)
				now = now.Add(time.Second)
			}
			cp := kept[5]
			cur := b.keys[target]
			b.land(now, target, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			h := b.tr.hosts[target]
			t.Logf("copy of h3's inc 2 seq 5 (prev_rev %d) put back at rev %d: h3 %q inc %d seq %d", cp.PrevRev, b.rev, h.rec.State, h.rec.Incarnation, h.rec.Seq)
			host, after := b.run(now, 120, others, map[string]bool{target: true})
			switch {
			case c.mut != nil && host == "":
				t.Fatalf("with the mutation h3 was not declared: the case shows nothing")
			case c.mut != nil:
				t.Logf("with the mutation: h3 declared %s after the copy", after)
				return
			case c.wantHeld && host != "":
				t.Fatalf("control: the withdrawn h3 declared %s after (rig)", after)
			case host != "":
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the copy: KeepWithdrawn returned early on the listed OLDER withdrawal W0 and set no replay bar (h.carried), so a copy of a record between W0 and the carried W1 was trusted", after)
			}
			t.Logf("h3 not declared")
		})
	}
}
