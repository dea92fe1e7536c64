package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
)

// Reviewer X50: attacks on the rollback gate (rollbackgate.go).

// x50Copy: a case of TestX50CopyOlderThanBeaconPassesGate.
type x50Copy struct {
	name string
	// copyLands: the compromised node lands its copy of h3's (3,21).
	copyLands bool
	// withdraw: h3 withdraws after its post-rollback renewals (else it
	// dies: its agent and host gone).
	withdraw bool
	// declared: h3 must be declared (otherwise never).
	declared bool
	// muts: rollbackExactMutation — the gate's first version: the hole
	// must show (declared).
	muts []*bool
}

// x50LandCopy: once the stream passed P (and h3's key is at or below it), the
// node lands its copy old by a plain put (h3 holds a trusted record: no
// fresh-write check) — once: copied says when.
func x50LandCopy(b *x11Bucket, now time.Time, old fencing.LeaseRecord, P uint64, copied *time.Time) {
	if copied.IsZero() && b.rev > P && b.keys["h3"].rev <= P {
		cp := old
		b.land(now.Add(700*time.Millisecond), "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true}})
		*copied = now.Add(700 * time.Millisecond)
	}
}

// x50Unseen: x48Rig's h3 (trusted at (3,20)); its next renewal (3,21)
// lands (prev_rev P) but the running controller's watch does not deliver
// it and its beacon is lost; the backup is restored and the fresh tracker
// starts at start. old is (3,21): the compromised node's copy.
func x50Unseen(t *testing.T) (b *x11Bucket, others []string, old fencing.LeaseRecord, P uint64, start time.Time) {
	t.Helper()
	b, others, bk, at := x48Rig(t)
	P = b.keys["h3"].rev
	c1 := b.tr
	b.tr = nil
	x38PutMod(b, at.Add(200*time.Millisecond), "h3", fencing.LeaseActive, 3, 21, nil)
	old = *b.keys["h3"].rec
	b.tr = c1
	if old.PrevRev != P {
		t.Fatalf("rig: (3,21) prev_rev %d, want %d", old.PrevRev, P)
	}
	b.rollBack(maps.Clone(bk.keys), bk.rev)
	start = at.Add(1500 * time.Millisecond)
	b.detectRollback(at.Add(time.Second), start)
	return b, others, old, P, start
}

// TestX50CopyOlderThanBeaconPassesGate (S: a compromised node with its
// own NATS credentials, plus one fault: h3's last pre-rollback renewal
// (3,21) reached neither the running controller's watch nor, by its
// beacon, the controller — the backup was restored right after it
// landed).
//
// Gate condition (a) accepts a record NOT NEWER than what h3's beacons
// named: a record OLDER than the newest the host announced passes, so
// long as it is newer than the bar. h3 renews on after the rollback
// (3,22..26, beacons to the fresh tracker) and withdraws in order
// (3,27, its withdrawal beacon too): its guests run unprotected. The
// node, which read (3,21) from the old stream (prev_rev P, a revision the
// rolled-back stream hands out again), puts it on h3's key once the
// stream passed P: not a replay (prev_rev < revision), not stale (h3's
// key revision, its withdrawal's, is below P), newer than the bar
// (3,20). The fresh tracker now holds h3 active at (3,21); its
// withdrawal beacon's revision is below the copy's. Due, the gate
// compares (3,21) with the beacons' newest (3,27): not newer — passes:
// the withdrawn host is declared.
func TestX50CopyOlderThanBeaconPassesGate(t *testing.T) {
	for _, c := range []x50Copy{
		{name: "withdrawn/copy", copyLands: true, withdraw: true},
		{name: "withdrawn/copy/rollbackExactMutation", copyLands: true, withdraw: true, muts: []*bool{&rollbackExactMutation, &rollbackLandedMutation, &unseenPrevMutation, &reusedRevMutation, &heldBackMutation}},
		{name: "control/withdrawn-no-copy", withdraw: true},
		{name: "control/dead-no-copy", declared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, old, P, start := x50Unseen(t)
			var wd time.Time
			copied := time.Time{}
			for s := 0; s < 150; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				switch {
				case s < 5 || s == 5 && !c.withdraw:
					gatePut(b, now.Add(500*time.Millisecond), fencing.LeaseActive, 3, uint64(22+s))
				case s == 5:
					gatePut(b, now.Add(500*time.Millisecond), fencing.LeaseWithdrawn, 3, 27)
					wd = now.Add(500 * time.Millisecond)
				}
				for _, h := range others {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
				}
				if c.copyLands {
					x50LandCopy(b, now, old, P, &copied)
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Host != "h3" {
						continue
					}
					if d.Op == OpDeclare {
						switch {
						case len(c.muts) > 0:
							t.Logf("with the mutation: the withdrawn h3 declared %v after its withdrawal", now.Sub(wd))
							return
						case c.declared:
							t.Logf("declared %v after the fresh start", now.Sub(start))
							return
						case c.withdraw:
							t.Fatalf("(S) h3 withdrew in order at (3,27) %v after the fresh start (its guests run unprotected) and was declared %v after its withdrawal (%v after the copy of its pre-rollback renewal (3,21) landed): the gate let an active record older than its beacons' newest (3,27) pass", wd.Sub(start), now.Sub(wd), now.Sub(copied))
						default:
							t.Fatalf("declared h3 at %v", now.Sub(start))
						}
					}
				}
			}
			if c.copyLands && copied.IsZero() {
				t.Fatalf("rig: the copy never landed (rev %d, P %d)", b.rev, P)
			}
			if c.declared || len(c.muts) > 0 {
				t.Fatalf("h3 never declared (with the mutation: the test no longer shows the hole)")
			}
		})
	}
}

