package controller

import (
	"fmt"
	"os"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX85FutureSealedRenewalKeepsDeadHost (reviewer X85, (c)): compute-3
// renews (anchored create, then renewals, each verified fresh and
// trusted). While it was cut off from NATS earlier, a compromised peer
// harvested k genuine renewals of its current process sealed for
// revisions R_i of the liar's choosing, far ahead (fencing
// TestX85LiarChoosesPrevRevOfRelayedRenewal: keyDeleted takes a liar's
// "invalid record at R" as the key's revision). compute-3 dies. Every
// ~20 s the liar deletes compute-3's key at exactly R_i (a publish with
// Nats-Expected-Last-Sequence R_i-1) and puts the renewal sealed for R_i
// by a CAS on the marker: prev_rev = the key's last revision, written
// fresh — a trusted renewal. The dead host is never declared while the
// harvest lasts (k = 0: declared 31 s after its death; k = 8: 3m11s —
// the harvest is bounded only by how long compute-3 was cut off and asked
// the liar).
//
// The harvest is closed agent-side (fencing TestX85LiarChoosesPrevRevOfRelayedRenewal):
// a revision one peer reports is acted on only once more than lying_peers
// peers report it. Beyond the threat model (lying_peers + 1 colluding
// peers) each harvested record still delays the declaration by one lease:
// bounded by the harvest, open (c), documented; the harvested case runs
// with HVG_X85=1 (it fails).
func TestX85FutureSealedRenewalKeepsDeadHost(t *testing.T) {
	for _, k := range []int{0, 8} {
		t.Run(fmt.Sprintf("harvested=%d", k), func(t *testing.T) {
			if k > 0 && os.Getenv("HVG_X85") == "" {
				t.Skip("open beyond lying_peers colluding peers (docs/security.md); HVG_X85=1 runs it")
			}
			x := x85Renewing(t)
			died := x.now
			// The harvest: seqs after the last landed one, each sealed
			// for a revision R_i the liar chose.
			var harvest []fencing.LeaseRecord
			for i := range k {
				h := *x.r
				h.Seq += uint64(1 + i)
				h.PrevRev = 1000 * uint64(i+1)
				harvest = append(harvest, h)
			}
			for _, h := range harvest {
				if d, _, ok := x.tick(20 * time.Second); ok {
					t.Fatalf("declared %s after death with harvested records left: %+v", x.now.Sub(died), d)
				}
				R := h.PrevRev
				x.del(R) // the liar's delete lands at exactly R
				x.value(R+1, h, fencing.Written{Known: true, HasExpected: true, Expected: R})
				x.rev = R + 1
			}
			_, _, ok := x.tick(3 * time.Minute)
			dead := x.now.Sub(died)
			t.Logf("declared %t, %s after death (%d harvested renewals)", ok, dead, k)
			if k > 0 && (!ok || dead > time.Minute) {
				t.Errorf("compute-3 declared %s after its death (lease_ttl + grace: 31 s): each of the %d renewals sealed for a revision the liar chose was trusted — k harvested, k × 20 s more", dead.Round(time.Second), k)
			}
			if k == 0 && !ok {
				t.Error("control: dead compute-3 not declared")
			}
		})
	}
}

// TestX85FutureSealedRenewalEndsWithdrawal (reviewer X85, (S)): as
// TestX85FutureSealedRenewalKeepsDeadHost, the liar holds one genuine
// renewal of compute-3's process sealed for a revision R it chose, from
// an earlier cut-off. compute-3's agent then stops in order (an upgrade,
// maintenance): its withdrawal is trusted and beaconed — never declared
// while it stands, guests running. The liar deletes the key at exactly R
// and puts the renewal by a CAS on the marker: prev_rev R = the key's
// last revision, trusted (an update: no identity check against the
// withdrawal, which is newer in its own process), and SealedBefore
// (the withdrawal receipt's check) says "sealed after" — prev_rev R is
// above the withdrawal's revision. No renewal follows: compute-3, its
// guests running, is declared.
//
// Fixed: a record of the process not newer than its trusted record is a
// held-back record put back (heldBack), refused. With heldBackMutation the
// withdrawn compute-3 is declared.
func TestX85FutureSealedRenewalEndsWithdrawal(t *testing.T) {
	for _, tc := range []struct{ land, mut bool }{{false, false}, {true, false}, {true, true}} {
		land := tc.land
		t.Run(fmt.Sprintf("land=%t/heldBackMutation=%t", land, tc.mut), func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &heldBackMutation)
			}
			x := x85Renewing(t)
			// The harvested renewal: sealed during an earlier cut-off
			// (seq below the withdrawal's), for R = 5000.
			h := *x.r
			h.Seq -= 3
			h.PrevRev = 5000
			w := x85Withdraw(x)
			wrev := x.rev
			if d, _, ok := x.tick(time.Minute); ok {
				t.Fatalf("withdrawn compute-3 declared: %+v", d)
			}
			if land {
				x.del(5000)
				x.value(5001, h, fencing.Written{Known: true, HasExpected: true, Expected: 5000})
			}
			sealed := x.tr.SealedBefore(x71Host, fencing.Beacon{Host: x71Host, BootID: w.BootID, Incarnation: w.Incarnation, Revision: wrev, State: fencing.LeaseWithdrawn, Epoch: w.Epoch, Seq: w.Seq})
			// The runner checks for missing beacons (the landed renewal
			// has none) as it ticks.
			d, after, ok := x85TickBeacons(t, x)
			t.Logf("declared %t %s after the landing (%s); the withdrawal receipt stops it: %t", ok, after, d.Reason, sealed)
			if tc.mut {
				if !ok {
					t.Error("heldBackMutation: the withdrawn compute-3 not declared — the test no longer shows the hole")
				}
				return
			}
			if ok && !sealed {
				t.Errorf("compute-3, withdrawn in order with its guests running, declared %s after the liar landed its renewal sealed for revision 5000 (seq %d < the withdrawal's %d); SealedBefore false", after, h.Seq, w.Seq)
			}
		})
	}
}

