package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X91: the lead "landable (vouch.go) hides a genuine withdrawal
// after a rollback under a running controller".
//
// landable(rec, m) refuses to keep as a vouching candidate a signed
// record whose PrevRev is below m.before, the key's last revision the
// watch delivered. After a lease-stream rollback under a running
// controller C1 (revisions reused below what C1 was delivered; nats.go's
// ordered consumer resumes at last delivered + 1, so nothing reused is
// delivered), a host's GENUINE orderly withdrawal — a compare-and-set on
// the key's revision as the rolled-back stream holds it, so sealed for a
// revision below C1's view — that lands after the stream was refilled
// past C1's last delivered revision IS delivered to C1, with a PrevRev
// below C1's h.rev. The suspicion: never a candidate, so the host is
// judged by its pre-rollback active record and declared, guests running
// (S).
//
// What the tests show:
//
//   - landable is not what refuses the withdrawal, and never decides
//     trust. The very condition (PrevRev != 0 && PrevRev < h.rev) is
//     fencing.StaleRecord (fencing/sign.go:366) in replay()
//     (invalid.go:480), and replayedAfterDelete's (invalid.go:571) for a
//     deleted key. A record verified written fresh goes through Observe
//     and is refused as a replay there (tracker.go:1035); an unfresh one
//     that landableMutation keeps as a candidate and whose beacon then
//     names it is re-observed by BeaconVouches through the same Observe
//     (vouch.go:479) — vouchedCreate only exempts prev_rev 0 creates
//     (vouch.go:147) — and refused again ("Refused after all"). landable
//     only keeps such records from counting toward maxLaterValues. Every
//     case below runs with landableMutation off and on, with the same
//     outcome.
//   - The refused withdrawal is the X21 class (a genuine record judged
//     stale after an unseen rollback), and three independent layers keep
//     the withdrawn host from being declared: its withdrawal beacon
//     (ObserveWithdrawal, invalid.go:706 — it names the landed revision,
//     above C1's trustedRev, so it is not ignored as X21's below-trusted
//     beacon was); its withdrawal receipt read before the declaration is
//     written (receipt.go:155-175: ObserveWithdrawal on the receipt's
//     revision, again above trustedRev — emulated here, as the x11 rig
//     has no runner); and the runner's rollback check (rollback.go:128)
//     followed by a fresh tracker that lists the withdrawal (verified
//     fresh, newer than its bar: trusted) behind the rollback gate.
//   - Only with the beacon lost, the receipt not read AND the rollback
//     check blinded does C1 declare — the residual docs/security.md
//     already lists ("all of its samples superseded", What is left;
//     TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon
//     "undetected/*"). Shown as wantHole, as X21 does, to prove the rig
//     reaches the declaration path.
//
// Verdict: no (S), no (c) from landable.

// x91Case: how the withdrawal's evidence reaches the controller.
type x91Case struct {
	name     string
	beacon   bool // the withdrawal beacon reaches C1
	receipt  bool // a declaration is checked against the host's receipt (Runner.checkReceipt)
	detect   bool // the runner's rollback check finds the rollback (else C1 runs on)
	gateOff  bool // the fresh tracker's rollback gate off (the layers beneath it)
	wantHole bool
}

func x91Cases() []x91Case {
	return []x91Case{
		{name: "beacon/undetected", beacon: true},
		{name: "receipt/undetected", receipt: true},
		{name: "lost/detected", detect: true},
		{name: "lost/detected/gateOff", detect: true, gateOff: true},
		{name: "lost/undetected-residual", wantHole: true},
	}
}

