package controller

import (
	"maps"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// gateOff: the test examines the layers beneath the rollback gate
// (rollbackgate.go) — the carries and bars that judge a host once the
// gate lets it go (its beacon proved its record, or an operator confirmed
// it) — as it did before the gate. Tests only.
func gateOff(t *testing.T) { x36Mutate(t, &rollbackGateMutation) }

// gateOn: the rollback gate is on for t (inside a test that turned it
// off), as in production.
func gateOn(t *testing.T) {
	was := rollbackGateMutation
	rollbackGateMutation = false
	t.Cleanup(func() { rollbackGateMutation = was })
}

// gateRun: x48Rig's h3 (incarnation 3, seq 20 trusted) under a running
// controller; the lease stream rolls back to the backup (h3 at
// incarnation 1), the fresh tracker starts at start. live(s) says what
// h3 writes in the fresh tracker's second s (nil: nothing — h3 is dead).
// It returns the fresh tracker's decisions about h3, each with its time.
type gateStep struct {
	inc, seq uint64
	st       fencing.LeaseState
	beacon   bool // its beacon names the record (BeaconWrote)
}

type gateDecision struct {
	d  Decision
	at time.Time
}

func gateRun(t *testing.T, secs int, steps map[int]gateStep, confirmAt int) (start time.Time, out []gateDecision) {
	t.Helper()
	start, out, _ = gateRunEach(t, secs, steps, confirmAt, nil)
	return start, out
}

// gateRunEach is gateRun calling each (if set) after every tick.
func gateRunEach(t *testing.T, secs int, steps map[int]gateStep, confirmAt int, each func(b *x11Bucket, s int, now time.Time)) (start time.Time, out []gateDecision, b *x11Bucket) {
	t.Helper()
	b, others, bk, at := x48Rig(t)
	if b.tr.ConfirmRollback("h3", "m1", 1, at) {
		t.Fatal("ConfirmRollback changed something on a tracker that saw no rollback")
	}
	b.rollBack(maps.Clone(bk.keys), bk.rev)
	start = at.Add(1500 * time.Millisecond)
	b.detectRollback(at.Add(time.Second), start)
	for s := 0; s < secs; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		if st, ok := steps[s]; ok {
			r := x38PutMod(b, now.Add(500*time.Millisecond), "h3", st.st, st.inc, st.seq, nil)
			if st.beacon {
				b.tr.BeaconWrote("h3", b.rev, r.Epoch, r.Incarnation, r.Seq)
			}
		}
		if s == confirmAt && confirmAt > 0 {
			if !b.tr.ConfirmRollback("h3", "m1", 7, now) {
				t.Fatalf("ConfirmRollback(h3) changed nothing")
			}
		}
		for _, h := range others {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Host == "h3" {
				out = append(out, gateDecision{d, now})
			}
		}
		if each != nil {
			each(b, s, now)
		}
	}
	return start, out, b
}

// gateFresh: x48Rig's h3 (incarnation 3, seq 20 trusted); the lease
// stream rolls back to the backup, the fresh tracker starts at start.
func gateFresh(t *testing.T) (b *x11Bucket, others []string, start time.Time) {
	t.Helper()
	b, others, bk, at := x48Rig(t)
	b.rollBack(maps.Clone(bk.keys), bk.rev)
	start = at.Add(1500 * time.Millisecond)
	b.detectRollback(at.Add(time.Second), start)
	return b, others, start
}

// gateOthers: the other hosts renew at now, the guard is published.
func gateOthers(b *x11Bucket, now time.Time, others []string) {
	for _, h := range others {
		b.write(now, h, fencing.LeaseActive, b.guard.Ref())
	}
	b.publish()
}

// gatePut: h3's agent writes (inc, seq, st) at now, its beacon naming the
// record reaching the tracker (BeaconWrote, as Runner.observeBeacons).
func gatePut(b *x11Bucket, now time.Time, st fencing.LeaseState, inc, seq uint64) fencing.LeaseRecord {
	r := x38PutMod(b, now, "h3", st, inc, seq, nil)
	b.tr.BeaconWrote("h3", b.rev, r.Epoch, r.Incarnation, r.Seq)
	return r
}

// gateDeclared: when h3 was declared, after start.
func gateDeclared(out []gateDecision, start time.Time) []time.Duration {
	var decl []time.Duration
	for _, d := range out {
		if d.d.Op == OpDeclare {
			decl = append(decl, d.at.Sub(start))
		}
	}
	return decl
}

func gateFirst(out []gateDecision, op Op) (gateDecision, bool) {
	for _, d := range out {
		if d.d.Op == op {
			return d, true
		}
	}
	return gateDecision{}, false
}

