package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X43: attacks on the pending counted carry (CountedSilent's
// From, Observe's countFrom reset) under review.

// TestX43HiddenRenewalCopyEndsPendingCarry (S1, compromised node + a
// lease-stream rollback; X42's scenario). The compromised node supersedes
// the last renewal R(k) of two rack hosts (h1, h2) with garbage before the
// controller's watch delivers it (X5's supersede; the hosts' beacons name
// R(k), so the old tracker sees them alive but trusts R(k-1)). The rack is
// cut off 2 s before the rollback is found: h1, h2 are carried with Record
// R(k-1) and From = lastSeen + silentAft. The fresh tracker lists them
// withdrawn (the backup's old withdrawals). The node writes its copy of
// R(k) — genuine, newer than the carried record, its prev_rev from the old
// numbering above the rolled-back stream's revisions, so not stale — before
// From: Observe ends the carry without a guard window (it had not
// counted), and re-landing the same copy every second restarts lastSeen
// (StaleRecord only compares prev_rev): h1, h2 never count, 10 <= 10, no
// hold, a Held rack host is declared 22 s after the fresh start.
// cut-40s-counted: the same against a carry that counted at once (X25's,
// From zero; also fails on 9dddd57 — not introduced by this change): the
// copy's guard window (silentEnd) runs out after 60 s and the hold ends.
// Needs the rollback to lose more revisions than the fresh stream writes
// until the declaration (a backup restore; the copies' prev_rev must stay
// at or above the key's revision). HELD: one copy only (h1, h2 count again
// suspect_after later); copies of the carried R(k-1) (refused by the bar);
// keys gone (a first value must be written fresh: Written.Fresh).
// Fix direction: a signed record whose prev_rev is not below the revision
// it landed on cannot be a fresh write (a replay from before the rollback):
// refuse it; and keep a pending carry counting from From even if ended.
func TestX43HiddenRenewalCopyEndsPendingCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name     string
		cutSecs  int
		copies   bool
		wantHeld bool
		carried  bool // copies of the carried record R(k-1), not of R(k)
		gone     bool // the backup holds no key of h1..h5 (HELD: a first value must be written fresh)
		once     bool // one copy each, not re-landed (HELD: h1, h2 count sa later)
		// passed: the fresh stream has passed the copies' prev_rev
		// before they land (a rollback losing less than it rewrites).
		passed bool
		mut    *bool
	}{
		{name: "held/one-copy-only/cut-2s", cutSecs: 2, copies: true, wantHeld: true, once: true},
		{"held/keys-gone/copies/cut-2s", 2, true, true, false, true, false, false, nil},
		{"control-no-copies/cut-2s", 2, false, true, false, false, false, false, nil},
		{"control-copies-of-carried-record/cut-2s", 2, true, true, true, false, false, false, nil},
		{"attack/copies/cut-2s", 2, true, false, false, false, false, false, nil},
		{"attack/copies/cut-40s-counted", 40, true, false, false, false, false, false, nil},
		{"attack/copies/cut-2s/prevRevMutation+carryWrittenMutation", 2, true, false, false, false, false, false, &prevRevMutation},
		// The stream past the copies' prev_rev: refused as not written
		// fresh (NeedsWritten while a carry holds); in this rig the
		// host's rollback carry of its hidden write holds it too.
		{"held/copies-stream-passed/cut-2s", 2, true, true, false, false, false, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.mut == &prevRevMutation {
				x32Mutate(t, &carryWrittenMutation) // the two defences overlap
				x32Mutate(t, &heldBackMutation)     // and a third (reviewer X85)
				x32Mutate(t, &unseenPrevMutation)   // and a third (reviewer X69)
			}
			b, hosts := x11Fleet(t, 60, 5)
			maint := x10Names(1, 6)
			rack := x10Names(1, 13)
			targets := []string{"h1", "h2"}
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			for _, h := range maint {
				b.write(at, h, fencing.LeaseWithdrawn, b.guard.Ref())
				b.tr.ObserveWithdrawal(at, h, b.keys[h].rev)
				b.flush()
			}
			b.run(at, 3, x11Without(hosts, maint...), nil)
			at = at.Add(3 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			if c.gone {
				for _, h := range maint {
					delete(backup, h)
				}
			}
			// h1..h5 back; h1, h2 renew with signed records (inc 2, seq 1..).
			var seq uint64
			var hidden map[string]fencing.LeaseRecord
			prior := map[string]fencing.LeaseRecord{}
			for s := 0; s < 60; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				last := s == 59
				if last {
					hidden = map[string]fencing.LeaseRecord{}
				}
				for _, h := range targets {
					if !last {
						prior[h] = x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
						continue
					}
					// R(k): superseded by garbage before the watch delivers it;
					// its beacon comes (the host is not cut off yet).
					c1 := b.tr
					b.tr = nil
					hidden[h] = x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
					wRev := b.rev
					b.tr = c1
					b.tr.Skipped(wRev + 1)
					b.garbage(now.Add(600*time.Millisecond), h)
					b.tr.ObserveBeacon(now.Add(600*time.Millisecond), h, wRev)
					b.flush()
				}
				b.run(now, 1, x11Without(hosts, targets...), nil)
			}
			at = at.Add(60 * time.Second)
			if host, _ := b.run(at, c.cutSecs, live, x10Set(rack)); host != "" {
				t.Fatalf("C1 declared %q (rig)", host)
			}
			at = at.Add(time.Duration(c.cutSecs) * time.Second)
			detect := at.Add(500 * time.Millisecond)
			t.Logf("rack cut off %d s: C1 counts %d silent (threshold %d), holding %t; h1 trusted seq %d", c.cutSecs, b.tr.Silent(detect), b.tr.Threshold(), b.tr.Holding(), b.tr.hosts["h1"].rec.Seq)
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(detect, start)
			for _, ch := range carry.counted {
				if ch.Host == "h1" {
					t.Logf("carried h1: seq %d From %v (start +%v)", ch.Record.Seq, !ch.From.IsZero(), ch.From.Sub(start))
				}
			}
			for _, w := range carry.withdrawn {
				if w.Host == "h1" {
					t.Logf("h1 carried withdrawn too: %s", w.Why)
				}
			}
			protect := x10Set(rack)
			now := start
			if c.passed {
				b.rev += 100_000 // the fresh stream's writes since (the others')
			}
			for s := 0; s < 120; s++ {
				if c.copies && (!c.once || s == 0) {
					for _, h := range targets {
						cp := hidden[h]
						if c.carried {
							cp = prior[h]
						}
						cur := b.keys[h]
						b.land(now.Add(100*time.Millisecond), h, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
					}
				}
				host, _ := b.run(now, 1, live, protect)
				now = now.Add(time.Second)
				if host != "" {
					after := now.Sub(start)
					h1 := b.tr.hosts["h1"]
					if c.mut != nil {
						t.Logf("with the mutation: the Held %s declared %s after the fresh start", host, after)
						return
					}
					if c.wantHeld {
						t.Fatalf("control: the Held %s declared %s after the fresh start (rig)", host, after)
					}
					t.Fatalf("the Held %s (rack cut off, guests running) declared %s after the fresh start: copies of h1/h2's hidden renewal R(k) (newer than the carried R(k-1)) ended the pending carry with no guard window and keep restarting lastSeen (h1 %q seq %d countedCarry %t; silent %d, threshold %d)",
						host, after, h1.rec.State, h1.rec.Seq, h1.countedCarry != nil, b.tr.Silent(now), b.tr.Threshold())
				}
			}
			if c.mut != nil {
				t.Fatalf("with the mutation no Held host was declared: the case shows nothing")
			}
			t.Logf("no Held host declared; holding %t silent %d threshold %d", b.tr.Holding(), b.tr.Silent(now), b.tr.Threshold())
		})
	}
}
