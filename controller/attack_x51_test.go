package controller

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X51: attacks on the revised rollback gate (rollbackgate.go).

// x51LandNoBeacon: host's agent writes (inc, seq, st) by a compare-and-set
// on its key (as x38Land), the watch delivers it, but its beacon is lost
// (neither ObserveBeacon/ObserveWithdrawal nor BeaconWrote).
func x51LandNoBeacon(b *x11Bucket, now time.Time, host string, st fencing.LeaseState, inc, seq uint64) fencing.LeaseRecord {
	return x38LandBeacon(b, now, x38Rec(b, host, st, inc, seq), false)
}

// TestX51ProvedThenLostStateWithdrawal ((S), faults only: an agent that
// loses its state, and one lost beacon — X49's faults, after h3 proved
// itself to the fresh tracker).
//
// After the rollback h3 renews (3,22..26), its beacons naming each: the
// gate's condition (a) holds (record == beacons' newest, above the bar
// (3,20)). Then h3's agent restarts with its state lost (incarnation 2):
// its records (2,1..) fall below the bar and are refused as replays; its
// beacons name them — BeaconWrote keeps the identity-largest (3,26), not
// the latest, so h.rec (3,26) == beacons.wrote (3,26) stays true. The
// lost-state agent withdraws in order at (2,11); that beacon is lost.
// The gate passes h3 on its old proof and it is declared while its
// guests run. Controls: the withdrawal beacon arrives (never declared);
// the lost-state agent dies (declared: no harm — shows the pass).
//
// Closed: a beacon naming a later revision than the judged record keeps
// the host gated (rollbackLaterMutation reopens it).
func TestX51ProvedThenLostStateWithdrawal(t *testing.T) {
	for _, c := range []struct {
		name     string
		withdraw bool // the lost-state agent withdraws (else it dies)
		beacon   bool // the withdrawal's beacon arrives
		muts     []*bool
	}{
		{name: "withdrawn/beacon-lost", withdraw: true},
		{name: "withdrawn/beacon-lost/rollbackLaterMutation+rollbackRefusedMutation", withdraw: true, muts: []*bool{&rollbackLaterMutation, &rollbackRefusedMutation, &rollbackUnvouchedMutation}},
		{name: "control/withdrawn/beacon-came", withdraw: true, beacon: true},
		{name: "control/dead"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, start := gateFresh(t)
			var wd, lastLive time.Time
			var declared bool
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				w := now.Add(500 * time.Millisecond)
				switch {
				case s < 5: // proved: (3,22..26), beacons naming each
					gatePut(b, w, fencing.LeaseActive, 3, uint64(22+s))
					lastLive = w
				case s >= 10 && s < 20: // state lost: (2,1..10), beacons naming each
					gatePut(b, w, fencing.LeaseActive, 2, uint64(s-9))
					lastLive = w
				case s == 20 && c.withdraw && c.beacon:
					gatePut(b, w, fencing.LeaseWithdrawn, 2, 11)
					wd = w
				case s == 20 && c.withdraw:
					x51LandNoBeacon(b, w, "h3", fencing.LeaseWithdrawn, 2, 11)
					wd = w
				}
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host != "h3" || d.Op != OpDeclare {
						continue
					}
					if len(c.muts) > 0 {
						t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
						return
					}
					if c.withdraw {
						hs := b.tr.hosts["h3"]
						t.Fatalf("(S) h3 proved itself after the fresh start at (3,22..26), its agent then lost its state (records (2,1..10) refused below the bar, beacons naming them) and withdrew in order at (2,11) %v after the fresh start (beacon lost: %t): declared %v after the withdrawal — the gate passed h3 on (a): judged record (%d,%d) == beacons.wrote (%d,%d), the identity-largest its beacons named, not the latest",
							wd.Sub(start), !c.beacon, now.Sub(wd), hs.rec.Incarnation, hs.rec.Seq, hs.beacons.wrote.inc, hs.beacons.wrote.seq)
					}
					t.Logf("dead lost-state h3 declared %v after its last beacon", now.Sub(lastLive))
					declared = true
				}
				if declared {
					return
				}
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation h3 was not declared: the test no longer shows the hole")
			}
			if !c.withdraw && !declared {
				t.Logf("control/dead: not declared in the run (the gate held it)")
			}
		})
	}
}

// TestX51WatchRestartSpendsConfirmation ((c) in the gate's second
// version, closed: a confirmation is spent by a trusted record or a
// beacon of the host, not by a watch restart's lastSeen).
//
// Found: ((c), faults only: a NATS hiccup).
//
// The dead h3 is gated; an operator confirms it at 60 s (taken: the
// revision 7 of its confirmation key). Tick declares it, but the
// declaration's compare-and-set fails (the same NATS trouble) and the
// lease watch restarts half a second later (WatchStarted). WatchStarted
// sets every host's lastSeen to now — not a sign of life of h3 — so
// expireConfirmation spends the confirmation; the declaration is not
// retried (gated again once due), and the runner's poll reading the same
// confirmation (revision 7) is refused by ConfirmRollback (rev not above
// the last taken). h3 stays undeclared until the operator runs the
// command again. Control: no watch restart — retried after DeclareRetry.
func TestX51WatchRestartSpendsConfirmation(t *testing.T) {
	for _, restart := range []bool{true, false} {
		t.Run(fmt.Sprintf("watch-restart=%t", restart), func(t *testing.T) {
			start, out, b := gateRunEach(t, 300, nil, 60, func(b *x11Bucket, s int, now time.Time) {
				if s == 60 && restart {
					b.tr.WatchStarted(now.Add(500 * time.Millisecond))
				}
				if s > 60 {
					b.tr.ConfirmRollback("h3", "m1", 7, now) // the poll reads the same key again
				}
			})
			decl := gateDeclared(out, start)
			if len(decl) == 0 || decl[0] != 60*time.Second {
				t.Fatalf("rig: h3 not declared at the confirmation (60s): %v", decl)
			}
			if len(decl) < 2 {
				_, conf := b.tr.confirmed["h3"]
				t.Fatalf("(c) the dead h3, confirmed by an operator at 60s, declared at %v; that declaration's write failed and the lease watch restarted 0.5s later: never declared again in the next %ds (confirmation still held: %t; gated: %v) — WatchStarted's lastSeen spent the operator's confirmation, and the same confirmation is not taken again", decl, 300-60, conf, b.tr.RollbackGated())
			}
			t.Logf("declarations at %v", decl)
		})
	}
}