// TestX50HeldConfirmationLostStateLive (held: passes). Tried: the gate
// holds the dead h3; it comes back with its agent's state lost (its
// records below the bar, refused as replays, its beacons naming them);
// the operator's confirmation of the earlier outage lands after. Not
// declared: its beacons renew its clock, so it is never due again
// while live — the confirmation only matters once it falls silent.
func TestX50HeldConfirmationLostStateLive(t *testing.T) {
	lostState := func(from, to int) map[int]gateStep {
		m := map[int]gateStep{}
		for s := from; s < to; s++ {
			m[s] = gateStep{inc: 2, seq: uint64(1 + s - from), st: fencing.LeaseActive, beacon: true}
		}
		return m
	}
	for _, c := range []struct {
		name      string
		confirmAt int
		bad       bool
	}{
		{name: "back-5s-before-confirmation", confirmAt: 60, bad: true},
		{name: "back-65s-before-confirmation", confirmAt: 120, bad: true},
		{name: "control/no-confirmation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			const back = 55
			start, out := gateRun(t, 150, lostState(back, 150), c.confirmAt)
			gate, said := gateFirst(out, OpRefusedDue)
			if !said || gate.at.Sub(start) >= back*time.Second {
				t.Fatalf("rig: h3 not gated while down (said %t at %v)", said, gate.at.Sub(start))
			}
			d, declared := gateFirst(out, OpDeclare)
			if declared {
				t.Fatalf("(S) h3 gated while down (said %v after the fresh start), back with its agent live at %ds (beacons every second since), confirmed at %ds: declared %v after the fresh start, %v after it came back and renewed — the confirmation outlived what it confirmed",
					gate.at.Sub(start), back, c.confirmAt, d.at.Sub(start), d.at.Sub(start.Add(back*time.Second)))
			}
			if c.bad {
				t.Logf("not declared: the confirmation was not taken for the live host")
			}
		})
	}
}

