package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// Reviewer X4, attacks on the beacons (6c8bc15).

// TestX4GarbageBetweenValueAndBeaconDeclaresLiveHost: h0 is alive and
// renews every second, but its records are unverifiable here (its key
// rotated before this controller re-read host_keys_file, or signing off
// on the agent); its beacon names each renewal, arriving just after the
// value (the watch and the beacon travel separately:
// TestBeaconsLetLiveHostRenewUnverifiably "beacon after the value"). A
// compromised node watching h0's key writes one garbage value right after
// each of h0's renewals, before h0's beacon arrives. ObserveBeacon counts a
// beacon only when it names the pending value AND that value is still the
// key's latest: the garbage replaced it, so h0's genuine, beaconed
// renewals all count for nothing and the live h0 is declared after
// lease_ttl + grace (it then fences on the declaration). Invariants (b)
// and (S). (h0's next CAS is on the garbage's revision: the agent rewrites
// an untrusted value while its lease is held, so h0 keeps renewing.)
// Control: without the garbage, never declared.
func TestX4GarbageBetweenValueAndBeaconDeclaresLiveHost(t *testing.T) {
	for _, garbage := range []bool{false, true} {
		t.Run(fmt.Sprintf("garbage=%t", garbage), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
				rev++
				own := rev
				tr.ObserveInvalid(now, "h0", own, "signed by unknown key h0-new", false)
				if garbage {
					rev++
					tr.ObserveInvalid(now.Add(5*time.Millisecond), "h0", rev, "undecodable", false)
				}
				tr.ObserveBeacon(now.Add(10*time.Millisecond), "h0", own)
				for _, d := range tr.Tick(now.Add(20 * time.Millisecond)) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Fatalf("live h0 declared at %s although its beacon named every one of its renewals (a garbage value followed each): %s", now.Sub(t0), d.Reason)
					}
				}
			}
		})
	}
}

// TestX4DeclaredLiveHostStandsOverGarbage: the same interleaving after a
// declaration. h0 is declared (its beacons lost for lease_ttl + grace —
// core NATS, best effort); h0's agent cannot verify the declaration
// (controller key rotated before the agents learnt it) and, its lease
// held, rewrites it — a renewal its beacon names — and a compromised node
// writes garbage right after. The beacon comes after the garbage:
// corroboratedRev never moves, DeclarationStands stays true and host
// recovery goes on evacuating a host whose agent renews (S).
func TestX4DeclaredLiveHostStandsOverGarbage(t *testing.T) {
	tr, rev := beaconFleet(t)
	declared, rev := declareH0(t, tr, rev, func(now time.Time, rev uint64) {
		tr.ObserveInvalid(now, "h0", rev, "signed by unknown key h0-new", false) // beacon lost
	})
	if declared.IsZero() {
		t.Fatal("h0 never declared")
	}
	now := declared.Add(time.Second)
	rev++
	own := rev
	tr.ObserveInvalid(now, "h0", own, "signed by unknown key h0-new", false)
	rev++
	tr.ObserveInvalid(now.Add(5*time.Millisecond), "h0", rev, "undecodable", false)
	tr.ObserveBeacon(now.Add(10*time.Millisecond), "h0", own)
	for _, l := range tr.View(now.Add(20 * time.Millisecond)).Hosts {
		if l.Host == "h0" && l.DeclarationStands {
			t.Errorf("h0's declaration still stands after h0's own beacon named a value it wrote after it (revision %d; garbage at %d followed)", own, rev)
		}
	}
}

