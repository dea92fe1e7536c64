package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X79: attacks on 7cc0f6c's range (vouch candidates, quiet pins).

// x79CandidateCopy: under the delete loop across a start (x71Rig, no
// trusted record), compute-3's create C lands at R (kept unfresh); the
// compromised compute-1 puts back a copy of a record of compute-3's it
// holds from before (old) at R+1 — a later vouchable value, kept beside C
// as a candidate — then deletes. C's beacon vouches C and the candidate
// is re-observed with plain Observe. compute-3 then dies. It returns
// whether the dead compute-3 was declared within 3 minutes.
func x79CandidateCopy(t *testing.T, old *fencing.LeaseRecord, w fencing.Written, rounds int) (bool, *x71Rig) {
	x := newX71Rig(t)
	x.rounds("vbm", rounds)
	R, c := x.create()
	next := R + 1
	if old != nil {
		if w.HasExpected {
			w.Expected = R
		}
		x.value(next, *old, w)
		next++
	}
	x.marker = next
	x.del(x.marker)
	x.beacon(R, c)
	x.rev = x.marker
	h := x.tr.hosts[x71Host]
	t.Logf("after vouch: state %q trustedRev %d rev %d deleted %t", h.rec.State, h.trustedRev, h.rev, h.deleted)
	for _, d := range x.said {
		if d.Op != OpInvalid && d.Op != OpLeaseDeleted {
			t.Logf("  %s %d: %.160s", d.Op, d.Revision, d.Reason)
		}
	}
	_, _, ok := x.tick(3 * time.Minute)
	return ok, x
}

func TestX79CandidateOldWithdrawalCopy(t *testing.T) {
	mk := func(boot string, inc, seq, prev uint64, st fencing.LeaseState) *fencing.LeaseRecord {
		r := rec(x71Host, fencing.BackstopWatchdog)
		r.Signer, r.Sig, r.BootID, r.Epoch, r.Incarnation, r.Seq, r.State, r.PrevRev = x71Host+"-key", "signed", boot, 1, inc, seq, st, prev
		if st == fencing.LeaseWithdrawn {
			r.Reason = "orderly-stop"
		}
		return r
	}
	for _, c := range []struct {
		name   string
		old    *fencing.LeaseRecord
		w      fencing.Written
		rounds int
	}{
		{name: "control", rounds: 3},
		{name: "oldboot-withdrawal-put", old: mk("boot-0", 1, 50, 40, fencing.LeaseWithdrawn), w: fencing.Written{Known: true}, rounds: 3},
		{name: "oldboot-withdrawal-cas", old: mk("boot-0", 1, 50, 40, fencing.LeaseWithdrawn), w: fencing.Written{Known: true, HasExpected: true}, rounds: 3},
		{name: "oldinc-withdrawal-put", old: mk("boot-1", 1, 50, 40, fencing.LeaseWithdrawn), w: fencing.Written{Known: true}, rounds: 3},
		{name: "oldboot-create-put", old: mk("boot-0", 1, 50, 0, fencing.LeaseActive), w: fencing.Written{Known: true}, rounds: 3},
		{name: "oldboot-withdrawal-put-r0", old: mk("boot-0", 1, 50, 40, fencing.LeaseWithdrawn), w: fencing.Written{Known: true}, rounds: 0},
		{name: "oldboot-withdrawal-create-r0", old: mk("boot-0", 1, 50, 0, fencing.LeaseWithdrawn), w: fencing.Written{Known: true}, rounds: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, x := x79CandidateCopy(t, c.old, c.w, c.rounds)
			if !ok {
				h := x.tr.hosts[x71Host]
				t.Errorf("dead compute-3 not declared within 3 minutes (state %q trustedRev %d vouched %d)", h.rec.State, h.trustedRev, x.vouched())
			}
		})
	}
}