// TestX91RefilledRollbackGenuineWithdrawalBelowView: the lead, end to end
// on the x11 rig: h3 renews (signed, epoch 1 incarnation 1, seq 1..7)
// under C1; the stream rolls back to a backup holding h3 at seq 3; the
// fleet refills it past C1's last delivered revision L (not delivered);
// h3's agent stops in order: its withdrawal (seq 8), a compare-and-set on
// the key's revision in the rolled-back stream (h3's seq-3 revision,
// below C1's trusted one), lands at L+1 and is delivered to C1.
func TestX91RefilledRollbackGenuineWithdrawalBelowView(t *testing.T) {
	for _, landableMut := range []bool{false, true} {
		for _, c := range x91Cases() {
			t.Run(fmt.Sprintf("%s/landableMutation=%t", c.name, landableMut), func(t *testing.T) {
				if landableMut {
					x32Mutate(t, &landableMutation)
				}
				if c.gateOff {
					gateOff(t)
				}
				b, hosts := x11Fleet(t, 10, 10)
				live := x11Without(hosts, "h3")
				at := t0.Add(10 * time.Second)
				var seq uint64
				b.x24Run(at, 3, live, "h3", 1, 1, &seq, nil) // seq 1..3
				at = at.Add(3 * time.Second)
				backup, backupRev := maps.Clone(b.keys), b.rev
				h3Backup := b.keys["h3"].rev
				b.x24Run(at, 4, live, "h3", 1, 1, &seq, nil) // seq 4..7
				at = at.Add(4 * time.Second)
				c1 := b.tr
				trusted, last := c1.hosts["h3"].trustedRev, b.rev
				now := at.Add(500 * time.Millisecond)

				// The rollback under C1: nothing reused reaches its watch.
				b.tr = nil
				b.rollBack(backup, backupRev)
				for i := 0; b.rev < last; i++ {
					b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
				}
				b.tr = c1 // L+1 on: delivered as L's successor, no skip

				// h3's orderly stop: its guests run on.
				seq++
				b.x24Write(now, "h3", fencing.LeaseWithdrawn, 1, 1, seq)
				e := b.keys["h3"]
				w := e.rev
				if e.rec.PrevRev != h3Backup || e.rec.PrevRev >= trusted || w != last+1 {
					t.Fatalf("rig: withdrawal at %d prev_rev %d; want prev_rev %d < trusted %d, at L+1 = %d", w, e.rec.PrevRev, h3Backup, trusted, last+1)
				}
				if ok, why := e.w.Fresh(*e.rec); !ok {
					t.Fatalf("rig: the genuine withdrawal is not written fresh: %s", why)
				}
				h := c1.hosts["h3"]
				t.Logf("C1 after the withdrawal (prev_rev %d, landed %d; C1's trusted %d, key rev %d): judged by %s seq %d at %d, unfresh kept %t",
					e.rec.PrevRev, w, trusted, h.rev, h.rec.State, h.rec.Seq, h.trustedRev, h.unfresh != nil)
				if h.rec.State != fencing.LeaseActive || h.trustedRev != trusted {
					t.Fatalf("rig: C1 was expected to refuse the withdrawal as stale (the X21 class), trusted %s at %d", h.rec.State, h.trustedRev)
				}
				if c.beacon {
					c1.ObserveBeacon(now, "h3", w)
					c1.BeaconWrote("h3", w, 1, 1, seq)
					c1.BeaconVouches(now, "h3", w, e.rec.BootID, 1, 1, seq)
					for _, d := range c1.ObserveWithdrawal(now, "h3", w) {
						t.Logf("C1 beacon: %s", d.Reason)
					}
				}
				start := now.Add(time.Second)
				if c.detect {
					b.tr = c1
					b.detectRollback(now.Add(500*time.Millisecond), start)
					hf := b.tr.hosts["h3"]
					t.Logf("fresh tracker lists h3: %s seq %d at %d (gate %t)", hf.rec.State, hf.rec.Seq, hf.trustedRev, b.tr.RollbackGateOn())
				}
				host, after := "", time.Duration(0)
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
							// Runner.checkReceipt with h3's receipt of w.
							rc := fencing.Beacon{Host: "h3", BootID: e.rec.BootID, State: fencing.LeaseWithdrawn, Revision: w, Epoch: 1, Incarnation: 1, Seq: seq}
							if b.tr.SealedBefore("h3", rc) {
								t.Logf("receipt: SealedBefore: declaration waits")
								continue
							}
							if b.tr.ReceiptStale("h3", rc, e.stored) {
								t.Errorf("receipt of the genuine withdrawal judged stale")
							}
							if news := b.tr.ObserveWithdrawal(tnow, "h3", w); len(news) > 0 {
								t.Logf("receipt: %s — declaration not written (ErrWithdrawalReceipt)", news[0].Reason)
								continue
							}
						}
						host, after = d.Host, tnow.Sub(start)
					}
				}
				t.Logf("h3 declared: %t (%s after the fresh start / C1 running on)", host != "", after)
				switch {
				case c.wantHole && host == "":
					t.Fatalf("the residual is not reached (h3 not declared): the case shows nothing")
				case !c.wantHole && host != "":
					t.Errorf("(S) the withdrawn h3 (genuine withdrawal sealed for %d, below C1's %d, landed at L+1 = %d) declared %s after start", e.rec.PrevRev, trusted, w, after)
				}
			})
		}
	}
}

