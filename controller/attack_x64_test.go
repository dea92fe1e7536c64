package controller_test

import (
	"fmt"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// TestX64HiddenPrevRevPutBackAfterMoveNATS (S, conditional as X62/X63's
// on an operator moving a withdrawn host to its own stream): X63's fix
// counts coverage from when the value the put-back record replaced was
// stored (hostState.trustedFrom) — but only when that value's revision is
// the tracker's trusted one (rec.PrevRev == h.trustedRev). Otherwise it
// falls back to the record's OWN stored time, which a put-back makes as
// late as compute-1 likes. Steps, while the controller's watch is cut:
// compute-3 renews once more (revision P: never seen by the controller,
// superseded by the withdrawal), seals a renewal for P that it asks
// compute-1 to relay (withheld), withdraws (receipt stored in the shared
// stream), the operator moves compute-3 to its own stream, and compute-1
// puts the relay back (10 ms later: the test margin). The watch is back:
// the listing shows the relay, PrevRev P != trustedRev (the earlier
// renewal) → trustedFrom 0 → coverage from the relay's own stored time,
// after the new stream's creation: the new, empty stream vouches, no
// receipt, declared. Wanted: not declared.
//   - hideP=false (control, X63's TestX63PutBackAfterMoveMakesTrustedStoredLateNATS
//     without the garbage): the controller saw P, trustedFrom is P's
//     stored time, before the move: waits.
//
// It was declared 5.25 s after the withdrawal (hideP=true, P's beacon
// lost or not, the beacon-loss machinery on or off). Closed: coverage
// counts from the stored time of the key's last value the tracker saw
// before the record, trusted or not (Tracker.coverStart: the record is
// not a replay, so it was sealed for that value or a later one); with
// prevStoredMutation it is declared.
func TestX64HiddenPrevRevPutBackAfterMoveNATS(t *testing.T) {
	for _, c := range []struct{ hideP, pBeacon, loss, mut bool }{
		// (hideP, P's beacon delivered, machinery off: declared 5.26 s
		// before the fix too; left out for CI's time.)
		{false, false, false, false}, {true, false, false, false}, {true, true, true, false},
		{true, false, false, true},
	} {
		t.Run(fmt.Sprintf("hideP=%t/pBeacon=%t/loss-machinery=%t/prevStoredMutation=%t", c.hideP, c.pBeacon, c.loss, c.mut), func(t *testing.T) {
			if !c.loss {
				defer controller.SetBeaconLossMutation(true)()
			}
			if c.mut {
				defer controller.SetPrevStoredMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: true, migrate: true, moved: true, putAfterMove: true, wantDeclared: c.mut, hideP: c.hideP, pBeacon: c.pBeacon})
		})
	}
}

// TestX64HiddenPrevRevOwnStreamHeldNATS (held): the same hidden P and
// withheld relay put back over the withdrawal, no operator action
// (shipped per-host streams, created before everything): the receipt is
// in compute-3's own stream, which covers (created long before P) —
// SealedBefore stops the declaration (reflect=0); compute-1's four
// reflected answers evicting the receipt leave junk, and the span skip
// (a listing) makes receipts matter: ErrReceiptsTampered (reflect=4).
func TestX64HiddenPrevRevOwnStreamHeldNATS(t *testing.T) {
	for _, reflect := range []int{0, 4} {
		t.Run(fmt.Sprintf("reflect=%d", reflect), func(t *testing.T) {
			defer controller.SetBeaconLossMutation(true)()
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: true, reflect: reflect, hideP: true})
		})
	}
}

