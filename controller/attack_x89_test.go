package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX89HiddenWithdrawalHeldBackRenewal (reviewer X89, (S), conditional
// on a harvested future-sealed renewal as in X85): as
// TestX85FutureSealedRenewalEndsWithdrawal, but the withdrawal is hidden
// from the watch (a burst makes it skip: reviewer X11) — known only by
// compute-3's withdrawal beacon (ObserveWithdrawal). heldBack compares
// with h.rec only, still the last active renewal, older than the
// harvested one: the harvested renewal (seq below the withdrawal's) is
// trusted, ends the withdrawal (trustedRev > withdrawnRev), SealedBefore
// says "after" (prev_rev 5000 > the withdrawal's revision), and the
// withdrawn compute-3, guests running, is declared.
//
// Fixed: SealedBefore takes a receipt newer than the trusted record in its
// process as sealed after it, whatever the record's prev_rev. With
// sealedProcMutation the hidden case is declared, the receipt silent.
func TestX89HiddenWithdrawalHeldBackRenewal(t *testing.T) {
	for _, tc := range []struct{ hidden, mut bool }{{false, false}, {true, false}, {true, true}} {
		hidden := tc.hidden
		t.Run(fmt.Sprintf("hidden=%t/sealedProcMutation=%t", hidden, tc.mut), func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &sealedProcMutation)
			}
			x := x85Renewing(t)
			h := *x.r
			h.Seq++ // sealed during an earlier cut-off, before the withdrawal
			h.PrevRev = 5000
			x.r.Seq++
			x.now = x.now.Add(time.Second)
			prev := x.rev
			x.rev += 3
			x.r.Seq++
			w := *x.r
			w.State, w.Reason, w.PrevRev = fencing.LeaseWithdrawn, "agent upgrade", prev
			wrev := x.rev
			if !hidden {
				x.value(wrev, w, fencing.Written{Known: true, HasExpected: true, Expected: prev})
			}
			x.beacon(wrev, w)
			// garbage over the withdrawal (the watch skipped it)
			x.rev++
			if hidden {
				x.tr.Skipped(x.rev)
			}
			x.tr.Stored(x71Host, x.rev, x.now)
			x.keep(x.tr.ObserveInvalid(x.now, x71Host, x.rev, "undecodable value (garbage)", false))
			if d, _, ok := x.tick(time.Minute); ok {
				t.Fatalf("withdrawn compute-3 declared before the landing: %+v", d)
			}
			x.del(5000)
			x.value(5001, h, fencing.Written{Known: true, HasExpected: true, Expected: 5000})
			sealed := x.tr.SealedBefore(x71Host, fencing.Beacon{Host: x71Host, BootID: w.BootID, Incarnation: w.Incarnation, Revision: wrev, State: fencing.LeaseWithdrawn, Epoch: w.Epoch, Seq: w.Seq})
			d, after, ok := x85TickBeacons(t, x)
			t.Logf("declared %t %s after the landing (%s); receipt stops it: %t", ok, after, d.Reason, sealed)
			if tc.mut {
				if !ok || sealed {
					t.Error("sealedProcMutation: the test no longer shows the hole")
				}
				return
			}
			if ok && !sealed {
				t.Errorf("compute-3, withdrawn in order (withdrawal hidden by a skip, beaconed), guests running, declared %s after the liar landed its renewal seq %d < withdrawal seq %d sealed for 5000", after, h.Seq, w.Seq)
			}
		})
	}
}

// TestX89RestartAfterHeldBackRenewal (reviewer X89, (S), conditional on
// a harvested future-sealed renewal and a controller restart): compute-3
// withdraws (trusted by C1); the liar deletes at 5000 and lands the
// harvested renewal (seq below the withdrawal's) by CAS on the marker
// before C2 starts (or C1 restarts). C2's first value is that renewal,
// written fresh: trusted — heldBack has no withdrawal to compare with, the
// withdrawal beacon (older revision) says nothing, SealedBefore compares
// revisions only for an update (5000 > the withdrawal's). Declared.
//
// Fixed as TestX89HiddenWithdrawalHeldBackRenewal (sealedProcMutation:
// declared, the receipt silent).
func TestX89RestartAfterHeldBackRenewal(t *testing.T) {
	for _, tc := range []struct{ beaconFirst, mut bool }{{true, false}, {false, false}, {true, true}} {
		beaconFirst := tc.beaconFirst
		t.Run(fmt.Sprintf("beaconFirst=%t/sealedProcMutation=%t", beaconFirst, tc.mut), func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &sealedProcMutation)
				x32Mutate(t, &withdrawnFreshMutation) // X97's layer off too (its withdrawal beacon stands)
			}
			x := x85Renewing(t)
			h := *x.r
			h.Seq -= 3
			h.PrevRev = 5000
			w := x85Withdraw(x)
			wrev := x.rev
			// C2 starts after the liar's landing.
			y := newX71Rig(t)
			y.now = x.now.Add(10 * time.Second)
			y.r = x.r
			if beaconFirst {
				y.beacon(wrev, w)
			}
			y.del(5000)
			y.value(5001, h, fencing.Written{Known: true, HasExpected: true, Expected: 5000})
			if !beaconFirst {
				y.beacon(wrev, w)
			}
			sealed := y.tr.SealedBefore(x71Host, fencing.Beacon{Host: x71Host, BootID: w.BootID, Incarnation: w.Incarnation, Revision: wrev, State: fencing.LeaseWithdrawn, Epoch: w.Epoch, Seq: w.Seq})
			_, after, ok := y.tick(3 * time.Minute)
			t.Logf("declared %t %s after C2's start; receipt stops it: %t", ok, after, sealed)
			if tc.mut {
				if !ok || sealed {
					t.Error("sealedProcMutation: the test no longer shows the hole")
				}
				return
			}
			if ok && !sealed {
				t.Errorf("withdrawn compute-3 declared %s after C2 started: the held-back renewal (seq %d < %d) trusted as first value", after, h.Seq, w.Seq)
			}
		})
	}
}
