package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// x75CopyRounds: reviewer X65's delete loop across a controller start
// (x71Rig), where compute-1 (compromised), right after deleting each
// create of compute-3, puts a COPY of that very create back (a create
// over its own marker: prev_rev 0, like the genuine one) and deletes it
// again — all before compute-3's beacon for the create is handled. The
// copy is itself an unfresh, vouchable value of compute-3's own and takes
// the place of the kept one (keepUnfresh); the beacon then names a
// revision nothing is kept for. copy=false: the plain loop (control).
// compute-3 lives n rounds, then dies. Reports whether it was declared
// within 3 minutes of its death.
func x75CopyRounds(t *testing.T, n int, copy bool) (bool, *x71Rig) {
	x := newX71Rig(t)
	for range n {
		x75CopyRound(t, x, copy)
	}
	_, _, ok := x.tick(3 * time.Minute)
	return ok, x
}

// TestX75CopyOfCreateBeforeBeaconKeepsDeadUndeclared (c): see x75CopyRounds.
func TestX75CopyOfCreateBeforeBeaconKeepsDeadUndeclared(t *testing.T) {
	if ok, x := x75CopyRounds(t, 20, false); !ok {
		t.Fatalf("control: plain loop, dead compute-3 not declared (vouched %d)", x.vouched())
	}
	if ok, x := x75CopyRounds(t, 20, true); !ok {
		t.Errorf("dead compute-3 not declared within 3 minutes of its death: a copy of each create, put back after the loop's delete before the create's beacon, displaced the kept value (vouched %d)", x.vouched())
	}
	x75Mutated(t, func() bool { ok, _ := x75CopyRounds(t, 20, true); return ok })
}

// x75Mutated runs attack with vouchCandidateMutation (a later vouchable
// value takes the kept one's place, as before reviewer X75) and fails
// unless the dead host stays undeclared: the test still shows the hole.
func x75Mutated(t *testing.T, attack func() bool) {
	t.Helper()
	vouchCandidateMutation = true
	defer func() { vouchCandidateMutation = false }()
	if attack() {
		t.Error("vouchCandidateMutation: the dead compute-3 declared: the test no longer shows the hole")
	}
}

// x75PutOlderRounds: as x75CopyRounds, but compute-1 needs no read of the
// new create: right after it lands, compute-1 PUTS (no expected-revision
// header, on top of the create — no delete first) a copy of compute-3's
// PREVIOUS create, which it has held since the round before (not older
// than the newest record compute-3's beacons named: still vouchable), then
// deletes (the loop). older=false: the plain loop (control).
func x75PutOlderRounds(t *testing.T, n int, older bool) (bool, *x71Rig) {
	x := newX71Rig(t)
	// compute-3's create from before the controller started (compute-1
	// read it then): any of its records it holds will do at first.
	x.r.Seq = 5
	old := *x.r
	prev := &old
	for range n {
		R, c := x.create()
		next := R + 1
		if older && prev != nil {
			x.value(next, *prev, fencing.Written{Known: true}) // a plain put: no header
			next++
		}
		x.marker = next
		x.del(x.marker)
		x.beacon(R, c)
		x.rev = x.marker
		cc := c
		prev = &cc
		for _, d := range x.tr.Tick(x.now) {
			if d.Op == OpDeclare {
				t.Fatalf("live compute-3 declared: %s", d.Reason)
			}
		}
	}
	_, _, ok := x.tick(3 * time.Minute)
	return ok, x
}

// TestX75PutOfPreviousCreateKeepsDeadUndeclared (c): see x75PutOlderRounds.
func TestX75PutOfPreviousCreateKeepsDeadUndeclared(t *testing.T) {
	if ok, x := x75PutOlderRounds(t, 20, false); !ok {
		t.Fatalf("control: plain loop, dead compute-3 not declared (vouched %d)", x.vouched())
	}
	if ok, x := x75PutOlderRounds(t, 20, true); !ok {
		t.Errorf("dead compute-3 not declared within 3 minutes of its death: a plain put of its previous create right after each new one (before the new one's beacon) displaced the kept value (vouched %d)", x.vouched())
	}
	x75Mutated(t, func() bool { ok, _ := x75PutOlderRounds(t, 20, true); return ok })
}

