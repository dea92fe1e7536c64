package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// x69Recreated is reviewer X67's re-created-bucket timeline
// (x67RecreatedWith: compute-3's boot B1, incarnation 5, then B2 with its
// state lost, incarnation 1, withdrew with W (inc 1, seq 3) at revision
// 1000 of the OLD bucket, its receipt in its own stream; the lease bucket
// re-created while no controller watched) — but compute-1 PADS the new
// bucket (writes to other keys, which its creds allow) before it puts
// B1's record back, so the record lands at revision rev, at or above
// W's 1000:
//   - prevRev 0: B1's create C1 (seq 1) on the empty key
//     (Nats-Expected-Last-Subject-Sequence 0: Written.Fresh).
//   - prevRev P > 0: a B1 renewal U (seq 2) sealed for revision P of the
//     old bucket; compute-1 first writes garbage to compute-3's key so it
//     lands exactly at P (padding), then writes U with a compare-and-set
//     on P (Written.Fresh), more padding in between so U lands at rev.
//
// The fresh controller lists U / C1 as compute-3's first value.
func x69Recreated(t *testing.T, rev, prevRev uint64) (tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) {
	t.Helper()
	return x69RecreatedBy(t, "boot-1", 5, rev, prevRev)
}

// x69RecreatedBy is x69Recreated with the put-back record of boot boot,
// incarnation inc.
func x69RecreatedBy(t *testing.T, boot string, inc, rev, prevRev uint64) (tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) {
	t.Helper()
	const host = "compute-3.example.org"
	tr = guardlessTracker(t, true)
	wStored = time.Now().Add(-10 * time.Minute)
	created = wStored.Add(-time.Hour)
	now = time.Now()
	c := controllertest.HostRecord(host)
	c.Signer, c.Sig, c.PrevRev = host+"-key", "signed", prevRev
	c.Epoch, c.Incarnation, c.Seq, c.BootID = 1, inc, 1, boot
	if prevRev != 0 {
		c.Seq = 2
	}
	tr.Stored(host, rev, now.Add(-time.Second))
	for _, d := range tr.ObserveWritten(now, host, rev, &c, fencing.Written{Known: true, HasExpected: true, Expected: prevRev}) {
		t.Logf("listing: %s %.120s", d.Op, d.Reason)
	}
	tr.WatchStarted(now)
	b = fencing.Beacon{Host: host, BootID: "boot-2", State: fencing.LeaseWithdrawn, Revision: 1000, Epoch: 1, Incarnation: 1, Seq: 3}
	return tr, b, wStored, created, now
}

// TestX69PaddedOldBootRecordOnRecreatedBucketHidesReceipt ((S),
// conditional as X67's: compute-3's agent lost its state dir across a
// reboot and the lease bucket was re-created without a controller
// watching). X67's fix makes W's receipt not stale (another boot); the
// receipt is then judged by ObserveWithdrawal, which takes it as news only
// above the trusted revision, and by SealedBefore, which asks nothing
// when the receipt's revision is at or above the trusted one. Revisions of
// a re-created bucket are compute-1's to choose (padding): the old boot's
// record put at revision >= 1000 makes W's receipt neither news nor
// "after the seal".
//
// control rev=3: X67's original (receipt news: not declared).
func TestX69PaddedOldBootRecordOnRecreatedBucketHidesReceipt(t *testing.T) {
	for _, c := range []struct {
		name         string
		rev, prevRev uint64
	}{
		{"control/create-at-3", 3, 0},
		{"create-at-1000", 1000, 0},
		{"create-at-1500", 1500, 0},
		{"update-prev-400-at-1000", 1000, 400},
		{"control/update-prev-400-at-1500", 1500, 400},
		{"create-at-1000/reusedRevMutation", 1000, 0},
		{"create-at-1500/reusedRevMutation", 1500, 0},
		{"update-prev-400-at-1000/reusedRevMutation", 1000, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			mut := strings.HasSuffix(c.name, "Mutation")
			if mut {
				defer controller.SetReusedRevMutation(true)()
			}
			tr, b, wStored, created, now := x69Recreated(t, c.rev, c.prevRev)
			declared, why := x67Declared(t, tr, b, wStored, created, now)
			t.Logf("outcome: %s (receipts matter: %t)", why, tr.ReceiptsMatter("compute-3.example.org"))
			if x69Mutated(t, mut, declared, why) {
				return
			}
			if declared {
				t.Errorf("compute-3 withdrew (W of boot-2 at revision 1000, receipt in its stream; guests running); compute-1 padded the re-created bucket and put back boot-1's record at revision %d (prev_rev %d): %s", c.rev, c.prevRev, why)
			}
		})
	}
}

