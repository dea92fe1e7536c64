package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X7, attacks on cc5b9f3 and 1127cce (issue 11).

// x7Fleet drives a pure-core fleet in 1 s steps: every host in live renews
// (signed, trusted, beaconed) naming the guard it acts on — the latest
// published one, or what name returns for it — and the controller
// publishes tr.Guard() each step, as the Runner does on a change.
type x7Fleet struct {
	t    *testing.T
	tr   *Tracker
	rev  uint64
	g    fencing.Guard // the latest published guard
	name map[string]func() *fencing.GuardVersion
}

func newX7Fleet(t *testing.T, enrolled func(string) bool) *x7Fleet {
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	tr.SetEnrolled(enrolled)
	return &x7Fleet{t: t, tr: tr, name: map[string]func() *fencing.GuardVersion{}}
}

func (f *x7Fleet) put(now time.Time, host string, st fencing.LeaseState) {
	f.rev++
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.State, r.Guard = host+"-key", st, f.g.Ref()
	if n := f.name[host]; n != nil {
		r.Guard = n()
	}
	f.tr.Observe(now, host, f.rev, r)
	f.tr.ObserveBeacon(now, host, f.rev)
}

func (f *x7Fleet) publish() {
	g := f.tr.Guard()
	f.tr.GuardPublished(g, nil)
	f.g = g
}

// step renews live at now, publishes and ticks; it returns the decisions.
func (f *x7Fleet) step(now time.Time, live []string) []Decision {
	for _, h := range live {
		f.put(now, h, fencing.LeaseActive)
	}
	f.publish()
	return f.tr.Tick(now)
}

func hostRange(a, b int) []string {
	var out []string
	for i := a; i < b; i++ {
		out = append(out, fmt.Sprintf("h%d", i))
	}
	return out
}

func without(hs []string, drop ...string) []string {
	var out []string
next:
	for _, h := range hs {
		for _, d := range drop {
			if h == d {
				continue next
			}
		}
		out = append(out, h)
	}
	return out
}

