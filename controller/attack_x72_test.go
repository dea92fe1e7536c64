package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X72: attacks on vouch.go, SealedBefore's namedAbove and
// deletedMember (tracker level, x71Rig).

// x72Withdraw: compute-3's current process stops in order under the
// loop: its withdrawal, a create over the marker, its beacon (the runner
// hands a withdrawal beacon to BeaconVouches and ObserveWithdrawal), then
// compute-1's delete. It returns the withdrawal and its revision.
func x72Withdraw(x *x71Rig) (fencing.LeaseRecord, uint64) {
	x.now = x.now.Add(time.Second)
	x.rev += 3
	x.r.Seq++
	x.r.PrevRev = 0
	w := *x.r
	w.State, w.Reason = fencing.LeaseWithdrawn, "stopped"
	R := x.rev
	x.value(R, w, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	x.beacon(R, w)
	x.marker = R + 1
	x.del(x.marker)
	x.rev = x.marker
	return w, R
}

// x72Copy: compute-1 deletes compute-3's key and puts back c (a create
// over its marker).
func x72Copy(x *x71Rig, c fencing.LeaseRecord) uint64 {
	x.now = x.now.Add(time.Second)
	x.marker = x.rev + 1
	x.del(x.marker)
	x.rev = x.marker + 1
	x.value(x.rev, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	return x.rev
}

// x72Declared runs the tracker up to 3 minutes; once compute-3 is due it
// replays Runner.checkReceipt on its newest receipt w (at wRev, stored at
// wStored; its receipts stream created an hour before the start).
func x72Declared(x *x71Rig, w fencing.LeaseRecord, wRev uint64, wStored time.Time) (bool, string) {
	d, after, ok := x.tick(3 * time.Minute)
	if !ok {
		return false, "tracker never due"
	}
	b := fencing.Beacon{Host: x71Host, BootID: w.BootID, Revision: wRev, Epoch: w.Epoch, Incarnation: w.Incarnation, Seq: w.Seq, State: w.State}
	if x.tr.SealedBefore(x71Host, b) {
		return false, "ErrReceiptAfterSeal"
	}
	created := t0.Add(-time.Hour)
	if x.tr.ReceiptStale(x71Host, b, wStored) {
		if x.tr.ReceiptsMatter(x71Host) && !x.tr.ReceiptsCover(x71Host, created) {
			return false, "stale, ErrReceiptsUnsound"
		}
		return true, fmt.Sprintf("declared %s (receipt stale): %s", after, d.Reason)
	}
	for _, dd := range x.tr.ObserveWithdrawal(x.now, x71Host, wRev) {
		if dd.Op == OpWithdrawn {
			return false, "ErrWithdrawalReceipt"
		}
	}
	if x.tr.ReceiptsMatter(x71Host) && !x.tr.ReceiptsCover(x71Host, created) {
		return false, "ErrReceiptsUnsound"
	}
	return true, fmt.Sprintf("declared %s: %s", after, d.Reason)
}

// TestX72OldProcessCopyAfterWithdrawal (hypothesis 2): under the loop
// across a start, compute-3's process P1 (incarnation 2) is vouched and
// names revisions in its beacons; it restarts in order (withdrawal W1),
// P2 (incarnation 3) is vouched in turn, names higher revisions, and
// stops in order (W2, its receipt the newest). compute-1 then puts back
// copies of P1's or P2's creates (P1's beacons named revisions above W1's
// receipt; for P2, above nothing after W2). The withdrawn compute-3 must
// never be declared.
func TestX72OldProcessCopyAfterWithdrawal(t *testing.T) {
	for _, which := range []string{"P1-last-create", "P1-first-create", "P2-last-create", "W1"} {
		t.Run(which, func(t *testing.T) {
			x := newX71Rig(t)
			x.rounds("vbm", 3)
			p1First := *x.r
			p1First.Seq -= 2
			x.rounds("vbm", 3)
			p1Last := *x.r
			w1, _ := x72Withdraw(x)
			x.r.Incarnation++
			x.r.Seq = 0
			x.rounds("vbm", 5)
			p2Last := *x.r
			w2, R := x72Withdraw(x)
			wStored := x.now
			var c fencing.LeaseRecord
			switch which {
			case "P1-last-create":
				c = p1Last
			case "P1-first-create":
				c = p1First
			case "P2-last-create":
				c = p2Last
			case "W1":
				c = w1
			}
			for range 5 {
				x72Copy(x, c)
			}
			x.now = x.now.Add(6 * time.Minute) // past ReceiptStaleMargin
			x.keep(x.tr.Tick(x.now))
			if ok, why := x72Declared(x, w2, R, wStored); ok {
				t.Fatalf("the withdrawn compute-3 declared: %s", why)
			} else {
				t.Logf("held: %s (trusted rev %d, vouched %d)", why, x.tr.hosts[x71Host].trustedRev, x.vouched())
			}
		})
	}
}

// TestX72CrashRestartThenOldCopy (hypothesis 2): P1 crashes (no
// withdrawal, no receipt) and P2 (a new incarnation) starts at once under
// the loop; P2 stops in order (W2, the newest receipt). compute-1 puts
// back P1's creates, whose beacons named revisions below W2 only. Never
// declared.
func TestX72CrashRestartThenOldCopy(t *testing.T) {
	x := newX71Rig(t)
	x.rounds("vbm", 5)
	p1 := *x.r
	x.r.Incarnation++
	x.r.Seq = 0
	x.rounds("vbm", 5)
	w2, R := x72Withdraw(x)
	wStored := x.now
	for range 5 {
		x72Copy(x, p1)
	}
	if ok, why := x72Declared(x, w2, R, wStored); ok {
		t.Fatalf("the withdrawn compute-3 declared: %s", why)
	} else {
		t.Logf("held: %s", why)
	}
}

// TestX72GarbageFloodBeforeBeacon (reviewer X72, residual of X65): under
// the loop across a start, compute-1 writes n values into compute-3's key
// right after each create, before the create's beacon is taken. With 16
// kept (beaconMemory) 17 dropped the kept create: no beacon vouched, and
// compute-3, dead, was never declared. Then maxLaterValues (64) were
// kept: declared; with one more than that: not (reviewer X75's residual
// race: a burst outran a beacon a few ms late). Now runs of garbage and
// markers compact (compactLater): declared with any number
// ("later=1000"); with laterCompactMutation the bound shows again.
func TestX72GarbageFloodBeforeBeacon(t *testing.T) {
	for _, c := range []struct {
		n   int
		mut bool
	}{{beaconMemory + 1, false}, {maxLaterValues, false}, {maxLaterValues + 2, false}, {1000, false}, {maxLaterValues + 2, true}} {
		n := c.n
		t.Run(fmt.Sprintf("later=%d/laterCompactMutation=%t", n, c.mut), func(t *testing.T) {
			if c.mut {
				x32Mutate(t, &laterCompactMutation)
			}
			want := n <= maxLaterValues || !c.mut
			if ok := x72Flood(t, n); ok != want {
				t.Errorf("compute-3 dead: declared %t (want %t) with %d values between each create and its beacon", ok, want, n)
			}
		})
	}
}

// x72Flood runs 20 rounds of the loop across a start with n values (n-1
// garbage, then compute-1's delete marker) between each create and its
// beacon, compute-3 dying after them; it reports whether compute-3 was
// declared within 3 minutes.
func x72Flood(t *testing.T, n int) bool {
	x := newX71Rig(t)
	for range 20 {
		x.now = x.now.Add(time.Second)
		x.rev += 3
		x.r.Seq++
		x.r.PrevRev = 0
		c := *x.r
		R := x.rev
		x.value(R, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
		g := R
		for range n - 1 {
			g++
			x.tr.Stored(x71Host, g, x.now)
			x.keep(x.tr.ObserveInvalid(x.now, x71Host, g, "garbage", true))
		}
		x.marker = g + 1
		x.del(x.marker)
		x.beacon(R, c)
		x.rev = x.marker
		x.keep(x.tr.Tick(x.now))
	}
	_, after, ok := x.tick(3 * time.Minute)
	t.Logf("declared %t %s after death (vouched %d)", ok, after, x.vouched())
	return ok
}

// TestX72WithdrawnDeletedKeysAcrossRestart ((c) left open by reviewer X72,
// now closed): h0..h9, signing required. Three hosts stop in order for
// maintenance (withdrawn: never declared, never counted silent) — or die
// and are declared — and a compromised h9 deletes their keys. The
// controller that saw it keeps them members and not silent. A controller
// that starts later (restart, upgrade, takeover) knew only the markers:
// each enrolled host's marker counted silent for good (keyGone), 3 >
// threshold 2, and when h0 died the guard held it undeclared for as long
// as the markers stood. Now the leader pins a withdrawn or declared
// record under a marker (or an untrusted value) as it pins an active
// one, and the restart takes it while the key is at that very revision:
// h0 is declared as without the deletes.
//
// "came-back": h6 came back while no controller ran (a create over its
// marker) and the compromised node deleted its key again: the revision
// moved, the pin is not taken, h6 counts silent — the safe side (it may
// be a Held host now; h6 and h0 silent, not more than 2: h0 declared).
// Controls: no deletes (h0 declared);
// withdrawnPinMutation (the pins of active records only: h0 held).
func TestX72WithdrawnDeletedKeysAcrossRestart(t *testing.T) {
	idle := []string{"h6", "h7", "h8"}
	for _, c := range []struct {
		name                          string
		declared, deletes, garbage    bool
		cameBack, mutate, wantDeclare bool
	}{
		{name: "withdrawn", deletes: true, wantDeclare: true},
		{name: "withdrawn-garbage", garbage: true, wantDeclare: true},
		{name: "declared", declared: true, deletes: true, wantDeclare: true},
		{name: "control-no-deletes", wantDeclare: true},
		{name: "came-back", deletes: true, cameBack: true, wantDeclare: true},
		{name: "withdrawn/withdrawnPinMutation", deletes: true, mutate: true},
		{name: "declared/withdrawnPinMutation", declared: true, deletes: true, mutate: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mutate {
				x32Mutate(t, &withdrawnPinMutation)
			}
			b, hosts := x11Fleet(t, 10, 5)
			at := t0.Add(5 * time.Second)
			live := x11Without(hosts, idle...)
			if c.declared {
				// The three die one after another and are declared (the
				// controller's declarations land in their keys); all at
				// once they would be a mass failure, held.
				var gone []string
				for _, dead := range idle {
					gone = append(gone, dead)
					up := x11Without(hosts, gone...)
					declared := false
					for s := 1; s <= 200 && !declared; s++ {
						at = at.Add(time.Second)
						for _, h := range up {
							b.write(at, h, fencing.LeaseActive, b.guard.Ref())
						}
						b.publish()
						for _, d := range b.tr.Tick(at) {
							if d.Op == OpDeclare && d.Host == dead {
								r := d.Record
								r.Signer = "ctl-key"
								b.land(at, d.Host, x11Entry{rec: &r})
								declared = true
							}
						}
					}
					if !declared {
						t.Fatalf("rig: %s never declared", dead)
					}
					b.run(at, 61, up, nil) // out of the guard window
					at = at.Add(61 * time.Second)
				}
			} else {
				for _, h := range idle {
					b.write(at, h, fencing.LeaseWithdrawn, b.guard.Ref()) // orderly stop
				}
			}
			b.run(at, 120, live, nil) // past the guard window
			at = at.Add(121 * time.Second)
			for _, h := range idle { // h9's deletes (or garbage)
				switch {
				case c.deletes:
					b.del(at, h)
				case c.garbage:
					b.garbage(at, h)
				}
			}
			b.run(at, 3, live, nil)
			b.stop()
			at = at.Add(5 * time.Second)
			if c.cameBack {
				b.write(at, "h6", fencing.LeaseActive, b.guard.Ref()) // its agent back, no controller running
				b.del(at, "h6")                                       // deleted again
			}
			start := at.Add(time.Second)
			b.start(start)
			for _, h := range idle {
				t.Logf("restored %s: state %q deleted %v", h, b.tr.hosts[h].rec.State, b.tr.hosts[h].deleted)
			}
			if c.cameBack {
				if st := b.tr.hosts["h6"].rec.State; st == fencing.LeaseWithdrawn {
					t.Fatalf("h6, back and deleted again while no controller ran, restored withdrawn from a pin its key moved past")
				}
			}
			host, after := b.run(start, 120, x11Without(live, "h0"), map[string]bool{"h0": true})
			end := start.Add(120 * time.Second)
			if host != "" {
				end = start.Add(after)
			}
			silent, thr := b.tr.Silent(end), b.tr.Threshold()
			switch {
			case c.wantDeclare && host == "":
				t.Fatalf("the dead h0 never declared in 120 s after the restart (silent %d, threshold %d): the markers over the %s hosts counted silent", silent, thr, map[bool]string{true: "declared", false: "withdrawn"}[c.declared])
			case !c.wantDeclare && host != "":
				t.Fatalf("h0 declared %s after the restart (silent %d, threshold %d): want held (the mutation)", after, silent, thr)
			}
			if host != "" {
				t.Logf("h0 declared %v after the restart (silent %d, threshold %d)", after, silent, thr)
			} else {
				t.Logf("h0 held (silent %d, threshold %d)", silent, thr)
			}
		})
	}
}
