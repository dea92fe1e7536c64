package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/controller/recovery"
	"hvguard/fencing"
)

// Reviewer X5, attacks on issue 11's latest fixes (6c8bc15..acba304).

// TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared: h0 (pinned,
// beaconing) dies at t0. A compromised node deletes h0's key once and
// writes back an old genuine record of h0 that it saved earlier (every
// agent can read every key): h0's withdrawal from an earlier orderly stop
// (an upgrade restart: every host has one), or an old controller
// declaration of h0 released since. replay() recognises no replay after a
// delete ("nothing to compare it with"), so Tracker.recreated takes it as
// h0's current trusted record: withdrawn (never declared, not even
// counted silent) or expired (never declared again). One delete and one
// write, and the dead h0 is never declared — invariant (c); docs/security.md
// "What is left" admits only an active replay "restarting the clock once
// per replay". The replay IS recognisable: its prev_rev (covered by h0's
// signature) is a revision before the delete marker's, while a genuine
// re-creation after a delete is a Create (prev_rev 0) and a rewrite of an
// untrusted value names a revision after the marker. Control: the delete
// alone (pinned: declared on time).
func TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared(t *testing.T) {
	for _, replay := range []fencing.LeaseState{"", fencing.LeaseWithdrawn, fencing.LeaseExpired} {
		name := string(replay)
		if name == "" {
			name = "control-delete-only"
		}
		t.Run(name, func(t *testing.T) {
			tr, rev := beaconFleet(t)
			old := *rec("h0", fencing.BackstopReset)
			old.Signer, old.Sig, old.PrevRev = "h0-key", "sig", 1 // genuine, written long ago by CAS on revision 1
			old.Reason = "orderly-stop"
			if replay == fencing.LeaseExpired {
				old.Signer, old.Reason = "ctl-key", "no renewal for 31s (declared by controller ctl-a, term 3)"
			}
			old.State = replay
			due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
				if s == 2 {
					rev++
					tr.Observe(now, "h0", rev, nil) // the delete
					if replay != "" {
						rev++
						r := old
						tr.Observe(now.Add(10*time.Millisecond), "h0", rev, &r) // the replay
					}
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared at %s", now.Sub(t0))
						return
					}
				}
			}
			h := tr.hosts["h0"]
			t.Errorf("dead h0 never declared in 120 s (lease_ttl + grace %s) after one delete and one replay of its old genuine %s record (prev_rev %d < the marker's revision): the tracker took it as h0's record (state %s)",
				due, replay, old.PrevRev, h.rec.State)
		})
	}
}

// TestX5HiddenRenewalsHoldTheGuard: h0 (pinned, beaconing) dies at t0. A
// compromised node supersedes every renewal of h1 and h2 (live, renewing
// every second) before the controller's watch delivers it — X4 showed a
// burst of pipelined writes into any key lags the watch at will, and the
// bucket keeps one value per key — with one garbage value. The watch then
// delivers only the garbage (Skipped), and h1's and h2's beacons name each
// renewal. ObserveBeacon counts the named, unseen revision as a renewal for
// the declaration clock (so h1 and h2 are not declared), but nothing ends
// their silence for the mass-failure guard (lastSeen moves only on a
// trusted record the watch delivered): from suspect_after on they count
// silent, with h0 3 > threshold 2, and the guard holds for as long as the
// attacker keeps it up: the dead h0 is never declared — invariant (c). A
// beacon is published only after the host's own compare-and-set landed,
// i.e. the host reached NATS: it is evidence the host is not cut off and
// could end its silence. Control: no attacker, declared on time.
func TestX5HiddenRenewalsHoldTheGuard(t *testing.T) {
	for _, attack := range []bool{false, true} {
		t.Run(fmt.Sprintf("attack=%t", attack), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
			held := false
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for i := 1; i < 10; i++ {
					host := fmt.Sprintf("h%d", i)
					rev++
					r := rec(host, fencing.BackstopReset)
					r.Signer = host + "-key"
					if attack && i <= 2 {
						// h's renewal landed at rev (its agent beacons
						// it); the attacker's garbage superseded it before
						// the watch got there.
						rev++
						tr.Skipped(rev)
						tr.ObserveInvalid(now, host, rev, "undecodable", false)
						tr.ObserveBeacon(now.Add(5*time.Millisecond), host, rev-1)
						continue
					}
					tr.Observe(now, host, rev, r)
					tr.ObserveBeacon(now.Add(5*time.Millisecond), host, rev)
				}
				for _, d := range tr.Tick(now.Add(10 * time.Millisecond)) {
					switch {
					case d.Op == OpHoldStarted:
						held = true
					case d.Op == OpDeclare && (d.Host == "h1" || d.Host == "h2"):
						t.Fatalf("live %s declared at %s", d.Host, now.Sub(t0))
					case d.Op == OpDeclare && d.Host == "h0":
						t.Logf("h0 declared at %s (hold seen %t)", now.Sub(t0), held)
						return
					}
				}
			}
			t.Errorf("dead h0 never declared in 120 s (lease_ttl + grace %s): the guard held (%t; silent %d > threshold %d) on live h1 and h2, whose every renewal a compromised node superseded before the watch delivered it although their beacons named each one",
				due, held, tr.Silent(t0.Add(120*time.Second)), tr.Threshold())
		})
	}
}

