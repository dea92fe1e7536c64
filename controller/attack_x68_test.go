package controller_test

import (
	"fmt"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// x68AgentIncarnation: an agent of boot "boot-1" restarted with its state
// dir lost (d nil) while its key is absent (cur nil: compute-1 deletes the
// key in a loop, X65) — the incarnation it seals with. fencing.NewAgent
// raises it from the key only when a same-boot record is read there.
func x68AgentIncarnation(t *testing.T, host string) uint64 {
	t.Helper()
	cfg := fencing.DefaultConfig(host, "boot-1")
	cfg.Enabled, cfg.HardwareWatchdog = true, true
	cfg.Timing = controllertest.HostRecord(host).Timing
	a, _, err := fencing.NewAgent(cfg, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return a.Durable().Incarnation
}

// TestX68SameBootLostStateOldCreateOverWithdrawal ((S), conditional:
// compute-3's agent restarted WITHIN ONE BOOT with its state dir lost
// (state_dir AND the /run runtime copy, or state_dir re-pointed: the
// runtime copy is ignored then) while compute-1 kept a foreign value in
// its key (NewAgent drops it: cur = nil) — the identities restart low in
// the SAME boot, which otherBootCreate/ReceiptStale do not consider).
// C_old: a create of boot-1 (inc 5, seq 100) compute-3 asked compute-1 to
// relay after an earlier delete, withheld. hide=false failed at 9d1a9ac
// too; hide=true was new with X65's chain. Closed: a create of another
// agent process (boot or incarnation) is unverifiable (otherBootCreate,
// sameProcess), the chain needs the same process; with sameBootMutation
// (incarnations of one boot ordered by identity) declared in both.
// X66's timeline with Q and W of boot-1 (the boot of R1 and C_old):
// otherBootCreate is false (same boot), replayedAfterDelete's notNewer
// finds C_old (inc 5, seq 100) newer than W (inc 1, seq 2) → trusted →
// compute-3 "active" while withdrawn → declared.
func TestX68SameBootLostStateOldCreateOverWithdrawal(t *testing.T) {
	const host = "compute-3.example.org"
	if inc := x68AgentIncarnation(t, host); inc != 1 {
		t.Logf("agent restarted with state lost, key absent: incarnation %d (premise weaker)", inc)
	} else {
		t.Logf("premise: agent restarted in the same boot with state lost and key absent seals incarnation %d", inc)
	}
	for _, c := range []struct{ hide, mut bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		hide := c.hide
		t.Run(fmt.Sprintf("hide=%t/sameBootMutation=%t", c.hide, c.mut), func(t *testing.T) {
			if c.mut {
				defer controller.SetSameBootMutation(true)()
				defer controller.SetReusedRevMutation(true)() // SealedBefore stops it too (reviewer X69)
			}
			tr := guardlessTracker(t, false)
			t0 := time.Now().Add(-time.Minute)
			now := time.Now()
			tr.WatchStarted(now)
			r1 := controllertest.HostRecord(host)
			r1.Incarnation, r1.Seq, r1.PrevRev, r1.Sig, r1.BootID = 5, 99, 4, "signed", "boot-1"
			tr.Stored(host, 5, t0)
			tr.Observe(now, host, 5, &r1)
			// compute-1 writes a copy of another host's record (or
			// garbage) into compute-3's key as its agent restarts: NewAgent
			// drops a foreign cur (cur.Host != cfg.Host → cur = nil).
			tr.Stored(host, 6, t0.Add(500*time.Millisecond))
			tr.ObserveInvalid(now, host, 6, "another host's record", false)
			q := r1
			q.Incarnation, q.Seq, q.PrevRev = 1, 1, 6 // same boot, state lost
			tr.Stored(host, 7, t0.Add(time.Second))
			for _, d := range tr.Observe(now, host, 7, &q) {
				t.Logf("Q: %s %.100s", d.Op, d.Reason)
			}
			w := q
			w.Seq, w.PrevRev, w.State = 2, 7, fencing.LeaseWithdrawn
			tr.Stored(host, 8, t0.Add(2*time.Second))
			for _, d := range tr.Observe(now, host, 8, &w) {
				t.Logf("W: %s %.100s", d.Op, d.Reason)
			}
			tr.Stored(host, 9, t0.Add(3*time.Second))
			tr.Observe(now, host, 9, nil) // compute-1's delete
			cOld := r1
			cOld.Seq, cOld.PrevRev = 100, 0
			tr.Stored(host, 10, t0.Add(4*time.Second))
			for _, d := range tr.Observe(now, host, 10, &cOld) {
				t.Logf("put-back: %s %.100s", d.Op, d.Reason)
			}
			if hide {
				tr.Stored(host, 11, t0.Add(5*time.Second))
				tr.ObserveInvalid(now, host, 11, "garbage", false)
			}
			declared, why := x68Declared(t, tr, w, 8, t0.Add(-time.Hour), now)
			t.Logf("outcome: %s", why)
			if c.mut {
				if !declared {
					t.Errorf("sameBootMutation: not declared (%s): the test no longer shows the hole", why)
				}
				return
			}
			if declared {
				t.Errorf("compute-3 withdrew (W, same boot, its receipt in its stream) and its guests run; compute-1 put back an older create of the same boot with a higher identity: %s", why)
			}
		})
	}
}

// TestX68SameBootLostStateReceiptStaleOnRecreatedBucket ((S),
// conditional as above plus X67's re-created bucket): x67Recreated with
// C1 of W's own boot (boot-2) but incarnation 5 (sealed before the
// in-boot state loss): ReceiptStale's boot check passes (same boot), the
// identity says C1 newer, it is stored > margin after W → stale → declared.
//
// Closed: a receipt of another incarnation than the trusted record is
// stale only if the host's beacons named that record; with
// sameBootMutation declared.
func TestX68SameBootLostStateReceiptStaleOnRecreatedBucket(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("sameBootMutation=%t", mut), func(t *testing.T) {
			if mut {
				defer controller.SetSameBootMutation(true)()
				defer controller.SetReusedRevMutation(true)() // SealedBefore stops it too (reviewer X69)
			}
			declared, why := x68SameBootStale(t)
			t.Logf("outcome: %s", why)
			switch {
			case mut && !declared:
				t.Errorf("sameBootMutation: not declared (%s): the test no longer shows the hole", why)
			case !mut && declared:
				t.Errorf("compute-3 (same boot, state lost in-boot) withdrew; compute-1 wrote its pre-loss create into the re-created bucket: %s", why)
			}
		})
	}
}

