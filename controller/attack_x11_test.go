package controller

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X11: attacks on the controllers' memory (memory.go), the
// first-value check (ObserveWritten) and per-host thresholds across
// controller restarts.

// x11Entry is what one key of the bucket holds: a record (rec; w: what
// its stored message says about its write), a delete marker (rec nil,
// !garbage) or an undecodable value (garbage).
type x11Entry struct {
	rev     uint64
	rec     *fencing.LeaseRecord
	w       fencing.Written
	garbage bool
	// stored: when the server stored it (Tracker.Stored): a stamp no
	// rollback or re-creation hands out again.
	stored time.Time
}

// x11Bucket models the lease bucket, _guard and the controllers' memory
// bucket across controller restarts, as Runner.Run drives a tracker:
// every write lands in the bucket and, if a controller runs, is
// delivered to it (a first value through ObserveWritten), and the
// memories it changed are written at once; start lists the bucket to a
// new tracker, restores the published guard, then the memories.
type x11Bucket struct {
	t   *testing.T
	rev uint64
	// landed counts the writes ever stored (x11Entry.stored).
	landed int64
	keys   map[string]x11Entry
	guard  fencing.Guard
	mem    map[string]Memory
	tr     *Tracker
	// enrolled, if set, is host_keys_file for the next controller
	// started (default enrolledH).
	enrolled func(string) bool
	// stream, if set, is the lease stream's identity for the next
	// controller started (Tracker.SetStream; default x10Tracker's).
	stream string
	// manual: the test writes the memories itself (flush does nothing).
	manual bool
	// delivered: the highest revision delivered to a running controller
	// (rollbackCarry.rev).
	delivered uint64
	// carry: the last rollback's carry (Runner.rolledBack).
	carry *rollbackCarry
}

func newX11Bucket(t *testing.T) *x11Bucket {
	return &x11Bucket{t: t, keys: map[string]x11Entry{}, mem: map[string]Memory{}}
}

// deliver hands e of host to tr at now, as the runner does.
func deliver(tr *Tracker, now time.Time, host string, e x11Entry) {
	tr.Stored(host, e.rev, e.stored)
	switch {
	case e.garbage:
		tr.ObserveInvalid(now, host, e.rev, "undecodable value (garbage)", false)
	case e.rec == nil:
		tr.Observe(now, host, e.rev, nil)
	case tr.NeedsWritten(host):
		tr.ObserveWritten(now, host, e.rev, e.rec, e.w)
	default:
		tr.Observe(now, host, e.rev, e.rec)
	}
}

func (b *x11Bucket) land(now time.Time, host string, e x11Entry) {
	b.rev++
	b.landed++
	e.rev = b.rev
	e.stored = now.Add(time.Duration(b.landed)) // never the same twice
	b.keys[host] = e
	if b.tr != nil {
		deliver(b.tr, now, host, e)
		b.delivered = max(b.delivered, e.rev)
		b.flush()
	}
}

// flush writes the memories the running controller changed.
func (b *x11Bucket) flush() {
	if b.manual {
		return
	}
	hosts, ms := b.tr.Memories(0)
	for i, h := range hosts {
		b.mem[h] = ms[i]
	}
}

// write: host's agent writes its record in state st naming guard g: a
// compare-and-set on the key's revision, or — its key deleted — a create
// over the marker (nats.go writes it on the marker's revision).
func (b *x11Bucket) write(now time.Time, host string, st fencing.LeaseState, g *fencing.GuardVersion) {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", g, st
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	cur, ok := b.keys[host]
	w := fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}
	r.PrevRev = cur.rev
	if !ok || cur.rec == nil && !cur.garbage {
		r.PrevRev = 0 // a create (over a marker: written on its revision)
	}
	b.land(now, host, x11Entry{rec: r, w: w})
	if b.tr != nil && st == fencing.LeaseActive {
		b.tr.ObserveBeacon(now, host, b.rev)
		b.flush()
	}
}

func (b *x11Bucket) del(now time.Time, host string)     { b.land(now, host, x11Entry{}) }
func (b *x11Bucket) garbage(now time.Time, host string) { b.land(now, host, x11Entry{garbage: true}) }

func (b *x11Bucket) publish() {
	g := b.tr.Guard()
	b.tr.GuardPublished(g, nil)
	b.guard = g
}

func (b *x11Bucket) stop() { b.tr = nil }

