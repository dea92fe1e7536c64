package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// x65Start drives a tracker through reviewer X65's delete loop across a
// controller start (TestX65DeleteLoopAcrossStartNATS, the tracker alone):
// the controller starts while compute-1 deletes compute-3's key right
// after each of its writes, so every value of compute-3 it sees is a
// create over a delete marker (never verified as written fresh). order
// says in which order the tracker sees, each round, compute-3's create
// (v), its beacon (b) and compute-1's delete marker (m). compute-3 lives
// for rounds renewals (one a second; it must not be declared), then dies
// (the loop's last marker stays). It returns when compute-3 was declared
// after its death (ok false: not within two minutes) and the decisions
// said.
func x65Start(t *testing.T, order string, rounds int) (after time.Duration, ok bool, said []Decision) {
	return x65StartEnd(t, order, rounds, "die")
}

// x65StartEnd is x65Start with compute-3's end: "die"; "withdraw" (an
// orderly stop: its withdrawal, a create over the loop's marker, its
// beacon and receipt — then compute-1's delete); "hidden" (the same,
// but the watch skips the withdrawal — compute-1's delete superseded it
// before delivery — and the beacons of the last create and of the
// withdrawal come after the marker: the create is vouched late, the
// withdrawal after it). A withdrawn compute-3 must never be declared.
func x65StartEnd(t *testing.T, order string, rounds int, end string) (after time.Duration, ok bool, said []Decision) {
	t.Helper()
	const host = "compute-3.example.org"
	cfg := DefaultConfig()
	cfg.GuardCount, cfg.GuardShare = 100, 1
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	now := t0
	rev, marker := uint64(100), uint64(100)
	tr.Stored(host, marker, now)
	tr.Observe(now, host, marker, nil) // the listing: the loop's marker
	tr.WatchStarted(now)
	r := rec(host, fencing.BackstopWatchdog)
	r.Signer, r.Sig, r.BootID, r.Epoch, r.Incarnation = host+"-key", "signed", "boot-1", 1, 2
	var beaconRev uint64
	keep := func(ds []Decision) {
		for _, d := range ds {
			if d.Op == OpDeclare {
				t.Fatalf("%s: the live compute-3 declared at %s: %s", order, now.Sub(t0), d.Reason)
			}
			said = append(said, d)
		}
	}
	for i := range rounds {
		now = now.Add(time.Second)
		rev += 3 // other hosts' writes in between
		r.Seq, r.PrevRev = uint64(i+1), 0
		wrote, c := rev, *r
		for _, step := range order {
			switch step {
			case 'v':
				tr.Stored(host, wrote, now)
				keep(tr.ObserveWritten(now, host, wrote, &c, fencing.Written{Known: true, HasExpected: true, Expected: marker}))
			case 'b':
				tr.BeaconChain(now, host, wrote, beaconRev)
				tr.ObserveBeacon(now, host, wrote)
				tr.BeaconWrote(host, wrote, c.Epoch, c.Incarnation, c.Seq)
				keep(tr.BeaconVouches(now, host, wrote, c.BootID, c.Epoch, c.Incarnation, c.Seq))
				beaconRev = wrote
			case 'm':
				marker = wrote + 1
				tr.Stored(host, marker, now)
				keep(tr.Observe(now, host, marker, nil))
			}
		}
		rev = marker
		keep(tr.Tick(now))
	}
	if end != "die" {
		now = now.Add(time.Second)
		last := *r
		r.Seq, r.PrevRev, r.State, r.Reason = r.Seq+1, 0, fencing.LeaseWithdrawn, "stopped"
		w := rev + 3
		beacon := func(rev uint64, c fencing.LeaseRecord) {
			tr.BeaconChain(now, host, rev, beaconRev)
			tr.ObserveBeacon(now, host, rev)
			tr.BeaconWrote(host, rev, c.Epoch, c.Incarnation, c.Seq)
			keep(tr.BeaconVouches(now, host, rev, c.BootID, c.Epoch, c.Incarnation, c.Seq))
			beaconRev = rev
		}
		if end == "withdraw" {
			tr.Stored(host, w, now)
			keep(tr.ObserveWritten(now, host, w, r, fencing.Written{Known: true, HasExpected: true, Expected: marker}))
		}
		marker = w + 1
		if end == "hidden" {
			// The watch skips the withdrawal: compute-1's delete at w+1
			// superseded it; the last create's beacon (if not sent in its
			// round) comes only now.
			tr.Skipped(marker)
			tr.Stored(host, marker, now)
			keep(tr.Observe(now, host, marker, nil))
			if !strings.Contains(order, "b") {
				beacon(rev-1, last) // the last create landed at the last marker - 1
			}
		}
		beacon(w, *r)
		keep(tr.ObserveWithdrawal(now, host, w))
		if end == "withdraw" {
			tr.Stored(host, marker, now)
			keep(tr.Observe(now, host, marker, nil))
		}
	}
	died := now
	for now.Sub(died) < 2*time.Minute {
		now = now.Add(500 * time.Millisecond)
		for _, d := range tr.Tick(now) {
			said = append(said, d)
			if d.Op == OpDeclare && end != "die" {
				t.Fatalf("%s: the withdrawn compute-3 declared %s after its withdrawal: %s", end, now.Sub(died), d.Reason)
			}
			if d.Op == OpDeclare {
				if d.Revision != marker {
					t.Errorf("%s: declared by CAS on revision %d, not the key's last (the marker %d)", order, d.Revision, marker)
				}
				return now.Sub(died), true, said
			}
		}
	}
	return 0, false, said
}