// TestX7StaleHostPinsLowGuardForEver (liveness; a regression of cc5b9f3):
// the pruning floor now counts withdrawn and declared hosts, so a host
// that stays withdrawn (out for repair, or decommissioned by an orderly
// stop without a delete + forget) or declared and never released (dead
// hardware, evacuated, left in the bucket) keeps every guard version from
// the one it last named in force, for ever — and merging beyond
// maxGuardHistory keeps the smallest threshold. A fleet that grows after
// such a host left holds with the threshold it had when small:
//
//   - withdrawn: 4 hosts (v1: threshold 0), h3 withdraws naming v1; 11
//     hosts join (15, threshold 3) and every member adopts each new guard.
//     Minutes later ONE host (h0) dies: 1 > 0, the guard holds for ever
//     and h0 is never declared.
//   - declared: 5 hosts (v1: threshold 1), h4 dies and is declared (never
//     released); 10 hosts join (15, threshold 3). Minutes later a rack of
//     two (h0, h1) dies: 2 > 1, held for ever.
//
// Before cc5b9f3 both were declared, as with no stale host (control); the
// lead reverted cc5b9f3's floor (and 1127cce's kept-version rule that made
// it needed): both declared again. The safety X6 found (a returning host naming a
// pruned version) needs the pruned version's threshold only when such a
// host renews again, not a permanent hold on the whole fleet.
func TestX7StaleHostPinsLowGuardForEver(t *testing.T) {
	for _, c := range []struct {
		name  string
		start int // hosts at first
		stale fencing.LeaseState
		dead  []string
		mut   bool
	}{
		{"withdrawn", 4, fencing.LeaseWithdrawn, []string{"h0"}, false},
		{"declared", 5, fencing.LeaseExpired, []string{"h0", "h1"}, false},
		{"control: no stale host", 4, "", []string{"h0"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newX7Fleet(t, nil)
			stale := fmt.Sprintf("h%d", c.start-1)
			live := hostRange(0, c.start)
			f.step(t0, live)
			f.step(t0, live) // everyone names v1
			v1 := f.g.Ref()
			now := t0
			switch c.stale {
			case fencing.LeaseWithdrawn:
				now = now.Add(time.Second)
				f.put(now, stale, fencing.LeaseWithdrawn) // orderly stop, stays out
				live = without(live, stale)
			case fencing.LeaseExpired:
				live = without(live, stale) // dies
				for s := 1; ; s++ {
					now = t0.Add(time.Duration(s) * time.Second)
					var decl *Decision
					for _, d := range f.step(now, live) {
						if d.Op == OpDeclare && d.Host == stale {
							decl = &d
						}
					}
					if decl != nil {
						f.rev++
						f.tr.Observe(now, stale, f.rev, &decl.Record) // the CAS landed; never released
						break
					}
					if s > 120 {
						t.Fatalf("%s never declared", stale)
					}
				}
			}
			t.Logf("%s at %s: %s, guard v%d threshold %d", stale, now.Sub(t0), c.stale, v1.Version, v1.Threshold)
			live = append(live, hostRange(c.start, 15)...) // the fleet grows to 15 hosts
			base := now
			for s := 1; s <= 300; s++ { // five quiet minutes: everyone adopts every guard
				now = base.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					if d.Op == OpDeclare {
						t.Fatalf("declared %s while every host renewed", d.Host)
					}
				}
			}
			t.Logf("before the failure: members %d, membership threshold %d, controller threshold %d, kept %v",
				f.tr.Members(), fencing.Guard{Count: fencing.DefaultGuardCount, Share: fencing.DefaultGuardShare}.Threshold(f.tr.Members()), f.tr.Threshold(), f.tr.GuardVersions())
			died := now
			live = without(live, c.dead...)
			declared := map[string]bool{}
			for s := 1; s <= 300; s++ {
				now = died.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					if d.Op == OpDeclare {
						declared[d.Host] = true
						f.rev++
						f.tr.Observe(now, d.Host, f.rev, &d.Record)
					}
				}
				if len(declared) == len(c.dead) {
					t.Logf("%v declared %s after they died", c.dead, now.Sub(died))
					return
				}
			}
			t.Errorf("%v (dead; %d of 15 hosts, threshold for 15 is 3) never declared in 300 s: %s %s named guard v%d (threshold %d) long ago and pins it: controller threshold %d, silent %d, holding %t, kept %v",
				c.dead, len(c.dead), stale, c.stale, v1.Version, v1.Threshold, f.tr.Threshold(), f.tr.Silent(now), f.tr.Holding(), f.tr.GuardVersions())
		})
	}
}