// TestX4LongHoldLapsesBeacons: a rack loses power: h0, h1, h2 die (3 > the
// guard threshold 2 of 10 hosts): the mass-failure guard holds and
// declares nothing. A compromised node writes garbage into h0's key every
// second. While h0's last beacon is within BeaconTrustWindow (5 min) the
// garbage is discounted; the hold outlasts it (h1 and h2 come back after
// 6 min; the hold ends GuardWindow later): the tracker is lenient again,
// every garbage value restarts h0's declaration clock, and the dead h0 is
// never declared — invariant (c). BeaconTrustWindow's comment assumes a
// dead host is declared within lease_ttl + grace of its last beacon; a
// hold (or an operator's pause) breaks that.
func TestX4LongHoldLapsesBeacons(t *testing.T) {
	tr, rev := beaconFleet(t)
	held := false
	var heldEnd time.Time
	for s := 1; s <= 12*60; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		// The live hosts renew and beacon (every agent of this release
		// does; the lead's fix made the window fleet-wide, so the test
		// models the beacons the live agents publish).
		for i := 3; i < 10; i++ {
			rev++
			r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
			r.Signer = fmt.Sprintf("h%d-key", i)
			tr.Observe(now, r.Host, rev, r)
			tr.ObserveBeacon(now, r.Host, rev)
		}
		if s >= 6*60 { // h1 and h2 are back
			for i := 1; i < 3; i++ {
				rev++
				r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
				r.Signer = fmt.Sprintf("h%d-key", i)
				tr.Observe(now, r.Host, rev, r)
				tr.ObserveBeacon(now, r.Host, rev)
			}
		}
		rev++
		tr.ObserveInvalid(now, "h0", rev, "undecodable", false) // the attacker
		for _, d := range tr.Tick(now) {
			switch {
			case d.Op == OpHoldStarted:
				held = true
			case d.Op == OpHoldEnded:
				heldEnd = now
			case d.Op == OpDeclare && d.Host == "h0":
				tr.Observe(now, "h0", rev+1, &d.Record)
				t.Logf("h0 declared at %s (hold ended at %s)", now.Sub(t0), heldEnd.Sub(t0))
				return
			}
		}
	}
	if !held || heldEnd.IsZero() {
		t.Fatalf("no hold, or it never ended: the test shows nothing (held %t, ended %v)", held, heldEnd)
	}
	t.Errorf("dead h0 never declared in 12 min (the hold ended at %s) while a compromised node wrote garbage into its key every second", heldEnd.Sub(t0))
}

// TestX4DeleteAndReplayDropBeacons: h0 (pinned, beaconing) dies at t0. A
// compromised node deletes h0's key and writes back h0's last genuine
// record (signed by h0: a replay nobody recognises after a delete —
// docs/security.md "What is left" says it restarts the clock "once per
// replay"), then garbage every second. Tracker.recreated starts h0 afresh
// WITHOUT its beacon state (beaconAt zero): the beacons no longer bind
// it, every garbage value restarts its declaration clock again and the
// dead h0 is never declared — not once per replay but for ever (c).
func TestX4DeleteAndReplayDropBeacons(t *testing.T) {
	tr, rev := beaconFleet(t)
	last := tr.hosts["h0"].rec
	last.PrevRev, last.Sig = 0, "sig"
	for s := 1; s <= 120; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		renewOthers(tr, now, &rev)
		switch s {
		case 2:
			rev++
			tr.Observe(now, "h0", rev, nil) // the delete
			rev++
			r := last
			tr.Observe(now, "h0", rev, &r) // the replay
		default:
			rev++
			tr.ObserveInvalid(now, "h0", rev, "undecodable", false)
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h0" {
				t.Logf("h0 declared at %s", now.Sub(t0))
				return
			}
		}
	}
	t.Errorf("dead h0 never declared in 120 s after one delete + replay, then garbage every second (lease_ttl + grace %s)", tr.hosts["h0"].rec.Timing.LeaseTTL+tr.hosts["h0"].grace)
}

