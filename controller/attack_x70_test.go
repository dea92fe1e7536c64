package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X70: the dead-host direction (invariant c: a compromised node
// cannot stop the declaration of a dead host other than itself).

// TestX70DeleteWithdrawnKeyShrinksMembership: with signatures required a
// compromised node's deletes must not shrink the membership N
// (docs/fencing.md, "Guard versions": "the membership N does not shrink
// under a compromised node's writes either: a deleted host with a trusted
// record stays a member until Forget"). Tracker.deletedMember keeps a
// deleted host only when countsDeleted(h) — not when its last record is
// withdrawn or expired. A withdrawn host (docs/fencing.md: "it stays a
// member for N") or a declared one leaves N when any agent deletes its
// key, the threshold min(count, floor(share × N)) drops, the controller
// publishes the lower threshold as a new guard version, and every due
// host is held on it (guard.go forHost: every kept version at or after
// the one it names).
//
// Fleet of 10 (threshold 2), h8 stopped in order for maintenance
// (withdrawn, still a member: N = 10). A rack of two (h0, h1) dies: 2
// silent, not more than 2: both declared ~22 s later (control). Attack:
// h9 deletes h8's withdrawn key before (or as) the rack dies: N = 9,
// threshold 1, 2 > 1: the controller holds for as long as the two stay
// dead — never declared. The same with a host declared earlier and never
// released (dead hardware left in the bucket).
func TestX70DeleteWithdrawnKeyShrinksMembership(t *testing.T) {
	for _, c := range []struct {
		name   string
		stale  fencing.LeaseState
		delete bool
	}{
		{"withdrawn/attack", fencing.LeaseWithdrawn, true},
		{"withdrawn/control", fencing.LeaseWithdrawn, false},
		{"declared/attack", fencing.LeaseExpired, true},
		{"declared/control", fencing.LeaseExpired, false},
		{"withdrawn/attack/memberStateMutation", fencing.LeaseWithdrawn, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			mut := strings.HasSuffix(c.name, "Mutation")
			if mut {
				x32Mutate(t, &memberStateMutation)
			}
			all := hostRange(0, 10)
			f := newX7Fleet(t, x70Enrolled(all))
			live := all
			f.step(t0, live)
			f.step(t0, live) // everyone names v1 (N = 10, threshold 2)
			now := t0
			stale := "h8"
			live = without(live, stale)
			switch c.stale {
			case fencing.LeaseWithdrawn:
				now = now.Add(time.Second)
				f.put(now, stale, fencing.LeaseWithdrawn) // orderly stop, out for repair
			case fencing.LeaseExpired:
				// h8 dies and is declared (never released).
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
						r := decl.Record
						r.Signer = "ctl-key"
						f.tr.Observe(now, stale, f.rev, &r)
						break
					}
					if s > 100 {
						t.Fatal("h8 never declared")
					}
				}
			}
			// Minutes pass: the declaration leaves the guard window;
			// everyone names the latest guard.
			start := now
			for s := 1; s <= 120; s++ {
				now = start.Add(time.Duration(s) * time.Second)
				f.step(now, live)
			}
			t.Logf("before: members %d, threshold %d, latest guard v%d threshold %d",
				f.tr.Members(), f.tr.membershipThreshold(), f.g.Version, f.g.Ref().Threshold)
			if c.delete {
				// h9 (compromised) deletes h8's key: a publish any agent
				// may make (relays).
				f.rev++
				f.tr.Observe(now, stale, f.rev, nil)
				t.Logf("after h9 deleted %s's key: members %d, threshold %d", stale, f.tr.Members(), f.tr.membershipThreshold())
			}
			// The rack of two dies.
			died := now
			live = without(live, "h0", "h1")
			declared := map[string]time.Duration{}
			var held []string
			for s := 1; s <= 600; s++ {
				now = died.Add(time.Duration(s) * time.Second)
				for _, d := range f.step(now, live) {
					switch d.Op {
					case OpDeclare:
						if _, ok := declared[d.Host]; !ok {
							declared[d.Host] = now.Sub(died)
							f.rev++
							r := d.Record
							r.Signer = "ctl-key"
							f.tr.Observe(now, d.Host, f.rev, &r)
						}
					case OpHoldStarted:
						held = append(held, fmt.Sprintf("%s at %s", d, now.Sub(died)))
					}
				}
			}
			t.Logf("holds: %v; declared: %v; members %d, silent %d, latest guard v%d threshold %d",
				held, declared, f.tr.Members(), f.tr.Silent(now), f.g.Version, f.g.Ref().Threshold)
			if mut {
				if len(declared) != 0 {
					t.Errorf("declared %v with a delete shrinking the membership: the test no longer shows the hole", declared)
				}
				return
			}
			for _, h := range []string{"h0", "h1"} {
				d, ok := declared[h]
				if !ok {
					t.Errorf("dead %s never declared in 600 s (h9 deleted the %s host %s's key: the membership shrank)", h, c.stale, stale)
					continue
				}
				if d > 40*time.Second {
					t.Errorf("dead %s declared %s after its death, want within lease_ttl + grace + a few s", h, d)
				}
			}
		})
	}
}