// x69RecreatedSame: as x69Recreated, but the record compute-1 puts back
// is one of W's OWN process (boot-2, incarnation 1): no state loss is
// needed. seq 1 (prevRev 0: B2's create C1) or seq 2 (B2's renewal Q2,
// sealed for prevRev of the old bucket), both older than W (seq 3).
func x69RecreatedSame(t *testing.T, rev, prevRev uint64) (tr *controller.Tracker, b fencing.Beacon, wStored, created, now time.Time) {
	t.Helper()
	return x69RecreatedBy(t, "boot-2", 1, rev, prevRev)
}

// TestX69SameProcessOlderRecordAtWithdrawalRevision ((S), conditional
// ONLY on the lease bucket being re-created while no controller watched —
// X67's premise without the state loss: any reboot or none). compute-3
// (boot-2, inc 1) wrote C1 (seq 1, create, rev 998), Q2 (seq 2, prev_rev
// 998, rev 999), then withdrew: W (seq 3, prev_rev 999) at revision 1000,
// receipt in its own stream; guests run. compute-1 read C1/Q2 from the
// key (any agent reads any key) and kept them. The bucket is re-created;
// compute-1 pads it so that its copy lands at EXACTLY revision 1000 —
// W's revision: for Q2 it writes garbage to compute-3's key at 998, one
// write to another key at 999, then Q2 by a compare-and-set on 998
// (Written.Fresh); for C1 a create on the empty key after 999 padding
// writes. SealedBefore asks nothing when the receipt's revision is not
// below the trusted one (b.Revision >= trustedRev), ReceiptStale finds the
// receipt newer than the record (same process: correct), and
// ObserveWithdrawal takes the receipt as news only ABOVE the trusted
// revision: 1000 <= 1000, not news. Declared.
//
// control at 1001: SealedBefore catches it (create: W newer; update:
// 1000 > prev_rev 998).
func TestX69SameProcessOlderRecordAtWithdrawalRevision(t *testing.T) {
	for _, c := range []struct {
		name         string
		rev, prevRev uint64
	}{
		{"control/create-at-1001", 1001, 0},
		{"control/update-prev-998-at-1001", 1001, 998},
		{"create-at-1000", 1000, 0},
		{"update-prev-998-at-1000", 1000, 998},
		{"create-at-1000/reusedRevMutation", 1000, 0},
		{"update-prev-998-at-1000/reusedRevMutation", 1000, 998},
	} {
		t.Run(c.name, func(t *testing.T) {
			mut := strings.HasSuffix(c.name, "Mutation")
			if mut {
				defer controller.SetReusedRevMutation(true)()
			}
			tr, b, wStored, created, now := x69RecreatedSame(t, c.rev, c.prevRev)
			declared, why := x67Declared(t, tr, b, wStored, created, now)
			t.Logf("outcome: %s (receipts matter: %t)", why, tr.ReceiptsMatter("compute-3.example.org"))
			if x69Mutated(t, mut, declared, why) {
				return
			}
			if declared {
				t.Errorf("compute-3 withdrew (W of boot-2 seq 3 at revision 1000, receipt in its stream; guests running); compute-1 put back W's own process's OLDER record (seq %d, prev_rev %d) into the re-created bucket at revision %d: %s", map[bool]int{true: 1, false: 2}[c.prevRev == 0], c.prevRev, c.rev, why)
			}
		})
	}
}

