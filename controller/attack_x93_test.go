package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X93: the watch's adjacency (Tracker.adjacent, 006f281) within
// a lease-stream rollback the running controller has not yet detected
// (docs/security.md, "reviewer X93": "argued from the code, not tested").
//
// The scenario, on the x11 rig (pure tracker, no runner):
//
//   - Old life. h3 (V) is out of service: its key is a delete marker at A
//     when C1 starts watching, and C1 never trusts a record of it
//     (trustedRev 0: NeedsWritten, so adjacency is consulted). The fleet
//     renews; a backup of the stream is taken (it holds the marker A);
//     the fleet renews on up to L, the last revision C1 is delivered.
//   - The stream rolls back to the backup under C1 (rollBack): nats.go
//     resumes C1's watch at L+1, so no reused revision is delivered.
//   - New life. V comes back: R1, an anchored create sealed for A (its
//     key's marker, still in the restored stream), active, seq 1; then
//     its agent stops in order: W, withdrawn, a compare-and-set on R1's
//     revision, same process, seq 2 — its guests run on. Both land at
//     reused revisions (≤ L), never delivered; every beacon of V is lost.
//     The fleet refills the stream up to L.
//   - A compromised node puts a copy of R1 at L+1. C1's watch delivers
//     it with After = A (its last delivered message of the key), its
//     stored message unknown (Known false): rec.PrevRev == A == h.rev,
//     nothing regressed, no carry, gate off — adjacent, so "written
//     fresh" and trusted. The header check would refuse it (a plain put,
//     or a compare-and-set on W's revision, not on A). V is judged by an
//     active record and is silent from then on.
//
// Subcases:
//
//   - receipt/…: the runner reads V's withdrawal receipt (of W: revision
//     w < L+1, same process, seq 2 > R1's 1) before it writes the
//     declaration — Runner.checkReceipt emulated as in X91 (SealedBefore,
//     ReceiptStale, ObserveWithdrawal, in that order). The declaration is
//     stopped, every tick, by SealedBefore (ErrReceiptAfterSeal):
//     ObserveWithdrawal alone could not, w being below the copy's
//     trustedRev. With sealedProcMutation (reviewer X89's same-process
//     rule off) it is still stopped — by the revision rule, w above the
//     copy's PrevRev A. With receiptSealedMutation (SealedBefore
//     ignored) it is declared: the receipt's SealedBefore is the layer.
//   - none/undetected: no receipt and the rollback check blinded (the
//     residual of every rollback test: all samples superseded) — V, its
//     guests running, is declared: wantHole, the hole the docs admit.
//     The declaration comes lease_ttl + grace (21.6 s) after the copy
//     landed: asserted above two RollbackCheckIntervals, the docs' "the
//     rollback check (about 2 s)" argument — a running check is there
//     long before.
//   - beacons/undetected: as none/undetected, but V's beacons of R1 and
//     W reach C1 (X91's order: ObserveBeacon, BeaconWrote,
//     BeaconVouches, ObserveWithdrawal). C1 takes W's beacon (withdrawn,
//     trustedRev 0 then). The copy of R1 is older than the write the
//     beacons named (1, 1, 2): not adjacent (Tracker.adjacent), not
//     trusted, V not declared. With adjacentBeaconMutation (found by
//     this test: the first version of adjacency) the copy trusted at L+1
//     — above the beacon's revision w — ended the withdrawn state:
//     declared (wantHole).
//   - none/undetected/adjacentMutation: adjacency ignored — the copy is
//     not trusted (not written fresh), V is never declared.
//   - none/gate-on: the rollback gate on in C1 (SetRollbackGate) — the
//     same: adjacency refused, the copy untrusted, V not declared.
//   - none/detected-after-copy: C1 trusts the copy, then its rollback
//     check finds the rollback (detectRollback: the fresh tracker lists
//     the stream — the copy at L+1, not verifiable) — not declared.
//   - none/detected-before-copy: the check finds it first; the fresh
//     tracker lists W (written fresh: trusted withdrawn) and refuses the
//     copy as a replay — not declared.
type x93Case struct {
	name     string
	receipt  bool  // Runner.checkReceipt emulated at each declaration
	mut      *bool // a mutation on
	gate     bool  // C1's rollback gate on before the copy lands
	detect   string
	beacons  bool // V's beacons of R1 and W reach C1 (lost otherwise)
	trusted  bool // C1 is expected to trust the copy (adjacency)
	wantHole bool
}

