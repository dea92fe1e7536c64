package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X35: attacks on companionsChecked / chainHolds / keepEarly.

// TestX35RollbackDuringListingDropsEarlyWithdrawal (S, narrow: needs a
// lease-stream rollback detected while a controller's watch is still
// listing; no compromised node needed). A controller starts (fresh
// tracker) and lists a large fleet. h3 stops in order after the
// listing's snapshot: its withdrawal W lands and its beacon arrives
// before h3's listed value — kept by keepEarly, to be replayed at
// WatchStarted. The rollback check (started by a tick during the
// listing: ring.maxRv > 0) finds the stream rolled back back to before W
// and the runner stops: r.rolledBack carries Tracker.Withdrawals(),
// which knows nothing of the kept beacons (t.early, never replayed). The
// fresh tracker lists the rolled-back stream (h3's last active record),
// h3's agent is gone (it sends nothing more): h3 is declared lease_ttl +
// grace later while its guests run. Control: the same beacon processed
// once h3 was listed (directly, before the rollback) is carried and h3 is
// never declared.
// Fix (sketch): Withdrawals() (the rollback carry) also returns the kept
// early withdrawals (t.early, kind earlyWithdrawal) — with the host's
// record if it was listed, or as a bare withdrawal beacon otherwise
// (KeepWithdrawn must then accept a host the old tracker held no record
// of); or replay t.early before taking the carry (StreamRolledBack).
func TestX35RollbackDuringListingDropsEarlyWithdrawal(t *testing.T) {
	for _, c := range []struct {
		name          string
		beaconInTrack bool
	}{
		{name: "beacon-before-h3-listed"},
		{name: "control-beacon-after-h3-listed", beaconInTrack: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			tr.SetEnrolled(enrolledH)
			start := t0.Add(100 * time.Second)
			const wRev = 11
			beacon := func(at time.Time) {
				tr.BeaconChain(at, "h3", wRev, 10)
				tr.ObserveBeacon(at, "h3", wRev)
				tr.ObserveWithdrawal(at, "h3", wRev)
			}
			if !c.beaconInTrack {
				beacon(start.Add(300 * time.Millisecond))
			}
			recs, _ := listFleet(tr, start)
			if c.beaconInTrack {
				beacon(start.Add(600 * time.Millisecond))
			}
			// The listing is not over (a large fleet: more keys to come);
			// the rollback check answers: rolled back to before W.
			now := start.Add(time.Second)
			withdrawn := tr.Withdrawals()
			counted := tr.CountedSilent(now)
			tr.StreamRolledBack(now, "test rollback")
			lastDelivered := uint64(10)
			t.Logf("carried withdrawals: %+v", withdrawn)

			nt, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			nt.SetSigningRequired(true)
			nt.SetEnrolled(enrolledH)
			nt.AfterRollback(lastDelivered)
			nstart := now.Add(5 * time.Second)
			for i, name := range listingOrder {
				rev := uint64(1 + i)
				nt.Skipped(rev)
				nt.Stored(name, rev, start)
				nt.ObserveWritten(nstart, name, rev, recs[name], fencing.Written{Known: true, HasExpected: true, Expected: recs[name].PrevRev})
			}
			nt.WatchStarted(nstart)
			for _, w := range withdrawn {
				nt.KeepWithdrawn(w, lastDelivered)
			}
			for _, h := range counted {
				nt.KeepCounted(h)
			}
			nt.GuardPublished(nt.Guard(), nil)
			nrev := uint64(20)
			declared, _ := x26Run(t, nt, nstart, 180, &nrev, "h3")
			if declared != 0 {
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the restart: its withdrawal beacon, kept during the listing (keepEarly), was not in the rollback carry", declared)
			}
		})
	}
}

