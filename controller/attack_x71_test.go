package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

const x71Host = "compute-3.example.org"

// x71Rig: reviewer X65's delete loop across a controller start (as
// x65StartEnd), the tracker returned for further steps.
type x71Rig struct {
	t         *testing.T
	tr        *Tracker
	now       time.Time
	rev       uint64
	marker    uint64
	r         *fencing.LeaseRecord
	beaconRev uint64
	said      []Decision
}

func newX71Rig(t *testing.T) *x71Rig {
	t.Helper()
	cfg := DefaultConfig()
	cfg.GuardCount, cfg.GuardShare = 100, 1
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	x := &x71Rig{t: t, tr: tr, now: t0, rev: 100, marker: 100}
	tr.Stored(x71Host, x.marker, x.now)
	tr.Observe(x.now, x71Host, x.marker, nil)
	tr.WatchStarted(x.now)
	r := rec(x71Host, fencing.BackstopWatchdog)
	r.Signer, r.Sig, r.BootID, r.Epoch, r.Incarnation = x71Host+"-key", "signed", "boot-1", 1, 2
	x.r = r
	return x
}

func (x *x71Rig) keep(ds []Decision) {
	for _, d := range ds {
		x.said = append(x.said, d)
	}
}

func (x *x71Rig) value(rev uint64, c fencing.LeaseRecord, w fencing.Written) {
	x.tr.Stored(x71Host, rev, x.now)
	x.keep(x.tr.ObserveWritten(x.now, x71Host, rev, &c, w))
}

func (x *x71Rig) beacon(rev uint64, c fencing.LeaseRecord) {
	x.tr.BeaconChain(x.now, x71Host, rev, x.beaconRev)
	x.tr.ObserveBeacon(x.now, x71Host, rev)
	x.tr.BeaconWrote(x71Host, rev, c.Epoch, c.Incarnation, c.Seq)
	x.keep(x.tr.BeaconVouches(x.now, x71Host, rev, c.BootID, c.Epoch, c.Incarnation, c.Seq))
	if c.State == fencing.LeaseWithdrawn {
		x.keep(x.tr.ObserveWithdrawal(x.now, x71Host, rev))
	}
	x.beaconRev = rev
}

func (x *x71Rig) del(rev uint64) {
	x.tr.Stored(x71Host, rev, x.now)
	x.keep(x.tr.Observe(x.now, x71Host, rev, nil))
}