// TestX5SkipElsewhereUnstandsDeclaration: dead h0 is declared (signatures
// required). A compromised node then makes the watch skip once anywhere in
// the bucket (a burst into its own key: X4) and writes one garbage value
// into h0's key. declarationStands requires t.skippedRev <= the
// declaration's revision — a bucket-wide condition — so the declaration no
// longer stands and host recovery's gate reads the garbage (paused) or,
// for a delete, the key's absence (stopped): the fix for X2's
// TestAgentCannotStopRecoveryOfDeclaredHost is undone by one burst. For
// the declaration clock 272924e lets the beacons decide after a skip; a
// genuine write after a declaration that a skip could have hidden is a
// release (controller-signed, or --unfence by the host, whose next
// renewal beacons) or the host's rewrite of a declaration it cannot
// verify (beaconed): with beacons binding h0, the skip tells nothing.
// docs/security.md "What is left" calls the pause after a watch skip the
// safe side, but the skip is the attacker's to make. Control: no skip.
func TestX5SkipElsewhereUnstandsDeclaration(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip=%t", skip), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			declared, rev := declareH0(t, tr, rev, func(time.Time, uint64) {})
			if declared.IsZero() {
				t.Fatal("h0 never declared")
			}
			now := declared.Add(time.Second)
			if skip {
				rev += 200 // the burst into the attacker's own key (h9)
				tr.Skipped(rev)
				tr.ObserveInvalid(now, "h9", rev, "undecodable", false)
			}
			rev++
			tr.ObserveInvalid(now.Add(time.Millisecond), "h0", rev, "undecodable", false)
			for _, l := range tr.View(now.Add(2 * time.Millisecond)).Hosts {
				if l.Host == "h0" && !l.DeclarationStands {
					t.Errorf("dead h0's declaration no longer stands after a watch skip in another key and one garbage value in h0's (host recovery pauses; a delete would stop it)")
				}
			}
		})
	}
}

