package controller

import (
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestBeaconsShedCountAgainstShedder: the runner sheds the beacons a host
// publishes beyond its verification budget (run.go, beaconBudget;
// reviewer X75's open (c)); the tracker counts the shedding against that
// host alone (Tracker.BeaconsShed). h0..h9 beaconing, a loss-free
// controller; h3 dies with a write of its key hidden after a watch skip
// (garbage, a compromised node's).
//   - "own/shed-before", "own/shed-after": h3 itself shed beacons — its
//     withdrawal's may be among them — before or after its garbage came:
//     refused-due, never declared (shedOwnMutation: declared, the hole);
//   - "other/gap": h5 is the shedder; its next verified beacon's chain
//     skips the shed ones (BeaconChainShed): no loss window, h3 declared
//     (shedFleetMutation: a window, h3 refused — the first try's hole: the
//     flooding host kept the dead victim undeclared);
//   - "other/missing": h5's renewal's beacon was shed: its missing beacon
//     makes no window (BeaconsMissing, shedExplains), h3 declared
//     (shedMissMutation: refused);
//   - "other/unshed-gap": control — h5's chain gap with nothing shed is a
//     loss on the way: a window, h3 refused.
func TestBeaconsShedCountAgainstShedder(t *testing.T) {
	for _, c := range []struct {
		name, shed                      string // shed: "own-before", "own-after", "gap", "missing", "unshed-gap"
		ownMut, fleetMut, missMut, want bool   // want: h3 declared
	}{
		{name: "own/shed-before", shed: "own-before"},
		{name: "own/shed-after", shed: "own-after"},
		{name: "own/shed-after/shedOwnMutation", shed: "own-after", ownMut: true, want: true},
		{name: "own/shed-before/shedOwnMutation", shed: "own-before", ownMut: true, want: true},
		{name: "other/gap", shed: "gap", want: true},
		{name: "other/gap/shedFleetMutation", shed: "gap", fleetMut: true},
		{name: "other/missing", shed: "missing", want: true},
		{name: "other/missing/shedMissMutation", shed: "missing", missMut: true},
		{name: "other/unshed-gap", shed: "unshed-gap"},
	} {
		t.Run(c.name, func(t *testing.T) {
			shedOwnMutation, shedFleetMutation, shedMissMutation = c.ownMut, c.fleetMut, c.missMut
			defer func() { shedOwnMutation, shedFleetMutation, shedMissMutation = false, false, false }()
			tr, rev := beaconFleet(t)
			at := t0.Add(10 * time.Minute)
			tr.WatchStarted(at.Add(-time.Minute))
			prev := map[string]uint64{}
			shedRenew(tr, at.Add(-2*time.Second), &rev, prev, "h3")
			if c.shed == "gap" || c.shed == "unshed-gap" {
				// h5 renews; its verified beacon names a Prev past the last
				// one received: the beacons between were shed (or lost).
				rev++
				r5 := rec("h5", fencing.BackstopReset)
				r5.Signer = "h5-key"
				tr.Observe(at.Add(-time.Second), "h5", rev, r5)
				if c.shed == "gap" {
					tr.BeaconsShed(at.Add(-time.Second), "h5", at.Add(-1500*time.Millisecond))
				}
				if tr.BeaconChainShed(at.Add(-time.Second), "h5", rev, prev["h5"]+1, c.shed == "gap") {
					tr.RefuseCovered()
				}
				tr.ObserveBeacon(at.Add(-time.Second), "h5", rev)
				prev["h5"] = rev
			}
			// h3's last renewal, stored and delivered at `at`.
			rev++
			r3 := rec("h3", fencing.BackstopReset)
			r3.Signer = "h3-key"
			tr.Stored("h3", rev, at)
			tr.Observe(at, "h3", rev, r3)
			tr.ObserveBeacon(at, "h3", rev)
			if c.shed == "own-before" {
				tr.BeaconsShed(at.Add(time.Second), "h3", at.Add(time.Second))
			}
			if c.shed == "missing" {
				// h5 renews; its beacon is shed (the runner takes the box).
				rev++
				r5 := rec("h5", fencing.BackstopReset)
				r5.Signer = "h5-key"
				tr.Observe(at, "h5", rev, r5)
				prev["h5"] = rev    // the beacon shed named it: the next one's Prev
				prev["h5-shed"] = 1 // the next one is after a shed (beaconRef.afterShed)
				tr.BeaconsShed(at.Add(100*time.Millisecond), "h5", at.Add(50*time.Millisecond))
			}
			// The garbage at rev+2, delivered after a skip.
			rev += 2
			tr.Skipped(rev)
			tr.Stored("h3", rev, at.Add(1500*time.Millisecond))
			tr.ObserveInvalid(at.Add(2*time.Second), "h3", rev, "undecodable value (garbage)", false)
			switch c.shed {
			case "own-after":
				tr.BeaconsShed(at.Add(2500*time.Millisecond), "h3", at.Add(time.Second))
			}
			var refusedDue bool
			var declared time.Duration
			for s := 3; s <= 180 && declared == 0; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				shedRenew(tr, now, &rev, prev, "h3")
				tr.BeaconsMissing(now)
				for _, d := range tr.Tick(now) {
					switch {
					case d.Op == OpRefusedDue && d.Host == "h3":
						refusedDue = true
					case d.Op == OpDeclare && d.Host == "h3":
						declared = now.Sub(at)
					case d.Op == OpDeclare:
						t.Fatalf("declared the live %s", d.Host)
					}
				}
			}
			switch {
			case c.want && declared == 0:
				t.Fatalf("the dead h3 never declared (refused-due said: %t): %s's shedding counted for every host", refusedDue, map[bool]string{true: "h3", false: "h5"}[c.shed[:3] == "own"])
			case !c.want && declared != 0:
				t.Fatalf("h3 (its write hidden, its beacons maybe shed or lost) declared %s after its last renewal", declared)
			case !c.want && !refusedDue:
				t.Fatal("h3 not declared but no refused-due said why")
			}
			t.Logf("declared after %s, refused-due said: %t", declared, refusedDue)
		})
	}
}

