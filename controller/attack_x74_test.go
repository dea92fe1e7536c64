package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX74LateBeaconBurstVouchOldValueLiveHost: under the delete loop across
// a start, compute-3 (LIVE) writes a create at R (delivered, kept unfresh),
// then its beacon stream stalls; its later creates are deleted before the
// watch delivers them (markers only, Skipped). The stalled beacons then
// arrive in order in one burst: R's vouches the value as observed long
// ago (lastSeen rewound), the later ones must renew it. Never declared.
//
// Since compactLater keeps the create across the stall's markers (before
// it, 64 of them dropped it: the 90 s and 5 min stalls held only so), R's
// vouch makes the host silent since R: a tick before the burst's next
// beacon declared it — a vouched host waits BeaconExpectWindow (vouchedAt);
// with vouchWaitMutation the 90 s stall declares the live host
// (TestX74LateBeaconBurstVouchWait).
func TestX74LateBeaconBurstVouchOldValueLiveHost(t *testing.T) {
	for _, stall := range []time.Duration{20 * time.Second, 90 * time.Second, 5 * time.Minute} {
		if why := x74Burst(t, stall); why != "" {
			t.Errorf("stall %s: LIVE compute-3 declared: %s", stall, why)
		}
	}
}

// TestX74LateBeaconBurstVouchWait: the mutation case of
// TestX74LateBeaconBurstVouchOldValueLiveHost.
func TestX74LateBeaconBurstVouchWait(t *testing.T) {
	x32Mutate(t, &vouchWaitMutation)
	if why := x74Burst(t, 90*time.Second); why == "" {
		t.Error("vouchWaitMutation: the live compute-3 not declared during its burst: the case does not show the hole")
	}
}

// x74Burst runs X74's stall and burst and returns why compute-3 was
// declared ("": never).
func x74Burst(t *testing.T, stall time.Duration) string {
	var declared string
	{
		x := newX71Rig(t)
		R, c := x.createDeleted()
		type nb struct {
			rev uint64
			c   fencing.LeaseRecord
		}
		pending := []nb{{R, c}}
		rev := x.marker
		from := x.now
		for x.now.Sub(from) < stall {
			x.now = x.now.Add(time.Second)
			x.r.Seq++
			w := rev + 1
			pending = append(pending, nb{w, *x.r})
			rev = w + 1
			x.tr.Skipped(rev)
			x.del(rev)
			for _, d := range x.tr.Tick(x.now) {
				x.said = append(x.said, d)
				if d.Op == OpDeclare {
					t.Logf("stall %s: declared during the stall (beacon loss path): %s", stall, d.Reason)
				}
			}
		}
		for _, p := range pending {
			x.beacon(p.rev, p.c)
			for _, d := range x.tr.Tick(x.now) {
				x.said = append(x.said, d)
				if d.Op == OpDeclare && declared == "" {
					declared = fmt.Sprintf("while its burst of beacons was replayed (after beacon of rev %d): %s", p.rev, d.Reason)
				}
			}
		}
		t.Logf("stall %s: vouched=%d", stall, x.vouched())
		// live on: keeps writing creates, deleted, beacons on time
		for range 60 {
			x.now = x.now.Add(time.Second)
			x.r.Seq++
			w := rev + 1
			rev = w + 1
			x.tr.Skipped(rev)
			x.del(rev)
			x.beacon(w, *x.r)
			for _, d := range x.tr.Tick(x.now) {
				if d.Op == OpDeclare && declared == "" {
					declared = "after the burst: " + d.Reason
				}
			}
		}
	}
	return declared
}

// TestX74WithdrawalThenOldCreateVouchedLate: compute-3's create at R is
// kept unfresh; it then stops in order: its withdrawal W (a create over
// the marker) is delivered (unfresh, another value after R) and its
// beacon for W arrives before the late beacon for R. Never declared.
func TestX74WithdrawalThenOldCreateVouchedLate(t *testing.T) {
	x := newX71Rig(t)
	R, c := x.createDeleted()
	w := *x.r
	w.Seq++
	w.State, w.Reason = fencing.LeaseWithdrawn, "stopped"
	W := x.marker + 1
	x.value(W, w, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	x.marker = W + 1
	x.del(x.marker)
	x.beacon(W, w)
	x.beacon(R, c)
	if d, after, ok := x.tick(5 * time.Minute); ok {
		t.Fatalf("withdrawn compute-3 declared %s after: %s", after, d.Reason)
	}
}

// TestX74BeaconsBeforeLaggingWatchWithdrawn: the watch lags; compute-3's
// beacons for its create R and then its withdrawal W (orderly stop) come
// before the watch delivers R (a create over the loop's marker: vouched
// on arrival by the named ring); W itself was deleted before delivery
// (skip, marker only). The withdrawn compute-3 must never be declared.
func TestX74BeaconsBeforeLaggingWatchWithdrawn(t *testing.T) {
	for _, warm := range []int{0, 3} {
		x := newX71Rig(t)
		x.rounds("vbm", warm)
		W, _ := x74BeaconsFirst(x)
		x.tr.Skipped(W + 1)
		x.marker = W + 1
		x.del(x.marker)
		if d, after, ok := x.tick(5 * time.Minute); ok {
			t.Errorf("warm %d: withdrawn compute-3 declared %s after: %s", warm, after, d.Reason)
		}
	}
}

// TestX74WithdrawalBeaconBeforeValueNoMarker: as above, but W is
// delivered late as a value after R (its create over R's marker).
func TestX74WithdrawalBeaconBeforeValueNoMarker(t *testing.T) {
	x := newX71Rig(t)
	W, w := x74BeaconsFirst(x)
	x.value(W, w, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	x.marker = W + 1
	x.del(x.marker)
	if d, after, ok := x.tick(5 * time.Minute); ok {
		t.Errorf("withdrawn compute-3 declared %s after: %s", after, d.Reason)
	}
}

// x74BeaconsFirst: compute-3's create R and its withdrawal W (R + 2, a
// create over R's marker) are beaconed before the watch delivers either;
// then R lands and the loop deletes it. It returns W and its record.
func x74BeaconsFirst(x *x71Rig) (uint64, fencing.LeaseRecord) {
	x.now = x.now.Add(time.Second)
	x.r.Seq++
	x.r.PrevRev = 0
	R := x.rev + 3
	c := *x.r
	w := *x.r
	w.Seq++
	w.State, w.Reason = fencing.LeaseWithdrawn, "stopped"
	W := R + 2
	x.beacon(R, c)
	x.beacon(W, w)
	x.value(R, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	x.marker = R + 1
	x.del(x.marker)
	return W, w
}
