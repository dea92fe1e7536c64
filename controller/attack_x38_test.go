package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X38: attacks on 8ec5344 / ec9d93b / a122cbc (KeepCounted's
// record-less host, KeepWithdrawn's listed-record rule, whenTracked's
// expectBeacon, ObserveBeacon's forward-only lastBeacon).

// x38Put: host's agent writes a SIGNED record (incarnation inc, seq seq)
// by a compare-and-set on its key's revision (a create over nothing or a
// marker), as x11Bucket.write but with the fields replay() and
// notNewer() compare. It returns a copy of the record (the bytes a
// compromised node that reads the bucket keeps).
func x38Put(b *x11Bucket, now time.Time, host string, st fencing.LeaseState, inc, seq uint64) fencing.LeaseRecord {
	return x38PutMod(b, now, host, st, inc, seq, nil)
}

// x38PutMod is x38Put with the record's constants set by mod (nil: none).
func x38PutMod(b *x11Bucket, now time.Time, host string, st fencing.LeaseState, inc, seq uint64, mod func(*fencing.LeaseRecord)) fencing.LeaseRecord {
	r := x38Rec(b, host, st, inc, seq)
	if mod != nil {
		mod(r)
	}
	return x38Land(b, now, r)
}

// x38Rec is the record x38PutMod writes.
func x38Rec(b *x11Bucket, host string, st fencing.LeaseState, inc, seq uint64) *fencing.LeaseRecord {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = fmt.Sprintf("sig-%s-%d-%d", host, inc, seq)
	r.Incarnation, r.Seq = inc, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	return r
}

// x38Land: r's host's agent writes r by a compare-and-set on its key's
// revision (prev_rev, the stored message's expected sequence), and its
// beacon (its withdrawal's, for a withdrawn record) reaches the tracker.
func x38Land(b *x11Bucket, now time.Time, r *fencing.LeaseRecord) fencing.LeaseRecord {
	return x38LandBeacon(b, now, r, true)
}

// x38LandBeacon is x38Land; without beacon, the host's beacon is lost.
func x38LandBeacon(b *x11Bucket, now time.Time, r *fencing.LeaseRecord, beacon bool) fencing.LeaseRecord {
	host, st := r.Host, r.State
	cur, ok := b.keys[host]
	w := fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}
	r.PrevRev = cur.rev
	if !ok || cur.rec == nil && !cur.garbage {
		r.PrevRev = 0
	}
	if !ok {
		w.Expected = 0
	}
	b.land(now, host, x11Entry{rec: r, w: w})
	if b.tr != nil && beacon {
		if st == fencing.LeaseWithdrawn {
			b.tr.ObserveWithdrawal(now, host, b.rev)
		} else {
			b.tr.ObserveBeacon(now, host, b.rev)
		}
		b.flush()
	}
	return *r
}