// TestX7DeletesMintZeroThresholdVersion (c; 1127cce's fix of
// TestX5OwnRecordNamesThresholdZero is bypassed): a member-named threshold
// now counts as the kept threshold of the version named — but the
// compromised h9 can make the controller publish (and so keep) a version
// of threshold 0 itself: it deletes the keys of six LIVE, enrolled hosts
// (h3..h8; six publishes its shipped permissions allow). A delete shrinks
// the membership at once (Members: 10 -> 4, threshold 2 -> 0), so the
// controller publishes v2 with threshold 0. The six agents re-create their
// keys at their next renewal (1 s later: never silent, N back to 10, v3
// threshold 2, every honest agent adopts it). h9's own signed renewals go
// on naming v2 — a kept version, so it pins the floor and its threshold 0
// counts (named threshold max(0, kept 0)). From then on ONE silent host is
// a mass failure: h0 dies at 30 s and is never declared, like every host
// that dies while h9 keeps naming v2 (c, fleet-wide; six deletes, then
// nothing but h9's own key). Controls: the deletes with h9 naming the
// latest guard like the others, and no deletes at all: h0 declared.
func TestX7DeletesMintZeroThresholdVersion(t *testing.T) {
	for _, c := range []struct {
		name          string
		deletes, lies bool
	}{
		{"attack: deletes, h9 names the version they minted", true, true},
		{"control: deletes only", true, false},
		{"control: nothing", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newX7Fleet(t, enrolledH)
			all := hostRange(0, 10)
			f.step(t0, all)
			f.step(t0, all)
			var minted *fencing.GuardVersion
			now := t0.Add(time.Second)
			f.step(now, all)
			if c.deletes {
				now = t0.Add(1500 * time.Millisecond)
				for _, h := range hostRange(3, 9) { // right after their renewals
					f.rev++
					f.tr.Observe(now, h, f.rev, nil)
				}
				f.publish()
				f.tr.Tick(now)
				minted = f.g.Ref()
				t.Logf("after the deletes: members %d, published guard v%d threshold %d", f.tr.Members(), minted.Version, minted.Threshold)
				if c.lies {
					f.name["h9"] = func() *fencing.GuardVersion { return minted }
				}
			}
			for s := 2; s <= 30; s++ { // the six re-create at their next renewal
				now = t0.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, all) {
					if d.Op == OpDeclare {
						t.Fatalf("declared %s while every host renewed", d.Host)
					}
				}
			}
			t.Logf("before h0 dies: members %d, latest guard v%d threshold %d, controller threshold %d, kept %v",
				f.tr.Members(), f.g.Version, f.g.Ref().Threshold, f.tr.Threshold(), f.tr.GuardVersions())
			live := without(all, "h0")
			for s := 31; s <= 180; s++ {
				now = t0.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared %s after it died", now.Sub(t0.Add(30*time.Second)))
						return
					}
				}
			}
			t.Errorf("dead h0 never declared in 150 s: h9 deleted 6 live hosts' keys once (they re-created them 0.5 s later) and names the guard v%d (threshold %d) that shrink minted: controller threshold %d, silent %d, holding %t, kept %v",
				minted.Version, minted.Threshold, f.tr.Threshold(), f.tr.Silent(now), f.tr.Holding(), f.tr.GuardVersions())
		})
	}
}