// TestX69CarriedWithdrawalEndedByOldBootRecordAtItsRevision ((S),
// conditional on compute-3's agent having lost its state dir across its
// reboot — X66's premise —, plus a lease stream rollback WITH a
// controller watching: carry applied). compute-3's B1 (inc 5) wrote R99
// (seq 99) at revision 400 and R100 (seq 100, prev_rev 400) at 401 of the
// old stream; compute-1 read R100 (any agent reads any key) and kept it.
// compute-3 rebooted with its state lost (B2, inc 1) and withdrew: W (inc
// 1, seq 3) at revision 1000, seen by the controller, receipt in its
// stream, guests running. The stream rolls back to a backup holding R99
// at 400; the fresh tracker lists R99 and KeepWithdrawn carries W (bar:
// W's identity). compute-1 pads the stream (other keys, 401..999) and
// writes R100 by a compare-and-set on 400: it lands at revision 1000,
// Written.Fresh. The carry's bar (h.carried, rollbackBar) orders R100
// against W by identity across processes (inc 5 > inc 1): not a replay,
// trusted, the carry ends; compute-3 "active" again, silent, due. W's
// receipt: SealedBefore asks nothing (1000 >= trusted 1000), ReceiptStale
// says not stale (another boot, beacon never named 1000), ObserveWithdrawal
// not news (1000 <= 1000): declared.
//
// BENEATH THE ROLLBACK GATE: with the gate on (AfterRollback, as the
// runner does after a detected rollback) compute-3 stays gated
// (control/gate-on); gate-off shows the carry's bar ordering records of
// two processes by identity, for when the operator clears the marker.
//
// same-process (control): compute-1 writes B2's own Q2 (seq 2, older
// than W) the same way: a replay by the carry's bar. at-1001 (control):
// SealedBefore (1000 > prev_rev 400).
func TestX69CarriedWithdrawalEndedByOldBootRecordAtItsRevision(t *testing.T) {
	const host = "compute-3.example.org"
	for _, c := range []struct {
		name string
		boot string
		inc  uint64
		seq  uint64
		rev  uint64
		gate bool
	}{
		{"control/same-process-at-1000", "boot-2", 1, 2, 1000, false},
		{"control/old-boot-at-1001", "boot-1", 5, 100, 1001, false},
		{"control/gate-on/old-boot-at-1000", "boot-1", 5, 100, 1000, true},
		{"gate-off/old-boot-at-1000", "boot-1", 5, 100, 1000, false},
		{"gate-off/old-boot-at-1000/reusedRevMutation", "boot-1", 5, 100, 1000, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mut := strings.HasSuffix(c.name, "Mutation")
			if mut {
				defer controller.SetReusedRevMutation(true)()
			}
			tr := guardlessTracker(t, true)
			if c.gate {
				tr.AfterRollback(1000)
			}
			wStored := time.Now().Add(-10 * time.Minute)
			created := wStored.Add(-time.Hour)
			now := time.Now()
			r99 := controllertest.HostRecord(host)
			r99.Signer, r99.Sig, r99.PrevRev = host+"-key", "signed", 399
			r99.Epoch, r99.Incarnation, r99.Seq, r99.BootID = 1, 5, 99, "boot-1"
			tr.Stored(host, 400, wStored.Add(-time.Hour))
			tr.ObserveWritten(now, host, 400, &r99, fencing.Written{Known: true, HasExpected: true, Expected: 399})
			tr.WatchStarted(now)
			w := r99
			w.BootID, w.Incarnation, w.Seq, w.PrevRev, w.State = "boot-2", 1, 3, 999, fencing.LeaseWithdrawn
			for _, d := range tr.KeepWithdrawn(controller.CarriedHost{Host: host, Record: w, Why: "it withdrew"}, 1000) {
				t.Logf("carry: %s %.100s", d.Op, d.Reason)
			}
			u := r99
			u.BootID, u.Incarnation, u.Seq, u.PrevRev = c.boot, c.inc, c.seq, 400
			tr.Stored(host, c.rev, now)
			for _, d := range tr.ObserveWritten(now, host, c.rev, &u, fencing.Written{Known: true, HasExpected: true, Expected: 400}) {
				t.Logf("put-back: %s %.120s", d.Op, d.Reason)
			}
			b := fencing.Beacon{Host: host, BootID: "boot-2", State: fencing.LeaseWithdrawn, Revision: 1000, Epoch: 1, Incarnation: 1, Seq: 3}
			declared, why := x67Declared(t, tr, b, wStored, created, now)
			t.Logf("outcome: %s", why)
			if x69Mutated(t, mut, declared, why) {
				return
			}
			if declared {
				t.Errorf("compute-3 withdrew (W of boot-2 at 1000, carried over the rollback, receipt in its stream; guests running); compute-1 wrote %s's record (inc %d, seq %d, prev_rev 400) at revision %d: %s", c.boot, c.inc, c.seq, c.rev, why)
			}
		})
	}
}

