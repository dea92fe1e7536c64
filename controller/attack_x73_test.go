package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X73: the dead-host direction.

// x73Fleet: ten signed, beaconing hosts renewing every second (as
// TestX70RebootedHostsUnderDeleteLoopHoldGuard's rig). skipped[h]: the
// compromised h9 deletes h's key right after each write of it, before the
// watch delivered it (the watch delivers only the marker, after a skip);
// h's beacons name the writes.
type x73Fleet struct {
	t       *testing.T
	f       *x7Fleet
	hs      map[string]*x70Host
	prevB   map[string]uint64
	skipped map[string]bool
	period  int
	looped  bool
	garbage bool // supersede with garbage instead of a delete (control)
	now     time.Time
}

func newX73Fleet(t *testing.T) *x73Fleet {
	all := hostRange(0, 10)
	f := newX7Fleet(t, x70Enrolled(all))
	x := &x73Fleet{t: t, f: f, hs: map[string]*x70Host{}, prevB: map[string]uint64{}, skipped: map[string]bool{}}
	for _, h := range all {
		x.hs[h] = &x70Host{boot: "boot-1"}
	}
	return x
}

func (x *x73Fleet) write(h string) {
	f, s, now := x.f, x.hs[h], x.now
	s.seq++
	r := rec(h, fencing.BackstopReset)
	r.Signer, r.Sig, r.Guard, r.Seq, r.PrevRev, r.BootID, r.Incarnation = h+"-key", "signed", f.g.Ref(), s.seq, s.rev, s.boot, 1
	f.rev++
	wrote := f.rev
	if x.skipped[h] {
		// h9's delete supersedes the write before the watch reaches it:
		// only the marker is delivered, after a skip.
		f.rev++
		f.tr.Stored(h, f.rev, now)
		f.tr.Skipped(f.rev)
		if x.garbage {
			f.tr.ObserveInvalid(now, h, f.rev, "garbage", false)
			s.rev = f.rev
		} else {
			f.tr.Observe(now, h, f.rev, nil)
			s.rev = 0
		}
	} else {
		f.tr.Stored(h, wrote, now)
		f.tr.Observe(now, h, wrote, r)
		s.rev = wrote
	}
	f.tr.BeaconChain(now, h, wrote, x.prevB[h])
	f.tr.ObserveBeacon(now, h, wrote)
	f.tr.BeaconWrote(h, wrote, r.Epoch, r.Incarnation, r.Seq)
	f.tr.BeaconVouches(now, h, wrote, r.BootID, r.Epoch, r.Incarnation, r.Seq)
	x.prevB[h] = wrote
}

func (x *x73Fleet) step(s int, live []string) []Decision {
	if x.period > 0 && x.looped {
		on := s%x.period < 5
		for h := range x.skipped {
			x.skipped[h] = on
		}
	}
	x.now = t0.Add(time.Duration(s) * time.Second)
	for _, h := range live {
		x.write(h)
	}
	x.f.publish()
	x.f.tr.BeaconsMissing(x.now)
	return x.f.tr.Tick(x.now)
}

// TestX73SkippedCreatesUnderDeleteLoopHoldGuard: renewedByBeacon returns
// early for a deleted host, so a live host whose every create is
// superseded by h9's delete before the watch delivers it (seen: only
// markers) stays "deleted" and counted silent although its beacons name
// each write. Three such live hosts (threshold 2) and a dead h0: held?
func TestX73SkippedCreatesUnderDeleteLoopHoldGuard(t *testing.T) {
	for _, c := range []struct {
		name          string
		loop, garbage bool
		period        int // skip only the first 5 s of every period s (0: always)
	}{{"delete", true, false, 0}, {"delete-5s-per-minute", true, false, 55}, {"garbage-control", true, true, 0}, {"no-loop-control", false, false, 0}, {"delete/deletedBeaconMutation", true, false, 0}} {
		loop := c.loop
		t.Run(c.name, func(t *testing.T) {
			mut := strings.HasSuffix(c.name, "Mutation")
			if mut {
				x32Mutate(t, &deletedBeaconMutation)
			}
			x := newX73Fleet(t)
			x.garbage = c.garbage
			live := hostRange(0, 10)
			x.f.tr.WatchStarted(t0)
			for s := 0; s < 60; s++ {
				x.step(s, live)
			}
			if loop {
				for _, h := range []string{"h1", "h2", "h3"} {
					x.skipped[h] = true
				}
				x.period, x.looped = c.period, true
			}
			for s := 60; s < 120; s++ {
				for _, d := range x.step(s, live) {
					if d.Op == OpDeclare {
						t.Errorf("declared the live %s", d.Host)
					}
				}
			}
			t.Logf("before h0 dies: members %d, silent %d, threshold %d", x.f.tr.Members(), x.f.tr.Silent(x.now), x.f.tr.membershipThreshold())
			died := x.now
			live = without(live, "h0")
			var declared time.Duration
			var held []string
			for s := 120; s < 720 && declared == 0; s++ {
				for _, d := range x.step(s, live) {
					switch {
					case d.Op == OpDeclare && d.Host != "h0":
						t.Errorf("declared the live %s", d.Host)
					case d.Op == OpDeclare:
						declared = x.now.Sub(died)
					case d.Op == OpHoldStarted:
						held = append(held, fmt.Sprintf("%s at %s", d, x.now.Sub(died)))
					}
				}
			}
			t.Logf("holds %v; silent now %d", held, x.f.tr.Silent(x.now))
			switch {
			case mut && declared != 0:
				t.Errorf("h0 declared %s after its death with the deleted hosts' beacons ignored: the test no longer shows the hole", declared)
			case mut:
			case declared == 0:
				t.Errorf("dead h0 never declared in 600 s: h9 deleted h1..h3's keys after each write before the watch delivered it; the live hosts count silent (beacons ignored for a deleted host)")
			case declared > 40*time.Second:
				t.Errorf("dead h0 declared %s after its death", declared)
			default:
				t.Logf("h0 declared %s after its death", declared)
			}
		})
	}
}
