package controller

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X10: attacks on per-host guard thresholds, deleted members and
// the guard's host list (fencing.Guard.Hosts, Tracker.restoreListed, in
// 0245747: a marker or untrusted value of a host counted only if a
// restored guard listed it). The list was withdrawn: every (S) test below
// failed with it and passes with the rule before (an enrolled host's
// marker or untrusted value counts); the names in the comments are those
// of 0245747.

// x10Entry is what one key of the bucket holds: a trusted record, a
// delete marker (rec nil, !garbage) or an undecodable value (garbage).
type x10Entry struct {
	rev     uint64
	rec     *fencing.LeaseRecord
	garbage bool
}

// x10Bucket models the lease bucket and _guard across controller
// restarts: every write lands in the bucket and, if a controller runs
// (tr != nil), is delivered to it; start lists the bucket to a new
// tracker in revision order, as a restarted controller's watch does, and
// restores the last guard published.
type x10Bucket struct {
	t     *testing.T
	rev   uint64
	keys  map[string]x10Entry
	guard fencing.Guard
	tr    *Tracker
	sb    *Tracker // a standby: watches, never acts
}

func newX10Bucket(t *testing.T) *x10Bucket {
	return &x10Bucket{t: t, keys: map[string]x10Entry{}}
}

func x10Tracker(t *testing.T) *Tracker {
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	tr.SetEnrolled(enrolledH)
	tr.SetStream("stream-1") // the lease stream (memory pins are taken only from it)
	return tr
}

// put: host's agent renews, naming the guard it acts on (g).
func (b *x10Bucket) put(now time.Time, host string, g *fencing.GuardVersion) {
	b.rev++
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard = host+"-key", g
	b.keys[host] = x10Entry{rev: b.rev, rec: r}
	for _, tr := range b.trackers() {
		tr.Observe(now, host, b.rev, r)
		tr.ObserveBeacon(now, host, b.rev)
	}
}

// del: a delete marker in host's key (any agent may write one).
func (b *x10Bucket) del(now time.Time, host string) {
	b.rev++
	b.keys[host] = x10Entry{rev: b.rev}
	for _, tr := range b.trackers() {
		tr.Observe(now, host, b.rev, nil)
	}
}

// garbage: an undecodable value in host's key (any agent may write one).
func (b *x10Bucket) garbage(now time.Time, host string) {
	b.rev++
	b.keys[host] = x10Entry{rev: b.rev, garbage: true}
	for _, tr := range b.trackers() {
		tr.ObserveInvalid(now, host, b.rev, "undecodable value (garbage)", false)
	}
}

// trackers: the running controller and the standby, if any.
func (b *x10Bucket) trackers() []*Tracker {
	var out []*Tracker
	for _, tr := range []*Tracker{b.tr, b.sb} {
		if tr != nil {
			out = append(out, tr)
		}
	}
	return out
}

// publish: the running controller publishes its guard (successfully).
func (b *x10Bucket) publish() {
	g := b.tr.Guard()
	b.tr.GuardPublished(g, nil)
	b.guard = g
}

// stop: the controller stops (crash, upgrade, leader change).
func (b *x10Bucket) stop() { b.tr = nil }

// start: a new controller starts at now: its watch lists the bucket (in
// revision order), then it restores the published guard (Runner.Run).
func (b *x10Bucket) start(now time.Time) *Tracker {
	tr := b.list(now)
	tr.RestoreGuard(b.guard)
	b.tr = tr
	return tr
}

// startStandby: a standby controller starts at now (lists the bucket,
// watches from then on, restores nothing until it takes over).
func (b *x10Bucket) startStandby(now time.Time) {
	b.sb = b.list(now)
}

// takeover: the leader stops, the standby takes over (Runner.Run: the
// guard is read and restored before it acts).
func (b *x10Bucket) takeover() *Tracker {
	b.tr, b.sb = b.sb, nil
	b.tr.RestoreGuard(b.guard)
	return b.tr
}