// TestX51UnreadableControlGatesNormalController ((c), documented, kept:
// faults only: the
// controllers' account unreachable, or the control bucket lost, when a
// controller starts — no rollback anywhere).
//
// Run gates every tracker that has Store.Control set until a poll reads
// the marker; a poll that cannot read it (res.known false) leaves the gate
// on, for as long as it cannot. Gated, a host passes only on a beacon this
// Run received naming its record: h3, dead before this controller
// started (or running an agent without beacon identities), is never
// declared — on a stream that never rolled back. Control: the first poll
// reads "no marker" — declared at lease_ttl + grace.
func TestX51UnreadableControlGatesNormalController(t *testing.T) {
	ctx, js, kv := x50ControlBucket(t)
	if err := js.DeleteKeyValue(ctx, ControlBucket); err != nil {
		t.Fatal(err)
	}
	var p confirmPoll
	res := p.poll(ctx, kv, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, time.Now())
	if res.known {
		t.Fatalf("rig: a poll of a lost control bucket read the marker: %+v", res)
	}
	for _, readable := range []bool{false, true} {
		t.Run(fmt.Sprintf("control-readable=%t", readable), func(t *testing.T) {
			b, others, _, at := x48Rig(t)
			b.tr.SetRollbackGate(MarkerUnread, "the controllers' rollback marker (control bucket) is not read yet")
			if readable {
				b.tr.SetRollbackGate(MarkerAbsent, "") // the first poll: no marker
			}
			for s := 0; s < 300; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				gateOthers(b, now, others)
				for _, d := range b.tr.Tick(now) {
					if d.Host == "h3" && d.Op == OpDeclare {
						if !readable {
							t.Fatalf("rig: declared with the gate on")
						}
						t.Logf("declared %v after its last renewal", now.Sub(at))
						return
					}
				}
			}
			if readable {
				t.Fatalf("control: h3 never declared")
			}
			// The price, documented (docs/security.md, "The rollback
			// marker"): a controller that cannot read the control bucket
			// holds no leader lock either (it lives there), so it would
			// not act anyway.
			t.Logf("(c, documented) the dead h3 not declared in 300 s while the control bucket could not be read (poll: %+v; gated: %v)", res, b.tr.RollbackGated())
		})
	}
}

// TestX51RecreatedControlBucketConfirmationRefused ((c) in the gate's
// second version, closed: "already taken" is per marker. Faults only: the
// control bucket re-created or restored while the controller runs — the
// event X50's TestX50ControlBucketRestoredAfterBaselineNATS covers for
// the poll alone).
//
// The dead h3 is gated; confirmed at 60 s (control-bucket revision 7): the
// declaration's compare-and-set fails — h3 comes back just then, its
// agent's state lost (records below the bar, beacons naming them: it
// stays unproven), and the confirmation is spent by its renewals, as it
// should. h3 dies again at 71 s and is gated again. Meanwhile the control
// bucket was re-created (an operator wrote the marker by hand: revisions
// restart) and the operator confirms h3 again at 120 s: revision 2. The
// poll takes it (it names the standing marker, is fresh), but
// Tracker.ConfirmRollback refuses any revision not above the last taken
// for the host (7): h3 is never declared by this tracker, whatever the
// operator runs. Control: the new confirmation lands at revision 8.
func TestX51RecreatedControlBucketConfirmationRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		rev    uint64
		marker string
	}{{"recreated/rev-2", 2, "m2"}, {"control/rev-8", 8, "m1"}} {
		t.Run(c.name, func(t *testing.T) {
			steps := map[int]gateStep{}
			for s := 61; s < 71; s++ {
				steps[s] = gateStep{inc: 2, seq: uint64(1 + s - 61), st: fencing.LeaseActive, beacon: true}
			}
			took := false
			start, out, _ := gateRunEach(t, 200, steps, 60, func(b *x11Bucket, s int, now time.Time) {
				if s == 120 {
					took = b.tr.ConfirmRollback("h3", c.marker, c.rev, now)
				}
			})
			decl := gateDeclared(out, start)
			if len(decl) == 0 || decl[0] != 60*time.Second {
				t.Fatalf("rig: not declared at the first confirmation: %v", decl)
			}
			if len(decl) < 2 || decl[1] < 120*time.Second {
				t.Fatalf("(c) h3, confirmed at 60s (revision 7; that declaration failed: h3 came back), dead again from 71s, confirmed again at 120s at revision %d of a re-created control bucket: taken %t, declarations %v — never declared after the second confirmation", c.rev, took, decl)
			}
			t.Logf("declarations at %v", decl)
		})
	}
}
