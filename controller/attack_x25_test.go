package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X25: TestX25OtherControllersPinAboveCarry (the main
// invariant: a withdrawn host, guests running, declared).
//
// The carry's pin bound (Runner.restoreMemory: a pin with KeyRev ≤
// carry.rev is not taken) is per PROCESS: carry.rev is the last revision
// THIS controller's watch was delivered. The memory bucket is shared by
// the two controllers. Leader L and standby S both watch; the lease
// stream rolls back a little (a clustered stream's new leader lacking a
// few acknowledged writes: no reconnect). S's connection reconnected (or
// its 2 s check simply came first): S finds the rollback at once —
// carry_S.rev = M, the last revision both were delivered — and its fresh
// tracker S2 lists the stream. Meanwhile h3 stopped in order (withdrawal
// at a REUSED revision ≤ M: neither old watch delivers it, and its beacon
// names a revision below L's trusted one: dropped) and the compromised
// node wrote garbage over h3's key, so S2 lists garbage (trustedRev 0).
// The stream passes M before L's next check: the compromised node's next
// garbage over h3 (revision > M) reaches L's old watch, which moves h3's
// pin along with the stale pre-rollback active record and writes it
// (rollback.go's own X21 scenario). L then finds the rollback — and dies
// (or loses the lock: the memory writes of StreamRolledBack fail on the
// NATS incident that caused the rollback, and its fresh tracker is a
// standby that writes nothing). S2 takes over: restoreMemory drops only
// pins at or below ITS carry.rev (M); L's pin is above it, stamped with
// the very message S2 delivered, so RestoreMemory takes it, and h3 —
// withdrawn, guests running — is declared.
//
// "control-leader-writes-dropped-pins" (passes): L's StreamRolledBack
// writes reach the bucket; h3 is not declared. "leader-dies" failed with
// the bound on the pin's key revision (KeyRev ≤ carry.rev). Fixed: a
// fresh tracker refuses every pin whose record was trusted at or below
// its carried revision (Tracker.AfterRollback), wherever the pin moved.
// Fix direction: a pin must not be taken by a tracker started after a
// rollback unless it was written after that tracker's own listing
// (e.g. compare KeyRev with the revision the fresh tracker listed at, not
// the old watch's, or stamp pins with the writer's rollback epoch).
func TestX25OtherControllersPinAboveCarry(t *testing.T) {
	for _, c := range []struct {
		name    string
		lWrites bool
	}{
		{"control-leader-writes-dropped-pins", true},
		{"leader-dies", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys)
			backupRev := b.rev
			b.run(at, 2, hosts, nil) // acknowledged, then lost
			at = at.Add(2 * time.Second)
			L := b.tr
			M := b.delivered
			// S's old tracker was delivered what L was.
			carryS := &rollbackCarry{withdrawn: L.Withdrawals(), counted: L.CountedSilent(at), rev: M}
			// The rollback: nobody's old watch gets a revision ≤ M again.
			b.keys, b.rev = backup, backupRev
			b.tr = nil
			b.manual = true
			lAlive := true
			var S2 *Tracker
			// land everywhere: S2 (if started) gets every write; L only
			// above M (its watch resumes at M+1); L, acting, writes its
			// memories.
			fan := func(now time.Time, host string) {
				e := b.keys[host]
				if S2 != nil {
					deliver(S2, now, host, e)
				}
				if lAlive && e.rev > M {
					deliver(L, now, host, e)
					b.delivered = max(b.delivered, e.rev)
					hs, ms := L.Memories(0)
					for i, h := range hs {
						b.mem[h] = ms[i]
					}
				}
			}
			renew := func(now time.Time) {
				for _, h := range live {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
					fan(now, h)
					if S2 != nil {
						S2.ObserveBeacon(now, h, b.keys[h].rev)
					}
					if lAlive {
						L.ObserveBeacon(now, h, b.keys[h].rev)
					}
				}
			}
			now := at.Add(100 * time.Millisecond)
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // orderly stop, reused revision
			wRev := b.keys["h3"].rev
			L.ObserveWithdrawal(now, "h3", wRev) // its beacon: below L's trusted revision, dropped
			b.garbage(now.Add(50*time.Millisecond), "h3")
			// S finds the rollback; S2 lists the stream.
			now = now.Add(100 * time.Millisecond)
			S2 = x10Tracker(t)
			names := sortedKeys(b)
			sortByRev(names, b)
			for _, h := range names {
				S2.Skipped(b.keys[h].rev)
				deliver(S2, now, h, b.keys[h])
			}
			S2.WatchStarted(now)
			S2.AfterRollback(carryS.rev) // as Runner.Run
			for _, w := range carryS.withdrawn {
				S2.KeepWithdrawn(w, carryS.rev)
			}
			S2.RestoreGuard(b.guard)
			t.Logf("M %d, backup %d, h3 withdrew at %d, S2 listed at %d: h3 trustedRev %d", M, backupRev, wRev, b.rev, S2.hosts["h3"].trustedRev)
			// Writes until the stream passes M.
			for s := 1; b.rev <= M+3; s++ {
				renew(now.Add(time.Duration(s) * 100 * time.Millisecond))
			}
			now = now.Add(time.Second)
			b.garbage(now, "h3") // above M: L's old watch gets it
			fan(now, "h3")
			g := b.keys["h3"]
			p := b.mem["h3"].Pin
			if p == nil || p.KeyRev != g.rev {
				t.Fatalf("rig: L did not move h3's pin to %d: %+v", g.rev, p)
			}
			t.Logf("L's pin on h3: KeyRev %d (carry_S.rev %d), record %s at %d", p.KeyRev, carryS.rev, p.Record.State, p.TrustedRev)
			now = now.Add(500 * time.Millisecond)
			if c.lWrites {
				L.StreamRolledBack(now, "test")
				hs, ms := L.Memories(0)
				for i, h := range hs {
					b.mem[h] = ms[i]
				}
			}
			lAlive = false // L dies (or loses the lock) here
			// S2 takes over after the leader TTL: its first acting tick.
			for s := 1; s <= 11; s++ {
				renew(now.Add(time.Duration(s) * time.Second))
				S2.Tick(now.Add(time.Duration(s) * time.Second))
			}
			now = now.Add(11 * time.Second)
			b.tr = S2
			b.manual = false
			for _, h := range S2.Hosts() { // Runner.restoreMemory (S2 was told AfterRollback(carry_S.rev))
				if m, ok := b.mem[h]; ok {
					S2.RestoreMemory(now, h, m)
				}
			}
			b.flush()
			host, after := b.run(now, 120, live, map[string]bool{"h3": true})
			if host != "" {
				t.Fatalf("h3 (withdrawn in order at revision %d, guests running) declared %s after S2 took over: it took L's pin (KeyRev %d > its own carry.rev %d) resting on h3's pre-rollback active record", wRev, after, p.KeyRev, carryS.rev)
			}
		})
	}
}