// TestX35EarlyCapDropsWithdrawalUnnoted (S: a compromised node, a
// controller (re)starting; the cap's loss window does not help a host
// with no beacon in the fresh tracker). While a fresh tracker lists the
// fleet, a compromised node h11 (not listed yet — its key written last,
// or none) floods its own beacon subject: keepEarly keeps its beacons
// (h11 untracked) until maxEarlyBeacons, then drops every later one and
// notes earlyLost. h3 (listed late, renewing every few seconds: no beacon
// of it kept before the cap) withdraws after the listing's snapshot; its
// withdrawal beacon is dropped at the cap. h11 overwrites W with G. At
// WatchStarted the cap makes a loss window [earlyLost, now] — but G,
// delivered right after the listing (the watch's backlog) and before the
// first acting tick restores the memory, finds h3 with no beacon in this
// tracker and not yet remembered: hasBeaconed false, afterSkip notes no
// hidden write, so the window covers nothing; observeInvalid takes the
// lenient path (clock restarted at G) and h3 is declared lease_ttl +
// grace later while its guests run. Controls: no flood (the withdrawal
// beacon replayed: never declared); the flood with G delivered after
// the memory restore (noted, covered: refused).
// Fix (sketch): at the cap keep, per host, at least the withdrawal
// beacons and the newest beacon (a per-host slot instead of dropping), or
// count a host with a beacon dropped at the cap as having beaconed
// (hasBeaconed) — simplest: restore the memory's Beacons flags before
// WatchStarted processes anything further (at the listing's end), or
// re-check the kept G (afterSkip) when the memory restore marks the
// host remembered.
func TestX35EarlyCapDropsWithdrawalUnnoted(t *testing.T) {
	for _, c := range []struct {
		name         string
		flood        bool
		gAfterMemory bool
		wantDeclared bool
	}{
		{name: "flood-g-before-memory", flood: true},
		{name: "control-no-flood"},
		{name: "control-flood-g-after-memory", flood: true, gAfterMemory: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			tr.SetEnrolled(enrolledH)
			start := t0.Add(100 * time.Second)
			const wRev, gRev = 11, 12
			if c.flood {
				for i := range maxEarlyBeacons + 10 {
					tr.ObserveBeacon(start.Add(200*time.Millisecond), "h11", uint64(1_000_000+i))
				}
			}
			at := start.Add(300 * time.Millisecond)
			tr.BeaconChain(at, "h3", wRev, 10)
			tr.ObserveBeacon(at, "h3", wRev)
			tr.ObserveWithdrawal(at, "h3", wRev)
			recs, prev := listFleet(tr, start)
			tr.WatchStarted(start.Add(500 * time.Millisecond))
			g := func() {
				tr.Skipped(gRev)
				missStored(tr, start.Add(700*time.Millisecond), "h3", gRev, start.Add(400*time.Millisecond))
				tr.ObserveInvalid(start.Add(700*time.Millisecond), "h3", gRev, "undecodable value (garbage)", false)
			}
			if !c.gAfterMemory {
				g() // the watch's backlog, before the first tick
			}
			for _, name := range tr.Hosts() { // the first acting tick
				tr.RestoreMemory(start.Add(time.Second), name, Memory{Beacons: true})
			}
			tr.GuardPublished(tr.Guard(), nil)
			if c.gAfterMemory {
				g()
			}
			declared, refused := fleetRun(t, tr, start, gRev, recs, prev, "h3")
			t.Logf("declared %s, refused-due %t; windows %+v", declared, refused, tr.lossWindows)
			if declared != 0 && !c.wantDeclared {
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the controller started: its withdrawal beacon was dropped at maxEarlyBeacons (h11's flood) and G, delivered before the memory restore, was not noted as a hidden write, so the cap's window covered nothing", declared)
			}
		})
	}
}

// TestX35NewHostBeaconsBeforeFirstDelivery (S, narrow; not new with this
// change — keepEarly's scope stops short of it). Membership change in a
// running controller (its listing long over): a new host h10 joins —
// first record A — and stops in order (withdrawal W) while the watch lags
// (a compromised node's bursts keep it 20 s behind, reviewer X4): both
// beacons arrive before the watch delivers A, h10 is not tracked, and
// they are dropped (keepEarly keeps beacons only during a listing). The
// node overwrites W with G. The watch delivers A (h10's first trusted
// record) and G after a skip: h10 never beaconed in this tracker, so no
// hidden write is noted, G restarts its clock (lenient), and h10 is
// declared lease_ttl + grace later while its guests run. Control: the
// same beacons arriving once A was delivered (h10 tracked): withdrawn,
// never declared.
// Fix (sketch): keep beacons of enrolled hosts not tracked yet at any
// time (bounded per host, e.g. the newest few and any withdrawal), and
// replay them when the host's first value is observed (Observe /
// ObserveWritten / ObserveInvalid of an untracked host).
func TestX35NewHostBeaconsBeforeFirstDelivery(t *testing.T) {
	for _, c := range []struct {
		name        string
		beaconLater bool
	}{
		{name: "beacons-before-first-delivery"},
		{name: "control-beacons-after-first-delivery", beaconLater: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, rev := boundFleet(t)
			at := t0.Add(time.Minute)
			x26Renew(tr, at, &rev, true, "")
			// h10 joins: A at aRev (stored at), W at wRev (at+2s), G at
			// gRev (at+3s) over W.
			aRev, wRev, gRev := rev+1, rev+2, rev+3
			rev += 3
			r10 := rec("h10", fencing.BackstopReset)
			r10.Signer = "h10-key"
			beacons := func(now time.Time) {
				tr.BeaconChain(now, "h10", aRev, 0)
				tr.ObserveBeacon(now, "h10", aRev)
				tr.BeaconChain(now, "h10", wRev, aRev)
				tr.ObserveBeacon(now, "h10", wRev)
				tr.ObserveWithdrawal(now, "h10", wRev)
			}
			if !c.beaconLater {
				beacons(at.Add(2100 * time.Millisecond))
			}
			// The lagging watch: A delivered 20 s after it was written, G
			// after a skip (W superseded).
			dl := at.Add(20 * time.Second)
			tr.Stored("h10", aRev, at)
			tr.ObserveWritten(dl, "h10", aRev, r10, fencing.Written{Known: true, HasExpected: true, Expected: r10.PrevRev})
			if c.beaconLater {
				beacons(dl.Add(100 * time.Millisecond))
			}
			tr.Skipped(gRev)
			tr.Stored("h10", gRev, at.Add(3*time.Second))
			tr.ObserveInvalid(dl.Add(200*time.Millisecond), "h10", gRev, "undecodable value (garbage)", false)
			declared, _ := x26Run(t, tr, dl, 180, &rev, "h10")
			if declared != 0 {
				t.Fatalf("the withdrawn new host h10 (guests running) declared %s after the watch delivered its first record: its beacons (the withdrawal's among them) came before it was tracked and were dropped", declared)
			}
		})
	}
}
