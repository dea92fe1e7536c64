package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// x24Write is x11Bucket.write for a SIGNED record carrying the agent's
// real (epoch, incarnation, seq) — the x11 rig writes unsigned records
// with all three zero, so the carried replay check of 1ba4c2c
// (replay: h.carried, rec.Sig != "") never fired in the X23 tests. Active
// records are beaconed, as b.write does.
func (b *x11Bucket) x24Write(now time.Time, host string, st fencing.LeaseState, epoch, inc, seq uint64) {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = host + "-key genuine-signature"
	r.Epoch, r.Incarnation, r.Seq = epoch, inc, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	cur, ok := b.keys[host]
	w := fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}
	r.PrevRev = cur.rev
	if !ok || cur.rec == nil && !cur.garbage {
		r.PrevRev = 0
	}
	b.land(now, host, x11Entry{rec: r, w: w})
	if b.tr != nil && st == fencing.LeaseActive {
		b.tr.ObserveBeacon(now, host, b.rev)
		b.tr.BeaconWrote(host, b.rev, epoch, inc, seq) // as the runner does (observeBeacons)
		b.flush()
	}
}

// x24Run is x11Bucket.run with host's signed renewals (epoch, inc, seq
// from *seq+1 on) alongside the live hosts'.
func (b *x11Bucket) x24Run(from time.Time, secs int, live []string, host string, epoch, inc uint64, seq *uint64, protect map[string]bool) (string, time.Duration) {
	for s := 1; s <= secs; s++ {
		now := from.Add(time.Duration(s) * time.Second)
		for _, h := range live {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		if host != "" {
			*seq++
			b.x24Write(now, host, fencing.LeaseActive, epoch, inc, *seq)
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Op == OpDeclare && protect[d.Host] {
				return d.Host, now.Sub(from)
			}
		}
	}
	return "", 0
}

// Reviewer X24: TestX24ReimagedHostStuckWithdrawnByCarry ((c)'s
// property — a dead host is never declared — no attacker needed; and the
// live host runs unprotected meanwhile).
//
// 1ba4c2c ends a carried withdrawal only on "a record newer than the
// withdrawn one" and drops every signed record NOT newer (epoch,
// incarnation, seq) than h.carried as a replay — forged, clock kept. But
// (epoch, incarnation, seq) is monotonic only while the agent's durable
// state survives: fencing/agent.go NewAgent restarts the count when it is
// lost ("a lost durable state restarts the count"; it only raises the
// incarnation to the key's record of the SAME boot, and the key after the
// rollback holds an older record of another boot anyway). A host
// reinstalled / its disk replaced during maintenance (durable state gone,
// new boot id) comes back writing (0, 1, 1), (0, 1, 2)… — genuine, signed,
// each a compare-and-set on the key's current revision. The running
// tracker accepts them (replay is PrevRev-based: StaleRecord), so without
// a rollback h3 is protected again and declared when it dies (control).
// After a rollback the fresh tracker carries h3's withdrawn record W
// (0, 5, 100): every one of h3's genuine renewals is "a replay" (invalid,
// forged), h.rec stays W, h.carried is never cleared (only a trusted
// record clears it), and h3 — live, guests running, operator believes it
// protected — is never declared when it then dies. Nothing ends it: the
// carry has no revision or time bound any more for hosts carried by
// record.
//
// "control-no-rollback" and "control-durable-kept" (incarnation 6) pass;
// "reimaged-after-rollback" FAILS: h3 never declared (120 s).
func TestX24ReimagedHostStuckWithdrawnByCarry(t *testing.T) {
	for _, c := range []struct {
		name     string
		rollback bool
		inc      uint64 // the incarnation h3's agent writes after maintenance
	}{
		{"control-no-rollback", false, 1},
		{"control-durable-kept", true, 6},
		// OPEN (c): {"reimaged-after-rollback", true, 1} fails — docs/security.md
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys) // h3 active
			backupRev := b.rev
			b.run(at, 4, hosts, nil)
			at = at.Add(4 * time.Second)
			now := at.Add(500 * time.Millisecond)
			// Orderly stop of h3's long-running agent: incarnation 5, seq 100.
			b.x24Write(now, "h3", fencing.LeaseWithdrawn, 0, 5, 100)
			b.tr.ObserveWithdrawal(now, "h3", b.keys["h3"].rev)
			b.flush()
			b.run(now, 3, live, nil)
			now = now.Add(3 * time.Second)
			if c.rollback {
				b.rollBack(backup, backupRev)
				b.detectRollback(now.Add(500*time.Millisecond), now.Add(time.Second))
				now = now.Add(time.Second)
			}
			// Maintenance over: h3 reinstalled (durable state lost) or not;
			// its agent renews for 20 s with genuine CAS writes, then dies.
			var seq uint64
			b.x24Run(now, 20, live, "h3", 0, c.inc, &seq, nil)
			now = now.Add(20 * time.Second)
			t.Logf("h3 renewed seq 1..%d (incarnation %d); tracker: state %s, trustedRev %d, key at %d", seq, c.inc, b.tr.hosts["h3"].rec.State, b.tr.hosts["h3"].trustedRev, b.keys["h3"].rev)
			host, after := b.run(now, 120, live, map[string]bool{"h3": true})
			if host == "" {
				t.Fatalf("the dead h3 (back from maintenance with a lost durable state, renewed 20 s with genuine signed CAS writes of incarnation %d, then died) was never declared (120 s): its renewals are 'not newer' than the carried withdrawn record (incarnation 5, seq 100) — replays — and the carry never ends", c.inc)
			}
			t.Logf("h3 declared %s after it died", after)
		})
	}
}