// TestX65VouchedCreateAcrossStart: the loop across a start (above) no
// longer keeps the dead compute-3 undeclared: its own beacon, naming the
// revision and identity of a create, vouches for it (vouch.go) — the
// beacon before the create, between it and the marker, or after both.
// It is declared lease_ttl + grace (30.5 s) after its last renewal,
// never while it renews. vouchMutation: never trusted, never declared.
func TestX65VouchedCreateAcrossStart(t *testing.T) {
	for _, order := range []string{"vmb", "vbm", "bvm"} {
		t.Run(order, func(t *testing.T) {
			after, ok, said := x65Start(t, order, 60)
			if !ok {
				t.Fatalf("compute-3 not declared within 2 minutes of its death (decisions: %v)", said)
			}
			if after > 32*time.Second || after < 30*time.Second {
				t.Errorf("declared %s after its death, want lease_ttl + grace (30.5 s)", after)
			}
			vouched := 0
			for _, d := range said {
				if d.Op == OpVouched {
					vouched++
				}
			}
			if vouched != 1 {
				t.Errorf("%d vouched decisions, want 1 (the first create; later creates are ordered against it)", vouched)
			}
			t.Logf("declared %s after its death", after)
		})
		t.Run(order+"/vouchMutation", func(t *testing.T) {
			x32Mutate(t, &vouchMutation)
			if after, ok, _ := x65Start(t, order, 60); ok {
				t.Fatalf("declared %s after its death without vouching: the test no longer shows the hole", after)
			}
		})
	}
}

// TestX65VouchedThenWithdrawn: under the loop across a start, compute-3
// stops in order (its withdrawal a create over the loop's marker, then
// deleted by compute-1): never declared — whether the withdrawal is
// delivered (and vouched by its beacon) or hidden by a watch skip, with
// the last create vouched only after the marker (its beacon late), the
// withdrawal's beacon after that.
func TestX65VouchedThenWithdrawn(t *testing.T) {
	for _, c := range []struct {
		end    string
		order  string
		rounds int
	}{{"withdraw", "vmb", 5}, {"withdraw", "vbm", 5}, {"hidden", "vmb", 5}, {"hidden", "vm", 1}} {
		t.Run(fmt.Sprintf("%s/%s/%d", c.end, c.order, c.rounds), func(t *testing.T) {
			_, ok, said := x65StartEnd(t, c.order, c.rounds, c.end)
			if ok {
				t.Fatal("declared")
			}
			withdrawn, vouched := false, false
			for _, d := range said {
				withdrawn = withdrawn || d.Op == OpWithdrawn
				vouched = vouched || d.Op == OpVouched
			}
			if !withdrawn || !vouched {
				t.Errorf("withdrawn %t, vouched %t, want both (decisions: %v)", withdrawn, vouched, said)
			}
		})
	}
}