// TestX91UnfreshWithdrawalBelowKeptCreate: the one path landable sits
// on. compute-3 has no trusted record (x71Rig: its key deleted at 100
// when the controller started); its create C (prev_rev 0 over the
// marker: not verifiable as written fresh) is kept unfresh at 103, its
// beacon late. The stream rolls back to before C (the key: marker 100).
// compute-3's agent stops in order: its CAS on 103 fails, it anchors on
// the marker — the withdrawal W (seq C+1, prev_rev 100) lands at 110,
// and its stored message cannot be read (superseded / the read failed:
// Written.Known false), so W too is unfresh, prev_rev 100 below the
// kept 103: not landable. Then C's beacon vouches C (active). W's beacon
// comes after C's ("C-then-W"), before it ("W-then-C"), or is lost
// ("C-only": then, as the x11 test shows, the receipt or the rollback
// check stands — the receipt emulated here too). With landableMutation W is a
// candidate; its beacon's BeaconVouches still refuses it (Observe:
// StaleRecord) — the outcome does not change: landable decides nothing.
func TestX91UnfreshWithdrawalBelowKeptCreate(t *testing.T) {
	for _, landableMut := range []bool{false, true} {
		for _, order := range []string{"C-then-W", "W-then-C", "C-only"} {
			beacon := order != "C-only"
			t.Run(fmt.Sprintf("%s/landableMutation=%t", order, landableMut), func(t *testing.T) {
				if landableMut {
					x32Mutate(t, &landableMutation)
				}
				x := newX71Rig(t)
				R, c := x.create() // kept unfresh at 103
				if h := x.tr.hosts[x71Host]; h.unfresh == nil || h.unfresh.rev != R || h.trustedRev != 0 {
					t.Fatalf("rig: create at %d not kept unfresh", R)
				}
				// Rollback; compute-3's withdrawal anchored on the old marker.
				x.now = x.now.Add(time.Second)
				x.r.Seq++
				wr := *x.r
				wr.State, wr.Reason, wr.PrevRev = fencing.LeaseWithdrawn, "agent upgrade", x.marker
				W := R + 7
				x.value(W, wr, fencing.Written{Known: false})
				h := x.tr.hosts[x71Host]
				cand := false
				if h.unfresh != nil {
					for _, l := range h.unfresh.later {
						cand = cand || l.rec != nil
					}
				}
				t.Logf("after W (prev_rev %d, at %d; key rev before it %d): candidate %t", wr.PrevRev, W, R, cand)
				if cand != landableMut {
					t.Fatalf("W a candidate: %t, want %t (landable)", cand, landableMut)
				}
				x.now = x.now.Add(time.Second)
				if order == "W-then-C" {
					// W's beacon first: with landableMutation W is the
					// candidate its BeaconVouches finds — re-observed
					// (vouch.go:479) and refused as a replay.
					ds := x.tr.BeaconVouches(x.now, x71Host, W, wr.BootID, wr.Epoch, wr.Incarnation, wr.Seq)
					for _, d := range ds {
						t.Logf("W's BeaconVouches: %s %.140s", d.Op, d.Reason)
						if d.Op == OpVouched {
							t.Errorf("W (prev_rev %d below the key's %d) vouched", wr.PrevRev, R)
						}
					}
					x.beacon(W, wr) // + ObserveWithdrawal
					x.now = x.now.Add(100 * time.Millisecond)
				}
				x.beacon(R, c) // C's late beacon: vouched
				if order == "C-then-W" {
					x.now = x.now.Add(100 * time.Millisecond)
					x.beacon(W, wr) // BeaconVouches (nothing kept now) + ObserveWithdrawal
				}
				h = x.tr.hosts[x71Host]
				t.Logf("judged by %s seq %d at %d; beacon-withdrawn %t", h.rec.State, h.rec.Seq, h.trustedRev, h.beaconWithdrawn())
				if h.rec.State == fencing.LeaseWithdrawn {
					t.Errorf("W trusted: landable is not the only thing refusing it? (state %s at %d)", h.rec.State, h.trustedRev)
				}
				d, after, declared := x85TickBeacons(t, x)
				t.Logf("declared %t %s %.160s", declared, after, d.Reason)
				if beacon && declared {
					t.Errorf("(S) withdrawn compute-3 declared %s after its withdrawal beacon came", after)
				}
				if !beacon && !declared {
					t.Logf("beacon lost: not declared by the tracker alone")
				}
				if !beacon && declared {
					// The tracker alone (no receipt, no rollback check):
					// the X21 residual; the runner's layers are shown in
					// TestX91RefilledRollbackGenuineWithdrawalBelowView.
					rc := fencing.Beacon{Host: x71Host, BootID: wr.BootID, State: fencing.LeaseWithdrawn, Revision: W, Epoch: wr.Epoch, Incarnation: wr.Incarnation, Seq: wr.Seq}
					news := x.tr.ObserveWithdrawal(x.now, x71Host, W)
					t.Logf("receipt check at the declaration: SealedBefore %t, news %d", x.tr.SealedBefore(x71Host, rc), len(news))
					if len(news) == 0 && !x.tr.SealedBefore(x71Host, rc) {
						t.Errorf("(S) the receipt of W would not stop the declaration")
					}
				}
			})
		}
	}
}