// start: a controller starts at now: its watch lists the bucket in
// revision order, its first acting tick restores the memories
// (Runner.restoreMemory), then the guard, and writes the memories changed.
func (b *x11Bucket) start(now time.Time) *Tracker {
	tr := x10Tracker(b.t)
	if b.enrolled != nil {
		tr.SetEnrolled(b.enrolled)
	}
	if b.stream != "" {
		tr.SetStream(b.stream)
	}
	names := make([]string, 0, len(b.keys))
	for h := range b.keys {
		names = append(names, h)
	}
	sort.Slice(names, func(i, j int) bool { return b.keys[names[i]].rev < b.keys[names[j]].rev })
	for _, h := range names {
		deliver(tr, now, h, b.keys[h])
	}
	tr.WatchStarted(now)
	for _, h := range tr.Hosts() {
		if m, ok := b.mem[h]; ok {
			tr.RestoreMemory(now, h, m)
		}
	}
	tr.RestoreGuard(b.guard)
	b.tr = tr
	b.flush()
	return tr
}

// run drives the running controller from..from+secs: live hosts renew
// naming the published guard, the guard is published, it ticks. It
// returns the first declaration of a host in protect (and when), if any.
func (b *x11Bucket) run(from time.Time, secs int, live []string, protect map[string]bool) (string, time.Duration) {
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		for _, h := range live {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && protect[d.Host] {
				return d.Host, now.Sub(from)
			}
		}
	}
	return "", 0
}

// x11Fleet: h0..h<n-1> renew for secs seconds under a running controller
// (signing required, memory on), the guard published.
func x11Fleet(t *testing.T, n, secs int) (*x11Bucket, []string) {
	b := newX11Bucket(t)
	hosts := x10Names(0, n)
	b.tr = x10Tracker(t)
	for _, h := range hosts {
		b.write(t0, h, fencing.LeaseActive, nil)
	}
	b.publish()
	b.run(t0, secs, hosts, nil)
	return b, hosts
}

func x11Without(names []string, drop ...string) []string {
	var out []string
	for _, n := range names {
		if !x10Set(drop)[n] {
			out = append(out, n)
		}
	}
	return out
}

// TestX11UnobservedWithdrawalDeclaredFromMemory (S): h0..h9, signing
// required. C1 runs and remembers h3 active. C1 stops (upgrade, both
// controllers down); meanwhile h3's agent stops in order — its
// withdrawal lands (its guests keep running, unprotected: never to be
// declared) — and then:
//
//   - "garbage": a compromised node writes garbage over the withdrawal;
//   - "delete-first": a compromised node deleted h3's key just before, so
//     the genuine withdrawal is a create over the marker (fencing.Agent
//     withdrawResult) — the key holds h3's own signed withdrawal, which
//     the first-value check cannot verify (Written.Fresh: "over a delete
//     marker, genuine or replayed alike").
//
// C2 starts: h3's key holds only an untrusted value, so RestoreMemory
// takes the remembered ACTIVE record and C2 declares h3 ~21 s after its
// start by CAS over its withdrawal: its guests are evacuated while they
// run (S). Before the memory (memoryMutation) h3 was never declared.
// Controls: the same with the withdrawal observed by C1 (remembered
// withdrawn: TestRestartMemoryWithdrawnHostNotDeclared's case), and with
// memoryMutation. docs/security.md calls the gap "a change observed by a
// controller that stops before its memory write (milliseconds)"; it is
// any withdrawal made while no controller runs.
func TestX11UnobservedWithdrawalDeclaredFromMemory(t *testing.T) {
	for _, c := range []struct {
		name               string
		observed, mutation bool
		attack             string
	}{
		{name: "garbage", attack: "garbage"},
		{name: "delete-first", attack: "delete-first"},
		{name: "control-observed-by-C1", attack: "garbage", observed: true},
		{name: "control-memoryMutation", attack: "garbage", mutation: true},
		{name: "control-delete-first-memoryMutation", attack: "delete-first", mutation: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			memoryMutation = c.mutation
			defer func() { memoryMutation = false }()
			b, hosts := x11Fleet(t, 10, 10)
			at := t0.Add(10 * time.Second)
			if !c.observed {
				b.stop()
			}
			if c.attack == "delete-first" {
				b.del(at, "h3")
			}
			b.write(at, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // h3's orderly stop
			if c.attack == "garbage" {
				b.garbage(at, "h3")
			}
			b.stop()
			start := at.Add(5 * time.Second)
			b.start(start)
			if host, after := b.run(start, 120, x11Without(hosts, "h3"), map[string]bool{"h3": true}); host != "" {
				if c.observed || c.mutation {
					t.Fatalf("control: %s declared %s after C2's start", host, after)
				}
				t.Fatalf("C2 declared h3 %s after its start: h3's agent withdrew (stopped in order, guests running) while no controller ran, and C2 took its remembered active record", after)
			}
		})
	}
}

