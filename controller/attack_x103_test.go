package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// x103Hide lands e on host's key without delivering it (the watch skips
// it: superseded before the watch reached it — a burst, the compromised
// node's lever) and returns it.
func (b *x11Bucket) x103Hide(now time.Time, host string, e x11Entry) x11Entry {
	b.rev++
	b.landed++
	e.rev = b.rev
	e.stored = now.Add(time.Duration(b.landed))
	b.keys[host] = e
	if b.tr != nil {
		b.tr.Skipped(b.rev + 1) // the next value it delivers follows a gap
	}
	return e
}

// x103HiddenWrite: host's agent writes (a compare-and-set on the key's
// revision) but the watch skips the value; its beacon arrives.
var x103ProbeHook func(*Tracker, uint64)

func (b *x11Bucket) x103HiddenWrite(now time.Time, host string, st fencing.LeaseState, boot string, inc, seq uint64) x11Entry {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), st
	r.Sig = host + "-key genuine-signature"
	r.BootID, r.Epoch, r.Incarnation, r.Seq = boot, 2, inc, seq
	if st == fencing.LeaseWithdrawn {
		r.Reason = "orderly-stop"
	}
	cur := b.keys[host]
	r.PrevRev = cur.rev
	e := b.x103Hide(now, host, x11Entry{rec: r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
	tr := b.tr
	tr.ObserveBeacon(now, host, e.rev)
	tr.BeaconWrote(host, e.rev, 2, inc, seq)
	tr.BeaconVouches(now, host, e.rev, boot, 2, inc, seq)
	if st == fencing.LeaseWithdrawn {
		tr.ObserveWithdrawalBy(now, host, e.rev, boot, inc)
		if x103ProbeHook != nil {
			x103ProbeHook(tr, e.rev)
		}
	}
	b.flush()
	return e
}

// Reviewer X103 (attack, (S), withdrawn host declared; faults needed:
// NONE — the compromised node's burst makes the watch skip h3's values,
// X11's lever). h3 runs boot-1 (incarnation 100), trusted at revision
// Q. Its agent then writes its next record N on Q — either the same
// process's next renewal (next=same) or, the agent restarted (a crash,
// systemd), a later incarnation's (next=laterInc, 150) — and from here
// the node buries every value of h3's key under garbage before the
// watch reaches it: N, h3's reboot into boot-2 and boot-2's renewals,
// and boot-2's orderly withdrawal W (its beacons all arrive: the
// withdrawal beacon names W, boot-2 — it stands, withdrawnRev above the
// trusted revision). The trusted record is still boot-1's active record
// at Q and h.rev is Q. The node now re-lands a copy of N (sealed for
// Q): not a replay (PrevRev Q = h.rev, below the copy's revision), not
// held back (the trusted record is active), not unseen (PrevRev = h.rev)
// — and otherProcessWhileWithdrawn spares it: the trusted active
// record's own process (X101's spare) or a later incarnation of its boot,
// not the withdrawal's boot (X102's spare). Trusted above W's revision,
// the withdrawal no longer counts (beaconWithdrawn: withdrawnRev ≤
// trustedRev), and h3 — withdrawn, guests running — is declared
// lease_ttl + grace later. With otherProcessActiveMutation (next=same) or
// otherProcessLaterIncMutation (next=laterInc) the copy is refused:
// the spares open the hole.
//
// Fixed twice: (a) the spares are for a comeback; a trusted record this
// tracker's own withdrawal beacon named a later revision than
// (beaconWithdrawn) is the host's record from before it withdrew, and another process than the
// withdrawal's — its own included — stays refused
// (otherProcessOlderActiveMutation); (b) a record sealed for a revision
// below the standing withdrawal's was written before it, whatever its
// process (sealedBeforeWithdrawalMutation; see
// TestX103HiddenWithdrawalProcessFirstRecordCopy). Either closes this
// case (sealedmut: (a) alone); both mutations reopen it (fixmut).
func TestX103HiddenNextRecordCopySparedOverWithdrawal(t *testing.T) {
	for _, c := range []struct {
		name string
		inc  uint64
		mut  *bool
		hole bool
	}{
		{name: "same", inc: 100},
		{name: "laterInc", inc: 150},
		{name: "same/mut", inc: 100, mut: &otherProcessActiveMutation},
		{name: "laterInc/mut", inc: 150, mut: &otherProcessLaterIncMutation},
		{name: "same/fixmut", inc: 100, mut: &otherProcessOlderActiveMutation, hole: true},
		{name: "laterInc/fixmut", inc: 150, mut: &otherProcessOlderActiveMutation, hole: true},
		{name: "same/sealedmut", inc: 100, mut: &sealedBeforeWithdrawalMutation},
		{name: "laterInc/sealedmut", inc: 150, mut: &sealedBeforeWithdrawalMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			if c.hole {
				// both fixes close it: the spares' bound and the
				// record sealed below the withdrawal's revision
				x32Mutate(t, &sealedBeforeWithdrawalMutation)
			}
			host, after, trusted := x103HiddenNext(t, c.inc)
			t.Logf("copy trusted %t; declared %q after %s", trusted, host, after)
			if c.hole {
				if host == "" {
					t.Fatalf("mutation: withdrawn h3 not declared — the rig does not reach the hole")
				}
				return
			}
			if c.mut != nil {
				if host != "" {
					t.Fatalf("mutation: withdrawn h3 declared — the spare is not what opens it")
				}
				return
			}
			if host != "" {
				t.Errorf("(S) withdrawn h3 (boot-2 withdrew in order, its beacon handled) declared %s after a copy of its hidden boot-1 record N (incarnation %d)", after, c.inc)
			}
		})
	}
}

