package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X6, attacks on 1127cce (issue 11, X5's fixes).

// x6Withdrawal is host's old genuine withdrawal (an earlier orderly stop,
// sealed by its key on revision 1), which any agent could read then.
func x6Withdrawal(host string) fencing.LeaseRecord {
	old := *rec(host, fencing.BackstopReset)
	old.State, old.Reason = fencing.LeaseWithdrawn, "orderly-stop"
	old.Signer, old.Sig, old.PrevRev = host+"-key", "sig", 1
	return old
}

// x6Replay is how the attacker of TestX6ReplayedWithdrawalsAcrossRestartEndHold
// writes an old genuine record back while no controller runs, and so
// what the replay's stored message says (fencing.Written).
type x6Replay struct {
	name string
	// old returns host's old genuine record; written what its stored
	// message says (marker: the revision of the delete marker before it).
	old     func(host string) fencing.LeaseRecord
	written func(marker uint64) fencing.Written
}

// x6Replays: the withdrawals written back by a plain put (no header) or
// by a delete then a create (nats.go's Create writes on the marker's
// revision, not on the record's prev_rev 1), or by a compare-and-set on
// the key's current revision; and (reviewer X9) an old controller
// declaration released since, put back.
var x6Replays = []x6Replay{
	{"withdrawn-put", x6Withdrawal, func(uint64) fencing.Written { return fencing.Written{Known: true} }},
	{"withdrawn-delete-create", x6Withdrawal, func(m uint64) fencing.Written {
		return fencing.Written{Known: true, HasExpected: true, Expected: m}
	}},
	{"withdrawn-cas-current", x6Withdrawal, func(m uint64) fencing.Written {
		return fencing.Written{Known: true, HasExpected: true, Expected: m - 1}
	}},
	{"released-put", x9Release, func(uint64) fencing.Written { return fencing.Written{Known: true} }},
}

// x9Release is the controller's old genuine release of host's old
// declaration (sealed by the controller's key on the expired record's
// revision 2), which any agent could read then.
func x9Release(host string) fencing.LeaseRecord {
	old := *rec(host, fencing.BackstopReset)
	old.State, old.Reason, old.Epoch = fencing.LeaseReleased, "evacuated", 1
	old.Signer, old.Sig, old.PrevRev = "ctl-key", "sig", 2
	return old
}

// observeFirst feeds tr a listed value as the Runner does: with what its
// stored message says when the tracker needs it.
func observeFirst(tr *Tracker, now time.Time, host string, rev uint64, r *fencing.LeaseRecord, w fencing.Written) []Decision {
	if tr.NeedsWritten(host) {
		return tr.ObserveWritten(now, host, rev, r, w)
	}
	return tr.Observe(now, host, rev, r)
}

// TestX6ReplayedWithdrawalsAcrossRestartEndHold: X5's Held-rack attack
// (TestX5ReplayedWithdrawalsEndHoldOverHeldRack) against a controller that
// starts after it. A rack h1..h4 is cut off (Held, guests running); the
// controller C1 holds (4 > threshold 2) — its last published guard is for
// 10 members (threshold 2). C1 stops (an upgrade of a single controller,
// or of every controller; the attacker needs no more than to act while
// none runs). While no controller runs, a compromised node
// writes h1's and h2's old genuine withdrawals back into their keys (a
// plain put, or a delete then a create). The new controller C2's listing shows only those withdrawals,
// for hosts it never saw: replay() compares nothing (h == nil), so they
// were trusted — withdrawn, not counted silent; no marker was seen, so no
// guard with the shrunken membership was ever published to keep a lower
// threshold in force (when C1 sees the delete, the published 8-member
// guard keeps threshold 1 in force while h3 and h4 name the older
// version: that case holds). Silent 2 = threshold 2: no hold, and h3 and
// h4 — Held, guests running — were declared at lease_ttl + grace after C2's
// start: (S), (b). Now a first value is trusted only if its stored message
// shows it written by a compare-and-set on its prev_rev (ObserveWritten):
// the replays are untrusted, h1 and h2 count silent, C2 holds.
// Control: no attack, C2 holds and declares nothing.
func TestX6ReplayedWithdrawalsAcrossRestartEndHold(t *testing.T) {
	t.Run("attack=none", func(t *testing.T) {
		if d := x6RestartOverHeldRack(t, nil); d != "" {
			t.Fatal(d)
		}
	})
	for _, a := range x6Replays[:3] {
		t.Run("attack="+a.name, func(t *testing.T) {
			if d := x6RestartOverHeldRack(t, &a); d != "" {
				t.Fatal(d)
			}
		})
	}
}

// TestX9ReplayedReleaseAtRestartEndsHold: TestX6ReplayedWithdrawalsAcrossRestartEndHold
// with an old controller declaration released since (controller-signed
// released, prev_rev 2) put back into h1's and h2's keys (docs/security.md
// had it open after reviewer X9): a released host is not counted silent
// either.
func TestX9ReplayedReleaseAtRestartEndsHold(t *testing.T) {
	a := x6Replays[3]
	if d := x6RestartOverHeldRack(t, &a); d != "" {
		t.Fatal(d)
	}
}

// TestX6WrittenMutation: with writtenMutation (a first value trusted
// without its stored message's word, as before) every replay of
// x6Replays ends C2's hold and a Held host is declared.
func TestX6WrittenMutation(t *testing.T) {
	writtenMutation = true
	defer func() { writtenMutation = false }()
	for _, a := range x6Replays {
		t.Run(a.name, func(t *testing.T) {
			d := x6RestartOverHeldRack(t, &a)
			if d == "" {
				t.Fatal("the mutation kills nothing: C2 held")
			}
			t.Logf("with the mutation: %s", d)
		})
	}
}

// x6RestartOverHeldRack runs TestX6ReplayedWithdrawalsAcrossRestartEndHold's
// fleet with attack (nil: none) and returns what went wrong ("": C2 held
// and declared nothing for 90 s).
func x6RestartOverHeldRack(t *testing.T, attack *x6Replay) string {
	t.Helper()
	c1, rev := beaconFleet(t)
	g := c1.Guard() // the guard agents act on (h1..h4 name it)
	c1.GuardPublished(g, nil)
	live := []string{"h0", "h5", "h6", "h7", "h8", "h9"} // h1..h4 are cut off at t0
	latest := map[string]uint64{}
	renew := func(tr *Tracker, now time.Time) {
		for _, host := range live {
			rev++
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Guard = host+"-key", g.Ref()
			r.PrevRev = latest[host]
			tr.Observe(now, host, rev, r)
			tr.ObserveBeacon(now, host, rev)
			latest[host] = rev
		}
	}
	for s := 1; s <= 30; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		renew(c1, now)
		for _, d := range c1.Tick(now.Add(20 * time.Millisecond)) {
			if d.Op == OpDeclare {
				t.Fatalf("C1 declared %s at %s", d.Host, now.Sub(t0))
			}
		}
	}
	if !c1.Holding() {
		t.Fatal("C1 not holding: the test shows nothing")
	}
	g = c1.Guard()
	c1.GuardPublished(g, nil) // C1's last publish; C1 stops
	restart := t0.Add(31 * time.Second)
	marker := map[string]uint64{}
	if attack != nil { // no controller runs
		for _, host := range []string{"h1", "h2"} {
			rev += 2 // the delete, then the replay
			marker[host], latest[host] = rev-1, rev
		}
	}

	// C2 starts: its watch lists every key's latest value (each with
	// what its stored message says: the genuine ones were written by a
	// compare-and-set on their prev_rev), then syncs; its first tick
	// restores the published guard.
	c2, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	c2.SetSigningRequired(true)
	c2.SetEnrolled(enrolledH) // as the Runner does from its keyring
	now := restart.Add(time.Second)
	for i := range 10 {
		host := fmt.Sprintf("h%d", i)
		r := rec(host, fencing.BackstopReset)
		r.Signer, r.Guard = host+"-key", g.Ref()
		lrev, ok := latest[host]
		if !ok {
			lrev = uint64(1 + i) // h1..h4: their last record before the cut (a create)
		} else {
			r.PrevRev = lrev - 1
		}
		c2.Skipped(lrev)
		if attack != nil && (host == "h1" || host == "h2") {
			old := attack.old(host)
			observeFirst(c2, now, host, lrev, &old, attack.written(marker[host])) // the replay: the key's latest value
			continue
		}
		observeFirst(c2, now, host, lrev, r, fencing.Written{Known: true, HasExpected: true, Expected: r.PrevRev})
	}
	c2.WatchStarted(now)
	c2.RestoreGuard(g)
	c2.GuardPublished(c2.Guard(), nil)
	for s := 1; s <= 90; s++ {
		now := restart.Add(time.Duration(1+s) * time.Second)
		renew(c2, now)
		for _, d := range c2.Tick(now.Add(20 * time.Millisecond)) {
			if d.Op == OpDeclare {
				return fmt.Sprintf("C2 declared %s %s after its start while h1..h4 were all cut off and confirming each other (Held, guests running): silent %d, threshold %d, withdrawn %v (replays of old records)",
					d.Host, now.Sub(restart), c2.Silent(now), c2.Threshold(), c2.Withdrawn())
			}
		}
	}
	if !c2.Holding() {
		return "C2 not holding: the test shows nothing"
	}
	return ""
}