// x70Enrolled is host_keys_file for the fleet all.
func x70Enrolled(all []string) func(string) bool {
	return func(h string) bool { return slices.Contains(all, h) }
}

// x70Host is a simulated agent of x70Loop: its key's revision, its seq
// and its boot.
type x70Host struct {
	rev, seq uint64
	boot     string
}

// TestX70RebootedHostsUnderDeleteLoopHoldGuard: a live host whose key
// is deleted after each of its writes re-creates it every time (a create,
// prev_rev 0). While it is of the agent process of the controller's
// last trusted record, each create is trusted (recreated: its silence
// ends). Once its agent restarts (a reboot, an upgrade: another boot or
// incarnation) every create is of another process (otherBootCreate):
// an unverifiable value — its beacon names it, so its declaration clock
// restarts and it is not declared — but the key stays "deleted" in the
// tracker (no trusted record re-creates it) and hostState.renewedByBeacon
// returns early for a deleted host: its silence for the mass-failure
// guard never ends. compute nodes reboot routinely (rolling upgrades);
// compute-9 (compromised) keeps a delete loop on the keys it sees come
// back from a reboot. Fleet of 10 (threshold 2): two live hosts, h1 and
// h2, rebooted under the loop, count silent for as long as it runs; h0
// dies: 3 silent > 2, the controller holds and the dead h0 is never
// declared. Control: no loop — h0 declared ~22 s after its death.
func TestX70RebootedHostsUnderDeleteLoopHoldGuard(t *testing.T) {
	for _, c := range []struct{ loop, mut bool }{{true, false}, {false, false}, {true, true}} {
		loop := c.loop
		t.Run(fmt.Sprintf("loop=%t/vouchOtherBootMutation=%t", loop, c.mut), func(t *testing.T) {
			if c.mut {
				x32Mutate(t, &vouchOtherBootMutation)
				x32Mutate(t, &deletedBeaconMutation) // reviewer X73's fix ends their silence too
			}
			all := hostRange(0, 10)
			f := newX7Fleet(t, x70Enrolled(all))
			hs := map[string]*x70Host{}
			for _, h := range all {
				hs[h] = &x70Host{boot: "boot-1"}
			}
			looped := map[string]bool{"h1": loop, "h2": loop}
			write := func(now time.Time, h string) {
				s := hs[h]
				s.seq++
				r := rec(h, fencing.BackstopReset)
				r.Signer, r.Sig, r.Guard, r.Seq, r.PrevRev, r.BootID = h+"-key", "signed", f.g.Ref(), s.seq, s.rev, s.boot
				f.rev++
				f.tr.Stored(h, f.rev, now)
				f.tr.Observe(now, h, f.rev, r)
				f.tr.ObserveBeacon(now, h, f.rev) // as the runner: observeBeacons
				f.tr.BeaconWrote(h, f.rev, r.Epoch, r.Incarnation, r.Seq)
				f.tr.BeaconVouches(now, h, f.rev, r.BootID, r.Epoch, r.Incarnation, r.Seq)
				s.rev = f.rev
				if looped[h] {
					// compute-9 deletes the key right after the write.
					f.rev++
					f.tr.Stored(h, f.rev, now)
					f.tr.Observe(now, h, f.rev, nil)
					s.rev = 0 // the next write meets the marker: a create
				}
			}
			live := all
			var now time.Time
			step := func(s int) []Decision {
				now = t0.Add(time.Duration(s) * time.Second)
				for _, h := range live {
					write(now, h)
				}
				f.publish()
				return f.tr.Tick(now)
			}
			f.tr.WatchStarted(t0)
			for s := 0; s < 60; s++ {
				step(s)
			}
			// h1 and h2 reboot (a rolling upgrade): boot-2, their state
			// kept — their next writes are creates over compute-9's markers.
			hs["h1"].boot, hs["h2"].boot = "boot-2", "boot-2"
			for s := 60; s < 120; s++ {
				step(s)
			}
			t.Logf("before h0 dies: members %d, silent %d, threshold %d", f.tr.Members(), f.tr.Silent(now), f.tr.membershipThreshold())
			died := now
			live = without(live, "h0")
			var declared time.Duration
			var held []string
			for s := 120; s < 720; s++ {
				for _, d := range step(s) {
					switch {
					case d.Op == OpDeclare && d.Host != "h0":
						t.Errorf("declared the live %s", d.Host)
					case d.Op == OpDeclare && declared == 0:
						declared = now.Sub(died)
					case d.Op == OpHoldStarted:
						held = append(held, fmt.Sprintf("%s at %s", d, now.Sub(died)))
					}
				}
				if declared != 0 {
					break
				}
			}
			t.Logf("holds %v; silent now %d", held, f.tr.Silent(now))
			switch {
			case c.mut && declared != 0:
				t.Errorf("declared %s after its death without vouching another process's create: the test no longer shows the hole", declared)
			case c.mut:
			case declared == 0:
				t.Errorf("dead h0 never declared in 600 s: compute-9's delete loop on the rebooted h1 and h2 kept them counted silent (live, renewing, beaconing)")
			case declared > 40*time.Second:
				t.Errorf("dead h0 declared %s after its death", declared)
			default:
				t.Logf("h0 declared %s after its death", declared)
			}
		})
	}
}