// TestX4BeaconQueueCrowdedOutByOneHost: the controller's beacon queue
// (then BeaconQueue, 4096; now beaconBox, per host) was shared by every host, and a host may publish its
// own beacon subject as fast as it likes (the shipped permissions). A
// compromised compute-1 publishing its own beacons in a loop keeps the
// queue full: the beacons of every other host are dropped ("queue
// full"). Their unverifiable values are then discounted (a live host
// whose key this controller does not know yet is declared: b, S), and
// once their last beacon is BeaconTrustWindow old the tracker is lenient
// again for them (garbage keeps a dead host undeclared: c). The queue
// needs no depth per host: the tracker only needs the highest revision
// each host's beacons named.
func TestX4BeaconQueueCrowdedOutByOneHost(t *testing.T) {
	r := &Runner{}
	out := newBeaconBox()
	msg := func(host string, rev uint64) *nats.Msg {
		m, err := natslease.BeaconMsg(fencing.Signer{}, fencing.LeaseRecord{Host: host}, rev, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for i := range 4096 + 10 { // compute-1's flood (between two reads of the tracker)
		r.beacon(msg("compute-1.example.org", uint64(i+1)), out)
	}
	var refused error
	r.OnBeacon = func(_ string, _ fencing.Beacon, err error) { refused = err }
	r.beacon(msg("compute-3.example.org", 99999), out)
	if refused != nil {
		t.Errorf("compute-3's beacon dropped because compute-1 flooded its own beacon subject: %v", refused)
	}
	revs, _ := out.take()
	if got := revs["compute-3.example.org"]; len(got) != 1 || got[0].rev != 99999 {
		t.Errorf("compute-3's beacon not delivered to the tracker after compute-1's flood: %v", got)
	}
}

// TestX4FakeKeysRaiseGuardThreshold: the shipped permissions let an agent
// write any single-token key of the lease bucket (kvPrefix + "*", for
// relays). A compromised node writes garbage under 40 made-up host names
// ("fake-0" …). Each becomes a tracked host ("no trusted record yet:
// never declared") and a MEMBER: N goes from 10 to 50, the guard the
// controller publishes says 50 members, the agents adopt it (it is
// signed by the controller), and the threshold goes from 2 to 10. A rack
// of 5 hosts cut off by a network fault then no longer makes the
// controller hold (5 ≤ 10) nor its agents Held (they need 11 + lying
// peers): all five fence and are declared — the mass-failure guard,
// which exists to keep an outage from fencing hosts, is switched off by
// one node (invariant (a), amplified by any outage). A key that never
// held a trusted record should not count toward N (a smaller N is the
// conservative side, as for a deleted key).
func TestX4FakeKeysRaiseGuardThreshold(t *testing.T) {
	tr, rev := beaconFleet(t)
	before := tr.Threshold()
	for i := range 40 {
		rev++
		tr.ObserveInvalid(t0.Add(time.Second), fmt.Sprintf("fake-%d", i), rev, "undecodable", false)
	}
	g := tr.Guard()
	tr.GuardPublished(g, nil)
	// The agents adopt the controller's new guard and name it.
	for i := range 10 {
		rev++
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		r.Signer = fmt.Sprintf("h%d-key", i)
		r.Guard = g.Ref()
		tr.Observe(t0.Add(2*time.Second), r.Host, rev, r)
	}
	if after := tr.Threshold(); after > before {
		t.Errorf("40 garbage values under made-up host names raised the guard threshold from %d to %d (published guard: %d members)", before, after, g.Members)
	}
}

// TestX4DeleteMakesLiveHostsBeaconsIgnored: h0 is alive, its records
// unverifiable here (key rotated out of order), each named by its beacon.
// A compromised node deletes h0's key once; h0's agent re-creates it at
// its next renewal and goes on renewing. observeInvalid leaves h0 marked
// deleted (only a trusted record re-creates it) and ObserveBeacon ignores
// a deleted host's beacons: every later renewal of h0 is discounted and
// the live h0 is declared (pinned: a delete stops nothing) — (b), (S).
func TestX4DeleteMakesLiveHostsBeaconsIgnored(t *testing.T) {
	tr, rev := beaconFleet(t)
	for s := 1; s <= 120; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		renewOthers(tr, now, &rev)
		if s == 5 {
			rev++
			tr.Observe(now, "h0", rev, nil) // the delete
		}
		rev++
		tr.ObserveInvalid(now, "h0", rev, "signed by unknown key h0-new", false)
		tr.ObserveBeacon(now.Add(10*time.Millisecond), "h0", rev)
		for _, d := range tr.Tick(now.Add(20 * time.Millisecond)) {
			if d.Op == OpDeclare && d.Host == "h0" {
				t.Fatalf("live h0 declared at %s (its key deleted once at 5 s) although its beacon named every renewal: %s", now.Sub(t0), d.Reason)
			}
		}
	}
}