// TestX11StaleWithdrawnMemoryEndsHold (S): 60 hosts, threshold 10; the
// rack h1..h12 (x10Pair: h11, h12) is the attack's. C1 runs and sees h11
// and h12 withdraw (orderly stops: remembered withdrawn). C1 stops
// (both controllers down); h11's and h12's agents start again and take
// their leases back (active, written fresh); then the rack h1..h12 is
// cut off: Held, guests running (its agents hold by 1 + 11 peers >
// threshold 10 + lying_peers 1). A compromised node writes garbage into
// h11's and h12's keys. C2 starts: h11 and h12 hold only untrusted
// values, RestoreMemory takes their remembered WITHDRAWN records —
// neither declared nor counted silent: 10 silent, not > 10, and the Held
// h1..h10 are declared while their guests run (S). Before the memory
// (memoryMutation) h11 and h12 counted silent as enrolled hosts with no
// trusted record (X8) and C2 held. Control: memoryMutation; and no
// garbage (their fresh active records are trusted: C2 holds).
func TestX11StaleWithdrawnMemoryEndsHold(t *testing.T) {
	for _, c := range []struct {
		name              string
		garbage, mutation bool
	}{
		{name: "garbage", garbage: true},
		{name: "control-memoryMutation", garbage: true, mutation: true},
		{name: "control-no-garbage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			memoryMutation = c.mutation
			defer func() { memoryMutation = false }()
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			at := t0.Add(5 * time.Second)
			for _, h := range x10Pair {
				b.write(at, h, fencing.LeaseWithdrawn, b.guard.Ref())
			}
			b.run(at, 5, x11Without(hosts, x10Pair...), nil)
			if r := b.tr.hosts["h11"].rec; r.State != fencing.LeaseWithdrawn { // the memory held records then
				t.Fatalf("C1 holds %+v of h11, want its withdrawal", r)
			}
			b.stop()
			at = at.Add(10 * time.Second)
			for _, h := range x10Pair { // their agents start again: leases taken back
				b.write(at, h, fencing.LeaseActive, b.guard.Ref())
			}
			// The rack is cut off (h1..h12 renew no more: Held).
			if c.garbage {
				for _, h := range x10Pair {
					b.garbage(at, h)
				}
			}
			start := at.Add(5 * time.Second)
			b.start(start)
			if host, after := b.run(start, 120, x11Without(hosts, rack...), x10Set(rack)); host != "" {
				if !c.garbage || c.mutation {
					t.Fatalf("control: %s declared %s after C2's start", host, after)
				}
				t.Fatalf("C2 declared the Held %s %s after its start (guests running): h11 and h12, Held too, were restored as withdrawn from a stale memory and not counted silent (silent %d, threshold %d)",
					host, after, b.tr.Silent(start.Add(after)), b.tr.Threshold())
			}
		})
	}
}

// TestX11HiddenWithdrawalDeclared (S, no restart needed): h0..h9 pinned,
// beaconing, C1 running. h3's agent stops in order: its withdrawal lands
// at revision R (its guests keep running; the agent confirms the
// withdrawal, disarms its watchdog and exits) and it beacons R. A
// compromised node supersedes R with garbage before C1's watch delivers
// it (a burst lags the watch at will: reviewer X4) — the watch skips R
// and shows R+1. C1 still holds h3's last trusted record, active; the
// beacon naming R counts as a renewal; then h3 is silent and C1 declares
// it by CAS over the garbage ~22 s later: a withdrawn host's guests
// evacuated while they run. The memory then also remembers h3 active.
// Control: the withdrawal delivered before the garbage (never declared).
// Fixed: the beacon names the withdrawal (fencing.Beacon.State,
// Tracker.ObserveWithdrawal); withdrawalMutation fails it.
func TestX11HiddenWithdrawalDeclared(t *testing.T) {
	for _, hidden := range []bool{true, false} {
		t.Run(map[bool]string{true: "hidden", false: "control-delivered"}[hidden], func(t *testing.T) {
			tr, rev := beaconFleet(t)
			at := t0.Add(time.Second)
			renewOthers(tr, at, &rev)
			rev++
			w := rec("h3", fencing.BackstopReset)
			w.Signer, w.State, w.Reason, w.PrevRev = "h3-key", fencing.LeaseWithdrawn, "orderly-stop", 4
			if !hidden {
				tr.Observe(at, "h3", rev, w)
			}
			tr.ObserveBeacon(at, "h3", rev)
			tr.ObserveWithdrawal(at, "h3", rev) // its beacon names the withdrawal (fencing.Beacon.State)
			rev++
			if hidden {
				tr.Skipped(rev)
			}
			tr.ObserveInvalid(at, "h3", rev, "undecodable value (garbage)", false)
			for s := 1; s <= 120; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				for i := range 10 {
					if i == 3 {
						continue
					}
					rev++
					r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
					r.Signer = fmt.Sprintf("h%d-key", i)
					tr.Observe(now, r.Host, rev, r)
					tr.ObserveBeacon(now, r.Host, rev)
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare {
						t.Fatalf("declared %s %s after h3's withdrawal landed (withdrawn: guests running, never to be declared); hidden %t", d.Host, now.Sub(at), hidden)
					}
				}
			}
		})
	}
}