// TestX6ReturningHostNamesPrunedGuardVersion: 1127cce counts a threshold a
// member's record names only as the kept threshold of the version named,
// and a version not kept names nothing — on the premise that every
// version an agent may act on is kept. It is not: keep() prunes the
// versions below the oldest one named by the members that count, and a
// withdrawn host (or a declared one) does not count. h3 withdraws while
// the fleet is 4 hosts (guard v1: threshold 0); 6 hosts join (v2:
// threshold 2), every counting member names v2 and v1 is pruned. h3's
// agent starts again with the guard it cached (v1: agents never go back
// to an older version, and its first renewal goes out before its first
// membership read — or that read fails, or a guard it cannot verify is
// refused): it acts on threshold 0 and its record names v1, which the
// controller no longer keeps, so the named threshold counts for nothing.
// h3 and h9 are then cut off: h3 confirms h9's outage (2 > 0 + lying_peers
// 1): Held, guests running. The controller's threshold is 2: silent 2 is
// no mass failure, and h3 is declared while its guests run (S). Before
// 1127cce the named threshold 0 was taken (guardClaimMutation: holds).
// Control: h3 names v2.
func TestX6ReturningHostNamesPrunedGuardVersion(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale-cache=%t", stale), func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			rev := uint64(0)
			put := func(now time.Time, host string, st fencing.LeaseState, gv *fencing.GuardVersion) {
				rev++
				r := rec(host, fencing.BackstopReset)
				r.Signer, r.State, r.Guard = host+"-key", st, gv
				tr.Observe(now, host, rev, r)
				tr.ObserveBeacon(now, host, rev)
			}
			now := t0
			for i := range 4 {
				put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, nil)
			}
			g1 := tr.Guard()
			tr.GuardPublished(g1, nil)
			if g1.Ref().Threshold != 0 {
				t.Fatalf("v1 threshold %d, want 0", g1.Ref().Threshold)
			}
			for i := range 4 {
				put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, g1.Ref())
			}
			now = now.Add(time.Second)
			put(now, "h3", fencing.LeaseWithdrawn, g1.Ref()) // orderly stop (maintenance)
			for i := 4; i < 10; i++ {
				put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, g1.Ref())
			}
			g2 := tr.Guard()
			tr.GuardPublished(g2, nil)
			for s := 2; s <= 12; s++ { // every counting member adopts v2; republished
				now = t0.Add(time.Duration(s) * time.Second)
				for _, i := range []int{0, 1, 2, 4, 5, 6, 7, 8, 9} {
					put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, g2.Ref())
				}
				tr.GuardPublished(tr.Guard(), nil)
				tr.Tick(now)
			}
			t.Logf("kept versions before h3 returns: %v (v1 %d, v2 %d)", tr.GuardVersions(), g1.Version, g2.Version)
			// h3's agent starts again: its first renewal names the guard it acts on.
			now = t0.Add(13 * time.Second)
			named := g2.Ref()
			if stale {
				named = g1.Ref()
			}
			put(now, "h3", fencing.LeaseActive, named)
			for _, i := range []int{0, 1, 2, 4, 5, 6, 7, 8, 9} {
				put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, g2.Ref())
			}
			// From 13 s on h3 and h9 are cut off; h3 is Held when it acts on v1.
			for s := 14; s <= 80; s++ {
				now = t0.Add(time.Duration(s) * time.Second)
				for _, i := range []int{0, 1, 2, 4, 5, 6, 7, 8} {
					put(now, fmt.Sprintf("h%d", i), fencing.LeaseActive, g2.Ref())
				}
				tr.GuardPublished(tr.Guard(), nil)
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						if stale {
							t.Fatalf("h3 declared %s after it was cut off, Held (it acts on guard v%d, threshold 0: 2 silent > 0 + lying_peers 1) with its guests running: controller threshold %d (silent %d), kept %v",
								now.Sub(t0.Add(13*time.Second)), g1.Version, tr.Threshold(), tr.Silent(now), tr.GuardVersions())
						}
						t.Logf("control: h3 (on v2, threshold 2: not Held, it fences) declared at %s", now.Sub(t0))
						return
					}
				}
			}
			if !stale {
				t.Fatal("control: h3 never declared: the test shows nothing")
			}
		})
	}
}