// x79ComebackFrom: 60 hosts (x11Fleet). h11 stops in order (signed
// withdrawal, its beacon) — or, declared, dies and is declared (the
// declaration lands in its key); after the guard window the compromised h59
// writes into h11's key (garbage, or a delete: kill) — C1 pins the
// withdrawal. restartBefore: C1 stops, C2 starts (restoring the pin)
// before h11's comeback. h11 comes back (boot-2, incarnation 2): its
// create/compare-and-set on the key, its beacon, then renewals with
// beacons for renewSecs; restartAfter: a restart after that. Then h11
// dies (the rest renew). It returns the decision of h11's declaration
// (if any) within 4 minutes and logs the states.
func x79ComebackFrom(t *testing.T, declared bool, kill string, restartBefore, restartAfter bool, renewSecs int) (bool, time.Duration) {
	b, hosts := x11Fleet(t, 60, 5)
	const h = "h11"
	at := t0.Add(5 * time.Second)
	others := x11Without(hosts, h)
	if declared {
		done := false
		for s := 1; s <= 200 && !done; s++ {
			at = at.Add(time.Second)
			for _, o := range others {
				b.write(at, o, fencing.LeaseActive, b.guard.Ref())
			}
			b.publish()
			for _, d := range b.tr.Tick(at) {
				if d.Op == OpDeclare && d.Host == h {
					r := d.Record
					r.Signer = "ctl-key"
					b.land(at, h, x11Entry{rec: &r})
					done = true
				}
			}
		}
		if !done || b.tr.hosts[h].rec.State != fencing.LeaseExpired {
			t.Fatalf("rig: h11 not declared")
		}
	} else {
		w := x76Signed(h, "boot-1", 1, 10, fencing.LeaseWithdrawn, b.guard.Ref(), b.keys[h].rev)
		rev := b.x76Land(at, h, w)
		b.x76Beacon(at, h, rev, w)
	}
	b.run(at, 120, others, nil)
	at = at.Add(121 * time.Second)
	switch kill {
	case "garbage":
		b.garbage(at, h)
	case "delete":
		b.del(at, h)
	}
	t.Logf("after %s: memory pin %s", kill, pinStr(b.mem[h].Pin))
	b.run(at, 5, others, nil)
	at = at.Add(6 * time.Second)
	if restartBefore {
		b.stop()
		at = at.Add(2 * time.Second)
		b.start(at)
		t.Logf("C2 restored %s: state %q trustedRev %d", h, b.tr.hosts[h].rec.State, b.tr.hosts[h].trustedRev)
	}
	prev := b.keys[h].rev
	if b.keys[h].rec == nil && !b.keys[h].garbage {
		prev = 0
	}
	cr := x76Signed(h, "boot-2", 2, 1, fencing.LeaseActive, b.guard.Ref(), prev)
	cRev := b.x76Land(at, h, cr)
	b.x76Beacon(at.Add(100*time.Millisecond), h, cRev, cr)
	for s := 1; s <= renewSecs; s++ {
		now := at.Add(time.Duration(s) * time.Second)
		for _, o := range others {
			b.write(now, o, fencing.LeaseActive, b.guard.Ref())
		}
		r := x76Signed(h, "boot-2", 2, uint64(1+s), fencing.LeaseActive, b.guard.Ref(), b.keys[h].rev)
		rv := b.x76Land(now, h, r)
		b.x76Beacon(now.Add(100*time.Millisecond), h, rv, r)
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == h {
				t.Fatalf("live h11 declared: %s", d.Reason)
			}
		}
	}
	at = at.Add(time.Duration(renewSecs) * time.Second)
	hs := b.tr.hosts[h]
	t.Logf("h11 renewing: state %q trustedRev %d key %d; pin %s", hs.rec.State, hs.trustedRev, b.keys[h].rev, pinStr(b.mem[h].Pin))
	if restartAfter {
		b.stop()
		at = at.Add(2 * time.Second)
		b.start(at)
		hs = b.tr.hosts[h]
		t.Logf("C3 restored %s: state %q trustedRev %d", h, hs.rec.State, hs.trustedRev)
	}
	// h11 dies.
	host, after := b.run(at, 240, others, map[string]bool{h: true})
	hs = b.tr.hosts[h]
	t.Logf("h11 dead: state %q trustedRev %d; declared %q after %s", hs.rec.State, hs.trustedRev, host, after)
	return host != "", after
}