// list: a new tracker whose watch lists the bucket at now.
func (b *x10Bucket) list(now time.Time) *Tracker {
	tr := x10Tracker(b.t)
	names := make([]string, 0, len(b.keys))
	for h := range b.keys {
		names = append(names, h)
	}
	sort.Slice(names, func(i, j int) bool { return b.keys[names[i]].rev < b.keys[names[j]].rev })
	for _, h := range names {
		e := b.keys[h]
		switch {
		case e.garbage:
			tr.ObserveInvalid(now, h, e.rev, "undecodable value (garbage)", false)
		default:
			tr.Observe(now, h, e.rev, e.rec)
		}
	}
	tr.WatchStarted(now)
	return tr
}

// run drives the running controller from..from+secs: live hosts renew
// naming the published guard, the guard is published, it ticks; a
// declaration of a host in held fails the test.
func (b *x10Bucket) run(from time.Time, secs int, live []string, held map[string]bool, what string) {
	b.t.Helper()
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		for _, h := range live {
			b.put(now, h, b.guard.Ref())
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && held[d.Host] {
				b.t.Fatalf("%s: declared %s %s after the controller started while it was cut off and Held (guests running): silent %d, threshold %d, members %d",
					what, d.Host, now.Sub(from), b.tr.Silent(now), b.tr.Threshold(), b.tr.Members())
			}
		}
	}
}

func x10Names(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("h%d", i))
	}
	return out
}

// x10Pair: the two hosts of a Held rack h1..h12 an attack drops from the
// controller's count. The agents hold by 1 + 11 peers > threshold 10 +
// lying_peers 1 (the default with signing required); the controller holds
// while more than 10 are silent, so dropping one host is not enough.
var x10Pair = []string{"h11", "h12"}