// TestX5ReplayedWithdrawalsEndHoldOverHeldRack: the same root cause as
// TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared, used against
// live hosts. A rack h1..h4 is cut off from NATS (its hosts reach each
// other): they confirm each other's "cannot renew", are Held and keep
// their guests running; the controller counts them silent (4 > threshold
// 2) and holds — the guard's promise to the Held hosts. A compromised node
// outside the rack deletes h1's and h2's keys and writes back each one's
// old genuine withdrawal (from any earlier orderly stop; it read the keys
// then). After a delete no replay is recognised: h1 and h2 are withdrawn,
// and a withdrawn host is not counted silent. Silent drops to 2, the hold
// ends, and h3 and h4 — Held, their guests running — are declared and
// handed to host recovery: invariants (b) and (S). Control: no attack,
// the hold stands and nothing is declared.
func TestX5ReplayedWithdrawalsEndHoldOverHeldRack(t *testing.T) {
	for _, attack := range []bool{false, true} {
		t.Run(fmt.Sprintf("attack=%t", attack), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			held := false
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for _, host := range []string{"h0", "h5", "h6", "h7", "h8", "h9"} { // h1..h4 are cut off
					rev++
					r := rec(host, fencing.BackstopReset)
					r.Signer = host + "-key"
					tr.Observe(now, host, rev, r)
					tr.ObserveBeacon(now, host, rev)
				}
				if attack && s == 40 {
					for _, host := range []string{"h1", "h2"} {
						old := *rec(host, fencing.BackstopReset)
						old.State, old.Reason = fencing.LeaseWithdrawn, "orderly-stop"
						old.Signer, old.Sig, old.PrevRev = host+"-key", "sig", 1
						rev++
						tr.Observe(now, host, rev, nil) // the delete
						rev++
						tr.Observe(now.Add(10*time.Millisecond), host, rev, &old) // the replay
					}
				}
				for _, d := range tr.Tick(now.Add(20 * time.Millisecond)) {
					switch {
					case d.Op == OpHoldStarted:
						held = true
					case d.Op == OpDeclare:
						t.Fatalf("%s declared at %s while h1..h4 were all cut off and confirming each other (Held, guests running): hold seen %t, silent now %d, threshold %d",
							d.Host, now.Sub(t0), held, tr.Silent(now), tr.Threshold())
					}
				}
			}
			if !held {
				t.Fatal("no hold: the test shows nothing")
			}
		})
	}
}

// TestX5FakeDeleteMarkersHoldForever: X4's fix (8f377be) keeps keys under
// made-up host names from counting in N, but not their DELETE markers. An
// agent may publish to any single-token lease key (relays), and a KV
// delete is such a publish: a compromised node deletes "fake-0",
// "fake-1", "fake-2" — keys that never existed. observeDeleted takes each
// marker of an unknown host for a real host deleted while this controller
// was down (restoreDeleted): tracked, deleted, lastSeen zero — counted
// SILENT at once and for ever (only Forget, by hand, drops it). 3 > the
// threshold 2: the mass-failure guard holds from the next tick, and the
// dead h0 (and every host that dies later) is never declared — invariant
// (c) for the whole fleet, three publishes, no further effort. Control:
// no markers, declared at 22 s.
func TestX5FakeDeleteMarkersHoldForever(t *testing.T) {
	for _, fakes := range []int{0, 3} {
		t.Run(fmt.Sprintf("fakes=%d", fakes), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
				if s == 1 {
					for i := range fakes {
						rev++
						tr.Observe(now, fmt.Sprintf("fake-%d", i), rev, nil)
					}
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared at %s", now.Sub(t0))
						return
					}
				}
			}
			t.Errorf("dead h0 never declared in 120 s (lease_ttl + grace %s) after delete markers of %d made-up host names: holding %t, silent %d > threshold %d",
				due, fakes, tr.Holding(), tr.Silent(t0.Add(120*time.Second)), tr.Threshold())
		})
	}
}

// TestX5OwnRecordNamesHugeGuardVersion: the versions named by members'
// records raise maxSeen, and the next guard is maxSeen + 1. A compromised
// h9 names version 2^64-1 in its own signed renewal: the controller's next
// guard (a membership change) is version 0 — agents adopt only a guard of
// a version >= theirs (fencing.Agent.SetMembers), so no agent adopts any
// guard the controller publishes from then on, and an agent started
// afterwards gets one it cannot order. Low: the controller keeps holding
// with the minimum of the kept versions (conservative); the agents' guard
// is frozen (a later shrink is not seen by them: they fence sooner).
func TestX5OwnRecordNamesHugeGuardVersion(t *testing.T) {
	tr, rev := beaconFleet(t)
	g := tr.Guard()
	tr.GuardPublished(g, nil)
	r := rec("h9", fencing.BackstopReset)
	r.Signer, r.Guard = "h9-key", &fencing.GuardVersion{Version: ^uint64(0), Threshold: g.Ref().Threshold}
	rev++
	tr.Observe(t0.Add(time.Second), "h9", rev, r)
	rev++
	tr.Observe(t0.Add(time.Second), "h1", rev, nil) // a membership change: a new guard is due
	if n := tr.Guard(); n.Version <= g.Version {
		t.Errorf("after h9 named guard version %d in its own record, the controller's next guard has version %d (published before: %d): no agent adopts it", ^uint64(0), n.Version, g.Version)
	}
}