func x103HiddenNext(t *testing.T, inc uint64) (string, time.Duration, bool) {
	b, live := x100Fleet(t)
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	seq := uint64(4)
	if inc != 100 {
		seq = 1
	}
	n := b.x103HiddenWrite(at, "h3", fencing.LeaseActive, "boot-1", inc, seq)
	b.x103Hide(at, "h3", x11Entry{garbage: true})
	b.run(at, 30, live, nil) // h3 reboots
	at = at.Add(30 * time.Second)
	for s := uint64(1); s <= 3; s++ {
		b.x103HiddenWrite(at, "h3", fencing.LeaseActive, "boot-2", 200, s)
		b.x103Hide(at, "h3", x11Entry{garbage: true})
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	b.x103HiddenWrite(at, "h3", fencing.LeaseWithdrawn, "boot-2", 200, 4)
	b.x103Hide(at, "h3", x11Entry{garbage: true})
	b.run(at, 1, live, nil)
	at = at.Add(time.Second)
	hs := b.tr.hosts["h3"]
	if hs.beacons.withdrewBoot != "boot-2" || !hs.beaconWithdrawn() || hs.rec.BootID != "boot-1" || hs.rec.State != fencing.LeaseActive {
		t.Fatalf("rig: withdrawal %d %q, withdrawnRev %d, trusted %d %s/%s", hs.beacons.withdrew, hs.beacons.withdrewBoot, hs.beacons.withdrawnRev, hs.trustedRev, hs.rec.BootID, hs.rec.State)
	}
	// The copy of N, landed by a plain put (the watch skipped the
	// garbage before it).
	cp := *n.rec
	b.tr.Skipped(b.rev + 1)
	b.land(at, "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true}})
	trusted := b.tr.hosts["h3"].trustedRev == b.keys["h3"].rev
	host, after := b.run(at, 150, live, map[string]bool{"h3": true})
	return host, after, trusted
}

// TestX103HiddenWithdrawalProcessFirstRecordCopy (probe): X103's first
// setting, but the copy is of the WITHDRAWAL's own process: boot-2's
// first record, written on Q (h3's last delivered value) and hidden, as
// everything after it up to boot-2's withdrawal W. Neither another
// process (otherProcessWhileWithdrawn) nor held back (the trusted record
// is boot-1's): the copy, older than W by the beacons' wrote, was
// trusted above W and h3 — withdrawn, guests running — declared 22 s
// later (attack, (S); faults needed: NONE, the node's burst; a hole of
// X101's rule, not of X102's spare: the withdrawal's own process was
// never "another").
//
// Fixed: a record sealed for a revision below the standing withdrawal's
// is refused over a trusted record (sealedBeforeWithdrawalMutation
// reopens it).
func TestX103HiddenWithdrawalProcessFirstRecordCopy(t *testing.T) {
	for _, mut := range []*bool{nil, &sealedBeforeWithdrawalMutation} {
		t.Run(map[bool]string{true: "fix", false: "mut"}[mut == nil], func(t *testing.T) {
			x32Mutate(t, mut)
			if mut != nil {
				x32Mutate(t, &withdrawalProcessOlderMutation) // X104's rule refuses it too
			}
			host, after, trusted := x103WithdrawalProcessCopy(t)
			t.Logf("copy trusted %t; declared %q after %s", trusted, host, after)
			if mut != nil {
				if host == "" {
					t.Fatalf("mutation: withdrawn h3 not declared — the rig does not reach the hole")
				}
				return
			}
			if host != "" {
				t.Errorf("(S) withdrawn h3 declared %s after a copy of its withdrawal process's hidden first record", after)
			}
		})
	}
}

func x103WithdrawalProcessCopy(t *testing.T) (string, time.Duration, bool) {
	b, live := x100Fleet(t)
	at := t0
	for seq := uint64(1); seq <= 3; seq++ {
		b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	b.run(at, 30, live, nil) // h3 reboots (hard: boot-1 wrote nothing more)
	at = at.Add(30 * time.Second)
	var first x11Entry
	for s := uint64(1); s <= 3; s++ {
		e := b.x103HiddenWrite(at, "h3", fencing.LeaseActive, "boot-2", 200, s)
		if s == 1 {
			first = e
		}
		b.x103Hide(at, "h3", x11Entry{garbage: true})
		b.run(at, 1, live, nil)
		at = at.Add(time.Second)
	}
	b.x103HiddenWrite(at, "h3", fencing.LeaseWithdrawn, "boot-2", 200, 4)
	b.x103Hide(at, "h3", x11Entry{garbage: true})
	b.run(at, 1, live, nil)
	at = at.Add(time.Second)
	hs := b.tr.hosts["h3"]
	if hs.beacons.withdrewBoot != "boot-2" || !hs.beaconWithdrawn() || hs.rec.BootID != "boot-1" {
		t.Fatalf("rig: withdrawal %d %q, trusted %d %s", hs.beacons.withdrew, hs.beacons.withdrewBoot, hs.trustedRev, hs.rec.BootID)
	}
	cp := *first.rec
	b.land(at, "h3", x11Entry{rec: &cp, w: fencing.Written{Known: true}})
	trusted := b.tr.hosts["h3"].trustedRev == b.keys["h3"].rev
	host, after := b.run(at, 150, live, map[string]bool{"h3": true})
	return host, after, trusted
}

// TestX103ListedComebackBelowWithdrawalAfterRollback (probe, price of
// X103's fixes; faults needed: a downward rollback below the withdrawal,
// a controller restart, the host's beacons lost — no attacker action):
// X102's listed comeback, but the stream rolled back below W's revision
// before h3 came back: the comeback's revisions, and its renewals'
// PrevRevs, are below the memory's withdrawal. A first version of X103's
// fixes (gated on revisions: trustedRev / PrevRev below the withdrawal's)
// refused its renewals and the live host was declared at 23 s; they are
// gated on the tracker's own withdrawal beacon naming a revision after
// the trusted record (beaconWithdrawn), which a memory's withdrawal does
// not set. Both cases must not declare.
func TestX103ListedComebackBelowWithdrawalAfterRollback(t *testing.T) {
	for _, c := range []struct {
		name string
		muts []*bool
	}{
		{name: "fixed"},
		{name: "beforeX103", muts: []*bool{&otherProcessOlderActiveMutation, &sealedBeforeWithdrawalMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, m := range c.muts {
				x32Mutate(t, m)
			}
			b, live := x100Fleet(t)
			at := t0
			backup := map[string]x11Entry{}
			var backupRev uint64
			for seq := uint64(1); seq <= 3; seq++ {
				b.x99Write(at, "h3", fencing.LeaseActive, "boot-1", 2, 100, seq, true)
				b.run(at, 1, live, nil)
				at = at.Add(time.Second)
				if seq == 1 {
					for k, v := range b.keys {
						backup[k] = v
					}
					backupRev = b.rev
				}
			}
			b.x99Write(at, "h3", fencing.LeaseWithdrawn, "boot-1", 2, 100, 4, true)
			w := b.mem["h3"].Withdrew
			b.stop()
			b.rollBack(backup, backupRev)
			at = at.Add(time.Second)
			b.x99Write(at, "h3", fencing.LeaseActive, "boot-2", 2, 200, 1, false)
			c2 := b.start(at.Add(100 * time.Millisecond))
			hs := c2.hosts["h3"]
			t.Logf("withdrawal at %d; comeback trusted at %d, withdrawal standing %d/%q", w.Rev, hs.trustedRev, hs.beacons.withdrew, hs.beacons.withdrewBoot)
			declared := ""
			for s := 1; s <= 120 && declared == ""; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				b.x99Write(now, "h3", fencing.LeaseActive, "boot-2", 2, 200, uint64(s+1), false)
				for _, hh := range live {
					b.write(now, hh, fencing.LeaseActive, b.guard.Ref())
				}
				b.publish()
				for _, d := range c2.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h3" {
						declared = fmt.Sprint(s, "s")
					}
				}
			}
			if declared != "" {
				t.Errorf("(S) the live h3 (renewing on boot-2 after a rollback below its withdrawal, beacons lost) declared at %s", declared)
			}
		})
	}
}