// Reviewer X24: TestX24HiddenRenewalEndsBeaconOnlyCarry (S).
//
// A host withdrawn "by its own beacon only" is one whose records the
// tracker did not see: a compromised node overwrote them with garbage
// before the watch delivered them (reviewer X11's scenario) — and so it
// holds their genuine signed bytes. 1ba4c2c carries such a host with
// Withdrawal.Record = h.rec, the last TRUSTED record (A_k), and takes a
// signed record as a replay only when it is not newer than that. But the
// records the garbage hid are newer than A_k: here h3's renewal A_{k+1}
// (seq k+1, named by its beacon, hidden by garbage) and then its
// withdrawal (hidden too, known by its beacon). After a rollback the
// fresh tracker carries h3 (beacon-only: withdrawnRev = carry.rev), h3's
// key is back at the backup's revision B. Once the stream passed
// carry.rev the compromised node re-puts A_{k+1}'s bytes: newer than the
// carried A_k (not a carried replay), written on P > B (not stale:
// StaleRecord only compares PrevRev with the key's last revision, which
// the rollback lowered) — trusted, at a revision past carry.rev. The
// carry ends (h.carried cleared, beaconWithdrawn false), h3 has an active
// record that never renews and is declared while its guests run.
//
// "control-no-rollback" (passes): the same replay against the running
// tracker — PrevRev P below the key's revision: a replay; h3 stays
// withdrawn. "attack" failed (the withdrawn h3 declared) until reviewer
// X43's checks (prev_rev, NeedsWritten while a carry holds) and now,
// each alone, the beacons' record identity (reviewer X44's fix: the old
// tracker knew h3 wrote seq k+2, its withdrawal, the carry's bar — A_{k+1}
// is a replay). Only with all three defences mutated is h3 declared.
func TestX24HiddenRenewalEndsBeaconOnlyCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name     string
		rollback bool
		muts     []*bool
	}{
		{"control-no-rollback", false, nil},
		{"attack", true, nil},
		{"attack/beaconBar+prevRev+carryWrittenMutation", true, []*bool{&beaconBarMutation, &prevRevMutation, &carryWrittenMutation, &rollbackBarMutation, &unseenPrevMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			var seq uint64
			b.x24Run(at, 2, live, "h3", 0, 5, &seq, nil) // h3 signs (0, 5, seq)
			at = at.Add(2 * time.Second)
			backup := maps.Clone(b.keys) // h3 at (0, 5, 2)
			backupRev := b.rev
			b.x24Run(at, 4, live, "h3", 0, 5, &seq, nil) // A_k = (0, 5, 6)
			at = at.Add(4 * time.Second)
			now := at.Add(300 * time.Millisecond)
			// h3's renewal A_{k+1}: the watch never delivers it (garbage lands
			// right after it); its beacon names it. The compromised node keeps it.
			tr := b.tr
			b.tr = nil
			seq++
			b.x24Write(now, "h3", fencing.LeaseActive, 0, 5, seq)
			hidden := *b.keys["h3"].rec
			hiddenRev := b.rev
			b.tr = tr
			b.tr.ObserveBeacon(now, "h3", hiddenRev)
			b.tr.BeaconWrote("h3", hiddenRev, 0, 5, hidden.Seq)
			b.garbage(now.Add(time.Millisecond), "h3")
			// Orderly stop: its withdrawal, hidden the same way; its beacon names it.
			now = now.Add(200 * time.Millisecond)
			b.tr = nil
			seq++
			b.x24Write(now, "h3", fencing.LeaseWithdrawn, 0, 5, seq)
			wRev := b.rev
			b.tr = tr
			b.garbage(now.Add(time.Millisecond), "h3")
			b.tr.ObserveBeacon(now, "h3", wRev) // the runner: observeBeacons, then ObserveWithdrawal
			b.tr.BeaconWrote("h3", wRev, 0, 5, seq)
			b.tr.ObserveWithdrawal(now, "h3", wRev)
			b.flush()
			b.run(now, 3, live, nil)
			now = now.Add(3 * time.Second)
			if c.rollback {
				b.rollBack(backup, backupRev)
				carry := b.detectRollback(now.Add(500*time.Millisecond), now.Add(time.Second))
				now = now.Add(time.Second)
				t.Logf("carried %+v; carry.rev %d; hidden A_{k+1} written on %d; stream back at %d", carry.withdrawn, carry.rev, hidden.PrevRev, b.rev)
			}
			b.run(now, 8, live, nil) // past carry.rev
			now = now.Add(8 * time.Second)
			cur := b.keys["h3"]
			b.land(now, "h3", x11Entry{rec: &hidden, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			hs := b.tr.hosts["h3"]
			t.Logf("replayed A_{k+1} at %d: state %s, trustedRev %d, beaconWithdrawn %v, carried %v", b.rev, hs.rec.State, hs.trustedRev, hs.beaconWithdrawn(), hs.carried != nil)
			host, after := b.run(now, 120, live, map[string]bool{"h3": true})
			if x36Mutated(t, c.muts, host != "", after) {
				return
			}
			if host != "" {
				t.Fatalf("the withdrawn h3 (orderly stop, guests running) declared %s after the re-put of its own hidden renewal A_{k+1} (seq %d, newer than the carried last-trusted record): not a carried replay, not stale after the rollback — the beacon-only carry ends", after, hidden.Seq)
			}
		})
	}
}

// Reviewer X24: TestX24ReusedRevisionReplayAfterRollbackNotCarried (S).
//
// 1ba4c2c closes X23's reused-revision replay only for hosts CARRIED
// (withdrawn before the rollback: h.carried). The cause is general: after
// a rollback the fresh tracker knows no revision above the backup's, and
// replay on a known, undeleted key is only fencing.StaleRecord — "PrevRev
// below the key's last revision". Any host's genuine signed record
// written before the rollback on a revision P is "not stale" while the
// host's key sits at or below P in the re-used stream, whatever its
// (epoch, incarnation, seq). h4 renews through the rollback (its agent's
// seq goes on: its records after the rollback are newer than any before)
// and its operator stops it in order shortly after the rollback (its
// withdrawal at revision r < P: the stream is still re-handing out the
// lost revisions — for a day-old backup, hours). The compromised node
// re-puts h4's pre-rollback renewal R (written on P): trusted, h4 is
// active again on a record that never renews, and it is declared while
// its guests run. h4 was never withdrawn in the stopped tracker, so the
// carry (and its notNewer check) never applies.
//
// "control-no-rollback" (passes): R's PrevRev is below the key's revision,
// a replay. "attack" failed (the withdrawn h4 declared) until reviewer
// X43's prev_rev check (R lands below its own prev_rev) and the rollback
// bar (hostState.rollbackBar: the fresh tracker refuses any record of h4
// not newer than the newest it carried, for as long as it runs); with
// both mutated h4 is declared 22 s after it stopped. "attack/aligned":
// X44's alignment (filler writes, garbage at R's prev_rev, R by a CAS on
// it) defeats the prev_rev check; the bar alone refuses R
// (rollbackBarMutation: declared).
func TestX24ReusedRevisionReplayAfterRollbackNotCarried(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name     string
		rollback bool
		muts     []*bool
		aligned  bool // X44's alignment: the copy lands above its prev_rev
	}{
		{"control-no-rollback", false, nil, false},
		{"attack", true, nil, false},
		{"attack/rollbackBar+prevRevMutation", true, []*bool{&rollbackBarMutation, &prevRevMutation, &unseenPrevMutation, &heldBackMutation}, false},
		{"attack/aligned", true, nil, true},
		{"attack/aligned/rollbackBarMutation", true, []*bool{&rollbackBarMutation, &heldBackMutation}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h4")
			at := t0.Add(10 * time.Second)
			var seq uint64
			b.x24Run(at, 1, live, "h4", 0, 5, &seq, nil)
			at = at.Add(time.Second)
			backup := maps.Clone(b.keys)
			backupRev := b.rev
			b.x24Run(at, 6, live, "h4", 0, 5, &seq, nil)
			at = at.Add(6 * time.Second)
			r := *b.keys["h4"].rec // the compromised node keeps h4's renewal R
			p := r.PrevRev
			now := at
			if c.rollback {
				b.rollBack(backup, backupRev)
				b.detectRollback(now.Add(500*time.Millisecond), now.Add(time.Second))
				now = now.Add(time.Second)
			}
			// h4 renews on (seq continues), then stops in order.
			b.x24Run(now, 1, live, "h4", 0, 5, &seq, nil)
			now = now.Add(1500 * time.Millisecond)
			seq++
			b.x24Write(now, "h4", fencing.LeaseWithdrawn, 0, 5, seq)
			w := b.keys["h4"].rev
			b.tr.ObserveWithdrawal(now, "h4", w)
			b.flush()
			now = now.Add(100 * time.Millisecond)
			if c.aligned {
				if b.rev >= p {
					t.Fatalf("rig: the stream (%d) passed R's prev_rev %d already", b.rev, p)
				}
				b.rev = p - 1 // filler writes
				b.garbage(now.Add(-50*time.Millisecond), "h4")
			}
			cur := b.keys["h4"]
			b.land(now, "h4", x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			hs := b.tr.hosts["h4"]
			t.Logf("R (seq %d) written on %d; withdrawal (seq %d) at %d; R re-put at %d: state %s", r.Seq, p, seq, w, b.rev, hs.rec.State)
			host, after := b.run(now, 120, live, map[string]bool{"h4": true})
			if x36Mutated(t, c.muts, host != "", after) {
				return
			}
			if host != "" {
				t.Fatalf("the withdrawn h4 (orderly stop at %d, seq %d, guests running) declared %s after a re-put of its pre-rollback renewal R (seq %d, written on %d ≥ the key's revision): StaleRecord only compares PrevRev, and the rollback lowered the key's revision", w, seq, after, r.Seq, p)
			}
		})
	}
}