func TestX79WithdrawnKeyTouchedThenComeback(t *testing.T) {
	x79Comebacks(t, false, "h11 back from maintenance (%s on its withdrawn key by h59), renewing, then dead: not declared within 4 minutes")
}

func TestX79DeclaredKeyTouchedThenComeback(t *testing.T) {
	x79Comebacks(t, true, "h11 declared, back (another boot; %s on its declared key by h59), renewing, then dead: not declared within 4 minutes")
}

// x79Comebacks runs x79ComebackFrom (declared or withdrawn first) for
// every touch of the key and restart before/after the comeback; failf
// names the touch.
func x79Comebacks(t *testing.T, declared bool, failf string) {
	for _, kill := range []string{"none", "garbage", "delete"} {
		for _, rb := range []bool{false, true} {
			for _, ra := range []bool{false, true} {
				name := kill
				if rb {
					name += "/restart-before"
				}
				if ra {
					name += "/restart-after"
				}
				t.Run(name, func(t *testing.T) {
					if ok, _ := x79ComebackFrom(t, declared, kill, rb, ra, 20); !ok {
						t.Errorf(failf, kill)
					}
				})
			}
		}
	}
}

// x79StartBeaconFirst is x11Bucket.start with host's beacons handled
// between the listing and the memory's restore — as Runner.Run does
// while it waits to act (a restarted controller waiting for the
// leadership, or a standby before its takeover: run.go handles beacons
// while watching; restoreMemory runs at the first acting tick).
// afterRestore: the beacons come after the restore instead (control).
func (b *x11Bucket) x79StartBeaconFirst(now time.Time, beacons func(), afterRestore bool) *Tracker {
	tr := x10Tracker(b.t)
	names := make([]string, 0, len(b.keys))
	for h := range b.keys {
		names = append(names, h)
	}
	sortByRev(names, b)
	for _, h := range names {
		deliver(tr, now, h, b.keys[h])
	}
	tr.WatchStarted(now)
	b.tr = tr
	b.manual = true // nothing written to the memory before the restore
	if !afterRestore {
		beacons()
	}
	for _, h := range tr.Hosts() {
		if m, ok := b.mem[h]; ok {
			tr.RestoreMemory(now, h, m)
		}
	}
	tr.RestoreGuard(b.guard)
	b.manual = false
	b.flush()
	if afterRestore {
		beacons()
	}
	return tr
}