// TestX38DeleteEndsCountedCarry (S1: a compromised node, a lease-stream
// rollback to a backup older than a maintenance window; no forgery).
//
// KeepCounted promises "counted silent until a trusted record newer than
// c.Record comes" (Observe: `!notNewer(*rec, *c)`). But Observe handles a
// DELETED key first: `case h != nil && h.deleted: h = t.recreated(now, h)`
// builds a fresh hostState that does not copy countedCarry, and only then
// compares with the (now nil) carry. So one delete marker (any agent may
// write one, relays) followed by a copy of ANY genuine record of the host
// that replayedAfterDelete lets through (prev_rev at or above the
// marker's revision — every record written after the rollback point, X24's
// class — or, for a host with no listed record, a record whose prev_rev
// the marker's revision equals, written with that CAS header: Fresh)
// ends the carry, whatever its age. The copy the node puts back is the
// host's own WITHDRAWAL from a maintenance window between the backup and
// the rollback: withdrawn, uncounted.
//
// Timeline (x11 rig, 60 hosts, threshold 10, rack h1..h12): backup;
// h1..h5 renew (signed, incarnation 1), withdraw for maintenance (W,
// seq 11-12) and come back (incarnation 2); rack cut off and Held, C1 holds
// (12 silent). The stream is restored from the backup; the fresh tracker
// lists h1..h5's incarnation-1 records and keeps h1..h12 counted
// (KeepCounted, c = incarnation 2). The node writes a delete marker on
// h1's and h5's keys, then copies of their W back: 10 counted, the hold
// ends, a Held host (guests running) is declared.
//
// Controls: the same copies of W with no delete marker (the countedCarry
// rule refuses to end the carry: W is older than c) — held; no attack.
// "keys-gone": h1..h5 joined after the backup (the record-less hostState
// of ec9d93b); the marker lands at W's prev_rev, W is written by CAS on
// it (Fresh) — the same.
// Fix direction: recreated (or Observe's deleted branch) must carry
// countedCarry (and any other carry) over, and the countedCarry end rule
// must run against the carried record before a delete resets the state.
// Checked by hand: `h.countedCarry = old.countedCarry` in recreated makes
// both attack cases pass (reverted).
func TestX38DeleteEndsCountedCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name        string
		del, replay bool
		gone        bool
		muts        []*bool
	}{
		{name: "control-no-attack"},
		{name: "control-replay-without-delete", replay: true},
		{name: "delete-then-replayed-withdrawal", del: true, replay: true},
		{name: "keys-gone/delete-then-replayed-withdrawal", del: true, replay: true, gone: true},
		{name: "delete-then-replayed-withdrawal/recreatedCarryMutation", del: true, replay: true, muts: []*bool{&recreatedCarryMutation, &prevRevMutation, &carryWrittenMutation, &rollbackBarMutation, &unseenPrevMutation}}, // X43's checks and the rollback bar refuse the copy too
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 60, 5)
			maint := x10Names(1, 6)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			others := x11Without(hosts, maint...)
			at := t0.Add(5 * time.Second)
			seq := map[string]uint64{}
			if !c.gone {
				for _, h := range maint {
					seq[h]++
					x38Put(b, at, h, fencing.LeaseActive, 1, seq[h])
				}
			}
			backup := maps.Clone(b.keys)
			if c.gone {
				for _, h := range maint {
					delete(backup, h)
				}
			}
			backupRev := b.rev
			tick := func(from time.Time, secs int, inc uint64, maintOn bool) {
				for s := 0; s < secs; s++ {
					now := from.Add(time.Duration(s) * time.Second)
					if maintOn {
						for _, h := range maint {
							seq[h]++
							x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, inc, seq[h])
						}
					}
					b.run(now, 1, others, nil)
				}
			}
			tick(at, 10, 1, true) // after the backup: h1..h5 renew (incarnation 1)
			at = at.Add(10 * time.Second)
			ws := map[string]fencing.LeaseRecord{}
			for _, h := range maint { // maintenance: orderly stops
				seq[h]++
				ws[h] = x38Put(b, at, h, fencing.LeaseWithdrawn, 1, seq[h])
			}
			tick(at, 3, 0, false)
			at = at.Add(3 * time.Second)
			for _, h := range maint { // back: restarted agents (incarnation 2)
				seq[h] = 0
			}
			tick(at, 30, 2, true)
			at = at.Add(30 * time.Second)
			if host, _ := b.run(at, 40, live, x10Set(rack)); host != "" || !b.tr.Holding() {
				t.Fatalf("C1 declared %q / not holding (rig)", host)
			}
			at = at.Add(40 * time.Second)
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(at.Add(500*time.Millisecond), start)
			t.Logf("backup rev %d; W of h1 prev_rev %d (inc %d seq %d); carried counted %d; fresh tracker at rev %d: silent %d, threshold %d, holding %t",
				backupRev, ws["h1"].PrevRev, ws["h1"].Incarnation, ws["h1"].Seq, len(carry.counted), b.rev, b.tr.Silent(start), b.tr.Threshold(), b.tr.Holding())
			now := start.Add(100 * time.Millisecond)
			targets := []string{"h1", "h5"}
			put := func(h string) {
				w := ws[h]
				cur := b.keys[h]
				cp := w
				b.land(now, h, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
				hs := b.tr.hosts[h]
				t.Logf("%s: copy of %s's W (prev_rev %d, inc %d seq %d) put back at rev %d: state %q, countedCarry %t, counted %t",
					now.Format("15:04:05.000"), h, w.PrevRev, w.Incarnation, w.Seq, b.rev, hs.rec.State, hs.countedCarry != nil, b.tr.counted(hs, now))
			}
			if c.gone {
				// The marker must land AT W's prev_rev (Fresh: the CAS
				// header equals prev_rev; a host with no listed record
				// needs it): the node writes into its own key up to one
				// below it (or publishes with Nats-Expected-Last-Sequence
				// until it lands), then the copy of W by CAS on it.
				for _, h := range targets {
					for b.rev < ws[h].PrevRev-1 {
						b.garbage(now, "h59")
					}
					b.del(now, h)
					t.Logf("%s: delete marker on %s's (record-less) key at rev %d", now.Format("15:04:05.000"), h, b.rev)
					put(h)
				}
			} else {
				if c.del {
					// Markers at once (any revision at or below W's
					// prev_rev will do: the rolled-back stream restarts
					// far below it)...
					for _, h := range targets {
						b.del(now, h)
						t.Logf("%s: delete marker on %s's key at rev %d", now.Format("15:04:05.000"), h, b.rev)
					}
				}
				// ... the fleet renews until the stream passes every W's
				// prev_rev (a copy then lands above its prev_rev, as a
				// genuine write would) ...
				for s := 0; b.rev <= ws[targets[len(targets)-1]].PrevRev; s++ {
					b.run(now, 1, live, nil)
					now = now.Add(time.Second)
				}
				if c.replay {
					for _, h := range targets {
						put(h)
					}
				}
			}
			t.Logf("after the attack: silent %d, threshold %d", b.tr.Silent(now.Add(time.Second)), b.tr.Threshold())
			host, after := b.run(now, 120, live, x10Set(rack))
			if x36Mutated(t, c.muts, host != "", after) {
				return
			}
			if host != "" {
				t.Fatalf("the fresh tracker declared the Held %s %s after the attack (silent %d, threshold %d): a delete marker plus a copy of an OLDER genuine withdrawal ended KeepCounted's carry (recreated drops countedCarry)", host, after, b.tr.Silent(now.Add(after)), b.tr.Threshold())
			}
			t.Logf("no Held host declared; holding %t", b.tr.Holding())
		})
	}
}