// Reviewer X25: TestX25RollbackResurrectedWithdrawalsEndHeldRackHold (the
// main invariant: a Held rack's hosts, guests running, declared; no
// attacker needed).
//
// The fresh tracker the daemon starts on a rolled-back stream lists the
// stream as it is now and carries only what the stopped one knew
// WITHDRAWN (KeepWithdrawn) — nothing of the hosts it knew active and
// counted by the mass-failure guard. 60 hosts, threshold 10. Five hosts
// (h1..h5) were stopped for maintenance when the backup was taken, and
// came back since. The rack h1..h12 is then cut off and Held: C1 counts
// 12 silent and holds (nobody of the rack declared). The lease stream is
// restored from that backup: the keys of h1..h5 hold their old withdrawn
// records again. The fresh tracker takes them as withdrawn — "never
// declared, not counted by the guard" — and counts only h6..h12 (7 < 10):
// the hold ends and h6..h12, Held with guests running, are declared.
// The stopped tracker knew h1..h5 active (their records after the
// backup): what it knew for certain — the hosts counted silent — is lost.
//
// "control-no-resurrection" (passes): the backup holds h1..h5 active; the
// fresh tracker counts 12 and holds. "resurrected" failed: a Held host
// declared. Fixed: the fresh tracker keeps counting the hosts the stopped
// one counted silent until they write a newer record (Tracker.KeepCounted);
// "resurrected/countedCarryMutation" shows the hole.
// Fix direction: carry the hosts the stopped tracker counted (and the
// hold) too; a carried host's trusted record newer than the listed one
// (epoch, incarnation, seq) wins over a listed withdrawn record.
func TestX25RollbackResurrectedWithdrawalsEndHeldRackHold(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name      string
		withdrawn bool
		mutation  bool // countedCarryMutation: the hole, as before KeepCounted
		// gone: h1..h5 joined after the backup, whose stream holds no key
		// of theirs (reviewer X37's note: KeepCounted dropped the carry
		// of a host not listed); untracked: countedUntrackedMutation.
		gone, untracked bool
	}{
		{"control-no-resurrection", false, false, false, false},
		{"resurrected", true, false, false, false},
		{"resurrected/countedCarryMutation", true, true, false, false},
		{"keys-gone", false, false, true, false},
		{"keys-gone/countedUntrackedMutation", false, true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			countedCarryMutation = c.mutation && !c.untracked
			countedUntrackedMutation = c.untracked
			defer func() { countedCarryMutation, countedUntrackedMutation = false, false }()
			b, hosts := x11Fleet(t, 60, 5)
			maint := x10Names(1, 6)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			if c.withdrawn {
				for _, h := range maint { // maintenance: orderly stops
					b.write(at, h, fencing.LeaseWithdrawn, b.guard.Ref())
					b.tr.ObserveWithdrawal(at, h, b.keys[h].rev)
					b.flush()
				}
				b.run(at, 3, x11Without(hosts, maint...), nil)
				at = at.Add(3 * time.Second)
			}
			backup := maps.Clone(b.keys)
			if c.gone {
				for _, h := range maint {
					delete(backup, h)
				}
			}
			backupRev := b.rev
			b.run(at, 30, hosts, nil) // h1..h5 back (their agents restarted)
			at = at.Add(30 * time.Second)
			if host, _ := b.run(at, 40, live, x10Set(rack)); host != "" || !b.tr.Holding() {
				t.Fatalf("C1 declared %q / not holding (rig)", host)
			}
			at = at.Add(40 * time.Second)
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(at.Add(500*time.Millisecond), start)
			if h1 := b.tr.hosts["h1"]; h1 != nil {
				t.Logf("carried %d withdrawals; fresh tracker: h1 %q, silent %d, threshold %d", len(carry.withdrawn), h1.rec.State, b.tr.Silent(start), b.tr.Threshold())
			} else {
				t.Logf("carried %d withdrawals; fresh tracker: h1 not tracked, silent %d, threshold %d", len(carry.withdrawn), b.tr.Silent(start), b.tr.Threshold())
			}
			host, after := b.run(start, 120, live, x10Set(rack))
			switch {
			case c.mutation && host == "":
				t.Fatalf("with countedCarryMutation no Held host was declared: the case shows nothing")
			case !c.mutation && host != "":
				t.Fatalf("the fresh tracker declared the Held %s %s after its start (silent %d, threshold %d): the rollback's resurrected withdrawals of h1..h5 ended the hold", host, after, b.tr.Silent(start.Add(after)), b.tr.Threshold())
			}
		})
	}
}