func x93Cases() []x93Case {
	return []x93Case{
		{name: "receipt/undetected", receipt: true, trusted: true},
		{name: "receipt/undetected/sealedProcMutation", receipt: true, mut: &sealedProcMutation, trusted: true},
		{name: "receipt/undetected/receiptSealedMutation", receipt: true, mut: &receiptSealedMutation, trusted: true, wantHole: true},
		{name: "none/undetected", trusted: true, wantHole: true},
		{name: "beacons/undetected", beacons: true},
		{name: "beacons/undetected/adjacentBeaconMutation", beacons: true, mut: &adjacentBeaconMutation, trusted: true, wantHole: true},
		{name: "none/undetected/adjacentMutation", mut: &adjacentMutation},
		{name: "none/gate-on", gate: true},
		{name: "none/detected-after-copy", detect: "after", trusted: true},
		{name: "none/detected-before-copy", detect: "before"},
	}
}

// x93Write lands host's signed record (state st, same boot and process
// throughout: epoch 1 incarnation 1, seq) sealed for prev — a
// compare-and-set on the key's current revision, stored header and all —
// and returns its entry. With b.tr nil (the rollback's reused
// revisions) it is delivered to no one.
func (b *x11Bucket) x93Write(now time.Time, host string, st fencing.LeaseState, seq, prev uint64) x11Entry {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = host + "-key genuine-signature"
	r.BootID, r.Epoch, r.Incarnation, r.Seq = host+"-boot-2", 1, 1, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	r.PrevRev = prev
	b.land(now, host, x11Entry{rec: r, w: fencing.Written{Known: true, HasExpected: true, Expected: b.keys[host].rev}})
	return b.keys[host]
}