// shedRenew: every host but skip renews at now, its beacon chained to its
// last one (prev, updated; prev[host+"-shed"] set: the host's beacons were
// shed before this one): no gap, no missing beacon.
func shedRenew(tr *Tracker, now time.Time, rev *uint64, prev map[string]uint64, skip string) {
	for i := range 10 {
		name := fmt.Sprintf("h%d", i)
		if name == skip {
			continue
		}
		*rev++
		r := rec(name, fencing.BackstopReset)
		r.Signer = name + "-key"
		tr.Observe(now, name, *rev, r)
		if tr.BeaconChainShed(now, name, *rev, prev[name], prev[name+"-shed"] != 0) {
			tr.RefuseCovered()
		}
		delete(prev, name+"-shed")
		tr.ObserveBeacon(now, name, *rev)
		prev[name] = *rev
	}
}

// TestBeaconBudget: the runner's per-host verification budget
// (beaconBudget): BeaconVerifyBurst at once, then BeaconVerifyRate a
// second; beyond it a beacon is shed (noted with its first time), the
// next verified one of that host carries afterShed, and another host's
// budget is its own.
func TestBeaconBudget(t *testing.T) {
	box := newBeaconBox()
	now := t0
	for i := range BeaconVerifyBurst {
		if box.shedOver("h1", now) {
			t.Fatalf("beacon %d of h1 shed within the burst of %d", i+1, BeaconVerifyBurst)
		}
	}
	if !box.shedOver("h1", now) {
		t.Fatalf("beacon %d of h1 at once not shed", BeaconVerifyBurst+1)
	}
	if box.shedOver("h2", now) {
		t.Fatal("h2's first beacon shed: h1's flood spent h2's budget")
	}
	_ = box.put("h1", fencing.Beacon{Host: "h1", Revision: 7}, false)
	_ = box.put("h1", fencing.Beacon{Host: "h1", Revision: 8}, false)
	_ = box.put("h2", fencing.Beacon{Host: "h2", Revision: 9}, false)
	revs, _, shed := box.takeAll()
	if got := []bool{revs["h1"][0].afterShed, revs["h1"][1].afterShed, revs["h2"][0].afterShed}; got[0] != true || got[1] || got[2] {
		t.Fatalf("afterShed of h1's two beacons and h2's = %v, want [true false false]", got)
	}
	if len(shed) != 1 || !shed["h1"].Equal(now) {
		t.Fatalf("shed = %v, want h1 from %v", shed, now)
	}
	now = now.Add(time.Second) // BeaconVerifyRate tokens back
	n := 0
	for !box.shedOver("h1", now) {
		n++
	}
	if n != BeaconVerifyRate {
		t.Fatalf("%d beacons of h1 verified a second after its budget ran out, want %d", n, BeaconVerifyRate)
	}
}

// TestBeaconsShedBeforeTracked: a host's beacons shed before the tracker
// tracks it (a controller start: the flood before the listing) count once
// it is: its hidden write is refused-due (earlyShed), as if tracked.
func TestBeaconsShedBeforeTracked(t *testing.T) {
	tr, rev := beaconFleet(t)
	at := t0.Add(10 * time.Minute)
	tr.BeaconsShed(at, "h10", at.Add(-time.Second))
	r := rec("h10", fencing.BackstopReset)
	r.Signer = "h10-key"
	rev++
	tr.Observe(at, "h10", rev, r)
	tr.ObserveBeacon(at, "h10", rev)
	h := tr.hosts["h10"]
	if h == nil || h.beacons.shed == nil {
		t.Fatal("h10's shedding before it was tracked was dropped")
	}
	if !h.beacons.shed.win.open || h.beacons.shed.win.from.After(at.Add(-time.Second)) {
		t.Fatalf("h10's shed window %+v: want open, from %v or earlier", h.beacons.shed.win, at.Add(-time.Second))
	}
}

// BenchmarkRunnerBeacon: what one beacon costs NATS's goroutine for the
// subscription (Runner.beacon): "verified" — decoded and its signature
// checked (every beacon before the budget, reviewer X75's flood);
// "shed" — beyond its host's budget, dropped before it is decoded. The
// ratio is how much faster a flooding host's excess goes by.
func BenchmarkRunnerBeacon(b *testing.B) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	signer := fencing.Signer{ID: "h1-key", Key: priv}
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{"h1": {{ID: "h1-key", Key: pub}}}}
	r := &Runner{Store: &natslease.Store{Keys: ring}, Now: func() time.Time { return t0 }}
	rec := fencing.LeaseRecord{Host: "h1", State: fencing.LeaseActive, Epoch: 1, Incarnation: 1, Seq: 3}
	m, err := natslease.BeaconMsg(signer, rec, 42, 41, t0)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		shed bool
	}{{"verified", false}, {"shed", true}} {
		b.Run(c.name, func(b *testing.B) {
			box := newBeaconBox()
			if c.shed {
				for !box.shedOver("h1", t0) { // the budget spent
				}
			} else {
				b.Cleanup(SetBeaconBudgetMutation(true))
			}
			n := 0
			for b.Loop() {
				r.beacon(m, box)
				if n++; n%beaconMemory == 0 {
					box.takeAll()
				}
			}
		})
	}
}