// TestX6DeletesWhileNoControllerEndHold: 1127cce ignores, with signatures
// required, the delete marker of a host this controller never saw — a
// host deleted while no controller ran is no longer counted silent
// (before: restoreDeleted counted it, docs/fencing.md "Key deleted" still
// says so). 12 hosts (threshold 2); a rack h1..h4 is cut off and Held
// (4 > 2 + lying_peers 1), the controller C1 holds. C1 stops; while no
// controller runs h1's and h2's keys are deleted (a compromised node: two
// publishes; or an operator cleaning up). C2's listing shows two markers
// of hosts it never saw: ignored; the guard C1 published lists no deleted
// host. N = 10 (threshold still 2), silent h3, h4 = 2: no hold, and the
// Held h3 and h4 are declared while their guests run (S). With
// fakeMarkerMutation (the rule before 1127cce) C2 holds. Control: no
// deletes, C2 holds.
func TestX6DeletesWhileNoControllerEndHold(t *testing.T) {
	for _, attack := range []bool{false, true} {
		t.Run(fmt.Sprintf("attack=%t", attack), func(t *testing.T) {
			newTracker := func() *Tracker {
				tr, err := NewTracker(resetConfig())
				if err != nil {
					t.Fatal(err)
				}
				tr.SetSigningRequired(true)
				return tr
			}
			var g fencing.Guard
			rev := uint64(0)
			latest := map[string]uint64{}
			put := func(tr *Tracker, now time.Time, host string) {
				rev++
				r := rec(host, fencing.BackstopReset)
				r.Signer, r.Guard = host+"-key", g.Ref()
				tr.Observe(now, host, rev, r)
				tr.ObserveBeacon(now, host, rev)
				latest[host] = rev
			}
			hosts := make([]string, 12)
			for i := range hosts {
				hosts[i] = fmt.Sprintf("h%d", i)
			}
			cut := map[string]bool{"h1": true, "h2": true, "h3": true, "h4": true}
			c1 := newTracker()
			for _, h := range hosts {
				put(c1, t0, h)
			}
			g = c1.Guard()
			c1.GuardPublished(g, nil)
			for _, h := range hosts {
				put(c1, t0, h) // everyone names g; h1..h4 are cut off from t0 on
			}
			for s := 1; s <= 30; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for _, h := range hosts {
					if !cut[h] {
						put(c1, now, h)
					}
				}
				c1.GuardPublished(c1.Guard(), nil)
				for _, d := range c1.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s", d.Host)
					}
				}
			}
			if !c1.Holding() || c1.Threshold() != 2 {
				t.Fatalf("C1 holding %t threshold %d: the test shows nothing", c1.Holding(), c1.Threshold())
			}
			g = c1.Guard()
			c1.GuardPublished(g, nil) // C1's last publish; C1 stops
			deleted := map[string]bool{}
			if attack {
				for _, h := range []string{"h1", "h2"} {
					rev++
					latest[h], deleted[h] = rev, true
				}
			}
			restart := t0.Add(32 * time.Second)
			c2 := newTracker()
			for _, h := range hosts {
				c2.Skipped(latest[h])
				if deleted[h] {
					c2.Observe(restart, h, latest[h], nil) // the marker
					continue
				}
				r := rec(h, fencing.BackstopReset)
				r.Signer, r.Guard = h+"-key", g.Ref()
				c2.Observe(restart, h, latest[h], r)
			}
			c2.WatchStarted(restart)
			c2.RestoreGuard(g)
			for s := 1; s <= 90; s++ {
				now := restart.Add(time.Duration(s) * time.Second)
				for _, h := range hosts {
					if !cut[h] {
						put(c2, now, h)
					}
				}
				c2.GuardPublished(c2.Guard(), nil)
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C2 declared %s %s after its start while h1..h4 were all cut off and Held (guests running): silent %d, threshold %d, members %d",
							d.Host, now.Sub(restart), c2.Silent(now), c2.Threshold(), c2.Members())
					}
				}
			}
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}