// TestX69EarlierBucketLifeRecordOverWithdrawal ((S), conditional on the
// lease bucket having been re-created ONCE, at any time before, without
// rotating the host keys — docs/security.md allows "or stop the agents
// until the stream holds their fresh records"; no lost state, no
// unwatched moment needed at the withdrawal). In the bucket's earlier life
// compute-3's record U (active, prev_rev 5000, landed at 5001) was read
// by compute-1 (any agent reads any key) and kept. In the current life a
// running controller trusts compute-3's Q (rev 6) and its orderly-stop
// withdrawal W (rev 7; receipt in its stream, guests run). compute-1
// waits until the stream passes 5000 (the fleet's renewals, or its own
// writes to other keys), then puts U into compute-3's key: it lands at
// 5001+. Not a replay: fencing.StaleRecord refuses only prev_rev BELOW the
// key's last revision (5000 > 7), replay's X43 check only prev_rev >= the
// landing revision; no identity is compared (a trusted host needs no
// Written). Trusted: compute-3 "active" again, silent, due. W's receipt
// (revision 7): SealedBefore asks whether 7 > U's prev_rev 5000 (no),
// ReceiptStale not stale (another process; same process: U older),
// ObserveWithdrawal not news (7 <= trusted 5001): declared.
//
// control/below: U sealed for prev_rev 5 (< 7): stale, refused.
func TestX69EarlierBucketLifeRecordOverWithdrawal(t *testing.T) {
	const host = "compute-3.example.org"
	for _, c := range []struct {
		name     string
		boot     string
		inc, seq uint64
		prevRev  uint64
	}{
		{"control/below-prev-5", "boot-1", 1, 900, 5},
		{"other-process", "boot-1", 1, 900, 5000},
		{"same-process-older", "boot-2", 2, 9, 5000},
		{"other-process/unseenPrevMutation", "boot-1", 1, 900, 5000},
		{"same-process-older/unseenPrevMutation", "boot-2", 2, 9, 5000},
	} {
		for _, beacons := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/beacons=%t", c.name, beacons), func(t *testing.T) {
				mut := strings.HasSuffix(c.name, "Mutation")
				if mut {
					defer controller.SetUnseenPrevMutation(true)()
					// heldBack refuses the same-process older record too
					// (reviewer X85): off, to show unseenPrevRev's hole.
					defer controller.SetHeldBackMutation(true)()
					// and the same-process receipt rule (reviewer X89).
					defer controller.SetSealedProcMutation(true)()
				}
				tr := guardlessTracker(t, true)
				now := time.Now()
				t0 := now.Add(-30 * time.Minute)
				q := controllertest.HostRecord(host)
				q.Signer, q.Sig, q.PrevRev = host+"-key", "signed", 5
				q.Epoch, q.Incarnation, q.Seq, q.BootID = 1, 2, 10, "boot-2"
				tr.Stored(host, 6, t0)
				tr.ObserveWritten(now, host, 6, &q, fencing.Written{Known: true, HasExpected: true, Expected: 5})
				tr.WatchStarted(now)
				w := q
				w.Seq, w.PrevRev, w.State = 11, 6, fencing.LeaseWithdrawn
				if beacons { // compute-3's signed beacons named Q
					tr.BeaconChain(now, host, 6, 5)
					tr.ObserveBeacon(now, host, 6)
					tr.BeaconWrote(host, 6, 1, 2, 10)
				}
				tr.Stored(host, 7, t0.Add(time.Second))
				for _, d := range tr.Observe(now, host, 7, &w) {
					t.Logf("W: %s", d.Op)
				}
				if beacons { // and its withdrawal
					tr.BeaconChain(now, host, 7, 6)
					tr.ObserveBeacon(now, host, 7)
					tr.BeaconWrote(host, 7, 1, 2, 11)
					tr.ObserveWithdrawal(now, host, 7)
				}
				u := q
				u.BootID, u.Incarnation, u.Seq, u.PrevRev = c.boot, c.inc, c.seq, c.prevRev
				tr.Stored(host, 5001, now)
				for _, d := range tr.Observe(now, host, 5001, &u) {
					t.Logf("put-back: %s %.120s", d.Op, d.Reason)
				}
				declared, why := x68Declared(t, tr, w, 7, t0.Add(-time.Hour), now)
				t.Logf("outcome: %s", why)
				if x69Mutated(t, mut, declared, why) {
					return
				}
				if declared {
					t.Errorf("compute-3 withdrew (W at 7, trusted, receipt in its stream; guests running); compute-1 put back its record from the bucket's earlier life (%s inc %d seq %d, prev_rev %d) at 5001: %s", c.boot, c.inc, c.seq, c.prevRev, why)
				}
			})
		}
	}
}

