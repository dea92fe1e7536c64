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
// compute-3, dead, was never declared. Now maxLaterValues (64) are kept:
// declared; with one more than that (the bound shown): not.
func TestX72GarbageFloodBeforeBeacon(t *testing.T) {
	for _, n := range []int{beaconMemory + 1, maxLaterValues, maxLaterValues + 2} {
		t.Run(fmt.Sprintf("later=%d", n), func(t *testing.T) {
			want := n <= maxLaterValues
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
