package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestRestartMemoryBindsDeadHost (issue 11, invariant c; the "controller
// started after a host died has no beacon history" residual): h0
// (pinned, beaconing) dies at t0; the controller restarts at 10 s (C2),
// its watch lists h0's last genuine record; then a compromised node
// writes garbage into h0's key every second. C2 never received a beacon
// of h0, so without the memory it was lenient for h0: each garbage value
// restarted its clock, never declared. With C1's memory (h0's beacons
// bound it) C2 declares h0 by CAS over the garbage lease_ttl + grace
// after its watch started. memoryMutation: never declared. Also: the
// live hosts are never declared, and h5 — live, renewing with values C2
// cannot verify (its key rotated), each named by its beacon — neither.
func TestRestartMemoryBindsDeadHost(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("memoryMutation=%t", mut), func(t *testing.T) {
			memoryMutation = mut
			defer func() { memoryMutation = false }()
			c1, rev := beaconFleet(t)
			g := c1.Guard()
			c1.GuardPublished(g, nil)
			bucket := map[string]Memory{} // MemoryBucket, written by C1
			latest := map[string]uint64{"h0": 1}
			renew := func(tr *Tracker, now time.Time, unverifiable bool) {
				for i := 1; i < 10; i++ {
					host := fmt.Sprintf("h%d", i)
					rev++
					latest[host] = rev
					if unverifiable && host == "h5" { // unverifiable to C2, named by its beacon
						tr.ObserveBeacon(now, host, rev)
						tr.ObserveInvalid(now, host, rev, "signed by an unknown key", false)
						continue
					}
					r := rec(host, fencing.BackstopReset)
					r.Signer, r.Guard = host+"-key", g.Ref()
					tr.Observe(now, host, rev, r)
					tr.ObserveBeacon(now, host, rev)
				}
			}
			for s := 1; s <= 10; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renew(c1, now, false)
				c1.Tick(now)
				hosts, ms := c1.Memories(0)
				for i, h := range hosts {
					bucket[h] = ms[i]
				}
			}
			if !bucket["h0"].Beacons {
				t.Fatalf("C1 remembered %+v of h0, want its beacons binding it", bucket["h0"])
			}
			// C2 starts: its watch lists every key's latest value.
			c2, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			c2.SetSigningRequired(true)
			c2.SetEnrolled(enrolledH)
			start := t0.Add(12 * time.Second)
			c2.Skipped(rev)
			for i := range 10 {
				host := fmt.Sprintf("h%d", i)
				r := rec(host, fencing.BackstopReset)
				r.Signer, r.Guard = host+"-key", g.Ref()
				if host == "h0" {
					r.Guard = nil // its record from t0
				}
				c2.Observe(start, host, latest[host], r)
			}
			c2.WatchStarted(start)
			for _, host := range c2.Hosts() {
				c2.RestoreMemory(start, host, bucket[host])
			}
			c2.RestoreGuard(c1.Guard())
			for ms := 250; ms <= 120_000; ms += 250 {
				now := start.Add(time.Duration(ms) * time.Millisecond)
				if ms%1000 == 0 {
					renew(c2, now, true)
					rev++
					latest["h0"] = rev
					c2.ObserveInvalid(now, "h0", rev, "undecodable", false) // the garbage
				}
				for _, d := range c2.Tick(now) {
					if d.Op != OpDeclare {
						continue
					}
					if d.Host != "h0" {
						t.Fatalf("C2 declared the live %s at %s after its start", d.Host, now.Sub(start))
					}
					if mut {
						t.Fatalf("h0 declared with memoryMutation: the test shows nothing")
					}
					if d.Revision != latest["h0"] {
						t.Errorf("declared on revision %d, want the garbage's %d", d.Revision, latest["h0"])
					}
					t.Logf("dead h0 declared %s after C2's start", now.Sub(start))
					return
				}
			}
			if !mut {
				t.Errorf("dead h0 never declared in 120 s after C2's start with garbage in its key every second")
			}
		})
	}
}

// TestMemoryWritesNotStarved (c; reviewer X18's "a flood of pins could
// delay a late-sorting host's pin", not tested until now): the runner
// writes at most MemoryWritesPerTick memories a tick. A compromised node
// writes garbage into every live host's key each tick (each is pinned)
// and the hosts renew (each pin dropped): 1199 memories due every tick.
// The dead h99 (the last host name in sort order) gets garbage once: its
// pin must reach the memory bucket — a restart before it is written does
// not declare it. Written oldest due first, it is written within
// ceil(1200 / 256) = 5 ticks; in host order (memoryOrderMutation) never.
func TestMemoryWritesNotStarved(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("memoryOrderMutation=%t", mutation), func(t *testing.T) {
			memoryOrderMutation = mutation
			defer func() { memoryOrderMutation = false }()
			const n, dead = 1200, "h99"
			b, hosts := x11Fleet(t, n, 3)
			live := x11Without(hosts, dead)
			b.manual = true // the runner's writes: MemoryWritesPerTick a tick
			at := t0.Add(4 * time.Second)
			written := 0
			for tick := 1; tick <= 40 && written == 0; tick++ {
				now := at.Add(time.Duration(tick) * TickInterval)
				for _, h := range live {
					b.garbage(now, h)
				}
				if tick == 1 {
					b.garbage(now, dead)
				}
				for _, h := range live {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
				}
				hs, ms := b.tr.Memories(MemoryWritesPerTick)
				if len(hs) > MemoryWritesPerTick {
					t.Fatalf("%d memories handed out in one tick, at most %d", len(hs), MemoryWritesPerTick)
				}
				for i, h := range hs {
					b.mem[h] = ms[i]
				}
				if p := b.mem[dead].Pin; p != nil && p.KeyRev == b.keys[dead].rev {
					written = tick
				}
			}
			want := (n + MemoryWritesPerTick - 1) / MemoryWritesPerTick
			switch {
			case mutation && written != 0:
				t.Fatalf("in host order the pin of %s was written at tick %d: the flood does not starve it (the test shows nothing)", dead, written)
			case !mutation && (written == 0 || written > want):
				t.Fatalf("the dead %s's pin written at tick %d (0: not within 40), want within %d ticks", dead, written, want)
			case !mutation:
				t.Logf("the dead %s's pin written at tick %d of the flood (%d memories due a tick)", dead, written, n-1)
			}
		})
	}
}