// TestX11RestorePrunesVersionHeldRackActsOn (S): per-host thresholds
// after a restart with the memory. 25 hosts (threshold 5, guard v1).
// Ten are decommissioned (withdrawn, deleted, Forget): 15 members,
// threshold 3, guard v2. The rack h1..h5 reads v2 and is cut off before
// its next renewal lands: its agents act on v2 (threshold 3; Held: 5
// silent > 3 + lying_peers 1), their last records name v1. Ten hosts
// join: 25 members, v3 (threshold 5); every other member names v3. C1
// holds the rack on v2 (forHost: its named v1 keeps every later version
// in). A compromised node writes garbage into h1..h5's keys and C1
// restarts (the decommissioned hosts' lines removed from host_keys_file,
// as docs/security.md says). C2's RestoreGuard prunes the kept versions
// below the floor of the members it knows — h1..h5 hold only untrusted
// values then, so the floor is v3 and v1, v2 go — and only then does
// RestoreMemory give h1..h5 their remembered records naming v1
// (threshold 5): forHost = 5, 5 silent is not more, and C2 declares the
// Held h1..h5 ~22 s after its start (S). Controls: C1 running on (holds),
// and memoryMutation (no record: never declared).
func TestX11RestorePrunesVersionHeldRackActsOn(t *testing.T) {
	for _, c := range []struct {
		name              string
		restart, mutation bool
	}{
		{name: "restart", restart: true},
		{name: "control-no-restart"},
		{name: "control-memoryMutation", restart: true, mutation: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			memoryMutation = c.mutation
			defer func() { memoryMutation = false }()
			b := newX11Bucket(t)
			hosts := x10Names(0, 25)
			old := x10Names(15, 25)
			rack := x10Names(1, 6)
			b.tr = x10Tracker(t)
			for _, h := range hosts {
				b.write(t0, h, fencing.LeaseActive, nil)
			}
			b.publish()
			b.run(t0, 5, hosts, nil)
			v1 := b.guard.Ref()
			at := t0.Add(5 * time.Second)
			for _, h := range old { // decommissioned: orderly stop, delete, Forget
				b.write(at, h, fencing.LeaseWithdrawn, v1)
				b.del(at, h)
				if err := b.tr.Forget(at, h); err != nil {
					t.Fatal(err)
				}
			}
			live := x10Names(0, 15)
			var v2 *fencing.GuardVersion
			for s := 1; s <= 90 && v2 == nil; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				for _, h := range live {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				b.tr.Tick(now)
				if g := b.guard.Ref(); g.Threshold < v1.Threshold {
					v2, at = g, now // the rack read v2; cut off before renewing again
				}
			}
			if v2 == nil || v2.Threshold != 3 {
				t.Fatalf("no guard with threshold 3 after the decommission: %+v", b.guard.Ref())
			}
			live = x11Without(live, rack...)
			for _, h := range x10Names(25, 35) { // ten hosts join
				b.write(at, h, fencing.LeaseActive, b.guard.Ref())
			}
			live = append(live, x10Names(25, 35)...)
			if host, after := b.run(at, 30, live, x10Set(rack)); host != "" {
				t.Fatalf("C1 declared the Held %s %s after the cut (the test shows nothing)", host, after)
			}
			at = at.Add(30 * time.Second)
			if g := b.guard.Ref(); g.Threshold != 5 || g.Version <= v2.Version {
				t.Fatalf("latest guard %+v, want a later version with threshold 5", g)
			}
			for _, h := range rack {
				if v := b.tr.hosts[h].rec.Guard; v == nil || v.Version != v1.Version { // the memory held records then
					t.Fatalf("%s's record names %+v, want v1 %+v", h, v, v1)
				}
			}
			if c.restart {
				for _, h := range rack {
					b.garbage(at, h)
				}
				b.stop()
				b.enrolled = func(h string) bool { return enrolledH(h) && !x10Set(old)[h] }
				at = at.Add(2 * time.Second)
				b.start(at)
			}
			if host, after := b.run(at, 120, live, x10Set(rack)); host != "" {
				t.Fatalf("declared the Held %s %s after the restart (its agent acts on v2, threshold 3; %d silent; kept versions %v)",
					host, after, b.tr.Silent(at.Add(after)), b.tr.GuardVersions())
			}
		})
	}
}