// TestX79BeaconBeforeRestoreKeepsWithdrawnPin (S): 60 hosts, threshold
// 10, the rack h1..h12 (x10Pair: h11, h12 in it). h11, h12 stop in order
// (signed withdrawals, beacons); the compromised h59 deletes their keys
// (C1 pins the withdrawals). They come back (boot-2): each creates its
// key over the marker (kept for its beacon), h59 writes
// maxLaterValues+1 garbage values after it (the kept create dropped; C1
// moves the withdrawn pin onto the last garbage, as in X76's case). C1
// dies before the creates' beacons are handled. C2 (restarted, or a
// standby that started after the garbage) lists the keys and, while it
// waits to act, handles the creates' beacons: ObserveBeacon finds no pin
// yet to drop (h.pin nil before RestoreMemory); at its first acting tick
// RestoreMemory takes the withdrawn pins anyway — it does not look at
// the beacons already handled (maxRev above the pin's TrustedRev: what
// pinnable and ObserveBeacon refuse a quiet pin on). C2 keeps the pins
// (in the memory too). C2 itself counts h11, h12 (corroboratedRev, X13).
// The rack is cut off before h11, h12 renew or beacon again (Held). C2
// holds; C2 restarts (or a standby takes over): C3 takes the stale pins —
// h11, h12 withdrawn, uncounted — 10 silent, not > 10: the Held h1..h10
// are declared while their guests run.
//
// Control "beacons-after-restore": the same beacons after C2's restore
// (ObserveBeacon drops the pins: C3 counts the garbage keys silent,
// holds).
func TestX79BeaconBeforeRestoreKeepsWithdrawnPin(t *testing.T) {
	for _, c := range []struct {
		name         string
		afterRestore bool
		wantHole     bool // restoreQuietMutation: RestoreMemory takes the pin, as before
	}{
		{"beacons-before-restore", false, false},
		{"beacons-before-restore/restoreQuietMutation", false, true},
		{"control-beacons-after-restore", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.wantHole {
				x32Mutate(t, &restoreQuietMutation)
			}
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			at := t0.Add(5 * time.Second)
			for _, h := range x10Pair {
				w := x76Signed(h, "boot-1", 1, 10, fencing.LeaseWithdrawn, b.guard.Ref(), b.keys[h].rev)
				rev := b.x76Land(at, h, w)
				b.x76Beacon(at, h, rev, w)
			}
			b.run(at, 120, x11Without(hosts, x10Pair...), nil)
			at = at.Add(121 * time.Second)
			for _, h := range x10Pair {
				b.del(at, h)
			}
			b.run(at, 5, x11Without(hosts, x10Pair...), nil)
			at = at.Add(6 * time.Second)
			creates := map[string]uint64{}
			recs := map[string]*fencing.LeaseRecord{}
			for _, h := range x10Pair {
				cr := x76Signed(h, "boot-2", 2, 1, fencing.LeaseActive, b.guard.Ref(), 0)
				creates[h], recs[h] = b.x76Land(at, h, cr), cr
				for range maxLaterValues + 1 {
					b.garbage(at, h)
				}
				t.Logf("%s: create at %d, key at %d; C1 memory pin %s", h, creates[h], b.keys[h].rev, pinStr(b.mem[h].Pin))
			}
			// C1 dies before the beacons are handled.
			b.stop()
			start := at.Add(2 * time.Second)
			b.x79StartBeaconFirst(start, func() {
				for _, h := range x10Pair {
					b.x76Beacon(start.Add(100*time.Millisecond), h, creates[h], recs[h])
				}
			}, c.afterRestore)
			for _, h := range x10Pair {
				hs := b.tr.hosts[h]
				t.Logf("C2 %s: state %q trustedRev %d maxRev %d corroborated %d; memory pin %s", h, hs.rec.State, hs.trustedRev, hs.beacons.maxRev, hs.beacons.corroboratedRev, pinStr(b.mem[h].Pin))
			}
			// The rack is cut off (Held) before h11, h12 write or beacon again.
			live := x11Without(hosts, rack...)
			if host, after := b.run(start, 40, live, x10Set(rack)); host != "" {
				t.Fatalf("C2 declared the Held %s %s after its start", host, after)
			}
			at = start.Add(40 * time.Second)
			t.Logf("C2: holding %v, silent %d, threshold %d", b.tr.Holding(), b.tr.Silent(at), b.tr.Threshold())
			b.stop()
			start = at.Add(2 * time.Second)
			b.start(start)
			for _, h := range x10Pair {
				t.Logf("C3 restored %s: state %q (trustedRev %d)", h, b.tr.hosts[h].rec.State, b.tr.hosts[h].trustedRev)
			}
			host, after := b.run(start, 120, live, x10Set(rack))
			switch {
			case c.wantHole && host == "":
				t.Fatalf("with restoreQuietMutation C3 held: the test no longer shows the hole")
			case c.wantHole:
				t.Logf("with restoreQuietMutation: the Held %s declared %s after C3's start", host, after)
				return
			case host != "":
				t.Fatalf("C3 declared the Held %s (guests running) %s after its start (silent %d, threshold %d): h11, h12 — back from maintenance, Held with their rack, their beacons naming their creates handled by C2 before its memory restore — restored WITHDRAWN by C3 from the pins C2 took (and kept in the memory) despite those beacons",
					host, after, b.tr.Silent(start.Add(after)), b.tr.Threshold())
			}
			t.Logf("C3 held (silent %d, threshold %d)", b.tr.Silent(start.Add(120*time.Second)), b.tr.Threshold())
		})
	}
}