// x85Renewing: compute-3's anchored create over marker 100, then 10
// renewals, each verified fresh and beaconed.
func x85Renewing(t *testing.T) *x71Rig {
	x := newX71Rig(t)
	x.now = x.now.Add(time.Second)
	x.r.Seq, x.r.PrevRev = 1, x.marker
	x.rev = 103
	x.value(x.rev, *x.r, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	for range 10 {
		x.now = x.now.Add(time.Second)
		prev := x.rev
		x.rev += 3
		x.r.Seq++
		x.r.PrevRev = prev
		x.value(x.rev, *x.r, fencing.Written{Known: true, HasExpected: true, Expected: prev})
		x.beacon(x.rev, *x.r)
		x.keep(x.tr.Tick(x.now))
	}
	return x
}

// TestX85StateLostSameIncarnationWithdraws: heldBack refuses a record of
// a process not newer than its trusted record only over a withdrawal.
// compute-3's agent restarts within its boot with its durable state lost
// while compute-1 had just deleted its key (nothing of its own to raise
// the incarnation from: reviewer X68's case): it reuses incarnation 2 and
// restarts its seqs at 1. It renews (anchored create, renewals, written
// fresh), then stops in order (an upgrade: its withdrawal, guests
// running); its beacons do not reach the controller (lost; with them the
// withdrawal's beacon alone keeps it undeclared). Trusted, the withdrawal
// stands: never declared. With
// heldBackActiveMutation (heldBack over an active record, its first
// version) every record of the restarted process, the withdrawal too, was
// refused as held back, and the withdrawn host, guests running, was
// declared once silent (S).
func TestX85StateLostSameIncarnationWithdraws(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("heldBackActiveMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &heldBackActiveMutation)
			}
			x := x85Renewing(t) // incarnation 2, seqs 1..11 trusted
			x.marker = x.rev + 1
			x.del(x.marker)
			x.rev = x.marker
			x.r.Seq = 0 // the state-lost process: same boot, same incarnation
			for i := range 6 {
				x.now = x.now.Add(time.Second)
				prev := x.rev
				x.rev += 3
				x.r.Seq++
				x.r.PrevRev = prev // the first one anchored on the marker
				c := *x.r
				if i == 5 {
					c.State, c.Reason = fencing.LeaseWithdrawn, "agent upgrade"
				}
				x.value(x.rev, c, fencing.Written{Known: true, HasExpected: true, Expected: prev})
				x.keep(x.tr.Tick(x.now))
			}
			d, after, declared := x.tick(3 * time.Minute)
			t.Logf("withdrawn compute-3 (reused incarnation, seqs from 1) declared %t %s %s", declared, after, d.Reason)
			if declared != mut {
				t.Errorf("withdrawn compute-3, guests running: declared %t, want %t", declared, mut)
			}
		})
	}
}

// x85Withdraw: compute-3's process stops in order (an upgrade): its
// withdrawal, by CAS on its last renewal, trusted and beaconed.
func x85Withdraw(x *x71Rig) fencing.LeaseRecord {
	x.now = x.now.Add(time.Second)
	prev := x.rev
	x.rev += 3
	x.r.Seq++
	w := *x.r
	w.State, w.Reason, w.PrevRev = fencing.LeaseWithdrawn, "agent upgrade", prev
	x.value(x.rev, w, fencing.Written{Known: true, HasExpected: true, Expected: prev})
	x.beacon(x.rev, w)
	return w
}

// x85TickBeacons runs the tracker for 3 minutes as the runner does —
// checking for missing beacons at each tick — and returns the first
// declaration.
func x85TickBeacons(t *testing.T, x *x71Rig) (Decision, time.Duration, bool) {
	for from := x.now; x.now.Sub(from) < 3*time.Minute; {
		x.now = x.now.Add(500 * time.Millisecond)
		if missing, _ := x.tr.BeaconsMissing(x.now); len(missing) > 0 {
			t.Logf("beacons missing at +%s: %v", x.now.Sub(from), missing)
		}
		for _, d := range x.tr.Tick(x.now) {
			if d.Op == OpDeclare {
				return d, x.now.Sub(from), true
			}
		}
	}
	return Decision{}, 0, false
}
