package controller

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"hvguard/fencing"
	"hvguard/fencing/keyfile"
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
// host this controller never saw counts again when the host has a key in
// host_keys_file — restored active with lastSeen zero: silent at once and
// for ever (until an agent creates the key, or an operator forgets it),
// and, its state being active, published in the guard's deleted list, so
// every later controller restores it too. host_keys_file routinely lists
// hosts with no agent running: hosts enrolled before their agent starts
// (docs/security.md rollout: keys collected first), and hosts
// decommissioned as documented (orderly stop, key deleted,
// Tracker.Forget) whose line nobody removed. A compromised h9 deletes the
// (absent or long-deleted) keys of three such names: 3 > threshold 2, the
// guard holds for good and the dead h0 is never declared (c, fleet-wide;
// three publishes; after a Forget the same three again). Control: no
// markers: h0 declared.
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
			if c != "control: no markers" {
				now = now.Add(time.Second)
				for _, h := range idle { // h9's three deletes
					f.rev++
					f.tr.Observe(now, h, f.rev, nil)
				}
			}
			died := now
			live := without(all, "h0")
			for s := 1; s <= 180; s++ {
				now = died.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared %s after it died", now.Sub(died))
						return
					}
				}
			}
			t.Errorf("dead h0 never declared in 180 s: three markers of enrolled hosts with no agent (%s): silent %d, threshold %d, holding %t; the published guard lists deleted %v (restored by every later controller)",
				c, f.tr.Silent(now), f.tr.Threshold(), f.tr.Holding(), f.g.Deleted)
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

// TestGuardHostsRoundTripSigned: the hosts a guard lists reach a
// restarted controller as signed (fencing.Guard.Hosts is covered by the
// controller's signature: altered, the guard is refused), and restoring
// them makes a marker seen before the restore count
// (Tracker.restoreListed) — only a listed host's.
func TestGuardHostsRoundTripSigned(t *testing.T) {
	dir := t.TempDir()
	pub, err := keyfile.Generate(filepath.Join(dir, "ctl.seed"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := keyfile.Signer(filepath.Join(dir, "ctl.seed"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := keyfile.Public(pub)
	if err != nil {
		t.Fatal(err)
	}
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Controllers: []fencing.PublicKey{key}}
	c1, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	c1.SetSigningRequired(true)
	for i, h := range []string{"h0", "h1", "h2"} {
		r := rec(h, fencing.BackstopReset)
		r.Signer = h + "-key"
		c1.Observe(t0, h, uint64(i+1), r)
	}
	g := c1.Guard()
	if !slices.Equal(g.Hosts, []string{"h0", "h1", "h2"}) {
		t.Fatalf("guard lists %v, want h0 h1 h2", g.Hosts)
	}
	b, err := fencing.EncodeGuard(signer.SealGuard(g)) // natslease.Store.PublishGuard
	if err != nil {
		t.Fatal(err)
	}
	got, err := fencing.DecodeGuard(b) // natslease.Store.ReadGuard
	if err == nil {
		err = ring.VerifyGuard(got)
	}
	if err != nil || !slices.Equal(got.Hosts, g.Hosts) {
		t.Fatalf("read back %v, %v; want %v", got.Hosts, err, g.Hosts)
	}
	forged := got
	forged.Hosts = append(slices.Clone(forged.Hosts), "spare-1")
	if err := ring.VerifyGuard(forged); err == nil {
		t.Fatal("a guard whose host list was altered after signing verified")
	}
	c2, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	c2.SetSigningRequired(true)
	c2.Observe(t0, "h1", 10, nil)      // listed once restored
	c2.Observe(t0, "spare-1", 11, nil) // never listed
	c2.RestoreGuard(got)
	if n := c2.Silent(t0.Add(time.Second)); n != 1 {
		t.Errorf("after the restore %d hosts count silent, want 1 (h1's marker; spare-1's counts for nothing)", n)
	}
}