// TestX7MarkersOfEnrolledIdleHostsHoldForever (c; cc5b9f3): a marker of a
// host this controller never saw counts when the host has a key in
// host_keys_file — restored active with lastSeen zero: silent at once and
// for ever (until an agent creates the key), and published in the guard's
// deleted list, so every later controller restores it too.
// host_keys_file may list hosts with no agent running: hosts enrolled
// before their agent starts, hosts decommissioned whose line nobody
// removed. A compromised h9 deletes the (absent or long-deleted) keys of
// three such names: 3 > threshold 2, the guard holds and the dead h0 is
// not declared — loudly (hold-started names the silent hosts).
//
// Open by design, with an operator remedy: ignoring the markers of hosts
// no controller ever trusted (0245747: a list of such hosts in the guard)
// let a Held rack be declared in six ways (reviewer X10,
// attack_x10_test.go: hosts that joined while no controller ran, lists
// lost across restarts…) — (S) outranks (c). The remedy: remove the
// idle hosts' lines from host_keys_file and restart the controllers; a
// controller then ignores their markers, drops them from the restored
// deleted list, and declares h0. Control: no markers: h0 declared.
func TestX7MarkersOfEnrolledIdleHostsHoldForever(t *testing.T) {
	idle := []string{"spare-1", "spare-2", "spare-3"}
	enrolled := func(h string) bool { return enrolledH(h) || h == "spare-1" || h == "spare-2" || h == "spare-3" }
	for _, c := range []string{"never started (enrolled ahead)", "decommissioned as documented, key left in host_keys_file", "control: no markers"} {
		t.Run(c, func(t *testing.T) {
			f := newX7Fleet(t, enrolled)
			all := hostRange(0, 10)
			if c == "decommissioned as documented, key left in host_keys_file" {
				for _, h := range idle {
					f.put(t0, h, fencing.LeaseActive)
				}
			}
			f.step(t0, all)
			now := t0
			if c == "decommissioned as documented, key left in host_keys_file" {
				now = t0.Add(time.Second)
				for _, h := range idle {
					f.put(now, h, fencing.LeaseWithdrawn) // orderly stop
					f.rev++
					f.tr.Observe(now, h, f.rev, nil) // key deleted
					if err := f.tr.Forget(now, h); err != nil {
						t.Fatal(err)
					}
				}
				for s := 2; s <= 120; s++ { // purged one guard window later
					now = t0.Add(time.Duration(s) * time.Second)
					f.step(now, all)
				}
			}
			markers := map[string]uint64{}
			if c != "control: no markers" {
				now = now.Add(time.Second)
				for _, h := range idle { // h9's three deletes
					f.rev++
					markers[h] = f.rev
					f.tr.Observe(now, h, f.rev, nil)
				}
			}
			died := now
			live := without(all, "h0")
			declared := func(tr *Tracker, from time.Time, secs int) (time.Duration, bool) {
				for s := 1; s <= secs; s++ {
					now := from.Add(time.Duration(s) * time.Second)
					for _, h := range live {
						f.put(now, h, fencing.LeaseActive)
					}
					g := tr.Guard()
					tr.GuardPublished(g, nil)
					f.g = g
					for _, d := range tr.Tick(now) {
						if d.Op == OpDeclare && d.Host == "h0" {
							return now.Sub(died), true
						}
					}
				}
				return 0, false
			}
			after, ok := declared(f.tr, died, 120)
			if c == "control: no markers" {
				if !ok {
					t.Fatal("control: dead h0 never declared")
				}
				t.Logf("h0 declared %s after it died", after)
				return
			}
			if ok {
				t.Logf("h0 declared %s after it died: the markers no longer hold the guard", after)
				return
			}
			t.Logf("as documented: three markers of enrolled idle hosts hold the guard (silent %d, threshold %d, deleted %v)",
				f.tr.Silent(died.Add(120*time.Second)), f.tr.Threshold(), f.g.Deleted)
			// The remedy: the lines removed, the controller restarted.
			c2 := newX7Fleet(t, enrolledH)
			c2.rev = f.rev
			from := died.Add(121 * time.Second)
			for _, h := range live {
				c2.rev++
				r := rec(h, fencing.BackstopReset)
				r.Signer, r.Guard = h+"-key", f.g.Ref()
				c2.tr.Observe(from, h, c2.rev, r)
			}
			r := rec("h0", fencing.BackstopReset)
			r.Signer = "h0-key"
			c2.tr.Observe(from, "h0", 5, r) // its last record, from before its death
			for h, rev := range markers {
				c2.tr.Observe(from, h, rev, nil)
			}
			c2.tr.WatchStarted(from)
			c2.tr.RestoreGuard(f.g)
			f.tr = c2.tr
			if after, ok := declared(c2.tr, from, 120); !ok {
				t.Errorf("after the idle hosts' lines were removed and the controller restarted, dead h0 still not declared: silent %d, threshold %d", c2.tr.Silent(from.Add(120*time.Second)), c2.tr.Threshold())
			} else {
				t.Logf("remedy: h0 declared %s after it died (%s after the restart)", after, after-121*time.Second)
			}
		})
	}
}

