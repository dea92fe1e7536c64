package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X83: newestOfProc (4a4b44d) assumes "a process's beacons name
// its newest write". Two ways a process has a record NEWER than the write
// its last beacon names, whose own beacon never comes:
//
//   - relay: in a peer round compute-3 hands its next renewal, sealed
//     (fencing.Agent startRound; agent askPeers), to its peers — compute-1
//     among them. compute-1 holds it unlanded: a genuine record of
//     compute-3's current process, newer than everything it has landed
//     yet. It puts it back (a create over its own marker) right after
//     compute-3's create lands, before the create's beacon is handled.
//   - a genuine newer write whose beacon is lost (the host dies between
//     the KV ack and the publish; or overlapping in-doubt renewals land out
//     of seq order and the agent's one-slot beacon queue keeps only the
//     older one's: fencer.beacon "replacing one not yet published").
//
// Either demotes (l.rec = nil) the candidate the host's last beacon names,
// or refuses it: the beacon vouches nothing, and compute-3, dead, is never
// declared (c). With candidateProcMutation (every vouchable record a
// candidate, as before 4a4b44d) each case is declared.

// x83OldKept: compute-1 puts back a saved record of compute-3's earlier
// boot (vouchable: no trusted record) and deletes it: it is the kept
// unfresh value from now on (no beacon ever names it), and compute-3's
// creates are candidates behind it (X82's setting).
func x83OldKept(x *x71Rig) {
	old := *x.r
	// A create (prev_rev 0) of that boot: a record sealed for an earlier
	// revision of the key is no candidate since landable (it cannot have
	// landed here), and would leave compute-3's create the kept value.
	old.BootID, old.Incarnation, old.Seq, old.PrevRev = "boot-0", 2, 900, 0
	g := x.rev + 1
	x.value(g, old, fencing.Written{Known: true, HasExpected: true, Expected: g - 1})
	x.marker = g + 1
	x.del(x.marker)
	x.rev = x.marker
}

// x83LiveThenKept: compute-3 trusted as live beforehand is not needed: the
// controller starts under the loop (newX71Rig); compute-1 makes an old
// record the kept one; compute-3 lives `live` rounds whose beacons come
// in time (the first vouch ends the unfresh window — so live=0 is the
// interesting case: compute-3 dies in the first window).
func TestX83RelayHeldNewerDemotesLastCreate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		oldKept  bool
		mut      bool
		declared bool
		flood    int
	}{
		{"kept-old-record", true, false, true, 0},
		{"kept-old-record/candidateProcMutation", true, true, true, 0},
		{"control-create-is-kept", false, false, true, 0},
		// and 70 garbage values after the relay record (compactLater runs):
		{"kept-old-record+flood70", true, false, true, 70},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &candidateProcMutation)
			}
			x := newX71Rig(t)
			if tc.oldKept {
				x83OldKept(x)
			}
			// compute-3's last create lands (its beacon is on its way).
			R, c := x.create()
			// compute-1 had been asked to relay compute-3's NEXT renewal
			// (the round's, sealed, never landed): it deletes and lands it
			// as a create over its own marker, then deletes again.
			relay := c
			relay.Seq++
			x.marker = R + 1
			x.del(x.marker)
			x.value(R+2, relay, fencing.Written{Known: true, HasExpected: true, Expected: R + 1})
			x.marker = R + 3
			x.del(x.marker)
			for range tc.flood {
				x.marker++
				x.tr.Stored(x71Host, x.marker, x.now)
				x.keep(x.tr.ObserveInvalid(x.now, x71Host, x.marker, "garbage", true))
			}
			if tc.flood > 0 {
				x.marker++
				x.del(x.marker)
			}
			x.rev = x.marker
			// compute-3 dies; the beacon of its last create is handled.
			x.beacon(R, c)
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok != tc.declared {
				t.Errorf("compute-3 dead: declared %t, want %t (vouched %d): the relay-held newer record of its process demoted the create its last beacon names", ok, tc.declared, x.vouched())
			}
		})
	}
}