// TestX50CopyWithOldConstantsPassesGate (S: the same attacker and fault
// as TestX50CopyOlderThanBeaconPassesGate). After the rollback h3 runs
// with a longer lease (lease_ttl 60 s: reconfigured, its records say
// so, its beacons name them); at 5 s after the fresh start it is cut off
// (alive, guests running; its agent fences by ITS constants). The node's
// copy of h3's pre-rollback (3,21) — lease_ttl 15 s — lands once the
// stream passes its prev_rev. The gate passes it (not newer than the
// beacons' newest, newer than the bar) and h3 is declared by the copy's
// constants: before lease_ttl + grace of its newest record since its
// last renewal — its agent may not have fenced yet. Control: no copy,
// declared no earlier than its own lease_ttl + grace.
func TestX50CopyWithOldConstantsPassesGate(t *testing.T) {
	long := func(r *fencing.LeaseRecord) { r.Timing.LeaseTTL = 60 * time.Second }
	for _, c := range []struct {
		name      string
		copyLands bool
		muts      []*bool
	}{
		{"cut-off/copy", true, nil},
		{"cut-off/copy/rollbackExactMutation", true, []*bool{&rollbackExactMutation, &rollbackLandedMutation, &unseenPrevMutation, &reusedRevMutation, &heldBackMutation}},
		{"control/cut-off-no-copy", false, nil},
	} {
		copyLands := c.copyLands
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, old, P, start := x50Unseen(t)
			var last time.Time
			var newest fencing.LeaseRecord
			var copied time.Time
			for s := 0; s < 200; s++ {
				now := start.Add(time.Duration(s) * time.Second)
				if s < 5 {
					newest = x38PutMod(b, now.Add(500*time.Millisecond), "h3", fencing.LeaseActive, 3, uint64(22+s), long)
					b.tr.BeaconWrote("h3", b.rev, newest.Epoch, newest.Incarnation, newest.Seq)
					last = now.Add(500 * time.Millisecond)
				}
				for _, h := range others {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
				}
				if copyLands {
					x50LandCopy(b, now, old, P, &copied)
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Host != "h3" || d.Op != OpDeclare {
						continue
					}
					g, err := b.tr.cfg.Grace(newest)
					if err != nil {
						t.Fatal(err)
					}
					due := newest.Timing.LeaseTTL + g
					after := now.Sub(last)
					if len(c.muts) > 0 {
						if after >= due {
							t.Fatal("with the mutation h3 was declared no earlier than its own lease_ttl + grace: the test no longer shows the hole")
						}
						t.Logf("with the mutation: declared %v after its last renewal, %v before it is due", after, due-after)
						return
					}
					if after < due {
						t.Fatalf("(S) h3, cut off %v after the fresh start with lease_ttl %v (grace %v: declarable %v after its last renewal), was declared %v after its last renewal (%v after the copy of its pre-rollback (3,21), lease_ttl %v, landed): the gate passed the copy, older than its beacons' newest (3,26), and h3 was judged by the copy's constants",
							last.Sub(start), newest.Timing.LeaseTTL, g, due, after, now.Sub(copied), old.Timing.LeaseTTL)
					}
					t.Logf("declared %v after its last renewal (due %v)", after, due)
					return
				}
			}
			if copyLands && copied.IsZero() {
				t.Fatalf("rig: the copy never landed")
			}
			if !copyLands || len(c.muts) > 0 {
				t.Fatalf("h3 never declared (control, or the mutation: the test no longer shows the hole)")
			}
		})
	}
}

// x50ControlBucket: a real control bucket on an embedded nats-server.
func x50ControlBucket(t *testing.T) (context.Context, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	deliverytest.PinStreamsDir(ctx, t, js)
	kv, err := EnsureControlBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, kv
}