// TestX38CountedCarryCountsForever ((c)/availability note, no attacker;
// a fault: a lease-stream rollback). KeepCounted's carry ends only with a
// trusted record NEWER than the carried one; a dead host never writes
// one, so the carry never ends and the dead host counts toward the
// mass-failure guard for as long as the process runs — one more toward a
// hold per such host (a hold then stops every declaration):
//   - "rollback-keys-gone": h7 joined after the backup and died; C1 counts
//     it silent (not due yet) at the rollback, whose stream holds no key
//     of h7: ec9d93b tracks it with no record — counted, never declared,
//     and nothing ends it (Forget needs a deleted key);
//   - "rollback-loses-declaration": C1 declared the dead h7 (its expired
//     record, epoch e+1, counted one guard window); the rollback lost the
//     declaration; the fresh tracker re-declares h7 from the listed active
//     record — epoch e+1 again, the same (epoch, incarnation, seq) as the
//     carried declaration: not newer, so the carry stands, and counted()
//     returns true before it looks at the expired state.
//
// Control: the same death, no rollback: declared, uncounted one guard
// window later.
func TestX38CountedCarryCountsForever(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name string
		mode string
		mut  *bool
	}{
		{name: "control-no-rollback"},
		{name: "rollback-keys-gone", mode: "gone"},
		{name: "rollback-loses-declaration", mode: "decl"},
		{name: "rollback-loses-declaration/declaredCarryMutation", mode: "decl", mut: &declaredCarryMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, hosts := x11Fleet(t, 60, 5)
			at := t0.Add(5 * time.Second)
			backup := maps.Clone(b.keys)
			delete(backup, "h7") // h7 joined after the backup
			backupRev := b.rev
			live := x11Without(hosts, "h7")
			declared := 0
			declare := func(host string) {
				if host != "h7" {
					return
				}
				declared++
				// the controller's declaration lands (signed by it)
				d := *b.tr.hosts["h7"]
				r := d.rec
				r.Epoch++
				r.State = fencing.LeaseExpired
				r.Sig, r.PrevRev = "controller-sig", d.rev
				if c.mode == "decl" && declared == 1 {
					backup, backupRev = maps.Clone(b.keys), b.rev // the rollback point: just before it
				}
				b.land(at, "h7", x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: d.rev}})
				t.Logf("h7 declared (epoch %d inc %d seq %d) at rev %d", r.Epoch, r.Incarnation, r.Seq, b.rev)
			}
			secs := 12 // h7 dies; counted silent, not due yet
			if c.mode == "decl" {
				secs = 40 // declared by C1, still counted (guard window)
			}
			for s := 0; s < secs; s++ {
				host, _ := b.run(at, 1, live, map[string]bool{"h7": true})
				at = at.Add(time.Second)
				declare(host)
			}
			h7 := b.tr.hosts["h7"]
			t.Logf("C1: h7 %q, counted %t, silent %d", h7.rec.State, b.tr.counted(h7, at), b.tr.Silent(at))
			if c.mode != "" {
				b.rollBack(backup, backupRev)
				b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
				at = at.Add(time.Second)
			}
			for s := 0; s < 600; s++ {
				host, _ := b.run(at, 1, live, map[string]bool{"h7": true})
				at = at.Add(time.Second)
				declare(host)
			}
			h7 = b.tr.hosts["h7"]
			counted := h7 != nil && b.tr.counted(h7, at)
			t.Logf("10 min later: h7 state %q, declarations %d, countedCarry %t, counted %t, silent %d", h7.rec.State, declared, h7.countedCarry != nil, counted, b.tr.Silent(at))
			switch {
			case c.mut != nil:
				if !counted {
					t.Fatalf("with the mutation h7 no longer counts: the case shows nothing")
				}
			case c.mode == "gone":
				// A host known only by its gone key: dead or cut off
				// and Held, nothing tells which — it counts until an
				// operator forgets it (the price, (c)).
				if !counted {
					t.Fatalf("the key-gone h7 stopped counting without an operator: a Held host's count could end a hold")
				}
				if err := b.tr.Forget(at, "h7"); err != nil {
					t.Fatalf("Forget(h7): %v", err)
				}
				for s := 0; s < 62; s++ {
					b.run(at, 1, live, map[string]bool{"h7": true})
					at = at.Add(time.Second)
				}
				if h7 := b.tr.hosts["h7"]; h7 != nil && b.tr.counted(h7, at) {
					t.Fatalf("h7 still counts a guard window after the operator forgot it")
				}
			case counted:
				t.Fatalf("the dead h7 still counts silent for the guard 10 minutes after the rollback (state %q): the counted carry never ends", h7.rec.State)
			}
		})
	}
}
