package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// x99Write: host's agent (boot, epoch, inc, seq) writes st by a
// compare-and-set on its key's revision; beacon: its beacon reaches the
// running controller (runner order: ObserveBeacon, BeaconWrote,
// BeaconVouches, then the withdrawal's).
func (b *x11Bucket) x99Write(now time.Time, host string, st fencing.LeaseState, boot string, epoch, inc, seq uint64, beacon bool) x11Entry {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = host + "-key genuine-signature"
	r.BootID, r.Epoch, r.Incarnation, r.Seq = boot, epoch, inc, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	cur, ok := b.keys[host]
	r.PrevRev = cur.rev
	if !ok || cur.rec == nil && !cur.garbage {
		r.PrevRev = 0
	}
	b.land(now, host, x11Entry{rec: r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
	e := b.keys[host]
	if beacon && b.tr != nil {
		b.tr.ObserveBeacon(now, host, e.rev)
		b.tr.BeaconWrote(host, e.rev, epoch, inc, seq)
		b.tr.BeaconVouches(now, host, e.rev, boot, epoch, inc, seq)
		if st == fencing.LeaseWithdrawn {
			b.tr.ObserveWithdrawalBy(now, host, e.rev, boot, 0)
		}
		b.flush()
	}
	return e
}

// TestX99StaleWithdrewNewBoot (probe, (c)): a host withdrew (its beacon
// handled, Memory.Withdrew written), a downward rollback moved revisions
// below W, the controller restarted (the node's garbage on the host's key
// before the listing: nothing trusted), and the host's new boot writes
// records older by writeID than W (durable state lost: epoch/incarnation
// lower) at revisions below W — its beacons never clear withdrew. Is the
// host trusted (vouched) and declared once it dies?
func TestX99StaleWithdrewNewBoot(t *testing.T) {
	for _, c := range []struct {
		older, beacons bool
		mut            *bool
	}{
		{older: true, beacons: true},
		{older: false, beacons: true},
		{older: false, beacons: false},
		{older: true, beacons: false},
		{older: true, beacons: false, mut: &withdrawnFreshMutation},
	} {
		t.Run(fmt.Sprintf("older=%t/beacons=%t/mut=%t", c.older, c.beacons, c.mut != nil), func(t *testing.T) {
			x32Mutate(t, c.mut)
			b := newX11Bucket(t)
			hosts := x10Names(0, 10)
			live := x11Without(hosts, "h3")
			b.tr = x10Tracker(t)
			for _, h := range live {
				b.write(t0, h, fencing.LeaseActive, nil)
			}
			b.publish()
			seq := uint64(1)
			b.x99Write(t0, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
			at := t0
			for i := 0; i < 3; i++ {
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
				seq++
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
			}
			backup, backupRev := maps.Clone(b.keys), b.rev
			for i := 0; i < 5; i++ {
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
				seq++
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
			}
			seq++
			w := b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, seq, true)
			if hs := b.tr.hosts["h3"]; hs.beacons.withdrew != w.rev || b.mem["h3"].Withdrew == nil {
				t.Fatalf("rig: withdrew %d, memory %+v", hs.beacons.withdrew, b.mem["h3"].Withdrew)
			}
			// Downward rollback, then restart; the node's garbage first.
			b.stop()
			b.rollBack(backup, backupRev)
			b.garbage(at, "h3")
			c2 := b.start(at.Add(100 * time.Millisecond))
			h := c2.hosts["h3"]
			t.Logf("W at %d, rolled back to %d; C2: withdrew %d wrote %+v trusted %d", w.rev, backupRev, h.beacons.withdrew, h.beacons.wrote, h.trustedRev)
			// The new boot: durable state lost (older: epoch 1, an
			// incarnation below the old one: a clock behind).
			ep, inc := uint64(2), uint64(200)
			if c.older {
				ep, inc = 1, 50
			}
			s := uint64(0)
			for i := 0; i < 3; i++ {
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
				s++
				e := b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", ep, inc, s, c.beacons)
				if e.rev >= w.rev {
					t.Fatalf("rig: new boot's write at %d, want below W %d", e.rev, w.rev)
				}
			}
			t.Logf("new boot: trusted %d (key %d), withdrew %d, state %s", h.trustedRev, h.rev, h.beacons.withdrew, h.rec.State)
			// h3 dies now.
			start := at
			declared := ""
			for i := 1; i <= 120 && declared == ""; i++ {
				now := start.Add(time.Duration(i) * time.Second)
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						declared = now.Sub(start).String()
					}
				}
			}
			t.Logf("h3 declared: %q", declared)
			if declared == "" && c.beacons {
				t.Errorf("(c) dead h3 (its new boot's beacons arrived) never declared: stale withdrew %d", h.beacons.withdrew)
			}
		})
	}
}