// TestX69EarlierBucketLifeWithdrawalKeepsDeadHost ((c), same premise as
// TestX69EarlierBucketLifeRecordOverWithdrawal: the bucket re-created once
// before, host keys not rotated). compute-3's last record in the current
// life is Q (active, rev 6); it dies (power loss). compute-1 kept
// compute-3's orderly-stop withdrawal from the bucket's earlier life
// (prev_rev 5000) and, once the stream passed 5000, puts it into
// compute-3's key: not stale (prev_rev above the key's last revision 6),
// trusted — the dead host is "withdrawn" and never declared.
func TestX69EarlierBucketLifeWithdrawalKeepsDeadHost(t *testing.T) {
	const host = "compute-3.example.org"
	for _, c := range []struct {
		prevRev uint64
		mut     bool
	}{{5, false}, {5000, false}, {5000, true}} {
		prevRev := c.prevRev
		t.Run(fmt.Sprintf("prev_rev=%d/unseenPrevMutation=%t", prevRev, c.mut), func(t *testing.T) {
			if c.mut {
				defer controller.SetUnseenPrevMutation(true)()
			}
			tr := guardlessTracker(t, true)
			now := time.Now()
			q := controllertest.HostRecord(host)
			q.Signer, q.Sig, q.PrevRev = host+"-key", "signed", 5
			q.Epoch, q.Incarnation, q.Seq, q.BootID = 1, 2, 10, "boot-2"
			tr.Stored(host, 6, now.Add(-time.Second))
			tr.ObserveWritten(now, host, 6, &q, fencing.Written{Known: true, HasExpected: true, Expected: 5})
			tr.WatchStarted(now)
			old := q
			old.BootID, old.Incarnation, old.Seq, old.PrevRev, old.State = "boot-1", 1, 900, prevRev, fencing.LeaseWithdrawn
			tr.Stored(host, 5001, now.Add(2*time.Second))
			for _, d := range tr.Observe(now.Add(2*time.Second), host, 5001, &old) {
				t.Logf("put-back: %s %.100s", d.Op, d.Reason)
			}
			due := false
			for i := 0; i < 240 && !due; i++ {
				now = now.Add(500 * time.Millisecond)
				for _, d := range tr.Tick(now) {
					due = due || d.Op == controller.OpDeclare && d.Host == host
				}
			}
			t.Logf("dead compute-3 due within 120 s: %t", due)
			if c.mut {
				if due {
					t.Error("unseenPrevMutation: the dead host declared: the test no longer shows the hole")
				}
				return
			}
			if !due {
				t.Errorf("compute-3 died (last record active at 6); compute-1 put back its withdrawal from the bucket's earlier life (prev_rev %d) at 5001: never declared (120 s)", prevRev)
			}
		})
	}
}

// x69Mutated: under a mutation (mut) the attack must succeed — declared —
// or the test no longer shows the hole; it reports whether mut was set.
func x69Mutated(t *testing.T, mut, declared bool, why string) bool {
	t.Helper()
	if mut && !declared {
		t.Errorf("under the mutation not declared (%s): the test no longer shows the hole", why)
	}
	return mut
}