// TestX50ControlBucketRestoredAfterBaselineNATS ((c) in the gate's first
// version: it compared revisions with a baseline read at the first poll,
// and a control bucket re-created or restored after it ignored every new
// confirmation). Confirmations now name the standing rollback marker: a
// re-created bucket holds none — the command says so
// (ErrNoRollbackMarker), a marker-gated controller's gate opens — and
// once an operator writes one by hand (mark-rollback) a confirmation
// naming it is taken.
func TestX50ControlBucketRestoredAfterBaselineNATS(t *testing.T) {
	ctx, js, kv := x50ControlBucket(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := WriteRollbackMarker(ctx, kv, RollbackMarker{By: "ctl-1", At: time.Now(), Reason: "found"}); err != nil {
		t.Fatal(err)
	}
	var p confirmPoll
	gated := []string{"h3"}
	if r := p.poll(ctx, kv, log, gated, time.Now()); !r.known || !r.marker {
		t.Fatalf("marker not read: %+v", r)
	}
	if err := js.DeleteKeyValue(ctx, ControlBucket); err != nil {
		t.Fatal(err)
	}
	kv, err := EnsureControlBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteRollbackConfirmation(ctx, kv, RollbackConfirmation{Host: "h3", By: "operator", At: time.Now()}); !errors.Is(err, ErrNoRollbackMarker) {
		t.Fatalf("a confirmation with no marker standing: %v, want ErrNoRollbackMarker", err)
	}
	if r := p.poll(ctx, kv, log, gated, time.Now()); !r.known || r.marker {
		t.Fatalf("after the re-creation: %+v, want known, no marker", r)
	}
	if _, err := WriteRollbackMarker(ctx, kv, RollbackMarker{By: "operator", At: time.Now(), Reason: "by hand"}); err != nil {
		t.Fatal(err)
	}
	rev, err := WriteRollbackConfirmation(ctx, kv, RollbackConfirmation{Host: "h3", By: "operator", At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.poll(ctx, kv, log, gated, time.Now()); len(r.confirmed) != 1 || r.confirmed[0].host != "h3" || r.confirmed[0].rev != rev {
		t.Fatalf("(c) the confirmation of h3 naming the hand-written marker (revision %d) not taken: %+v", rev, r)
	}
}

// TestX50OldConfirmationRestoredAfterBaselineNATS (S in the gate's first
// version; faults only). A restore of the control bucket brings back an
// EARLIER incident's marker with h3's confirmation naming it: the marker
// stands, the confirmation names it — but it was written months ago, and
// is not taken (ConfirmMaxAge), whether restored before or after the
// controller's first poll. Control: a confirmation written now is.
func TestX50OldConfirmationRestoredAfterBaselineNATS(t *testing.T) {
	for _, restoredAfter := range []bool{true, false} {
		t.Run(fmt.Sprintf("restored-after-first-poll=%t", restoredAfter), func(t *testing.T) {
			ctx, _, kv := x50ControlBucket(t)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			var p confirmPoll
			gated := []string{"h3"}
			restore := func() { // the backup's content
				if _, err := WriteRollbackMarker(ctx, kv, RollbackMarker{By: "ctl-1", At: time.Now().Add(-90 * 24 * time.Hour), Reason: "incident #1"}); err != nil {
					t.Fatal(err)
				}
				if _, err := WriteRollbackConfirmation(ctx, kv, RollbackConfirmation{Host: "h3", By: "operator", Reason: "incident #1 (months ago)", At: time.Now().Add(-90 * 24 * time.Hour)}); err != nil {
					t.Fatal(err)
				}
			}
			if !restoredAfter {
				restore()
			} else if _, err := WriteRollbackMarker(ctx, kv, RollbackMarker{By: "ctl-1", At: time.Now(), Reason: "found now"}); err != nil {
				t.Fatal(err)
			}
			p.poll(ctx, kv, log, gated, time.Now())
			if restoredAfter {
				restore()
			}
			if r := p.poll(ctx, kv, log, gated, time.Now()); len(r.confirmed) != 0 {
				t.Fatalf("(S) h3's confirmation from an earlier incident (restored with its marker) was taken: %+v", r)
			}
			rev, err := WriteRollbackConfirmation(ctx, kv, RollbackConfirmation{Host: "h3", By: "operator", Reason: "checked now", At: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if r := p.poll(ctx, kv, log, gated, time.Now()); len(r.confirmed) != 1 || r.confirmed[0].rev != rev {
				t.Fatalf("control: the confirmation written now (revision %d) not taken: %+v", rev, r)
			}
		})
	}
}

// TestX50StickyProofThenCopy (S in the gate's first version: the
// attacker and fault of TestX50CopyOlderThanBeaconPassesGate). h3 is
// silent after the fresh start (a reboot): due, the gate says so
// (saidGate). It comes back (state kept: (3,22..24), beacons naming
// each) and a metrics scrape or `status` (Tracker.View) ran the gate's
// check, which in the first version kept its pass for good. h3 withdraws
// in order (3,25); the node's copy of (3,21) lands once the stream
// passes its prev_rev; h3 was declared. Closed: the check keeps nothing
// (re-checked every tick) and View changes nothing.
func TestX50StickyProofThenCopy(t *testing.T) {
	b, others, old, P, start := x50Unseen(t)
	var said, viewed, wd, copied time.Time
	for s := 0; s < 150; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		switch {
		case s >= 23 && s <= 25:
			gatePut(b, now.Add(300*time.Millisecond), fencing.LeaseActive, 3, uint64(22+s-23))
		case s == 26:
			b.tr.View(now) // a scrape
			if h := b.tr.hosts["h3"]; !b.tr.rollbackGated("h3", h) {
				viewed = now
			}
			gatePut(b, now.Add(300*time.Millisecond), fencing.LeaseWithdrawn, 3, 25)
			wd = now.Add(300 * time.Millisecond)
		}
		for _, h := range others {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		if !wd.IsZero() {
			x50LandCopy(b, now, old, P, &copied)
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Host != "h3" {
				continue
			}
			if d.Op == OpRefusedDue && said.IsZero() {
				said = now
			}
			if d.Op == OpDeclare {
				t.Fatalf("(S) h3 gated at %v after the fresh start, back and proved by a scrape at %v (passing the gate then: %t), withdrawn at %v, copy of (3,21) landed at %v: declared at %v — %v after its withdrawal",
					said.Sub(start), viewed.Sub(start), !viewed.IsZero(), wd.Sub(start), copied.Sub(start), now.Sub(start), now.Sub(wd))
			}
		}
	}
	if said.IsZero() || copied.IsZero() {
		t.Fatalf("rig: said %v, copied %v (rev %d, P %d, h3 key rev %d)", said, copied, b.rev, P, b.keys["h3"].rev)
	}
}