// TestRepeatedDeletesMintLowThresholds (after X7): per-host thresholds
// (Tracker.hostThreshold) stop a compromised node's own named threshold
// from holding others, but the deletes themselves minted low thresholds
// that GENUINE agents adopt: h9 deletes six live hosts' keys right after
// every round of renewals; each shrink published a guard for 4 members
// (threshold 0), every agent read it before its next renewal and named
// it, so the dead h0's last record names threshold 0 and one silent host
// holds it for good. With signatures required a deleted host with a
// trusted record stays a member (Members), so no shrunken guard is
// published. memberDeleteMutation restores the shrink. Control: no
// deletes.
func TestRepeatedDeletesMintLowThresholds(t *testing.T) {
	for _, deletes := range []bool{true, false} {
		t.Run(fmt.Sprintf("deletes=%t", deletes), func(t *testing.T) {
			f := newX7Fleet(t, enrolledH)
			all := hostRange(0, 10)
			f.step(t0, all)
			live := all
			var died time.Time
			for s := 1; s <= 240; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				if s == 30 {
					live, died = without(all, "h0"), now
				}
				for _, d := range f.step(now, live) {
					if d.Op != OpDeclare {
						continue
					}
					if d.Host != "h0" || died.IsZero() {
						t.Fatalf("declared %s at %s while it renewed", d.Host, now.Sub(t0))
					}
					t.Logf("h0 declared %s after it died", now.Sub(died))
					return
				}
				if deletes { // h9, right after the round: the next guard is published before the next renewals
					for _, h := range hostRange(3, 9) {
						f.rev++
						f.tr.Observe(now.Add(500*time.Millisecond), h, f.rev, nil)
					}
					f.publish()
				}
			}
			t.Errorf("dead h0 never declared in 210 s: h9 deleted six live hosts' keys after every round; latest guard v%d threshold %d, h0's threshold named %v, members %d, silent %d",
				f.g.Version, f.g.Ref().Threshold, f.tr.hosts["h0"].rec.Guard, f.tr.Members(), f.tr.Silent(t0.Add(240*time.Second)))
		})
	}
}

// TestPinnedOldVersionChurnHoldsForever (after reviewer X10): the fleet
// grew from one host (guard v1: threshold 0) to ten (threshold 2); the
// compromised h9 keeps naming v1 in its own records, so the pruning floor
// keeps it as the oldest kept version. After h0 dies, h9 deletes a live
// host's key every second: each delete and re-creation is a new guard
// version (same threshold). Beyond maxGuardHistory versions, merging the
// oldest into the next carried threshold 0 forward, version by version,
// until it sat at or after the version h0's last record names: h0 held on
// threshold 0 by its own silence, for good (c). Merging a kept version
// into a next one with no higher threshold (mergeable) loses nothing and
// carries nothing forward. mergeMutation fails it. Control: no churn.
func TestPinnedOldVersionChurnHoldsForever(t *testing.T) {
	for _, churn := range []bool{true, false} {
		t.Run(fmt.Sprintf("churn=%t", churn), func(t *testing.T) {
			f := newX7Fleet(t, enrolledH)
			f.step(t0, []string{"h9"}) // the first host: v1, threshold 0
			v1 := f.g.Ref()
			if v1.Threshold != 0 {
				t.Fatalf("v1 threshold %d, want 0", v1.Threshold)
			}
			f.name["h9"] = func() *fencing.GuardVersion { return v1 } // pinned for ever
			all := []string{"h9"}
			for i := range 9 { // the fleet grows, one host a second
				all = append(all, fmt.Sprintf("h%d", i))
				f.step(t0.Add(time.Duration(1+i)*time.Second), all)
			}
			for s := 10; s <= 30; s++ {
				f.step(t0.Add(time.Duration(s)*time.Second), all)
			}
			died := t0.Add(30 * time.Second)
			live := without(all, "h0")
			for s := 1; s <= 240; s++ {
				now := died.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					if d.Op == OpDeclare {
						if d.Host != "h0" {
							t.Fatalf("declared the live %s", d.Host)
						}
						t.Logf("h0 declared %s after it died (kept %v)", now.Sub(died), f.tr.GuardVersions())
						return
					}
				}
				if churn {
					f.rev++
					f.tr.Observe(now.Add(500*time.Millisecond), fmt.Sprintf("h%d", 1+s%8), f.rev, nil)
					f.publish()
				}
			}
			t.Errorf("dead h0 never declared in 240 s: h9 names v1 (threshold 0) and churned versions: kept %v, h0 names %v",
				f.tr.GuardVersions(), f.tr.hosts["h0"].rec.Guard)
		})
	}
}
