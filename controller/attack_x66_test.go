package controller_test

import (
	"fmt"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// x66LostState builds reviewer X66's timeline on the tracker alone.
// compute-3's first boot B1 (incarnation 5) writes R1 (seq 99, rev 5,
// t0). Earlier in that boot compute-1 deleted its key once and kept
// the create compute-3 re-created it with (C_old: incarnation 5, seq 100,
// prev_rev 0 — any agent may read and delete any key: relays). compute-3
// reboots with its state_dir lost: fencing.NewAgent raises the
// incarnation from the key only for a record of the same boot, so B2
// seals incarnation 1 (docs/security.md says such an agent "writes
// identities below its withdrawal's"). B2's Q (inc 1, seq 1, rev 6) and
// its orderly-stop withdrawal W (inc 1, seq 2, rev 7, t0+2 s) land and are
// trusted; W's receipt is stored in compute-3's own stream (created an
// hour before). compute-1 deletes the key (rev 8) and puts C_old back
// (a create at rev 9, t0+4 s): newer than W, so not a replay
// (replayedAfterDelete), trusted — compute-3 "active" again while it is
// withdrawn with its guests running. hide: compute-1 then writes garbage
// over it (rev 10), so receipts matter.
func x66LostState(t *testing.T, hide bool) (tr *controller.Tracker, w fencing.LeaseRecord, created, now time.Time) {
	t.Helper()
	const host = "compute-3.example.org"
	tr = guardlessTracker(t, false)
	t0 := time.Now().Add(-time.Minute)
	now = time.Now()
	tr.WatchStarted(now)
	r1 := controllertest.HostRecord(host)
	r1.Incarnation, r1.Seq, r1.PrevRev, r1.Sig, r1.BootID = 5, 99, 4, "signed", "boot-1"
	tr.Stored(host, 5, t0)
	tr.Observe(now, host, 5, &r1)
	q := r1
	q.Incarnation, q.Seq, q.PrevRev, q.BootID = 1, 1, 5, "boot-2"
	tr.Stored(host, 6, t0.Add(time.Second))
	tr.Observe(now, host, 6, &q)
	w = q
	w.Seq, w.PrevRev, w.State = 2, 6, fencing.LeaseWithdrawn
	tr.Stored(host, 7, t0.Add(2*time.Second))
	tr.Observe(now, host, 7, &w)
	tr.Stored(host, 8, t0.Add(3*time.Second))
	tr.Observe(now, host, 8, nil) // compute-1's delete
	cOld := r1
	cOld.Seq, cOld.PrevRev = 100, 0
	tr.Stored(host, 9, t0.Add(4*time.Second))
	tr.Observe(now, host, 9, &cOld) // compute-1's put-back of B1's create
	if hide {
		tr.Stored(host, 10, t0.Add(5*time.Second))
		tr.ObserveInvalid(now, host, 10, "garbage", false)
	}
	return tr, w, t0.Add(-time.Hour), now
}

// x66Declared runs the tracker and Runner.checkReceipt's judgement of
// W's receipt (found in the stream, revision 7): true when compute-3
// would be declared.
func x66Declared(t *testing.T, tr *controller.Tracker, w fencing.LeaseRecord, created, now time.Time) (bool, string) {
	t.Helper()
	return x68Declared(t, tr, w, 7, created, now)
}

// guardlessTracker is a tracker whose mass-failure guard never holds
// (count 100, share 1), signatures required if signed.
func guardlessTracker(t *testing.T, signed bool) *controller.Tracker {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.GuardCount, cfg.GuardShare = 100, 1
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if signed {
		tr.SetSigningRequired(true)
	}
	return tr
}

// TestX66LostStateOldCreateOverWithdrawal ((S), conditional on
// compute-3's agent losing its state dir across a reboot; the tracker
// alone, Runner.checkReceipt's steps replayed on it: W's receipt is FOUND
// in compute-3's own stream): see x66LostState.
//
//   - hide=false (older than the create chain): no garbage, receipts do
//     not matter. W's receipt names rev 7, below the put-back's 9: no news
//     (ObserveWithdrawal); SealedBefore misses it (for a create it asks
//     whether the withdrawal is NEWER than the record — a lost state
//     inverts that); the withdrawn compute-3 was declared 3.5 s after its
//     "last renewal".
//   - hide=true: garbage after the put-back makes receipts matter; the
//     create chain (reviewer X65's fix) counted C_old from W's bound (C_old
//     "newer" than W although sealed long before it: the host seals in
//     identity order only within a boot) and it was declared.
//
// Closed: a create after a delete of another boot than the last trusted
// record is a replay (replayedAfterDelete), and the chain needs the same
// boot; with bootOrderMutation declared in both.
func TestX66LostStateOldCreateOverWithdrawal(t *testing.T) {
	for _, hide := range []bool{false, true} {
		for _, mut := range []bool{false, true} {
			t.Run(fmt.Sprintf("hide=%t/bootOrderMutation=%t", hide, mut), func(t *testing.T) {
				if mut {
					defer controller.SetBootOrderMutation(true)()
					defer controller.SetReusedRevMutation(true)() // SealedBefore stops it too (reviewer X69)
				}
				tr, w, created, now := x66LostState(t, hide)
				declared, why := x66Declared(t, tr, w, created, now)
				t.Logf("outcome: %s", why)
				switch {
				case mut && !declared:
					t.Errorf("bootOrderMutation: not declared (%s): the test no longer shows the hole", why)
				case !mut && declared:
					t.Errorf("compute-3 withdrew (W, its receipt in its stream) and its guests run; compute-1 put back an old-boot create newer than W: %s", why)
				}
			})
		}
	}
}

// TestX66WithheldCreatePutBackAfterMove (held; the tracker alone):
// identity order intact. compute-3's Q (seq 1, rev 5, t0; prev_rev 4,
// the value before it stored at t0-1 s) is trusted; compute-1 deletes the
// key (rev 6, t0+1 s); compute-3 seals a create C (seq 2) and asks
// compute-1 to relay it — withheld; compute-3 re-creates itself and then
// withdraws (hidden by a skip: revs 7, 8, stored up to t0+3 s); the
// operator moves compute-3 to its own receipts stream at t0+10 s (W's
// receipt left behind); compute-1 deletes the key (rev 9) and puts C back
// (rev 10). The chain counts C from Q's bound (t0-1 s at most): a stream
// created at t0+10 s must not cover compute-3.
func TestX66WithheldCreatePutBackAfterMove(t *testing.T) {
	const host = "compute-3.example.org"
	tr, err := controller.NewTracker(controller.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0, now := time.Now().Add(-time.Minute), time.Now()
	tr.WatchStarted(now)
	q := controllertest.HostRecord(host)
	q.Seq, q.PrevRev, q.Sig = 1, 4, "signed"
	tr.Stored(host, 4, t0.Add(-time.Second))
	tr.ObserveInvalid(now, host, 4, "garbage", false)
	tr.Stored(host, 5, t0)
	tr.Observe(now, host, 5, &q)
	tr.Stored(host, 6, t0.Add(time.Second))
	tr.Observe(now, host, 6, nil)
	tr.Skipped(9)
	tr.Stored(host, 9, t0.Add(4*time.Second))
	tr.Observe(now, host, 9, nil)
	c := q
	c.Seq, c.PrevRev = 2, 0
	tr.Stored(host, 10, t0.Add(20*time.Second))
	tr.Observe(now, host, 10, &c)
	x64WantCover(t, tr, host, t0.Add(10*time.Second), false)
	if !tr.ReceiptsCover(host, t0.Add(-time.Hour)) {
		t.Fatal("a stream created an hour before does not cover: the chain did not apply (the test shows nothing)")
	}
}