// TestX11DeleteAtRestartBypassesMemory (c; reviewer X11): h0..h9,
// signing required, memory on. h0 (pinned, beaconing) dies; a
// compromised node deletes its key (or writes garbage into it). C1 would
// declare h0 over that value, but it restarts before lease_ttl + grace
// (an upgrade, a leader change to a standby started after the write):
// C2's watch shows only the marker (the garbage) of an enrolled host —
// before the memory's pin it tracked h0 with no trusted record, and never
// declared it: one write plus any controller restart before the
// declaration left a dead host undeclared for good. Now C1 pinned the
// key's state (memory.go) and C2, finding the key at that very revision,
// takes h0's last trusted record and declares it by CAS on the marker.
// Control: pinMutation (no pin): never declared.
func TestX11DeleteAtRestartBypassesMemory(t *testing.T) {
	for _, c := range []struct {
		attack   string
		mutation bool
	}{{"delete", false}, {"garbage", false}, {"delete", true}, {"garbage", true}} {
		t.Run(fmt.Sprintf("%s/pinMutation=%t", c.attack, c.mutation), func(t *testing.T) {
			pinMutation = c.mutation
			defer func() { pinMutation = false }()
			b, hosts := x11Fleet(t, 10, 10)
			at := t0.Add(10 * time.Second) // h0 dies
			if c.attack == "delete" {
				b.del(at.Add(time.Second), "h0")
			} else {
				b.garbage(at.Add(time.Second), "h0")
			}
			b.run(at, 10, hosts[1:], nil)
			b.stop()
			start := at.Add(12 * time.Second)
			b.start(start)
			host, after := b.run(start, 300, hosts[1:], map[string]bool{"h0": true})
			switch {
			case host == "" && !c.mutation:
				t.Fatalf("%s: the dead h0 never declared in 300 s after C2's start (its key: %+v, memory %+v)", c.attack, b.keys["h0"], b.mem["h0"])
			case host != "" && c.mutation:
				t.Fatalf("%s: h0 declared %s after C2's start without the pin: the test shows nothing", c.attack, after)
			case host != "":
				t.Logf("%s: dead h0 declared %s after C2's start", c.attack, after)
			}
		})
	}
}

// TestPinNotTakenAfterLaterWrite (S): the pin is taken only while the key
// is still at its revision. C1 pins h3 (garbage over its active record),
// then stops; while no controller runs h3's agent stops in order — its
// withdrawal lands over the garbage (its guests keep running) — and a
// compromised node writes garbage over the withdrawal. C2 finds h3's key
// at a later revision than the pin's: it takes nothing and never
// declares h3. Control "no-withdrawal": the key still at the pin's
// revision, h3 (dead) is declared.
func TestPinNotTakenAfterLaterWrite(t *testing.T) {
	for _, withdraw := range []bool{true, false} {
		t.Run(map[bool]string{true: "withdrawal", false: "control-no-withdrawal"}[withdraw], func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			at := t0.Add(10 * time.Second)
			b.garbage(at, "h3")
			if b.mem["h3"].Pin == nil {
				t.Fatalf("C1 pinned nothing: %+v", b.mem["h3"])
			}
			b.stop()
			if withdraw {
				b.write(at.Add(time.Second), "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // its orderly stop
				b.garbage(at.Add(2*time.Second), "h3")
			}
			start := at.Add(5 * time.Second)
			b.start(start)
			host, after := b.run(start, 300, x11Without(hosts, "h3"), map[string]bool{"h3": true})
			switch {
			case withdraw && host != "":
				t.Fatalf("C2 declared the withdrawn h3 %s after its start (guests running): a pin taken although its key moved on", after)
			case !withdraw && host == "":
				t.Fatal("control: the dead h3 (key at the pin's revision) never declared")
			}
		})
	}
}