// TestX6GarbageThenDeleteFakesHoldAfterRestart: 1127cce ignores the delete
// markers of hosts never seen (X5's made-up markers), but a made-up name
// the controller has seen — one garbage value written there first — is
// "seen": its marker makes it a deleted host, and deletedHosts() lists
// every deleted host whose record is neither expired nor withdrawn,
// including one with no trusted record at all (state ""). So the published
// guard's deleted list carries "fake-0..2", and the next controller (a
// restart, a takeover) restores them (restoreDeleted): active, lastSeen
// zero — silent at once and for ever, and it publishes them again. 3 >
// threshold 2: the guard holds for good and the dead h0 is never declared
// (c, fleet-wide; six publishes, then any restart). Control: no fakes,
// declared on time.
func TestX6GarbageThenDeleteFakesHoldAfterRestart(t *testing.T) {
	for _, fakes := range []int{0, 3} {
		t.Run(fmt.Sprintf("fakes=%d", fakes), func(t *testing.T) {
			c1, rev := beaconFleet(t)
			now := t0.Add(time.Second)
			for i := range fakes {
				host := fmt.Sprintf("fake-%d", i)
				rev++
				c1.ObserveInvalid(now, host, rev, "undecodable", false) // garbage under a made-up name
				rev++
				c1.Observe(now, host, rev, nil) // then its delete
			}
			g := c1.Guard()
			c1.GuardPublished(g, nil)
			t.Logf("C1's published guard: members %d, deleted %v", g.Members, g.Deleted)

			c2, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			c2.SetSigningRequired(true)
			c2.SetEnrolled(enrolledH) // as the Runner does from its keyring (lead's fix)
			restart := t0.Add(2 * time.Second)
			for i := range 10 { // the listing: h0 dies at t0 (its last record), h1..h9 renew
				host := fmt.Sprintf("h%d", i)
				r := rec(host, fencing.BackstopReset)
				r.Signer = host + "-key"
				rev++
				c2.Observe(restart, host, rev, r)
				c2.ObserveBeacon(restart, host, rev)
			}
			for i := range fakes {
				rev++
				c2.Observe(restart, fmt.Sprintf("fake-%d", i), rev, nil) // the markers: never seen here, ignored
			}
			c2.WatchStarted(restart)
			c2.RestoreGuard(g)
			for s := 1; s <= 120; s++ {
				now := restart.Add(time.Duration(s) * time.Second)
				renewOthers(c2, now, &rev)
				c2.GuardPublished(c2.Guard(), nil)
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared %s after C2's start", now.Sub(restart))
						return
					}
				}
			}
			end := restart.Add(120 * time.Second)
			t.Errorf("dead h0 never declared in 120 s after C2's start: C2 restored %d made-up hosts from C1's guard (deleted %v): holding %t, silent %d > threshold %d",
				fakes, g.Deleted, c2.Holding(), c2.Silent(end), c2.Threshold())
		})
	}
}