// rounds: compute-3's creates over the loop's markers, one a second, in
// order (v: value, b: beacon, m: marker).
func (x *x71Rig) rounds(order string, n int) {
	for range n {
		x.now = x.now.Add(time.Second)
		x.rev += 3
		x.r.Seq++
		x.r.PrevRev = 0
		wrote, c := x.rev, *x.r
		for _, s := range order {
			switch s {
			case 'v':
				x.value(wrote, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
			case 'b':
				x.beacon(wrote, c)
			case 'm':
				x.marker = wrote + 1
				x.del(x.marker)
			}
		}
		x.rev = x.marker
		x.keep(x.tr.Tick(x.now))
	}
}

// createDeleted: a second on, compute-3's next create over the loop's
// marker lands (3 revisions on: compute-1's writes between), and the loop
// deletes it at once. It returns the create's revision and record.
func (x *x71Rig) createDeleted() (uint64, fencing.LeaseRecord) {
	R, c := x.create()
	x.marker = R + 1
	x.del(x.marker)
	return R, c
}

// create: a second on, compute-3's next create over the loop's marker
// lands (3 revisions on). It returns its revision and record.
func (x *x71Rig) create() (uint64, fencing.LeaseRecord) {
	x.now = x.now.Add(time.Second)
	x.r.Seq++
	x.r.PrevRev = 0
	R := x.rev + 3
	c := *x.r
	x.value(R, c, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	return R, c
}

// withdrawal: a second on, compute-3's current process stops in order
// (reason): its withdrawal lands over the loop's marker (3 revisions on,
// x.rev) and is beaconed. It returns the record.
func (x *x71Rig) withdrawal(reason string) fencing.LeaseRecord {
	x.now = x.now.Add(time.Second)
	x.rev += 3
	x.r.Seq++
	w := *x.r
	w.State, w.Reason = fencing.LeaseWithdrawn, reason
	x.value(x.rev, w, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
	x.beacon(x.rev, w)
	return w
}

// tick runs the tracker for d; it returns the first declaration.
func (x *x71Rig) tick(d time.Duration) (Decision, time.Duration, bool) {
	from := x.now
	for x.now.Sub(from) < d {
		x.now = x.now.Add(500 * time.Millisecond)
		for _, dd := range x.tr.Tick(x.now) {
			x.said = append(x.said, dd)
			if dd.Op == OpDeclare {
				return dd, x.now.Sub(from), true
			}
		}
	}
	return Decision{}, 0, false
}

func (x *x71Rig) vouched() int {
	n := 0
	for _, d := range x.said {
		if d.Op == OpVouched {
			n++
		}
	}
	return n
}

// TestX71VouchedCreateReceiptsCover (invariant 2): the dead compute-3,
// its first create vouched under the loop, must be covered by its own
// receipts stream created an hour before (else its declaration waits on
// ErrReceiptsUnsound for ever while the loop's marker stays).
func TestX71VouchedCreateReceiptsCover(t *testing.T) {
	for _, order := range []string{"vbm", "vmb", "bvm"} {
		t.Run(order+"/vouchCoverMutation", func(t *testing.T) {
			x32Mutate(t, &vouchCoverMutation)
			x := newX71Rig(t)
			x.rounds(order, 20)
			if _, _, ok := x.tick(2 * time.Minute); !ok {
				t.Fatal("not declared by the tracker")
			}
			if !x.tr.ReceiptsMatter(x71Host) || x.tr.ReceiptsCover(x71Host, t0.Add(-time.Hour)) {
				t.Fatal("covered (or receipts do not matter) without the vouched coverage: the test no longer shows the hole")
			}
		})
		t.Run(order, func(t *testing.T) {
			x := newX71Rig(t)
			x.rounds(order, 20)
			if x.vouched() != 1 {
				t.Fatalf("vouched %d", x.vouched())
			}
			_, after, ok := x.tick(2 * time.Minute)
			if !ok {
				t.Fatal("not declared by the tracker")
			}
			created := t0.Add(-time.Hour)
			if x.tr.ReceiptsMatter(x71Host) && !x.tr.ReceiptsCover(x71Host, created) {
				h := x.tr.hosts[x71Host]
				t.Errorf("%s: due %s after death, but receipts matter and the stream created an hour before does not cover it (trustedFrom %d, trustedStored %d): the dead host waits on ErrReceiptsUnsound for ever", order, after, h.trustedFrom, h.trustedStored)
			}
		})
	}
}

// TestX71WithdrawalKnownBeforeLateVouch (invariant 1): compute-3's last
// create is delivered (unfresh), compute-1 deletes it; compute-3 stops in
// order — its withdrawal superseded by compute-1's next delete before the
// watch delivered it — and the controller learns of the withdrawal
// (ObserveWithdrawal: a receipt, or its beacon in the same batch) before
// the late beacon of the create vouches for it. Never declared.
func TestX71WithdrawalKnownBeforeLateVouch(t *testing.T) {
	for _, rounds := range []int{0, 3} {
		x := newX71Rig(t)
		x.rounds("vbm", rounds)
		R, c := x.createDeleted()
		// withdrawal: a create over the marker at R+2, deleted at R+3
		// before delivery.
		w := *x.r
		w.Seq++
		w.State, w.Reason = fencing.LeaseWithdrawn, "stopped"
		W := R + 2
		x.tr.Skipped(R + 3)
		x.marker = R + 3
		x.del(x.marker)
		x.keep(x.tr.ObserveWithdrawal(x.now, x71Host, W))
		x.beacon(R, c)
		x.beacon(W, w)
		if d, after, ok := x.tick(3 * time.Minute); ok {
			t.Fatalf("rounds %d: the withdrawn compute-3 declared %s after its withdrawal: %s", rounds, after, d.Reason)
		}
	}
}

// TestX71GarbageBeforeBeaconKeepsDeadUndeclared (invariant 2): under the
// loop across a start, compute-1 writes garbage into compute-3's key
// right after each create (then deletes): the create's beacon, arriving
// after the garbage, vouches for nothing (only the key's last value,
// or one a delete followed) — compute-3 dies, undeclared.
func TestX71GarbageBeforeBeaconKeepsDeadUndeclared(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("vouchLaterMutation=%t", mut), func(t *testing.T) {
			if mut {
				x32Mutate(t, &vouchLaterMutation)
			}
			if declared := x71GarbageBeforeBeacon(t); declared == mut {
				t.Errorf("compute-3 dead, declared within 3 minutes: %t (want %t): garbage between each create and its beacon", declared, !mut)
			}
		})
	}
}

// x71GarbageBeforeBeacon runs TestX71GarbageBeforeBeaconKeepsDeadUndeclared's
// loop (one garbage value, then the marker) and reports whether the dead
// compute-3 was declared.
func x71GarbageBeforeBeacon(t *testing.T) bool { return x72Flood(t, 2) }

// TestX71AgentRestartUnderLoopAfterVouch (invariant 2, adjacent): under
// the loop across a start compute-3 is vouched (its create), then its
// agent restarts (a new incarnation, same boot: an upgrade) — every create
// of the new process is another process's create after a delete
// (otherBootCreate): never trusted while the loop runs, and no beacon
// vouches for it (a trusted record is held). It then dies: declared?
func TestX71AgentRestartUnderLoopAfterVouch(t *testing.T) {
	for _, c := range []struct{ withdraw, trustedBefore, mut bool }{{false, false, false}, {true, false, false}, {true, true, false}, {true, false, true}, {true, true, true}} {
		withdraw := c.withdraw
		vouchOtherBootMutation = c.mut
		t.Cleanup(func() { vouchOtherBootMutation = false })
		x := newX71Rig(t)
		if c.trustedBefore {
			// pre-existing check: compute-3 trusted (an update written
			// fresh) before the loop begins — no vouch involved.
			x.now = x.now.Add(time.Second)
			x.r.Seq++
			x.r.PrevRev = x.marker
			x.rev++
			x.value(x.rev, *x.r, fencing.Written{Known: true, HasExpected: true, Expected: x.marker})
			x.beacon(x.rev, *x.r)
			x.marker = x.rev + 1
			x.del(x.marker)
			x.rev = x.marker
		}
		x.rounds("vbm", 3)
		if withdraw {
			// orderly stop of the old process: its withdrawal, a create over the marker.
			x.withdrawal("upgrade")
			x.keep(x.tr.ObserveWithdrawal(x.now, x71Host, x.rev))
			x.marker = x.rev + 1
			x.del(x.marker)
			x.rev = x.marker
		}
		x.r.Incarnation++
		x.r.Seq = 0
		x.rounds("vbm", 10)
		d, after, ok := x.tick(3 * time.Minute)
		if c.mut {
			if ok {
				t.Errorf("withdraw=%t trustedBefore=%t vouchOtherBootMutation: declared %s after death: the test no longer shows the hole", withdraw, c.trustedBefore, after)
			}
			continue
		}
		if !ok {
			t.Errorf("withdraw=%t trustedBefore=%t: the restarted compute-3, dead, not declared within 3 minutes (vouched %d)", withdraw, c.trustedBefore, x.vouched())
		} else {
			t.Logf("withdraw=%t: declared %s after death: %s", withdraw, after, d.Reason)
		}
	}
}
