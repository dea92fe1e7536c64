package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X49: the rollbackBar outlives every record for as long as the
// fresh tracker runs. An agent restarted AFTER the fresh start with its
// durable state lost (or re-enrolled after a key delete) writes at an
// incarnation below the bar: all its genuine records are refused as
// replays (its renewals count only through its beacons). Its orderly
// stop then rests on its withdrawal BEACON alone: core NATS, at most
// once, and the last one the stopped host sends (no later beacon shows a
// chain gap). Lost, the genuine withdrawal record is refused as a replay
// and the withdrawn host is declared ~21 s later while its guests run.
// Without the rollback (or with the agent's state kept, incarnation 4, or
// rollbackBarMutation) the withdrawal record alone keeps it undeclared.

type x49Case struct {
	name     string
	inc      uint64
	del      bool // key deleted first (re-enrolled)
	wrote    bool // its beacons name the record identity (BeaconWrote)
	wBeacon  bool // its withdrawal beacon reaches the fresh tracker
	withdraw bool
	muts     []*bool
}

func x49Run(t *testing.T, c x49Case) (string, time.Duration, time.Time) {
	x36Mutate(t, c.muts...)
	b, others, bk, at := x48Rig(t)
	b.rollBack(maps.Clone(bk.keys), bk.rev)
	start := at.Add(1500 * time.Millisecond)
	b.detectRollback(at.Add(time.Second), start)
	hs := b.tr.hosts["h3"]
	t.Logf("fresh: h3 rec %s inc %d seq %d bar %v", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar)
	if c.del { // the operator deletes h3's key and re-enrols it: its agent starts afresh
		b.del(start.Add(-200*time.Millisecond), "h3")
		b.flush()
	}
	var last time.Time
	for s := 0; s < 8; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		last = now.Add(500 * time.Millisecond)
		r := x38PutMod(b, last, "h3", fencing.LeaseActive, c.inc, uint64(s+1), nil)
		if c.wrote {
			b.tr.BeaconWrote("h3", b.rev, r.Epoch, r.Incarnation, r.Seq)
		}
		if h, d := b.run(now, 1, others, x10Set([]string{"h3"})); h != "" {
			t.Fatalf("live h3 declared while renewing at inc %d (%v after fresh start); untrusted %q", c.inc, now.Add(d).Sub(start), b.tr.hosts["h3"].untrustedWhy)
		}
	}
	from := start.Add(8 * time.Second)
	if c.withdraw {
		tr := b.tr
		if !c.wBeacon {
			b.tr = nil
		}
		last = from.Add(200 * time.Millisecond)
		r := x38PutMod(b, last, "h3", fencing.LeaseWithdrawn, c.inc, 9, nil)
		b.tr = tr
		if !c.wBeacon {
			b.tr.Observe(last, "h3", b.rev, &r)
		} else if c.wrote {
			b.tr.BeaconWrote("h3", b.rev, r.Epoch, r.Incarnation, r.Seq)
		}
		b.flush()
		hs := b.tr.hosts["h3"]
		t.Logf("after W: rec %s inc %d seq %d, beacon-withdrawn %t, untrusted %q", hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.beaconWithdrawn(), hs.untrustedWhy)
	}
	h, d := b.run(from, 180, others, x10Set([]string{"h3"}))
	return h, d, from
}

// TestX49LostStateAfterFreshStartOrderlyStop: h3's agent restarted after
// the fresh start with its state lost (incarnation 2 under the bar's 3),
// renews, then stops in order (withdrawal + its beacon): its guests run on.
func TestX49LostStateAfterFreshStartOrderlyStop(t *testing.T) {
	for _, c := range []x49Case{
		{name: "control/state-kept", inc: 4, wrote: true, wBeacon: true, withdraw: true},
		{name: "fault/lost-state", inc: 2, wrote: true, wBeacon: true, withdraw: true},
		{name: "fault/lost-state/no-wrote", inc: 2, wrote: false, wBeacon: true, withdraw: true},
		{name: "control/state-kept/withdrawal-beacon-lost", inc: 4, wrote: true, wBeacon: false, withdraw: true},
		{name: "fault/lost-state/withdrawal-beacon-lost", inc: 2, wrote: true, wBeacon: false, withdraw: true},
		{name: "fault/key-recreated/withdrawal-beacon-lost", inc: 1, del: true, wrote: true, wBeacon: false, withdraw: true},
		{name: "control/lost-state/withdrawal-beacon-lost/rollbackBarMutation", inc: 2, wrote: true, wBeacon: false, withdraw: true, muts: []*bool{&rollbackBarMutation}},
		// Closed by the rollback gate (rollbackgate.go): the lost-state
		// agent's records never pass the bar, so nothing proves them —
		// not declared until an operator confirms (c). Without the gate
		// the hole shows: declared 21 s after the withdrawal.
		{name: "fault/lost-state/withdrawal-beacon-lost/rollbackGateMutation", inc: 2, wrote: true, wBeacon: false, withdraw: true, muts: []*bool{&rollbackGateMutation}},
		{name: "fault/key-recreated/withdrawal-beacon-lost/rollbackGateMutation", inc: 1, del: true, wrote: true, wBeacon: false, withdraw: true, muts: []*bool{&rollbackGateMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, d, _ := x49Run(t, c)
			if len(c.muts) > 0 && c.muts[0] == &rollbackGateMutation {
				if h == "" {
					t.Fatal("without the rollback gate the withdrawn h3 was not declared: the test no longer shows the hole the gate closes")
				}
				t.Logf("without the gate: declared %v after the withdrawal", d)
				return
			}
			if h != "" {
				t.Fatalf("the WITHDRAWN h3 (orderly stop at inc %d, guests running) declared %v after its withdrawal", c.inc, d)
			}
		})
	}
}
