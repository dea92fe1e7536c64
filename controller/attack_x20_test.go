package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX20ForgedValueEndsRegression (reviewer X20): a regressed host
// (tracker.go regress: its key's revisions went down — the lease stream
// re-created or rolled back) is "not declared until a revision above
// h.rev arrives". But ANY value above h.rev clears h.regressed — an
// untrusted one included (invalid.go observeInvalid: `h.rev,
// h.regressed = rev, false`; keydelete.go the same for a marker). While
// h0 is regressed its genuine renewals (below h.rev) are dropped, so its
// lastSeen/declaration clock stays at the last pre-regression record.
// A compromised node writes one forged value (or a delete marker) into
// h0's key at the next stream revision (above h0's old one): the forged
// value keeps the clock (restart only when !forged || hidden), the
// regression is cleared, and the very next Tick declares the live h0 by
// CAS on the forged value's revision — its guests running.
//
// Model as TestRevisionRegressedNotDeclared's (h1..h9 keep writing above
// h0's old revision; the guard does not hold for one silent host).
// Control: no forged value — h0 is never declared while regressed.
func TestX20ForgedValueEndsRegression(t *testing.T) {
	for _, c := range []struct {
		name  string
		forge bool
	}{
		{name: "forged-value-clears-regression", forge: true},
		{name: "control-no-forged-value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, rev := regressFleet(t)
			low := uint64(0)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				var ds []Decision
				low++ // h0's genuine renewal in the re-created stream: h0 is alive throughout
				ds = append(ds, tr.Observe(now, "h0", low, rec("h0", fencing.BackstopReset))...)
				for i := 1; i < 10; i++ {
					rev++
					ds = append(ds, tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))...)
				}
				if c.forge && s == 60 {
					rev++ // the compromised node's forged value in h0's key, above h0's old revision 100
					tr.ObserveInvalid(now, "h0", rev, "forged: signed by h9's key", true)
				}
				ds = append(ds, tr.Tick(now)...)
				for _, d := range ds {
					if d.Op != OpDeclare || d.Host != "h0" {
						continue
					}
					if !c.forge {
						t.Fatalf("control: the live h0 declared at %ds (revision %d)", s, d.Revision)
					}
					t.Fatalf("the live h0 (renewing every second at its re-created stream's revisions, last %d) declared at %ds by CAS on the forged value's revision %d: one forged value above its old revision ended the regression with its clock stale since t0", low, s, d.Revision)
				}
			}
		})
	}
}

// TestX20PinTakenAfterStreamRollback (reviewer X20): a pin is taken when
// the key is "at that very revision" in the same stream (Stream: the
// stream's creation time). A lease stream ROLLED BACK (a NATS failure
// losing its last messages — the case regress() names beside
// re-creation, whose advice is "restart the controllers") keeps its
// creation time and hands the lost sequences out again. C1 pinned h3
// (garbage at R1, h3's last trusted record active). The stream rolls
// back to below R1; C1 is restarted as advised. h3 stops in order: its
// withdrawn record lands at R1-1; the compromised node times one garbage
// write into h3's key to land on R1 again (it sees the sequence in its
// own writes' revisions). C2 lists h3's key at R1, untrusted, same
// stream id: it takes C1's pin and declares the withdrawn h3 (guests
// running) by CAS on R1 — which holds, h3 writes nothing more.
//
// Fixed: a pin names when the server stored the value at KeyRev
// (MemoryPin.KeyStored); the garbage landing on R1 again after the
// rollback is stored at another time, so the pin is not taken.
// "rollback-storedMutation" (no stored-time check) shows the hole.
// Control: no rollback — the same withdrawal and garbage land at R1+1,
// R1+2: the pin is not taken, h3 stays undeclared.
func TestX20PinTakenAfterStreamRollback(t *testing.T) {
	for _, c := range []struct {
		name     string
		rollback bool
		wantHole bool
		mutation bool
	}{
		{name: "rollback-then-withdraw-then-garbage-on-R1", rollback: true},
		{name: "rollback-storedMutation", rollback: true, wantHole: true, mutation: true},
		{name: "control-no-rollback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			storedMutation = c.mutation
			defer func() { storedMutation = false }()
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			b.run(at, 3, live, nil) // h3's link is briefly down (3 s: not due)
			at = at.Add(3 * time.Second)
			prevH9 := b.keys["h9"]
			b.write(at, "h9", fencing.LeaseActive, b.guard.Ref()) // R1-1
			prevH3 := b.keys["h3"]
			b.garbage(at, "h3") // R1: the compromised node's garbage
			r1 := b.keys["h3"].rev
			if b.mem["h3"].Pin == nil || b.mem["h3"].Pin.KeyRev != r1 {
				t.Fatalf("C1 did not pin h3 at %d (rig): %+v", r1, b.mem["h3"].Pin)
			}
			b.stop()
			if c.rollback { // the lease stream loses R1-1 and R1; same creation time
				b.rev = r1 - 2
				b.keys["h9"], b.keys["h3"] = prevH9, prevH3
			}
			b.write(at.Add(time.Second), "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // h3's orderly stop
			b.garbage(at.Add(time.Second), "h3")                                      // the compromised node again
			if got := b.keys["h3"].rev; (got == r1) != c.rollback {
				t.Fatalf("garbage at %d, R1 %d (rig)", got, r1)
			}
			start := at.Add(3 * time.Second)
			b.x19Start(start)
			host, after := b.run(start, 120, live, map[string]bool{"h3": true})
			switch {
			case c.wantHole && host == "":
				t.Fatalf("with storedMutation (no stored-time check) the withdrawn h3 was not declared: the test no longer reaches the hole")
			case !c.wantHole && host != "":
				t.Fatalf("the withdrawn h3 (orderly stop, guests running) declared %s after C2's start: C1's pin taken from a rolled-back stream's reused revision %d", after, r1)
			}
		})
	}
}