// TestX70RestartedHostUnderDeleteLoopNeverTrusted: h8's agent stops in
// order (an upgrade: its withdrawn record, trusted) and starts again —
// a new incarnation. compute-9 (compromised) deletes h8's key after each
// of its writes from then on: every write of the new process is a create
// over a marker, of another agent process than the controller's last
// trusted record (the withdrawal): otherBootCreate, an unverifiable value
// — "trusted with the host's next renewal", which never comes as an
// update. The tracker keeps h8 withdrawn (its beacons name the creates:
// not counted, and Tick never declares a withdrawn host). h8 dies: never
// declared — while the loop runs, and after it stops (h8 writes nothing
// more). The end state is the documented (c) of X13 (a new agent's
// records "hidden by garbage, or unverifiable after a key rotation") but
// reached with one delete per write: no watch skip, no key rotation.
// Control: no loop — h8's second write is an update over its create,
// trusted: declared ~22 s after its death.
func TestX70RestartedHostUnderDeleteLoopNeverTrusted(t *testing.T) {
	for _, c := range []struct{ loop, mut bool }{{true, false}, {false, false}, {true, true}} {
		loop := c.loop
		t.Run(fmt.Sprintf("loop=%t/vouchOtherBootMutation=%t", loop, c.mut), func(t *testing.T) {
			if c.mut {
				x32Mutate(t, &vouchOtherBootMutation)
			}
			all := hostRange(0, 10)
			f := newX7Fleet(t, x70Enrolled(all))
			hs := map[string]*x70Host{}
			for _, h := range all {
				hs[h] = &x70Host{boot: "boot-1"}
			}
			looped := false
			write := func(now time.Time, h string, st fencing.LeaseState, inc uint64) {
				s := hs[h]
				s.seq++
				r := rec(h, fencing.BackstopReset)
				r.Signer, r.Sig, r.Guard, r.Seq, r.PrevRev, r.BootID, r.Incarnation, r.State = h+"-key", "signed", f.g.Ref(), s.seq, s.rev, s.boot, inc, st
				f.rev++
				f.tr.Stored(h, f.rev, now)
				f.tr.Observe(now, h, f.rev, r)
				f.tr.ObserveBeacon(now, h, f.rev) // as the runner: observeBeacons
				f.tr.BeaconWrote(h, f.rev, r.Epoch, r.Incarnation, r.Seq)
				f.tr.BeaconVouches(now, h, f.rev, r.BootID, r.Epoch, r.Incarnation, r.Seq)
				s.rev = f.rev
				if looped && h == "h8" {
					f.rev++
					f.tr.Stored(h, f.rev, now)
					f.tr.Observe(now, h, f.rev, nil) // compute-9's delete
					s.rev = 0
				}
			}
			live := all
			inc8 := uint64(1)
			var now time.Time
			step := func(s int) []Decision {
				now = t0.Add(time.Duration(s) * time.Second)
				for _, h := range live {
					inc := uint64(1)
					if h == "h8" {
						inc = inc8
					}
					write(now, h, fencing.LeaseActive, inc)
				}
				f.publish()
				return f.tr.Tick(now)
			}
			f.tr.WatchStarted(t0)
			for s := 0; s < 60; s++ {
				step(s)
			}
			// h8's orderly stop (withdrawn, incarnation 1), then its agent
			// starts again: incarnation 2.
			looped = loop // compute-9 deletes from the withdrawal on
			write(now, "h8", fencing.LeaseWithdrawn, 1)
			inc8 = 2
			for s := 61; s < 121; s++ {
				step(s)
			}
			died := now
			live = without(live, "h8")
			var declared time.Duration
			for s := 121; s < 721 && declared == 0; s++ {
				for _, d := range step(s) {
					switch {
					case d.Op == OpDeclare && d.Host != "h8":
						t.Errorf("declared the live %s", d.Host)
					case d.Op == OpDeclare:
						declared = now.Sub(died)
					}
				}
			}
			t.Logf("h8 tracked as %s (deleted %t); silent %d", f.tr.hosts["h8"].rec.State, f.tr.hosts["h8"].deleted, f.tr.Silent(now))
			switch {
			case c.mut && declared != 0:
				t.Errorf("declared %s after its death without vouching another process's create: the test no longer shows the hole", declared)
			case c.mut:
			case declared == 0:
				t.Errorf("dead h8 never declared in 600 s: compute-9 deleted its key after each write of its restarted agent — every one a create of another process, never trusted; h8 stays withdrawn")
			case declared > 40*time.Second:
				t.Errorf("dead h8 declared %s after its death", declared)
			default:
				t.Logf("h8 declared %s after its death", declared)
			}
		})
	}
}