func x10Set(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// TestX10DeletedThenGarbageAtRestartEndsHold: 60 hosts, signing required,
// threshold 10. A rack h1..h12 is cut off and Held (x10Pair), guests
// running; C1 holds. A compromised node deletes h11's key: C1 keeps
// counting it (deleted, a member) and publishes it in the guard's Deleted
// list — not in Hosts (listedHosts skips deleted hosts). The controller
// restarts; before the new one lists the bucket the compromised node
// writes garbage over h11's marker. C2's first value of h11 is untrusted:
// observeInvalid asks silentUntrusted before the guard is restored (not
// listed yet: false); RestoreGuard's restoreDeleted finds h11 tracked and
// skips it (it only marks it listed), and restoreListed never sees it
// (not in Hosts). So h11 is never counted silent: 10 silent, not > 10,
// and the Held h1..h10 are declared while their guests run (S). Before
// 0245747 silentUntrusted asked only enrolled: h11 counted. (Every attack
// here is made on h11 and h12: x10Pair.) Controls: the
// marker alone, and garbage alone (X8's case), keep C2 holding.
func TestX10DeletedThenGarbageAtRestartEndsHold(t *testing.T) {
	for _, c := range []struct {
		name           string
		del, overwrite bool
	}{{"marker-only", true, false}, {"garbage-only", false, true}, {"delete-then-garbage", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			for _, h := range all {
				b.put(t0, h, b.guard.Ref()) // everyone names the guard; the rack is cut off from here on
			}
			for s := 1; s <= 30; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for _, h := range live {
					b.put(now, h, b.guard.Ref())
				}
				if s == 20 && c.del {
					for _, h := range x10Pair {
						b.del(now, h)
					}
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s", d.Host)
					}
				}
			}
			if !b.tr.Holding() {
				t.Fatal("C1 not holding: the test shows nothing")
			}
			b.stop() // C1 stops
			if c.overwrite {
				for _, h := range x10Pair {
					b.garbage(t0.Add(31*time.Second), h) // over the marker (or the record)
				}
			}
			start := t0.Add(32 * time.Second)
			c2 := b.start(start)
			b.run(start, 90, live, cut, "C2")
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}

// TestX10HostJoinedWhileNoControllerRanIgnored: 58 hosts (threshold 10);
// C1 publishes its guard (Hosts: the 58) and stops (an upgrade, a leader
// change). While no controller runs h11 and h12 join (new hosts, or back
// from a withdrawal: a withdrawn host is not listed either): their agents
// read the guard from _guard and name it in their trusted records. Then
// the rack h1..h12 is cut off and Held (x10Pair; h11 and h12 confirm their
// peers like any agent). A compromised node deletes their keys (or writes
// garbage into them). C2 starts: no guard lists them (no controller ever
// saw them), so their markers or garbage count for nothing
// (observeDeleted: unlisted; silentUntrusted false) — 10 silent, not >
// 10, and the Held h1..h10 are declared while their guests run (S).
// Before 0245747 an enrolled host's marker or untrusted value counted
// (reviewers X6, X8). The same follows a guard publish that failed after
// they joined, then a restart; docs/security.md bounds this at "less than
// one publish (<= 1 s) before every controller stops". Control: their
// keys untouched (their trusted records count), C2 holds.
func TestX10HostJoinedWhileNoControllerRanIgnored(t *testing.T) {
	for _, c := range []struct{ how, attack string }{
		{"new", "none"}, {"new", "delete"}, {"new", "garbage"}, {"back-from-withdrawn", "none"}, {"back-from-withdrawn", "delete"}} {
		attack := c.attack
		t.Run(c.how+"/attack="+attack, func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			joined := x10Set(x10Pair)
			for _, h := range all {
				if !joined[h] {
					b.put(t0, h, nil)
				}
			}
			if c.how == "back-from-withdrawn" { // withdrawn (orderly stop) under C1: members, not listed
				for _, h := range x10Pair {
					b.rev++
					w := rec(h, fencing.BackstopReset)
					w.Signer, w.State, w.Reason = h+"-key", fencing.LeaseWithdrawn, "orderly-stop"
					b.keys[h] = x10Entry{rev: b.rev, rec: w}
					b.tr.Observe(t0, h, b.rev, w)
				}
			}
			b.publish()
			for s := 1; s <= 5; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for _, h := range all {
					if !joined[h] {
						b.put(now, h, b.guard.Ref())
					}
				}
				b.publish()
				b.tr.Tick(now)
			}
			b.stop() // C1 stops
			for _, h := range x10Pair {
				b.put(t0.Add(6*time.Second), h, b.guard.Ref())
			}
			// The rack is cut off from 6 s on; the others renew.
			for s := 7; s <= 20; s++ {
				for _, h := range live {
					b.put(t0.Add(time.Duration(s)*time.Second), h, b.guard.Ref())
				}
			}
			for _, h := range x10Pair {
				switch attack {
				case "delete":
					b.del(t0.Add(21*time.Second), h)
				case "garbage":
					b.garbage(t0.Add(21*time.Second), h)
				}
			}
			start := t0.Add(25 * time.Second)
			c2 := b.start(start)
			b.run(start, 90, live, cut, "C2")
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}

// TestX10MarkerMemoryOverflowDropsListedHost: restoreListed counts a
// listed host's marker seen before the guard was restored only if
// remember kept it, and remember keeps at most maxMarkers (65536) — of
// any names, made-up ones included (observeDeleted remembers unenrolled
// names too). A rack h1..h12 is cut off and Held (x10Pair); C1 holds and
// its guard lists h11. While no controller runs, a compromised node
// deletes 65536 keys under made-up names (accepted by the server: X5's
// TestX5FakeDeleteMarkersHoldForeverNATS), then h11's key. C2's watch
// lists the made-up markers first (older revisions): the memory is full
// when h11's marker comes, so it is dropped; the restored guard lists
// h11 but no marker of it is remembered, h11 is not tracked, never
// counted: 10 silent, the Held h1..h10 are declared (S). Control: the
// same without the made-up markers.
func TestX10MarkerMemoryOverflowDropsListedHost(t *testing.T) {
	for _, fakes := range []int{0, 1 << 16} {
		t.Run(fmt.Sprintf("fakes=%d", fakes), func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			for _, h := range all {
				b.put(t0, h, b.guard.Ref())
			}
			b.run(t0, 30, live, cut, "C1")
			if !b.tr.Holding() {
				t.Fatalf("C1 not holding: the test shows nothing")
			}
			b.stop()
			for i := 0; i < fakes; i++ {
				b.del(t0.Add(31*time.Second), fmt.Sprintf("x%d", i))
			}
			for _, h := range x10Pair {
				b.del(t0.Add(31*time.Second), h)
			}
			start := t0.Add(32 * time.Second)
			c2 := b.start(start)
			b.run(start, 90, live, cut, "C2")
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}

// TestX10GarbageThenDeleteDropsListAcrossRestarts: the list is lost across
// a restart chain. A rack h1..h12 is cut off and Held (x10Pair), C1 holds
// and lists h11. A compromised node writes garbage into h11's key; C1
// restarts: C2's first value of h11 is the garbage, the restored guard
// lists h11 (Hosts), so it counts silent — right. The node then deletes
// h11's key: C2 marks the untrusted h11 deleted, and from then on its
// guard lists h11 nowhere (listedHosts skips deleted hosts; deletedHosts
// wants a trusted record: countsDeleted). C2 restarts: C3 sees only h11's
// marker, no guard lists it (observeDeleted: unlisted), h11 is never
// counted: 10 silent, the Held h1..h10 are declared (S). Before 0245747
// the enrolled h11's marker counted. Controls: without the delete (C3
// restores h11 from Hosts) and without the garbage (Deleted).
func TestX10GarbageThenDeleteDropsListAcrossRestarts(t *testing.T) {
	for _, c := range []struct {
		name        string
		garb, erase bool
	}{{"garbage-only", true, false}, {"delete-only", false, true}, {"garbage-restart-delete", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			for _, h := range all {
				b.put(t0, h, b.guard.Ref())
			}
			b.run(t0, 30, live, cut, "C1")
			if c.garb {
				for _, h := range x10Pair {
					b.garbage(t0.Add(31*time.Second), h)
				}
			}
			b.stop()
			start2 := t0.Add(32 * time.Second)
			b.start(start2)
			b.run(start2, 20, live, cut, "C2")
			if c.erase {
				for _, h := range x10Pair {
					b.del(start2.Add(21*time.Second), h)
				}
			}
			b.run(start2.Add(21*time.Second), 20, live, cut, "C2")
			b.stop()
			start3 := start2.Add(45 * time.Second)
			c3 := b.start(start3)
			b.run(start3, 90, live, cut, "C3")
			if !c3.Holding() {
				t.Fatal("C3 not holding: the test shows nothing")
			}
		})
	}
}

// TestX10GarbageAtRestartMintsZeroThreshold: 0245747 keeps a deleted
// member in N so that deletes mint no low-threshold guard (reviewer X7),
// but a listed host whose key holds garbage at a restart is not a member
// either (Members: no trusted record): a compromised h59 that keeps
// garbage in the keys of h1..h56 (written right after their renewals, or
// just before a controller starts) makes the restarted C2 publish, first,
// a guard for 4 members: threshold 0. C2 keeps that version, and
// forHost holds a host on every kept version at or above the version its
// own record names. So:
//
//   - dead-at-restart: h0 died 10 s before the restart (not due yet at
//     C1); it names C1's version, below the threshold-0 one: held on
//     threshold 0 by its own silence, never declared (c);
//   - pin-and-churn: h0 dies 60 s later and names a newer version; h59
//     names the threshold-0 version in its own records (the floor keeps
//     it), then, after h0's death, deletes live hosts' keys one a second
//     (each delete and re-creation is a new guard version): beyond
//     maxGuardHistory versions the merge carries threshold 0 forward
//     (keep: kept[1] takes min(kept[0], kept[1])) past h0's version, and h0
//     is held for good — one restart gives the node a permanent lever
//     over every later death (c).
//
// Controls: the same without the garbage at the restart — h0 declared.
func TestX10GarbageAtRestartMintsZeroThreshold(t *testing.T) {
	for _, c := range []struct {
		name          string
		garbage, late bool
	}{{"dead-at-restart/control", false, false}, {"dead-at-restart/garbage", true, false},
		{"pin-and-churn/control", false, true}, {"pin-and-churn/garbage", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b := newX10Bucket(t)
			all := x10Names(0, 60)
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			live := all
			died := time.Time{}
			for s := 1; s <= 20; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				if s == 10 && !c.late {
					live, died = x10Names(1, 60), now
				}
				for _, h := range live {
					b.put(now, h, b.guard.Ref())
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("C1 declared %s", d.Host)
					}
				}
			}
			b.stop()
			if c.garbage { // h59, just before C2 lists the bucket
				for _, h := range x10Names(1, 57) {
					b.garbage(t0.Add(21*time.Second), h)
				}
			}
			start := t0.Add(22 * time.Second)
			b.start(start)
			b.publish() // C2's first tick: restore, publish, tick
			pin := b.guard.Ref()
			t.Logf("C2's first guard: v%d threshold %d (members %d)", pin.Version, pin.Threshold, b.guard.Members)
			for s := 1; s <= 240; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				if c.late && s == 60 {
					live, died = x10Names(1, 60), now
				}
				for _, h := range live {
					g := b.guard.Ref()
					if h == "h59" && c.late {
						g = pin // h59 names C2's first version for ever
					}
					b.put(now, h, g)
				}
				if c.late && !died.IsZero() && now.Sub(died) < 20*time.Second {
					b.del(now.Add(500*time.Millisecond), fmt.Sprintf("h%d", 10+now.Sub(died)/time.Second)) // h59: one live host's key a second
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Op != OpDeclare {
						continue
					}
					if d.Host != "h0" || died.IsZero() {
						t.Fatalf("C2 declared %s while it renewed", d.Host)
					}
					t.Logf("h0 declared %s after its death", now.Sub(died))
					return
				}
			}
			end := start.Add(240 * time.Second)
			h0 := b.tr.hosts["h0"]
			t.Errorf("dead h0 never declared (died %s before the end): it names %v, held on threshold %d (membership's %d), silent %d; kept %v",
				end.Sub(died), h0.rec.Guard, b.tr.hostThreshold(b.tr.membershipThreshold(), h0), b.tr.membershipThreshold(), b.tr.Silent(end), b.tr.GuardVersions())
		})
	}
}

