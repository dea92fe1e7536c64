package controller_test

import (
	"fmt"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// x67Recreated builds reviewer X67's timeline on a fresh tracker (a
// controller started on a re-created lease bucket; no controller watched
// the re-creation, so no rollback marker, no gate).
//
// Old bucket: compute-3's boot B1 (incarnation 5) created its key with
// C1 (seq 1, prev_rev 0); compute-1 kept a copy (any agent reads any key,
// and creates are relayed). compute-3 rebooted with its state dir lost:
// B2 restarts its count (incarnation 1), renews, then stops in order:
// W (inc 1, seq 3, withdrawn) at revision 1000, its receipt stored at
// wStored in compute-3's receipts stream (created an hour before; the
// stream outlives the bucket). Its guests run.
//
// The lease bucket is re-created (revisions restart). More than
// ReceiptStaleMargin after W, compute-1 writes C1 into the empty key: a
// create on an absent key (Nats-Expected-Last-Subject-Sequence 0), so
// Written.Fresh — the first value a fresh controller lists, trusted.
//
// sameBoot (the control): compute-1 writes B2's own create instead
// (inc 1, seq 1: older than W by identity, as every copy within a boot).
func x67Recreated(t *testing.T, sameBoot bool, putBackAfter time.Duration) (tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) {
	t.Helper()
	if sameBoot {
		return x67RecreatedWith(t, "boot-2", 1, putBackAfter)
	}
	return x67RecreatedWith(t, "boot-1", 5, putBackAfter)
}

// x67RecreatedWith is x67Recreated with C1 of boot boot, incarnation inc.
func x67RecreatedWith(t *testing.T, boot string, inc uint64, putBackAfter time.Duration) (tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) {
	t.Helper()
	const host = "compute-3.example.org"
	tr = guardlessTracker(t, true)
	wStored = time.Now().Add(-putBackAfter)
	created = wStored.Add(-time.Hour)
	now = time.Now()
	c := controllertest.HostRecord(host)
	c.Signer, c.Sig, c.PrevRev = host+"-key", "signed", 0
	c.Epoch, c.Incarnation, c.Seq, c.BootID = 1, inc, 1, boot
	tr.Stored(host, 3, now.Add(-time.Second))
	for _, d := range tr.ObserveWritten(now, host, 3, &c, fencing.Written{Known: true, HasExpected: true, Expected: 0}) {
		t.Logf("listing: %s %s", d.Op, d.Reason)
	}
	tr.WatchStarted(now)
	b = fencing.Beacon{Host: host, BootID: "boot-2", State: fencing.LeaseWithdrawn, Revision: 1000, Epoch: 1, Incarnation: 1, Seq: 3}
	return tr, b, wStored, created, now
}

// x67Declared: the tracker runs until compute-3 is due, then
// Runner.checkReceipt's judgement of W's receipt (found in the stream,
// the newest, signed) is replayed on it: true when compute-3 would be
// declared.
func x67Declared(t *testing.T, tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) (bool, string) {
	t.Helper()
	const host = "compute-3.example.org"
	var due bool
	var at time.Duration
	for i := 0; i < 80 && !due; i++ {
		now = now.Add(500 * time.Millisecond)
		at += 500 * time.Millisecond
		for _, d := range tr.Tick(now) {
			if d.Op == controller.OpDeclare && d.Host == host {
				due = true
			}
		}
	}
	if !due {
		return false, "tracker never due"
	}
	if tr.SealedBefore(host, b) {
		return false, "ErrReceiptAfterSeal"
	}
	if tr.ReceiptStale(host, b, wStored) {
		if tr.ReceiptsMatter(host) && !tr.ReceiptsCover(host, created) {
			return false, "stale, ErrReceiptsUnsound"
		}
		return true, fmt.Sprintf("declared %s after the listing: W's receipt taken as STALE (receipts matter: %t)", at, tr.ReceiptsMatter(host))
	}
	for _, d := range tr.ObserveWithdrawal(now, host, b.Revision) {
		if d.Op == controller.OpWithdrawn {
			return false, "ErrWithdrawalReceipt (receipt is news: withdrawn)"
		}
	}
	if tr.ReceiptsMatter(host) && !tr.ReceiptsCover(host, created) {
		return false, "ErrReceiptsUnsound"
	}
	return true, fmt.Sprintf("declared %s after the listing (receipt not news)", at)
}

// TestX67OldBootCreateOnRecreatedBucketMakesReceiptStale ((S),
// conditional: compute-3's agent lost its state dir across a reboot, and
// the lease bucket was re-created — without rotating the host keys —
// while no controller watched it): see x67Recreated. ReceiptStale took
// W's receipt for one "from before the trusted record" because C1 is
// newer by identity (incarnation 5 > 1) and stored more than 5 min after
// the receipt — both hold for an old boot's record put back late — and
// the withdrawn compute-3 (guests running) was declared 3.5 s after the
// listing.
//
// sameBoot=true (the control): any copy of B2's is older than W: not
// stale, the receipt is news, compute-3 stays withdrawn. Closed: a
// receipt of another boot than the trusted record is stale only if the
// host's beacons named that record (Tracker.ReceiptStale); with
// receiptBootMutation declared.
func TestX67OldBootCreateOnRecreatedBucketMakesReceiptStale(t *testing.T) {
	for _, c := range []struct{ sameBoot, mut bool }{{true, false}, {false, false}, {false, true}} {
		t.Run(fmt.Sprintf("sameBoot=%t/receiptBootMutation=%t", c.sameBoot, c.mut), func(t *testing.T) {
			if c.mut {
				defer controller.SetReceiptBootMutation(true)()
			}
			tr, b, wStored, created, now := x67Recreated(t, c.sameBoot, 10*time.Minute)
			declared, why := x67Declared(t, tr, b, wStored, created, now)
			t.Logf("outcome: %s", why)
			switch {
			case c.mut && !declared:
				t.Errorf("receiptBootMutation: not declared (%s): the test no longer shows the hole", why)
			case !c.mut && declared:
				t.Errorf("compute-3 withdrew (W, inc 1 seq 3, its receipt in its stream) and its guests run; compute-1 wrote an old boot's create into the re-created bucket 10 min later: %s", why)
			}
		})
	}
}

// x67RebootDeleteLoop: compute-3's boot B1 (inc 5, seq 10) is trusted at
// rev 5. compute-3 reboots — ANY reboot: BootID is the kernel's boot id,
// its state dir kept (incarnation raised to 6). compute-1 deletes the key
// after each of its writes (X65's delete loop), so each write is a
// create: C (boot-2, inc 6, seq k, prev_rev 0). beacons: its signed
// beacons name each write. After n creates compute-3 dies (power loss).
// Returns when (from the death) it is declared, or 0.
func x67RebootDeleteLoop(t *testing.T, n int, beacons bool) (time.Duration, string) {
	t.Helper()
	const host = "compute-3.example.org"
	tr := guardlessTracker(t, true)
	t0 := time.Now().Add(-time.Minute)
	now := t0
	tr.WatchStarted(now)
	r1 := controllertest.HostRecord(host)
	r1.Signer, r1.Sig = host+"-key", "signed"
	r1.Epoch, r1.Incarnation, r1.Seq, r1.PrevRev, r1.BootID = 1, 5, 10, 4, "boot-1"
	tr.Stored(host, 5, now)
	tr.Observe(now, host, 5, &r1)
	rev := uint64(5)
	log := ""
	for k := 1; k <= n; k++ {
		now = now.Add(200 * time.Millisecond)
		rev++
		tr.Stored(host, rev, now)
		tr.Observe(now, host, rev, nil) // compute-1's delete
		now = now.Add(100 * time.Millisecond)
		rev++
		c := r1
		c.Incarnation, c.Seq, c.PrevRev, c.BootID = 6, uint64(k), 0, "boot-2"
		tr.Stored(host, rev, now)
		for _, d := range tr.Observe(now, host, rev, &c) {
			if k == 1 {
				log += fmt.Sprintf("[%s: %.120s] ", d.Op, d.Reason)
			}
		}
		if beacons {
			tr.BeaconWrote(host, rev, c.Epoch, c.Incarnation, c.Seq)
			tr.ObserveBeacon(now, host, rev)
		}
		for _, d := range tr.Tick(now) {
			if d.Op == controller.OpDeclare && d.Host == host {
				return -1, "declared while alive (S): " + d.Reason
			}
		}
	}
	// compute-1 deletes once more after its last create; compute-3 dies.
	now = now.Add(200 * time.Millisecond)
	rev++
	tr.Stored(host, rev, now)
	tr.Observe(now, host, rev, nil)
	died := now
	for i := 0; i < 120; i++ {
		now = now.Add(500 * time.Millisecond)
		for _, d := range tr.Tick(now) {
			if d.Op == controller.OpDeclare && d.Host == host {
				return now.Sub(died), log
			}
		}
	}
	return 0, log
}

// TestX67RebootDeleteLoopLiveHostDeclared ((S) of X66's first fix,
// conditional on compute-3's beacons not binding at this controller — an
// agent's beacons never received, or the fleet's beacon subscription
// silent > BeaconTrustWindow; the tracker alone): see
// x67RebootDeleteLoop. compute-3 merely REBOOTED (state dir kept; any
// reboot changes BootID) and compute-1 deletes its key after each write:
// every genuine create of the new boot was taken for a replay and ignored
// as a "forged value" — not even an unverifiable renewal — so the live
// compute-3 was declared 3.3 s into the loop. Closed: such a create is
// an unverifiable value (otherBootCreate: not forged), which restarts
// the clock when beacons do not bind; with otherBootForgedMutation the
// live host is declared. beacons=true: held (its beacons renew it). The
// dead host is declared 3 s after its death in every fixed case.
func TestX67RebootDeleteLoopLiveHostDeclared(t *testing.T) {
	for _, c := range []struct{ beacons, mut bool }{{false, false}, {false, true}, {true, false}} {
		t.Run(fmt.Sprintf("beacons=%t/otherBootForgedMutation=%t", c.beacons, c.mut), func(t *testing.T) {
			if c.mut {
				defer controller.SetOtherBootForgedMutation(true)()
			}
			after, log := x67RebootDeleteLoop(t, 20, c.beacons)
			t.Logf("first create: %s", log)
			switch {
			case c.mut && after >= 0:
				t.Errorf("otherBootForgedMutation: the live compute-3 not declared (%s): the test no longer shows the hole", after)
			case c.mut:
				t.Logf("otherBootForgedMutation: %s", log)
			case after < 0:
				t.Errorf("the live compute-3 (rebooted; each write a create, deleted by compute-1): %s", log)
			case after == 0:
				t.Errorf("compute-3 (rebooted, then dead after 20 creates each deleted by compute-1) not declared within 60 s of its death")
			default:
				t.Logf("declared %s after its death", after)
			}
		})
	}
}