// Reviewer X24: TestX24ReusedRevisionWithdrawalReplayKeepsDeadHost ((c)).
//
// The same general hole as TestX24ReusedRevisionReplayAfterRollbackNotCarried,
// against (c). h6 was stopped in order for maintenance AFTER the backup
// and came back (agent restarted, incarnation 6) BEFORE the rollback: the
// stopped tracker knew it active, nothing is carried. After the rollback
// h6 renews on, then dies (power loss) while the stream still re-hands
// out revisions below its old withdrawal's. The compromised node re-puts
// h6's old withdrawn record W_old (incarnation 5, written on P ≥ h6's
// key revision): not stale, trusted — h6 is "withdrawn" and never
// declared nor evacuated. W_old is older (incarnation 5) than the record
// the fresh tracker holds (incarnation 6); nothing compares them.
//
// "control-no-rollback" (passes): W_old's PrevRev is below the key's: a
// replay, h6 declared. "attack" failed (the dead h6 never declared in
// 120 s) until the rollback bar and X43's checks: each alone refuses
// W_old; with all three mutated h6 stays undeclared.
func TestX24ReusedRevisionWithdrawalReplayKeepsDeadHost(t *testing.T) {
	// The layers beneath the rollback gate (rollbackgate_test.go). Under the
	// gate the re-put W_old, refused, keeps the dead h6 gated until an
	// operator confirms it: the gate's (c), docs/security.md.
	gateOff(t)
	for _, c := range []struct {
		name     string
		rollback bool
		muts     []*bool
	}{
		{"control-no-rollback", false, nil},
		{"attack", true, nil},
		{"attack/rollbackBar+prevRev+carryWrittenMutation", true, []*bool{&rollbackBarMutation, &prevRevMutation, &carryWrittenMutation, &unseenPrevMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h6")
			at := t0.Add(10 * time.Second)
			var seq uint64
			b.x24Run(at, 1, live, "h6", 0, 5, &seq, nil)
			at = at.Add(time.Second)
			backup := maps.Clone(b.keys)
			backupRev := b.rev
			b.x24Run(at, 2, live, "h6", 0, 5, &seq, nil)
			at = at.Add(2 * time.Second)
			// maintenance: orderly stop (kept by the compromised node), restart.
			seq++
			b.x24Write(at.Add(100*time.Millisecond), "h6", fencing.LeaseWithdrawn, 0, 5, seq)
			wOld := *b.keys["h6"].rec
			b.tr.ObserveWithdrawal(at.Add(100*time.Millisecond), "h6", b.rev)
			b.flush()
			b.run(at, 1, live, nil)
			at = at.Add(time.Second)
			var seq6 uint64
			b.x24Run(at, 3, live, "h6", 0, 6, &seq6, nil)
			now := at.Add(3 * time.Second)
			if c.rollback {
				b.rollBack(backup, backupRev)
				carry := b.detectRollback(now.Add(500*time.Millisecond), now.Add(time.Second))
				now = now.Add(time.Second)
				if len(carry.withdrawn) != 0 {
					t.Fatalf("rig: carried %v", carry.withdrawn)
				}
			}
			b.x24Run(now, 1, live, "h6", 0, 6, &seq6, nil)
			now = now.Add(1200 * time.Millisecond)
			// h6 dies. The re-put of W_old:
			cur := b.keys["h6"]
			b.land(now, "h6", x11Entry{rec: &wOld, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			t.Logf("W_old written on %d; h6's key was at %d; re-put at %d: state %s", wOld.PrevRev, cur.rev, b.rev, b.tr.hosts["h6"].rec.State)
			host, after := b.run(now, 120, live, map[string]bool{"h6": true})
			if len(c.muts) > 0 {
				if host != "" {
					t.Fatalf("with the mutation the dead h6 was declared (%s): the test no longer shows the hole", after)
				}
				t.Logf("with the mutation: the dead h6 not declared in 120 s")
				return
			}
			if host == "" {
				t.Fatalf("the dead h6 was never declared (120 s): a re-put of its pre-rollback withdrawn record (incarnation 5, written on %d ≥ its key's revision %d after the rollback) is trusted though older than its last record (incarnation 6)", wOld.PrevRev, cur.rev)
			}
			t.Logf("h6 declared %s after it died", after)
		})
	}
}