// TestX5OwnRecordNamesThresholdZero: the controller holds with the
// minimum of every threshold a member's latest record names (guard.go:
// an agent cut off keeps acting on the guard it had). A record is the
// agent's own word — a compromised h9 signs its own renewals with its own
// key (trusted) and names {version: the current one, threshold: 0}. The
// controller's threshold becomes 0: one silent host is a "mass failure",
// the guard holds, and the dead h0 — like every host that dies while h9
// keeps naming 0 — is never declared (c, fleet-wide, no write outside
// h9's own key). A named threshold could be bounded below by the threshold
// of the version it names (the controller published it: it knows it).
// Control: h9 names the real guard, h0 declared at 22 s.
func TestX5OwnRecordNamesThresholdZero(t *testing.T) {
	for _, lie := range []bool{false, true} {
		t.Run(fmt.Sprintf("lie=%t", lie), func(t *testing.T) {
			tr, rev := beaconFleet(t)
			g := tr.Guard()
			tr.GuardPublished(g, nil)
			named := g.Ref()
			if lie {
				named = &fencing.GuardVersion{Version: g.Version, Threshold: 0}
			}
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for i := 1; i < 10; i++ {
					host := fmt.Sprintf("h%d", i)
					rev++
					r := rec(host, fencing.BackstopReset)
					r.Signer, r.Guard = host+"-key", g.Ref()
					if i == 9 {
						r.Guard = named // compromised h9's own (signed, trusted) renewal
					}
					tr.Observe(now, host, rev, r)
					tr.ObserveBeacon(now, host, rev)
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared at %s", now.Sub(t0))
						return
					}
				}
			}
			t.Errorf("dead h0 never declared in 120 s: h9's own record names threshold 0 for guard version %d (published threshold %d): controller threshold %d, holding %t",
				g.Version, g.Ref().Threshold, tr.Threshold(), tr.Holding())
		})
	}
}

// TestOwnNamedThresholdZeroPausesNoRecovery: host recovery waits while
// the guard holds a declared host (recovery.WhyGuardHolding). With the
// hold judged on the lowest threshold of any member, h9 naming threshold
// 0 in its own renewals (TestX5OwnRecordNamesThresholdZero) made the gate
// of every declared host say guard-holding while anything was silent;
// per host, the dead h0's declaration is recoverable at once.
// hostThresholdMutation fails it.
func TestOwnNamedThresholdZeroPausesNoRecovery(t *testing.T) {
	tr, rev := beaconFleet(t)
	g := tr.Guard()
	tr.GuardPublished(g, nil)
	declared := ""
	for s := 1; s <= 60; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for i := 1; i < 10; i++ {
			host := fmt.Sprintf("h%d", i)
			rev++
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Guard = host+"-key", g.Ref()
			if i == 9 && declared != "" { // h9 names 0 once h0 is declared
				r.Guard = &fencing.GuardVersion{Version: g.Version, Threshold: 0}
			}
			tr.Observe(now, host, rev, r)
			tr.ObserveBeacon(now, host, rev)
		}
		if declared != "" {
			v := tr.View(now)
			for _, h := range v.Hosts {
				if h.Host != declared {
					continue
				}
				if why, detail := recovery.Confirm(leaseOf(h)); why == recovery.WhyGuardHolding {
					t.Fatalf("%s declared, but its recovery waits: %s (silent %d, lowest threshold %d, named by h9)", declared, detail, v.Silent, v.Threshold)
				}
				if v.Threshold != 0 || v.Silent == 0 {
					t.Fatalf("h9's threshold 0 not in force (threshold %d, silent %d): the test shows nothing", v.Threshold, v.Silent)
				}
				return
			}
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare {
				rev++
				d.Record.Signer = "ctl-key"
				tr.Observe(now, d.Host, rev, &d.Record) // the declaration lands
				declared = d.Host
			}
		}
	}
	t.Fatal("h0 never declared: the test shows nothing")
}