// TestX64CoverFromUnseenPrevRev (the tracker alone; the mechanism of
// TestX64HiddenPrevRevPutBackAfterMoveNATS): a trusted record at rev 5
// stored at t0; a signed record sealed for rev 6 (never delivered: the
// watch skipped it) lands at rev 8, stored 10 s later. A receipts stream
// created between the two must not cover the host: a withdrawal hidden
// between rev 6 and rev 8 was stored before the stream existed. The
// control (sealed for rev 5, the trusted one) does not cover. Covered
// with prevStoredMutation (prev_rev 6: coverage from the record's own
// stored time); a stream created before the trusted record covers.
func TestX64CoverFromUnseenPrevRev(t *testing.T) {
	const host = "compute-3.example.org"
	for _, c := range []struct {
		prev        uint64
		mut, early  bool
		wantCovered bool
	}{{prev: 5}, {prev: 6}, {prev: 6, mut: true, wantCovered: true}, {prev: 6, early: true, wantCovered: true}} {
		t.Run(fmt.Sprintf("prev_rev=%d/prevStoredMutation=%t/created-before=%t", c.prev, c.mut, c.early), func(t *testing.T) {
			if c.mut {
				defer controller.SetPrevStoredMutation(true)()
			}
			tr, rec, t0, now := x64Tracked(t, host)
			rec.Seq, rec.PrevRev = 2, c.prev
			tr.Skipped(8)
			tr.Stored(host, 8, t0.Add(10*time.Second))
			tr.Observe(now, host, 8, &rec)
			created := t0.Add(5 * time.Second)
			if c.early {
				created = t0.Add(-5 * time.Second)
			}
			x64WantCover(t, tr, host, created, c.wantCovered)
		})
	}
}

// x64Tracked is a tracker that trusted host's signed record (seq 1,
// prev_rev 4) at revision 5, stored at t0 (a minute ago), and that
// record.
func x64Tracked(t *testing.T, host string) (tr *controller.Tracker, rec fencing.LeaseRecord, t0, now time.Time) {
	t.Helper()
	tr, err := controller.NewTracker(controller.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0, now = time.Now().Add(-time.Minute), time.Now()
	tr.WatchStarted(now)
	rec = controllertest.HostRecord(host)
	rec.Seq, rec.PrevRev, rec.Sig = 1, 4, "signed"
	tr.Stored(host, 5, t0)
	tr.Observe(now, host, 5, &rec)
	return tr, rec, t0, now
}

// x64WantCover checks that receipts matter for host and whether a stream
// created at created covers it.
func x64WantCover(t *testing.T, tr *controller.Tracker, host string, created time.Time, want bool) {
	t.Helper()
	if !tr.ReceiptsMatter(host) {
		t.Fatal("receipts do not matter after a span skip")
	}
	if got := tr.ReceiptsCover(host, created); got != want {
		t.Fatalf("a receipts stream created at %s covers %s: %t, want %t (a withdrawal hidden before the stream existed is vouched for if covered)", created.Format(time.RFC3339), host, got, want)
	}
}

// TestX64CoverFromCreateAfterDelete (the tracker alone; a variant of the
// same fallback, not shown end to end: it needs compute-3 to have sealed
// a create — its key deleted by compute-1 — that it asked compute-1 to
// relay): trusted record at rev 5 (stored t0), a delete marker at rev 6
// (t0+1 s), a signed create (prev_rev 0, newer) delivered after a skip at
// rev 8, stored t0+10 s. A withdrawal hidden after the marker was stored
// after t0+1 s; a stream created at t0+5 s must not cover the host.
//
// Closed: a create is covered by no stream (coverNever: nothing bounds
// when it was sealed) — its host waits, if receipts matter for it, until
// it writes again; with prevStoredMutation it is covered.
func TestX64CoverFromCreateAfterDelete(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("prevStoredMutation=%t", mut), func(t *testing.T) {
			if mut {
				defer controller.SetPrevStoredMutation(true)()
			}
			x64CreateAfterDelete(t, mut)
		})
	}
}

func x64CreateAfterDelete(t *testing.T, wantCovered bool) {
	const host = "compute-3.example.org"
	tr, rec, t0, now := x64Tracked(t, host)
	tr.Stored(host, 6, t0.Add(time.Second))
	tr.Observe(now, host, 6, nil)
	rec.Seq, rec.PrevRev = 3, 0
	tr.Skipped(8)
	tr.Stored(host, 8, t0.Add(10*time.Second))
	tr.Observe(now, host, 8, &rec)
	x64WantCover(t, tr, host, t0.Add(5*time.Second), wantCovered)
}