// TestX83NewerWriteBeaconLostDemotesNamed: the second way, no relay: a
// create G5 (a candidate behind the kept old record), the loop's marker,
// compute-3's next create G6 (demotes G5), the marker; G5's beacon is
// handled late (behind compute-1's flood, as X75), G6's never comes
// (compute-3 died right after the write). order "b5" only; "b5b6"
// (control): G6's beacon comes.
func TestX83NewerWriteBeaconLostDemotesNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b6    bool
		mut   bool
		early bool // G5's beacon before G6's value (no demotion: control)
	}{
		{"late-b5-b6-lost", false, false, false},
		{"late-b5-b6-lost/candidateProcMutation", false, true, false},
		{"late-b5-b6-comes(control)", true, false, false},
		{"early-b5-b6-lost(control)", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mut {
				x32Mutate(t, &candidateProcMutation)
			}
			x := newX71Rig(t)
			x83OldKept(x)
			R5, c5 := x.create()
			x.marker = R5 + 1
			x.del(x.marker)
			x.rev = x.marker
			if tc.early {
				x.beacon(R5, c5)
			}
			R6, c6 := x.create()
			x.marker = R6 + 1
			x.del(x.marker)
			x.rev = x.marker
			if !tc.early {
				x.beacon(R5, c5)
			}
			if tc.b6 {
				x.beacon(R6, c6)
			}
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if !ok {
				t.Errorf("compute-3 dead: not declared within 3 minutes (vouched %d): its last beacon names G5, demoted by G6 whose beacon never came", x.vouched())
			}
		})
	}
}

// TestX83OutOfOrderLandingOlderRefused: overlapping in-doubt renewals
// (fencing.Agent.step: "a new renewal goes out every half interval even
// if one is outstanding"), both creates over compute-1's markers: G6
// lands first (kept), compute-1 deletes, G5's slower create lands over
// that marker. The agent's one-slot beacon queue (fencer.beacon,
// "replacing one not yet published") keeps only G5's beacon (acked last).
// compute-3 dies. G5 is refused as a candidate (older than the kept G6
// of its process): its beacon vouches nothing.
func TestX83OutOfOrderLandingOlderRefused(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("candidateProcMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &candidateProcMutation)
			}
			x := newX71Rig(t)
			x.now = x.now.Add(time.Second)
			x.r.Seq = 5
			c5 := *x.r
			c6 := c5
			c6.Seq = 6
			R6 := x.rev + 3
			x.value(R6, c6, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
			x.del(R6 + 1)
			R5 := R6 + 2
			x.value(R5, c5, fencing.Written{Known: true, HasExpected: true, Expected: R6 + 1})
			x.marker = R5 + 1
			x.del(x.marker)
			x.rev = x.marker
			x.beacon(R5, c5)
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if !ok {
				t.Errorf("compute-3 dead: not declared (vouched %d): its only beacon names G5, landed after G6 and refused as a candidate", x.vouched())
			}
		})
	}
}

// TestX83LostStateSameIncarnationRefused ((c), conditional as X68:
// compute-3's agent restarted within ONE boot with its state dir lost,
// its key deleted by compute-1's loop, so fencing.NewAgent restarts at
// incarnation x68AgentIncarnation — the same (boot, incarnation) as the
// boot's first process if this boot is the host's first (a fresh
// install). compute-1 puts back ONE saved renewal of that first process
// (seq 5000) before the new process's first create: kept, and every
// create of the new process (seq 1, 2, ...) is "an older write of a
// process kept already" — refused as a candidate for good; never
// vouched, never declared. Before 4a4b44d compute-1 had to put back a
// same-identity copy ahead of each create (holds) and win each race
// against the create's beacon.
func TestX83LostStateSameIncarnationRefused(t *testing.T) {
	// as x68AgentIncarnation (package controller_test): state dir lost
	// (d nil), key absent (cur nil).
	cfg := fencing.DefaultConfig(x71Host, "boot-1")
	cfg.Enabled, cfg.HardwareWatchdog = true, true
	a, _, err := fencing.NewAgent(cfg, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	inc := a.Durable().Incarnation
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("candidateProcMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &candidateProcMutation)
			}
			x := newX71Rig(t)
			x.r.Epoch, x.r.Incarnation, x.r.Seq = 0, inc, 0
			old := *x.r
			old.Seq, old.PrevRev = 5000, 7
			g := x.rev + 1
			x.value(g, old, fencing.Written{Known: true, HasExpected: true, Expected: g - 1})
			x.marker = g + 1
			x.del(x.marker)
			x.rev = x.marker
			x.rounds("vbm", 10)
			_, after, ok := x.tick(3 * time.Minute)
			t.Logf("incarnation %d: vouched %d, declared %t %s after death", inc, x.vouched(), ok, after)
			if !ok {
				t.Errorf("compute-3 dead: not declared (vouched %d): one saved record of the boot's first process refuses every create of the lost-state process", x.vouched())
			}
		})
	}
}