// TestRollbackGate: after a rollback a host is declared only on evidence
// that its record is its own and newest (its beacon names it, newer than
// its bar) or an operator's confirmation. A dead host is not declared by
// itself (the price, c), and says so once; confirmed, it is declared at
// its next tick. Without the gate (rollbackGateMutation) the dead host
// is declared lease_ttl + grace after the fresh start, as before.
func TestRollbackGate(t *testing.T) {
	renew := func(from, to int, inc uint64, seq0 uint64, beacon bool) map[int]gateStep {
		m := map[int]gateStep{}
		for s := from; s < to; s++ {
			m[s] = gateStep{inc: inc, seq: seq0 + uint64(s-from), st: fencing.LeaseActive, beacon: beacon}
		}
		return m
	}
	for _, c := range []struct {
		name      string
		steps     map[int]gateStep
		confirmAt int
		// declared: h3 must be declared (and not before minAfter after
		// the fresh start); otherwise never in the run.
		declared bool
		minAfter time.Duration
		muts     []*bool
	}{
		{name: "dead/not-declared"},
		{name: "dead/confirmed", confirmAt: 60, declared: true, minAfter: 60 * time.Second},
		{name: "dead/no-gate", declared: true, muts: []*bool{&rollbackGateMutation}},
		// A live host proves itself: renewals newer than its bar (inc 4)
		// named by its beacons; it dies at 10 s and is declared.
		{name: "proved-then-dead", steps: renew(0, 10, 4, 1, true), declared: true, minAfter: 10 * time.Second},
		// Renewals without beacon identities prove nothing (agents before
		// seq; relayed renewals): it dies, not declared.
		{name: "unproved-no-beacon-then-dead", steps: renew(0, 10, 4, 1, false)},
		// An agent restarted with its state lost (reviewer X49): its
		// records fall below the bar (refused as replays), its beacons
		// name them: nothing newer than the bar — not declared.
		{name: "lost-state-then-dead", steps: renew(0, 10, 2, 1, true)},
		{name: "lost-state-then-dead/confirmed", steps: renew(0, 10, 2, 1, true), confirmAt: 90, declared: true, minAfter: 90 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			start, out := gateRun(t, 150, c.steps, c.confirmAt)
			d, declared := gateFirst(out, OpDeclare)
			gate, said := gateFirst(out, OpRefusedDue)
			if declared != c.declared {
				t.Fatalf("declared %t (at %v after the fresh start), want %t; decisions %v", declared, d.at.Sub(start), c.declared, out)
			}
			if declared {
				t.Logf("declared %v after the fresh start", d.at.Sub(start))
				if after := d.at.Sub(start); after < c.minAfter {
					t.Fatalf("declared %v after the fresh start, before %v", after, c.minAfter)
				}
				if c.confirmAt > 0 && d.at.Sub(start) > time.Duration(c.confirmAt+1)*time.Second {
					t.Fatalf("confirmed at %ds but declared only %v after the fresh start", c.confirmAt, d.at.Sub(start))
				}
				return
			}
			if !said || !strings.Contains(gate.d.Reason, "confirm-rollback h3") {
				t.Fatalf("the gated due host was not said (OpRefusedDue naming the command): %v", out)
			}
			n := 0
			for _, d := range out {
				if d.d.Op == OpRefusedDue {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("the gate said %d times, want once: %v", n, out)
			}
			t.Logf("said at %v: %s", gate.at.Sub(start), gate.d.Reason)
		})
	}
}

// TestRollbackGateLists: RollbackGated lists the gated due hosts (the
// runner polls their confirmations), the view marks them; a confirmation
// is taken once per revision and spent when the host shows signs of life
// after it (a beacon, a renewal); without a rollback ConfirmRollback
// changes nothing (gateRunEach checks).
func TestRollbackGateLists(t *testing.T) {
	var gated []string
	var first int
	_, _, b := gateRunEach(t, 60, nil, 0, func(b *x11Bucket, s int, now time.Time) {
		if g := b.tr.RollbackGated(); len(g) > 0 && gated == nil {
			gated, first = g, s
			for _, h := range b.tr.View(now).Hosts {
				if h.RollbackGated != (h.Host == "h3") {
					t.Fatalf("view: %s rollback_gated %t", h.Host, h.RollbackGated)
				}
			}
		}
	})
	if len(gated) != 1 || gated[0] != "h3" {
		t.Fatalf("RollbackGated %v, want the dead h3 alone (the others renew)", gated)
	}
	t.Logf("h3 gated from %d s after the fresh start", first)
	now := b.tr.hosts["h3"].lastSeen.Add(time.Minute)
	if !b.tr.ConfirmRollback("h3", "m1", 5, now) || b.tr.ConfirmRollback("h3", "m1", 5, now) {
		t.Fatal("a confirmation not taken once per revision")
	}
	if b.tr.rollbackGated("h3", b.tr.hosts["h3"]) {
		t.Fatal("h3 gated although confirmed")
	}
	// h3 shows signs of life (its beacon): the confirmation is spent.
	b.tr.ObserveBeacon(now.Add(time.Second), "h3", b.rev)
	b.tr.Tick(now.Add(2 * time.Second))
	if !b.tr.rollbackGated("h3", b.tr.hosts["h3"]) {
		t.Fatal("h3's confirmation not spent by its beacon after it")
	}
	if b.tr.ConfirmRollback("h3", "m1", 5, now.Add(3*time.Second)) {
		t.Fatal("the spent confirmation (revision 5) taken again")
	}
	if !b.tr.rollbackGated("h0", b.tr.hosts["h0"]) {
		t.Fatal("h0, renewing without beacon identities, is not gated: nothing proved its record")
	}
}