// TestX10ReplayedWithdrawalAfterRestartOfDeletedHost: X5's replay rule
// (after a delete, a signed record naming a revision before the marker is
// a replay: replayedAfterDelete) needs the marker's revision (h.rev). A
// rack h1..h12 is cut off and Held (x10Pair); a compromised node deletes h11's key
// while C1 runs (C1 publishes h11 in Deleted). C1 restarts: C2's watch
// lists h11's marker before the guard is restored — unlisted, only
// remembered — then RestoreGuard's restoreDeleted creates h11 from
// Deleted with revision 0, and restoreListed never applies the
// remembered marker (h11 is in Deleted, not Hosts). The node now writes
// back h11's own old withdrawal (genuinely signed at an earlier orderly
// stop, prev_rev long before the marker): PrevRev < h.rev (0) is false, it
// is taken as h11's record, a withdrawn host counts for nothing, 10
// silent, and the Held h1..h10 are declared (S). Before 0245747 the
// marker of an enrolled never-seen host set h.rev (observeDeleted) and
// the replay was refused. Not X6's open case: C2 runs when the replay is
// written. Control: no replay, C2 holds.
func TestX10ReplayedWithdrawalAfterRestartOfDeletedHost(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replay=%t", replay), func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			old := map[string]x10Entry{} // each one's first record: its withdrawal at an earlier stop is modelled on it
			for _, h := range x10Pair {
				old[h] = b.keys[h]
			}
			for _, h := range all {
				b.put(t0, h, b.guard.Ref())
			}
			b.run(t0, 20, live, cut, "C1")
			for _, h := range x10Pair {
				b.del(t0.Add(21*time.Second), h)
			}
			b.run(t0.Add(21*time.Second), 10, live, cut, "C1")
			b.stop()
			start := t0.Add(32 * time.Second)
			c2 := b.start(start)
			b.run(start, 5, live, cut, "C2")
			for _, h := range x10Pair {
				if !replay {
					break
				}
				w := *old[h].rec
				w.State, w.Reason, w.Sig, w.PrevRev = fencing.LeaseWithdrawn, "orderly-stop", h+"-sig", old[h].rev
				b.rev++
				b.keys[h] = x10Entry{rev: b.rev, rec: &w}
				ds := c2.Observe(start.Add(5500*time.Millisecond), h, b.rev, &w)
				t.Logf("replayed withdrawal of %s (prev_rev %d, marker after it): %v", h, w.PrevRev, ds)
			}
			b.run(start.Add(5*time.Second), 90, live, cut, "C2")
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}