func x68SameBootStale(t *testing.T) (bool, string) {
	tr, b, wStored, created, now := x67RecreatedWith(t, "boot-2", 5, 10*time.Minute)
	return x67Declared(t, tr, b, wStored, created, now)
}

// x68Declared runs the tracker until host is due, then replays
// Runner.checkReceipt's judgement of W's receipt (revision wRev, found in
// the stream) on it: true when compute-3 would be declared.
func x68Declared(t *testing.T, tr *controller.Tracker, w fencing.LeaseRecord, wRev uint64, created, now time.Time) (bool, string) {
	t.Helper()
	const host = "compute-3.example.org"
	var due bool
	for i := 0; i < 40 && !due; i++ {
		now = now.Add(500 * time.Millisecond)
		for _, d := range tr.Tick(now) {
			if d.Op == controller.OpDeclare && d.Host == host {
				due = true
			}
		}
	}
	if !due {
		return false, "tracker never due"
	}
	b := fencing.Beacon{Host: host, BootID: w.BootID, Revision: wRev, Epoch: w.Epoch, Incarnation: w.Incarnation, Seq: w.Seq}
	if tr.SealedBefore(host, b) {
		return false, "ErrReceiptAfterSeal"
	}
	if tr.ReceiptStale(host, b, now.Add(-time.Minute)) {
		if tr.ReceiptsMatter(host) && !tr.ReceiptsCover(host, created) {
			return false, "stale, ErrReceiptsUnsound"
		}
		return true, fmt.Sprintf("declared: receipt STALE (receipts matter: %t)", tr.ReceiptsMatter(host))
	}
	for _, d := range tr.ObserveWithdrawal(now, host, b.Revision) {
		if d.Op == controller.OpWithdrawn {
			return false, "ErrWithdrawalReceipt"
		}
	}
	if tr.ReceiptsMatter(host) && !tr.ReceiptsCover(host, created) {
		return false, "ErrReceiptsUnsound"
	}
	return true, fmt.Sprintf("declared (receipts matter: %t)", tr.ReceiptsMatter(host))
}

// TestX68ReplayedOldBeaconMakesReceiptStale ((S), X67's conditions —
// compute-3's new boot B2 lost its state and withdrew; the lease bucket
// re-created with no controller watching — plus one old genuine beacon
// replayed): x67Recreated lands C1 (B1's create) at revision 3 of the
// re-created bucket. In the OLD bucket C1 had landed at revision 3 too
// (compute-1 pads the new bucket's revisions with writes to other keys
// until C1 lands on the same number), and B1 published a signed beacon
// naming revision 3 (epoch 1, inc 5, seq 1, boot-1). compute-1 kept it
// and has the server publish it again on compute-3's beacon subject
// (JetStream reflection, docs/security.md *reviewer X12*: a direct get of
// a stored value answered on any subject; signatures stop forgeries, not
// copies). ReceiptStale's new guard asks only h.beacons.revs.has(3) —
// a revision number, not the boot, the identity or the time of the
// beacon — so W's receipt (boot-2) is judged by identity again: stale,
// declared.
//
// OPEN, conditional on compute-1 holding a copy of compute-3's beacon:
// the shipped permissions let no agent subscribe to another host's
// beacons or read the receipts streams, and plaintext NATS off loopback
// is refused (docs/security.md, What is left). Skipped; remove the skip
// to see it fail.
func TestX68ReplayedOldBeaconMakesReceiptStale(t *testing.T) {
	t.Skip("open (S, conditional on a copy of another host's beacon, which the shipped permissions and TLS deny): ReceiptStale's beacon check names a revision number only")
	const host = "compute-3.example.org"
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replayedBeacon=%t", replay), func(t *testing.T) {
			tr, b, wStored, created, now := x67Recreated(t, false, 10*time.Minute)
			if replay {
				tr.BeaconChain(now, host, 3, 0)
				tr.ObserveBeacon(now, host, 3)
				tr.BeaconWrote(host, 3, 1, 5, 1)
			}
			declared, why := x67Declared(t, tr, b, wStored, created, now)
			t.Logf("outcome: %s", why)
			if declared {
				t.Errorf("compute-3 withdrew (W of boot-2, receipt in its stream), guests running; compute-1 wrote B1's create into the re-created bucket and replayed B1's old beacon naming the same revision number: %s", why)
			}
		})
	}
}
