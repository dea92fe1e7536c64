package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestRestartMemoryDeclaresDeadHostUnderGarbage (issue 11, invariant c;
// the "controller started after a host died" residual): h0 (pinned,
// beaconing) dies at t0; a compromised node writes garbage into its key
// every second. The controller C1 restarts at 10 s (C2): its watch lists
// h0's key holding garbage — no trusted record of h0, no beacon — so
// before the memory C2 never declared it (nothing to declare it with).
// With C1's memory (its last trusted record and its beacons binding it)
// restored, C2 declares h0 by CAS over the garbage lease_ttl + grace
// after its watch started. memoryMutation: never declared.
// Also: the live hosts, renewing, are never declared by C2, and h5 —
// live, but renewing with values C2 cannot verify (its key rotated), each
// named by its beacon — is not declared either.
func TestRestartMemoryDeclaresDeadHostUnderGarbage(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("memoryMutation=%t", mut), func(t *testing.T) {
			memoryMutation = mut
			defer func() { memoryMutation = false }()
			c1, rev := beaconFleet(t)
			g := c1.Guard()
			c1.GuardPublished(g, nil)
			bucket := map[string]Memory{} // MemoryBucket, written by C1
			flush := func() {
				hosts, ms := c1.Memories()
				for i, h := range hosts {
					bucket[h] = ms[i]
				}
			}
			latest := map[string]uint64{}
			renew := func(tr *Tracker, now time.Time) {
				for i := 1; i < 10; i++ {
					host := fmt.Sprintf("h%d", i)
					rev++
					latest[host] = rev
					if tr != c1 && host == "h5" { // unverifiable to C2, named by its beacon
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
			garbage := func(tr *Tracker, now time.Time) {
				rev++
				latest["h0"] = rev
				tr.ObserveInvalid(now, "h0", rev, "undecodable", false)
			}
			for s := 1; s <= 10; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renew(c1, now)
				garbage(c1, now)
				c1.Tick(now)
				flush()
			}
			if bucket["h0"].Record.Host != "h0" || !bucket["h0"].Beacons {
				t.Fatalf("C1 remembered %+v of h0, want its record and beacons", bucket["h0"])
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
			c2.ObserveInvalid(start, "h0", latest["h0"], "undecodable", false)
			for i := 1; i < 10; i++ {
				host := fmt.Sprintf("h%d", i)
				r := rec(host, fencing.BackstopReset)
				r.Signer, r.Guard = host+"-key", g.Ref()
				c2.Observe(start, host, latest[host], r)
			}
			c2.WatchStarted(start)
			c2.RestoreGuard(c1.Guard())
			for _, host := range c2.Hosts() {
				c2.RestoreMemory(start, host, bucket[host])
			}
			due := rec("h0", fencing.BackstopReset).Timing.LeaseTTL
			for ms := 250; ms <= 120_000; ms += 250 {
				now := start.Add(time.Duration(ms) * time.Millisecond)
				if ms%1000 == 0 {
					renew(c2, now)
					garbage(c2, now)
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
					t.Logf("dead h0 declared %s after C2's start (lease_ttl %s + grace)", now.Sub(start), due)
					return
				}
			}
			if !mut {
				t.Errorf("dead h0 never declared in 120 s after C2's start with garbage in its key every second")
			}
		})
	}
}

// TestRestartMemoryWithdrawnHostNotDeclared: h3 withdraws (its agent
// stopped in order; its guests run, unprotected); a compromised node
// then writes garbage into its key and the controller restarts. The
// remembered record is the withdrawal: h3 is never declared (a withdrawn
// host never is) and does not count silent. Without the state among
// what a memory keeps (remembers), h3 stayed remembered active and was
// declared 21 s after the restart.
func TestRestartMemoryWithdrawnHostNotDeclared(t *testing.T) {
	c1, rev := beaconFleet(t)
	g := c1.Guard()
	c1.GuardPublished(g, nil)
	bucket := map[string]Memory{}
	flush := func() {
		hosts, ms := c1.Memories()
		for i, h := range hosts {
			bucket[h] = ms[i]
		}
	}
	flush() // h3 remembered active
	rev++
	w := rec("h3", fencing.BackstopReset)
	w.Signer, w.State, w.Reason = "h3-key", fencing.LeaseWithdrawn, "orderly-stop"
	c1.Observe(t0.Add(time.Second), "h3", rev, w)
	flush()
	if bucket["h3"].Record.State != fencing.LeaseWithdrawn {
		t.Fatalf("C1 remembered %+v of h3, want its withdrawal", bucket["h3"])
	}
	c2, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	c2.SetSigningRequired(true)
	c2.SetEnrolled(enrolledH)
	start := t0.Add(5 * time.Second)
	rev += 5
	c2.ObserveInvalid(start, "h3", rev, "undecodable", false)
	for i := range 10 {
		if host := fmt.Sprintf("h%d", i); host != "h3" {
			r := rec(host, fencing.BackstopReset)
			r.Signer = host + "-key"
			rev++
			c2.Observe(start, host, rev, r)
		}
	}
	c2.WatchStarted(start)
	c2.RestoreGuard(c1.Guard())
	for _, host := range c2.Hosts() {
		c2.RestoreMemory(start, host, bucket[host])
	}
	for s := 1; s <= 120; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		for i := range 10 {
			if host := fmt.Sprintf("h%d", i); host != "h3" {
				r := rec(host, fencing.BackstopReset)
				r.Signer = host + "-key"
				rev++
				c2.Observe(now, host, rev, r)
				c2.ObserveBeacon(now, host, rev)
			}
		}
		rev++
		c2.ObserveInvalid(now, "h3", rev, "undecodable", false)
		for _, d := range c2.Tick(now) {
			if d.Op == OpDeclare {
				t.Fatalf("declared %s %s after the restart (h3 withdrew; its guests run)", d.Host, now.Sub(start))
			}
		}
		if n := c2.Silent(now); n != 0 {
			t.Fatalf("%d hosts count silent at %s: the withdrawn h3 must not", n, now.Sub(start))
		}
	}
}