// TestX10StandbyGarbageThenDeleteNeverCounted: a standby C2 starts while
// a compromised node's garbage is in the key of h11, a host of a Held
// rack h1..h12 (x10Pair; C1 holds: h11's trusted record came before the garbage):
// C2 tracks h11 from the garbage (no trusted record; silentUntrusted
// false: no guard restored yet). The node then deletes h11's key: C1
// counts it (deleted member, Deleted list), C2 marks its untrusted h11
// deleted. C1 stops and C2 takes over: restoreDeleted finds h11 tracked
// (sets its guard only), restoreListed skips deleted hosts (and h11 is
// not in Hosts), so silentUntrusted stays false and counted never counts
// a deleted host with no trusted record: 10 silent, the Held h1..h10 are
// declared (S). Before 0245747 silentUntrusted was set for any enrolled
// host at its first untrusted value. Controls: garbage without the
// delete, and the delete without the garbage — C2 holds.
func TestX10StandbyGarbageThenDeleteNeverCounted(t *testing.T) {
	for _, c := range []struct {
		name        string
		garb, erase bool
	}{{"garbage-only", true, false}, {"delete-only", false, true}, {"garbage-standby-delete", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b := newX10Bucket(t)
			all, rack := x10Names(0, 60), x10Names(1, 13)
			cut := x10Set(rack)
			var live []string
			for _, h := range all {
				if !cut[h] {
					live = append(live, h)
				}
			}
			b.tr = x10Tracker(t)
			for _, h := range all {
				b.put(t0, h, nil)
			}
			b.publish()
			for _, h := range all {
				b.put(t0, h, b.guard.Ref())
			}
			b.run(t0, 20, live, cut, "C1")
			if c.garb {
				for _, h := range x10Pair {
					b.garbage(t0.Add(21*time.Second), h)
				}
			}
			b.startStandby(t0.Add(22 * time.Second))
			b.run(t0.Add(22*time.Second), 10, live, cut, "C1")
			if c.erase {
				for _, h := range x10Pair {
					b.del(t0.Add(33*time.Second), h)
				}
			}
			b.run(t0.Add(33*time.Second), 10, live, cut, "C1")
			start := t0.Add(44 * time.Second)
			c2 := b.takeover()
			b.run(start, 90, live, cut, "C2 (took over)")
			if !c2.Holding() {
				t.Fatal("C2 not holding: the test shows nothing")
			}
		})
	}
}