// TestX93AdjacentCopyAfterUndetectedRollback: see above.
func TestX93AdjacentCopyAfterUndetectedRollback(t *testing.T) {
	for _, c := range x93Cases() {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.mut == &adjacentBeaconMutation {
				x32Mutate(t, &withdrawnFreshMutation) // X97's layer off too
			}
			if c.mut == &receiptSealedMutation {
				// X104: the receipt's withdrawal, below the trusted copy's
				// revision but above the revision it was sealed for,
				// stands in the tracker too (ObserveWithdrawalBy)
				x32Mutate(t, &lateWithdrawalMutation)
			}
			b := newX11Bucket(t)
			hosts := x10Names(0, 10)
			live := x11Without(hosts, "h3")
			b.tr = x10Tracker(t)
			b.del(t0, "h3") // V out of service: its key's marker, all C1 has of it
			A := b.keys["h3"].rev
			for _, h := range live {
				b.write(t0, h, fencing.LeaseActive, nil)
			}
			b.publish()
			b.run(t0, 3, live, nil)
			at := t0.Add(3 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev // holds the marker A
			b.run(at, 4, live, nil)
			at = at.Add(4 * time.Second)
			c1 := b.tr
			L := b.rev
			if h := c1.hosts["h3"]; h == nil || h.rev != A || h.trustedRev != 0 || !c1.NeedsWritten("h3") {
				t.Fatalf("rig: C1 should hold only h3's marker at %d, nothing trusted", A)
			}
			now := at.Add(500 * time.Millisecond)

			// The rollback under C1; V's new life at reused revisions.
			b.tr = nil
			b.rollBack(backup, backupRev)
			if e := b.keys["h3"]; e.rev != A || e.rec != nil {
				t.Fatalf("rig: the restored stream does not hold h3's marker at %d", A)
			}
			b.write(now, live[0], fencing.LeaseActive, b.guard.Ref())
			r1 := b.x93Write(now, "h3", fencing.LeaseActive, 1, A) // anchored create on A
			b.write(now, live[1], fencing.LeaseActive, b.guard.Ref())
			w := b.x93Write(now.Add(100*time.Millisecond), "h3", fencing.LeaseWithdrawn, 2, r1.rev) // orderly stop
			for i := 0; b.rev < L; i++ {
				b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
			}
			if ok, why := r1.w.Fresh(*r1.rec); !ok || w.rev >= L || r1.rec.PrevRev != A {
				t.Fatalf("rig: R1 at %d (fresh %t %s), W at %d, want both below L = %d", r1.rev, ok, why, w.rev, L)
			}
			if ok, why := w.w.Fresh(*w.rec); !ok {
				t.Fatalf("rig: the genuine withdrawal is not written fresh: %s", why)
			}
			b.tr = c1 // L+1 on: delivered as L's successor, no skip
			if c.beacons {
				// V's beacons (core NATS, not the stream) reach C1 as
				// they were sent; X91's order.
				for _, e := range []x11Entry{r1, w} {
					c1.ObserveBeacon(now, "h3", e.rev)
					c1.BeaconWrote("h3", e.rev, 1, 1, e.rec.Seq)
					c1.BeaconVouches(now, "h3", e.rev, e.rec.BootID, 1, 1, e.rec.Seq)
					if e.rec.State == fencing.LeaseWithdrawn {
						for _, d := range c1.ObserveWithdrawal(now, "h3", e.rev) {
							t.Logf("C1 beacon: %s", d.Reason)
						}
					}
				}
			}
			if c.gate {
				c1.SetRollbackGate(MarkerStands, "test")
			}
			start := now.Add(time.Second)
			if c.detect == "before" {
				b.detectRollback(now.Add(200*time.Millisecond), now.Add(300*time.Millisecond))
				hf := b.tr.hosts["h3"]
				t.Logf("fresh tracker lists h3 before the copy: %s seq %d at %d (gate %t)", hf.rec.State, hf.rec.Seq, hf.trustedRev, b.tr.RollbackGateOn())
			}

			// The compromised node's copy of R1 at L+1, delivered with
			// After = A, its stored message not read (Known false).
			cp := *r1.rec
			hdr := fencing.Written{Known: true, HasExpected: true, Expected: w.rev}
			if ok, _ := hdr.Fresh(cp); ok {
				t.Fatalf("rig: the copy's header (a compare-and-set on W's %d) would pass", w.rev)
			}
			copyAt := now.Add(400 * time.Millisecond)
			b.land(copyAt, "h3", x11Entry{rec: &cp, w: fencing.Written{After: A}})
			copyRev := b.keys["h3"].rev
			if copyRev != L+1 {
				t.Fatalf("rig: the copy at %d, not L+1 = %d", copyRev, L+1)
			}
			h := b.tr.hosts["h3"]
			t.Logf("A %d, backup %d, R1 %d, W %d, L %d, copy %d: h3 judged by %s seq %d at %d (key rev %d)",
				A, backupRev, r1.rev, w.rev, L, copyRev, h.rec.State, h.rec.Seq, h.trustedRev, h.rev)
			if c.detect != "before" {
				trusted := h.trustedRev == copyRev && h.rec.State == fencing.LeaseActive
				if trusted != c.trusted {
					t.Fatalf("C1 trusts the copy of R1 at %d: %t, want %t", copyRev, trusted, c.trusted)
				}
			}
			if c.detect == "after" {
				b.detectRollback(now.Add(500*time.Millisecond), start)
				hf := b.tr.hosts["h3"]
				t.Logf("fresh tracker lists h3: %s seq %d at %d (gate %t)", hf.rec.State, hf.rec.Seq, hf.trustedRev, b.tr.RollbackGateOn())
			}

			rc := fencing.Beacon{Host: "h3", BootID: w.rec.BootID, State: fencing.LeaseWithdrawn, Revision: w.rev, Epoch: 1, Incarnation: 1, Seq: w.rec.Seq}
			host, after, stops := "", time.Duration(0), 0
			var declaredAt time.Time
			for s := 1; s <= 120 && host == ""; s++ {
				tnow := start.Add(time.Duration(s) * time.Second)
				for _, hh := range live {
					b.write(tnow, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range b.tr.Tick(tnow) {
					if d.Op != OpDeclare || d.Host != "h3" {
						continue
					}
					if c.receipt {
						// Runner.checkReceipt with V's receipt of W.
						if b.tr.SealedBefore("h3", rc) && !receiptSealedMutation {
							if stops == 0 {
								t.Logf("receipt: SealedBefore (ErrReceiptAfterSeal): the declaration waits (%s after start)", tnow.Sub(start))
							}
							stops++
							continue
						}
						if b.tr.ReceiptStale("h3", rc, w.stored) {
							t.Logf("receipt judged stale")
						} else if news := b.tr.ObserveWithdrawal(tnow, "h3", w.rev); len(news) > 0 {
							t.Logf("receipt: %s — not declared (ErrWithdrawalReceipt)", news[0].Reason)
							stops++
							continue
						}
					}
					host, after, declaredAt = d.Host, tnow.Sub(start), tnow
				}
			}
			t.Logf("h3 declared: %t (%s after start), declarations stopped by the receipt: %d", host != "", after, stops)
			switch {
			case c.wantHole && host == "":
				t.Fatalf("the hole is not reached (h3 not declared): the case shows nothing")
			case !c.wantHole && host != "":
				t.Errorf("(S) the withdrawn h3 (W at %d, R1's copy at %d trusted by adjacency on %d) declared %s after start", w.rev, copyRev, A, after)
			case c.receipt && !c.wantHole && stops == 0:
				t.Errorf("no declaration reached the receipt check: the case shows nothing")
			case c.wantHole && declaredAt.Sub(copyAt) <= 2*RollbackCheckInterval:
				// The docs' argument: a running rollback check finds the
				// rollback long before the copy's silence is due.
				t.Errorf("h3 declared %s after the copy landed: within two rollback checks (%s)", declaredAt.Sub(copyAt), RollbackCheckInterval)
			}
			if c.wantHole {
				t.Logf("the hole: declared %s after the copy landed (rollback check every %s)", declaredAt.Sub(copyAt), RollbackCheckInterval)
			}
		})
	}
}