// x75CopyRound is one round of x75CopyRounds on x.
func x75CopyRound(t *testing.T, x *x71Rig, copy bool) {
	R, c := x.createDeleted()
	if copy {
		x.value(x.marker+1, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
		x.marker += 2
		x.del(x.marker)
	}
	x.beacon(R, c)
	x.rev = x.marker
	for _, d := range x.tr.Tick(x.now) {
		if d.Op == OpDeclare {
			t.Fatalf("live compute-3 declared: %s", d.Reason)
		}
	}
}

// TestX75HeldRestartCopiesAfterTrust: compute-3 trusted (vouched), then its
// agent restarts (new incarnation) under the loop with copies displacing
// each new create: it dies — declared on its trusted record.
func TestX75HeldRestartCopiesAfterTrust(t *testing.T) {
	x := newX71Rig(t)
	x.rounds("vbm", 3)
	x.r.Incarnation++
	x.r.Seq = 0
	for range 10 {
		x75CopyRound(t, x, true)
	}
	if _, after, ok := x.tick(3 * time.Minute); !ok {
		t.Errorf("restarted compute-3 dead, not declared (vouched %d)", x.vouched())
	} else {
		t.Logf("declared %s after death", after)
	}
}

// x75DelayedBeacons: the loop across a start, every beacon of compute-3
// handled lag rounds late (a compromised node saturating the runner's
// beacon subscription — verified one at a time on NATS's goroutine — with
// its own beacon subject: delayed, none dropped); copy: compute-1 also
// puts a copy of each create back after its delete (then deletes it).
// compute-3 lives n rounds, then dies (its pending beacons then arrive).
func x75DelayedBeacons(t *testing.T, n, lag int, copy bool) (bool, *x71Rig) {
	x := newX71Rig(t)
	type nb struct {
		rev uint64
		c   fencing.LeaseRecord
	}
	var pending []nb
	flush := func(keep int) {
		for len(pending) > keep {
			x.beacon(pending[0].rev, pending[0].c)
			pending = pending[1:]
		}
	}
	for range n {
		R, c := x.createDeleted()
		if copy {
			x.value(x.marker+1, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
			x.marker += 2
			x.del(x.marker)
		}
		pending = append(pending, nb{R, c})
		flush(lag)
		x.rev = x.marker
		for _, d := range x.tr.Tick(x.now) {
			if d.Op == OpDeclare {
				t.Fatalf("live compute-3 declared: %s", d.Reason)
			}
		}
	}
	x.now = x.now.Add(2 * time.Second)
	flush(0)
	_, _, ok := x.tick(3 * time.Minute)
	return ok, x
}

// TestX75DelayedBeaconsCopiesKeepDeadUndeclared (c): beacons delayed
// (a flood of the attacker's own beacon subject) and a copy after each
// create: the dead compute-3 is never declared. Controls: delayed
// beacons alone (declared: its last create's late beacon vouches), and
// copies with beacons on time (lag 0: the beacon after the copy).
func TestX75DelayedBeaconsCopiesKeepDeadUndeclared(t *testing.T) {
	for _, lag := range []int{0, 1, 3} {
		if ok, x := x75DelayedBeacons(t, 20, lag, false); !ok {
			t.Fatalf("control lag %d: no copies, dead compute-3 not declared (vouched %d)", lag, x.vouched())
		}
		if ok, x := x75DelayedBeacons(t, 20, lag, true); !ok {
			t.Errorf("lag %d: dead compute-3 not declared within 3 minutes of its death (vouched %d)", lag, x.vouched())
		}
		x75Mutated(t, func() bool { ok, _ := x75DelayedBeacons(t, 20, lag, true); return ok })
	}
}

// TestX75HeldRestartCopiesThenWithdrawal (S attempt): compute-3 vouched
// (p1), its agent crash-restarts (p2: new incarnation) under the loop;
// compute-1 copies each p2 create back after its delete (p2 never
// trusted, p1's active record stays the trusted one); p2 then stops in
// order: its withdrawal W (a create over the marker) is followed by a
// copy of p2's last create and a delete before W's beacon. The withdrawn
// compute-3 (guests running) must not be declared.
func TestX75HeldRestartCopiesThenWithdrawal(t *testing.T) {
	for _, lag := range []bool{false, true} {
		x := newX71Rig(t)
		x.rounds("vbm", 3)
		x.r.Incarnation++
		x.r.Seq = 0
		for range 5 {
			x75CopyRound(t, x, true)
		}
		x.now = x.now.Add(time.Second)
		last := *x.r
		w := *x.r
		w.Seq++
		w.PrevRev = 0
		w.State, w.Reason = fencing.LeaseWithdrawn, "stopped"
		W := x.rev + 3
		x.value(W, w, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
		x.marker = W + 1
		x.del(x.marker)
		x.value(x.marker+1, last, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
		x.marker += 2
		x.del(x.marker)
		if lag {
			x.now = x.now.Add(3 * time.Second)
		}
		x.beacon(W, w)
		if d, after, ok := x.tick(3 * time.Minute); ok {
			t.Errorf("lag %t: the withdrawn compute-3 declared %s after its withdrawal: %s", lag, after, d.Reason)
		}
	}
}

// x75RestartInOrder: a RUNNING controller trusts compute-3 (vouched);
// compute-3's agent restarts in order (an upgrade: its withdrawal, trusted;
// then a new incarnation) while compute-1 runs the delete loop on its key
// — and, with copy, puts a copy of each create of the new process back
// after its delete, before the create's beacon. The new process lives
// n rounds, then compute-3 dies. Reports whether it was declared.
func x75RestartInOrder(t *testing.T, n int, copy bool) (bool, *x71Rig) {
	x := newX71Rig(t)
	x.rounds("vbm", 3)
	x.withdrawal("upgrade")
	x.marker = x.rev + 1
	x.del(x.marker)
	x.rev = x.marker
	x.r.Incarnation++
	x.r.Seq = 0
	for range n {
		x75CopyRound(t, x, copy)
	}
	_, _, ok := x.tick(3 * time.Minute)
	return ok, x
}

// TestX75OrderlyRestartCopiesKeepDeadUndeclared (c): see x75RestartInOrder
// (no controller restart needed: reviewer X70/X71's "an agent restarted
// in order under the loop stayed withdrawn" back, with one copy a round).
func TestX75OrderlyRestartCopiesKeepDeadUndeclared(t *testing.T) {
	if ok, x := x75RestartInOrder(t, 10, false); !ok {
		t.Fatalf("control: no copies, the restarted compute-3 dead, not declared (vouched %d)", x.vouched())
	}
	if ok, x := x75RestartInOrder(t, 10, true); !ok {
		h := x.tr.hosts[x71Host]
		t.Errorf("the restarted compute-3, dead, not declared within 3 minutes: its trusted record stays the old process's withdrawal (%s, incarnation %d; vouched %d)", h.rec.State, h.rec.Incarnation, x.vouched())
	}
	x75Mutated(t, func() bool { ok, _ := x75RestartInOrder(t, 10, true); return ok })
}

// TestX81CopiesAndGarbageBeforeBeacon (reviewer X81, tracker side): under
// the loop across a start, compute-1 answers each of compute-3's creates
// with 100 pairs of (a copy of the create put back, garbage) and its
// delete marker before the create's beacon is taken — values a burst
// lands in milliseconds, a beacon delayed by a flood comes after. A copy
// of a record kept already is no candidate (holds) and folds with the
// garbage (compactLater): the create is vouched, and compute-3, dead,
// declared. With laterCompactMutation the 65th value dropped the kept
// create every round: never vouched, never declared.
func TestX81CopiesAndGarbageBeforeBeacon(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("laterCompactMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &laterCompactMutation)
			}
			x := newX71Rig(t)
			for range 5 {
				R, c := x.create()
				g := R
				for range 100 {
					g++
					x.value(g, c, fencing.Written{Known: true, HasExpected: true, Expected: g - 1}) // the copy
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
			t.Logf("vouched %d, declared %t %s after death", x.vouched(), ok, after)
			if ok == mut {
				t.Errorf("compute-3 dead: declared %t, want %t (vouched %d)", ok, !mut, x.vouched())
			}
		})
	}
}
