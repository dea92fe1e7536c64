package controller

import (
	"maps"
	"slices"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X47: attacks on be52f8c (the rollback bar for every host,
// KeepBar's replacement of an older listed record, the raised epoch of a
// fresh declaration).
//
// KeepBar replaces a LISTED host-written record older than the stopped
// tracker's trusted one with that record (h.rec = c.Record) — and nothing
// else: it does not judge the record it puts in (Tracker.judge, which
// Observe calls for every active record it takes). A host listed
// WITHDRAWN was never judged by the fresh tracker (Observe judges only
// active records): its hostState has grace 0, refused "" and silentAft
// 0. After the replacement the host is active with those values:
//   - a host whose constants the controller refuses (monitor-only, fencing
//     disabled, a backstop not accepted, a grace over max_grace) — never
//     declared, whatever its silence (OpRefusedDue) — is declared at
//     lease_ttl after the fresh start: its guests, never fenced by
//     anything, are evacuated while they run;
//   - any other host is declared at lease_ttl, not lease_ttl + grace: a
//     host whose agent is wedged (its guests stopped only by its hardware
//     watchdog, 10 s later) is declared before its backstop has fired.
//
// The listed withdrawal is the node's aligned copy of the host's old
// maintenance withdrawal, landed between the rollback and the fresh
// tracker's listing (X46's TestX46CopyListedBeforeCarryApplied: the
// watch of the stopped tracker never delivers it), or — no attacker — the
// backup's own withdrawal (a backup taken during the maintenance stop).

// x47Put: host's agent writes a signed record (state st, incarnation inc,
// seq seq) with the constants mod sets, by a compare-and-set on its key's
// revision (x38Land). It returns the record.
func x47Put(b *x11Bucket, now time.Time, host string, st fencing.LeaseState, inc, seq uint64, mod func(*fencing.LeaseRecord)) fencing.LeaseRecord {
	return x38PutMod(b, now, host, st, inc, seq, mod)
}

// x47MonitorOnly: the host's agent is monitor-only (fence action none):
// the controller refuses its constants and never declares it.
func x47MonitorOnly(r *fencing.LeaseRecord) { r.Action = fencing.ActionNone }

// x47Watchdog: the host's backstop is its hardware watchdog (10 s): grace
// 15.5 s at the defaults (TestGraceAtDefaults).
func x47Watchdog(r *fencing.LeaseRecord) { r.Backstop = fencing.BackstopWatchdog }

// x47Rig: ten hosts (x11Fleet); h3's agent (its constants: mod) renews ten
// times (incarnation 1) — backup "A" after the third (h3 listed active,
// incarnation 1 seq 3) —, stops in
// order for maintenance (W, incarnation 1 seq 11, trusted) — backup "W"
// here (h3 listed withdrawn) —, 30 s later comes back (incarnation 2) and
// renews 20 times; the last renewal lands at last. It returns the rig,
// the hosts but h3, both backups, W, the time reached (last + 1 s) and
// last.
type x47Backup struct {
	keys map[string]x11Entry
	rev  uint64
}

func x47Rig(t *testing.T, mod func(*fencing.LeaseRecord)) (b *x11Bucket, others []string, a, w x47Backup, wRec fencing.LeaseRecord, at, last time.Time) {
	return x47Rig2(t, mod, mod)
}

// x47Rig2: x47Rig with h3's constants mod1 in incarnation 1 (before and at
// the maintenance stop), mod2 in incarnation 2 (reconfigured during it).
func x47Rig2(t *testing.T, mod, mod2 func(*fencing.LeaseRecord)) (b *x11Bucket, others []string, a, w x47Backup, wRec fencing.LeaseRecord, at, last time.Time) {
	t.Helper()
	b, hosts := x11Fleet(t, 10, 5)
	const victim = "h3"
	others = x11Without(hosts, victim)
	at = t0.Add(5 * time.Second)
	var seq uint64
	for s := 0; s < 10; s++ {
		now := at.Add(time.Duration(s) * time.Second)
		seq++
		x47Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 1, seq, mod)
		b.run(now, 1, others, nil)
		if s == 2 {
			a = x47Backup{maps.Clone(b.keys), b.rev}
		}
	}
	at = at.Add(10 * time.Second)
	seq++
	wRec = x47Put(b, at.Add(500*time.Millisecond), victim, fencing.LeaseWithdrawn, 1, seq, mod)
	w = x47Backup{maps.Clone(b.keys), b.rev}
	b.run(at, 30, others, nil)
	at = at.Add(30 * time.Second)
	if r := b.tr.hosts[victim].rec; r.State != fencing.LeaseWithdrawn {
		t.Fatalf("rig: W not trusted: %+v", r)
	}
	seq = 0
	for s := 0; s < 20; s++ { // back: incarnation 2
		now := at.Add(time.Duration(s) * time.Second)
		seq++
		x47Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 2, seq, mod2)
		last = now.Add(500 * time.Millisecond)
		b.run(now, 1, others, nil)
	}
	at = at.Add(20 * time.Second)
	if r := b.tr.hosts[victim].rec; r.State != fencing.LeaseActive || r.Incarnation != 2 {
		t.Fatalf("rig: h3 not back: %+v", r)
	}
	return b, others, a, w, wRec, at, last
}

// x47Case: how the fresh tracker comes to list h3.
type x47Case struct {
	name     string
	rollback bool
	backupW  bool // the backup was taken during the maintenance stop (W in it)
	copy     bool // the node lands an aligned copy of W before the listing
	muts     []*bool
}

// x47After: h3 falls silent at last (its agent crashed or hung, or it is
// cut off); silent secs later the stream is restored from the chosen backup
// (and the node lands its copy), the running controller finds it 1 s later
// and a fresh tracker starts 0.5 s after that — or, with no rollback, the
// controller runs on. It returns the first declaration of h3 (when,
// measured from h3's last renewal) within 150 s, and the fresh start.
func x47After(t *testing.T, c x47Case, b *x11Bucket, others []string, a, w x47Backup, wRec fencing.LeaseRecord, at, last time.Time, silent int) (declared bool, after time.Duration, start time.Time) {
	t.Helper()
	const victim = "h3"
	if silent > 0 {
		b.run(at, silent, others, nil)
		at = at.Add(time.Duration(silent) * time.Second)
	}
	start = at.Add(1500 * time.Millisecond)
	if c.rollback {
		bk := a
		if c.backupW {
			bk = w
		}
		b.rollBack(maps.Clone(bk.keys), bk.rev)
		if c.copy {
			c1 := b.tr
			b.tr = nil // the stopped tracker's watch never delivers it (rollback.go)
			ok := x45Align(b, at.Add(200*time.Millisecond), victim, wRec, 0)
			b.tr = c1
			if !ok {
				t.Fatalf("rig: copy not landed (stream at %d, copy's prev_rev %d)", b.rev, wRec.PrevRev)
			}
		}
		b.detectRollback(at.Add(time.Second), start)
		hs := b.tr.hosts[victim]
		t.Logf("fresh tracker after the listing: %s rec %s inc %d seq %d action %q backstop %q; grace %v refused %q silentAft %v; bar %v",
			victim, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq, hs.rec.Action, hs.rec.Backstop, hs.grace, hs.refused, hs.silentAft, hs.rollbackBar)
	} else {
		b.run(at, 1, others, nil)
		start = at.Add(time.Second)
	}
	for s := 0; s < 150; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		if h, d := b.run(now, 1, others, x10Set([]string{victim})); h != "" {
			return true, now.Add(d).Sub(last), start
		}
	}
	return false, 0, start
}

// TestX47ListedWithdrawalUnrefusesMonitorOnlyHost (S, needs a rollback;
// the attack case a compromised node's aligned copy, the fault case no
// attacker). h3 is monitor-only (fence action none): the controller
// refuses its constants and never declares it — its agent fences
// nothing, its guests run on whatever its agent does. h3 withdraws for
// maintenance (W), comes back (incarnation 2) and its agent crashes (the
// guests run on). 5 s later the stream rolls back; the fresh tracker
// lists W — the node's copy landed before the listing, or the backup's
// own — and KeepBar puts h3's last renewal back as its record, unjudged:
// refused "", grace 0. The monitor-only h3 is declared 15 s after the
// fresh start: its running guests are evacuated (and started elsewhere).
//
// "control/no-rollback": never declared (OpRefusedDue).
// "control/listed-active": the backup holds h3's incarnation-1 renewal
// (judged when listed: refused), KeepBar replaces it the same way — never
// declared. "attack/.../listedBarMutation": with the listed W left as it
// is, h3 stays withdrawn — never declared.
func TestX47ListedWithdrawalUnrefusesMonitorOnlyHost(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []x47Case{
		{"control/no-rollback", false, false, false, nil},
		{"control/listed-active", true, false, false, nil},
		{"attack/copy-before-listing", true, false, true, nil},
		{"attack/copy-before-listing/listedBarMutation", true, false, true, []*bool{&listedBarMutation}},
		{"attack/copy-before-listing/judgeBarMutation", true, false, true, []*bool{&judgeBarMutation, &listedHostMutation}},
		{"fault/backup-during-maintenance", true, true, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, others, a, w, wRec, at, last := x47Rig(t, x47MonitorOnly)
			if r := b.tr.hosts["h3"].refused; r == "" {
				t.Fatal("rig: monitor-only h3 not refused by the running controller")
			}
			declared, after, start := x47After(t, c, b, others, a, w, wRec, at, last, 5)
			if x47JudgeMutated(t, c, declared, after) {
				return
			}
			if !declared {
				t.Logf("h3 (monitor-only) never declared")
				return
			}
			t.Fatalf("the MONITOR-ONLY h3 (fence action none: its constants refused, never to be declared; its agent crashed, its guests running) DECLARED %v after its last renewal (%v after the fresh start): the fresh tracker listed its old withdrawal and KeepBar put its last renewal back as its record without judging it (refused \"\", grace 0)",
				after, last.Add(after).Sub(start))
		})
	}
}

// TestX47ListedWithdrawalDeclaresWithoutGrace (S, needs a rollback).
// As above with a host the controller accepts: h3's backstop is its
// hardware watchdog (10 s; grace 15.5 s: declared no earlier than
// lease_ttl + grace = 30.5 s after its last renewal). Its agent hangs
// (the guests stop only when the watchdog resets the host) 1 s before the
// rollback; the fresh tracker lists W, KeepBar puts h3's last renewal back
// unjudged (grace 0) and h3 is declared at lease_ttl after the fresh
// start — about 17 s after its last renewal, 13 s before its watchdog is
// due to have fired: its guests are evacuated while they still run.
//
// "control/no-rollback", "control/listed-active": declared >= 30.5 s
// after the last renewal.
func TestX47ListedWithdrawalDeclaresWithoutGrace(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []x47Case{
		{"control/no-rollback", false, false, false, nil},
		{"control/listed-active", true, false, false, nil},
		{"attack/copy-before-listing", true, false, true, nil},
		{"fault/backup-during-maintenance", true, true, false, nil},
		{"fault/backup-during-maintenance/judgeBarMutation", true, true, false, []*bool{&judgeBarMutation, &listedHostMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "attack/copy-before-listing" || c.name == "fault/backup-during-maintenance" {
				t.Skip("open (c), docs/security.md (KeepBar): the dead h3 listed on its older withdrawal stays withdrawn, never declared — it fails without the skip (X46's TestX46CopyListedBeforeCarryApplied)")
			}
			x36Mutate(t, c.muts...)
			b, others, a, w, wRec, at, last := x47Rig(t, x47Watchdog)
			hs := b.tr.hosts["h3"]
			due := hs.rec.Timing.LeaseTTL + hs.grace
			if hs.grace < 15*time.Second || hs.refused != "" {
				t.Fatalf("rig: h3 grace %v refused %q", hs.grace, hs.refused)
			}
			declared, after, start := x47After(t, c, b, others, a, w, wRec, at, last, 0)
			if !declared {
				t.Fatalf("the dead h3 never declared")
			}
			t.Logf("h3 declared %v after its last renewal (%v after the fresh start); lease_ttl + grace %v", after, last.Add(after).Sub(start), due)
			if len(c.muts) > 0 {
				if after >= due {
					t.Fatalf("with the mutation h3 declared %v after its last renewal, not before lease_ttl + grace %v: the test no longer shows the hole", after, due)
				}
				return
			}
			if after < due {
				t.Fatalf("h3 (watchdog backstop, agent hung) DECLARED %v after its last renewal — %v before lease_ttl + grace (%v), its watchdog not yet due to have reset it: its guests are evacuated while they run (KeepBar put its renewal over the listed withdrawal without judging it: grace 0)",
					after, due-after, due)
			}
		})
	}
}

// TestX47CarriedRecordConstantsNotJudged (S, needs a rollback; no
// withdrawal listed, no attacker needed). KeepBar also replaces a listed
// ACTIVE record older than the stopped tracker's — judged when listed,
// with ITS constants. h3's agent is reconfigured during its maintenance
// stop: monitor-only from incarnation 2 on (fence action none; refused,
// never declared). The backup holds h3's incarnation-1 renewal (fence
// action pause: accepted, grace 6.3 s). Its incarnation-2 agent crashes
// (guests running); 5 s later the stream rolls back: the fresh tracker
// lists the incarnation-1 renewal (judged: accepted), KeepBar puts the
// incarnation-2 renewal back as h3's record — monitor-only, not judged —
// and h3 is declared 15 + 6.3 s after the fresh start.
//
// "control/no-rollback": never declared (refused).
func TestX47CarriedRecordConstantsNotJudged(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []x47Case{
		{"control/no-rollback", false, false, false, nil},
		{"attack/listed-older-active", true, false, false, nil},
		{"attack/listed-older-active/listedBarMutation", true, false, false, []*bool{&listedBarMutation}},
		{"attack/listed-older-active/judgeBarMutation", true, false, false, []*bool{&judgeBarMutation, &listedHostMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "attack/listed-older-active" {
				// Closed by the rollback gate: nothing since the rollback
				// proved the listed record (the dead h3's beacons named a
				// newer one before it), so it is not declared until an
				// operator confirms. Beneath the gate the hole stays:
				// TestRollbackGateHoldsBeneath's x47-constants case.
				gateOn(t)
			}
			x36Mutate(t, c.muts...)
			b, others, a, w, wRec, at, last := x47Rig2(t, nil, x47MonitorOnly)
			if r := b.tr.hosts["h3"].refused; r == "" {
				t.Fatal("rig: monitor-only h3 not refused by the running controller")
			}
			declared, after, start := x47After(t, c, b, others, a, w, wRec, at, last, 5)
			if x47JudgeMutated(t, c, declared, after) {
				return
			}
			if !declared {
				t.Logf("h3 (monitor-only since incarnation 2) never declared")
				return
			}
			if len(c.muts) > 0 {
				t.Logf("with the mutation (listed record kept) h3 declared %v after its last renewal: the listed incarnation-1 record, accepted, is what the fresh tracker has (a separate matter: the rollback lost the reconfiguration)", after)
				return
			}
			t.Fatalf("h3, MONITOR-ONLY since incarnation 2 (refused, never to be declared; agent crashed, guests running), DECLARED %v after its last renewal (%v after the fresh start): KeepBar put its incarnation-2 renewal over the listed incarnation-1 one without judging it — the grace and refusal are the listed record's",
				after, last.Add(after).Sub(start))
		})
	}
}

// TestX47ReinstalledHostRefusedByBar (c, needs a rollback, no attacker;
// the bar's "newer" order is not the host's). KNOWN: docs/security.md
// names it ("A reinstalled host ... reimaged-after-rollback, commented
// out"); here as a running case, since be52f8c gives every host a bar. The rollback bar refuses,
// for the fresh tracker's whole life, every host-written record not
// newer (epoch, incarnation, seq) than the newest the stopped tracker
// knew. A host REINSTALLED since (its durable state gone, a new boot)
// starts again at incarnation 1 (fencing.NewAgent: the key's incarnation
// is taken only from a record of the same boot): every record it writes
// is "not newer" than its pre-rollback incarnation-3 records — refused as
// a replay. h3 (incarnation 3) renews before and after the rollback,
// withdraws for its reinstall (trusted), and comes back reinstalled
// (incarnation 1): its renewals are refused, it stays withdrawn for the
// fresh tracker; it dies 30 s later and is never declared.
//
// "control/no-rollback": declared ~22 s after it died.
func TestX47ReinstalledHostRefusedByBar(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name     string
		rollback bool
		muts     []*bool
	}{
		{"control/no-rollback", false, nil},
		{"fault/reinstalled-after-rollback", true, nil},
		{"fault/reinstalled-after-rollback/rollbackBarMutation", true, []*bool{&rollbackBarMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "fault/reinstalled-after-rollback" {
				t.Skip("open (c), docs/security.md (rollbacks, reimaged-after-rollback): a host reinstalled after a rollback restarts at incarnation 1, its records are refused by the bar until the controllers restart — it fails without the skip")
			}
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 10, 5)
			const victim = "h3"
			others := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			var seq uint64
			for s := 0; s < 20; s++ { // incarnation 3 (restarted twice before)
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x47Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 3, seq, nil)
				b.run(now, 1, others, nil)
			}
			at = at.Add(20 * time.Second)
			if c.rollback {
				b.rollBack(backup, backupRev)
				b.detectRollback(at.Add(500*time.Millisecond), at.Add(time.Second))
				t.Logf("fresh tracker: %s bar %v", victim, b.tr.hosts[victim].rollbackBar)
			} else {
				b.run(at, 1, others, nil)
			}
			at = at.Add(time.Second)
			for s := 0; s < 10; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x47Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 3, seq, nil)
				b.run(now, 1, others, nil)
			}
			at = at.Add(10 * time.Second)
			seq++
			x47Put(b, at.Add(500*time.Millisecond), victim, fencing.LeaseWithdrawn, 3, seq, nil) // stopped for its reinstall
			b.run(at, 60, others, nil)
			at = at.Add(60 * time.Second)
			if r := b.tr.hosts[victim].rec; r.State != fencing.LeaseWithdrawn {
				t.Fatalf("rig: withdrawal not trusted: %+v", r)
			}
			seq = 0
			for s := 0; s < 30; s++ { // reinstalled: incarnation 1, seq from 1
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x47Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 1, seq, nil)
				if h, _ := b.run(now, 1, others, x10Set([]string{victim})); h != "" {
					t.Fatalf("%s declared while renewing", h)
				}
			}
			at = at.Add(30 * time.Second)
			hs := b.tr.hosts[victim]
			t.Logf("reinstalled %s renewed 30 times (incarnation 1): rec %s inc %d seq %d", victim, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq)
			died := at
			if h, after := b.run(at, 150, others, x10Set([]string{victim})); h != "" {
				t.Logf("%s declared %v after it died", h, after)
				return
			}
			if len(c.muts) > 0 {
				t.Fatal("with the mutation the dead host was not declared either")
			}
			hs = b.tr.hosts[victim]
			t.Fatalf("the dead reinstalled %s never declared (150 s after it died at %v): its incarnation-1 records were refused as replays by the rollback bar (%v) — it stayed %s (incarnation %d seq %d) for the fresh tracker",
				victim, died.Sub(t0), hs.rollbackBar, hs.rec.State, hs.rec.Incarnation, hs.rec.Seq)
		})
	}
}

// TestX47ListedDeclarationOfLiveHostNotGivenWay (S, needs a rollback, no
// attacker). KeepBar puts the stopped tracker's newer record over an
// older LISTED one only when both are the host's own: a listed
// DECLARATION older than the host's last trusted renewal stays. h3 dies,
// is declared (D, epoch 1) — the backup is taken now —, evacuated,
// released, comes back (epoch 1, incarnation 2) and renews: alive, guests
// running. The stream is restored from the backup: the fresh tracker
// lists D — older than its bar (h3's incarnation-2 renewal) — and takes
// the live h3 as DECLARED (expired, epoch 1) at once; h3's agent, on its
// next renewal's conflict, takes D too (expired, epoch 1 not below its
// own: fencing/agent.go declaredBy) and fences — X46's open agent-side
// item, with no copy landed. (In the rig h3 renews on, as an agent that
// refused D would; the tracker still calls it declared until one lands.)
//
// "control/backup-before-declaration": the backup holds h3's
// incarnation-1 renewal: listed, given way to its incarnation-2 one —
// never declared.
func TestX47ListedDeclarationOfLiveHostNotGivenWay(t *testing.T) {
	for _, c := range []struct {
		name     string
		declared bool // the backup taken while h3 was declared
		muts     []*bool
	}{
		{"control/backup-before-declaration", false, nil},
		{"fault/backup-while-declared", true, nil},
		{"fault/backup-while-declared/listedDeclMutation", true, []*bool{&listedDeclMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			b, hosts := x11Fleet(t, 10, 5)
			const victim = "h3"
			others := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			var seq uint64
			for s := 0; s < 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x39Put(b, now.Add(500*time.Millisecond), victim, 0, 1, seq)
				b.run(now, 1, others, nil)
			}
			backup, backupRev := maps.Clone(b.keys), b.rev
			at = at.Add(30 * time.Second)
			if h, after := b.run(at, 60, others, x10Set([]string{victim})); h != victim {
				t.Fatalf("rig: %s not declared", victim)
			} else {
				at = at.Add(after)
			}
			x39Declare(b, at.Add(100*time.Millisecond), victim)
			if c.declared {
				backup, backupRev = maps.Clone(b.keys), b.rev
			}
			b.run(at, 5, others, nil)
			at = at.Add(5 * time.Second)
			d, err := b.tr.Release(victim, "evacuated")
			if err != nil {
				t.Fatalf("rig: release: %v", err)
			}
			rel := d.Record
			cur := b.keys[victim]
			rel.Sig, rel.PrevRev = "controller-sig-release-"+victim, cur.rev
			b.land(at.Add(100*time.Millisecond), victim, x11Entry{rec: &rel, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			b.run(at, 3, others, nil)
			at = at.Add(3 * time.Second)
			seq = 0
			for s := 0; s < 20; s++ { // back: epoch 1, incarnation 2
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x39Put(b, now.Add(500*time.Millisecond), victim, 1, 2, seq)
				b.run(now, 1, others, nil)
			}
			at = at.Add(20 * time.Second)
			if r := b.tr.hosts[victim].rec; r.State != fencing.LeaseActive || r.Epoch != 1 {
				t.Fatalf("rig: %s not back: %+v", victim, r)
			}
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			b.detectRollback(at.Add(500*time.Millisecond), start)
			hs := b.tr.hosts[victim]
			t.Logf("fresh tracker after the listing: %s rec %s epoch %d inc %d seq %d, bar %v", victim, hs.rec.State, hs.rec.Epoch, hs.rec.Incarnation, hs.rec.Seq, hs.rollbackBar)
			if len(c.muts) > 0 {
				if hs.rec.State != fencing.LeaseExpired {
					t.Fatalf("with the mutation the live %s is %s, not taken as declared: the test no longer shows the hole", victim, hs.rec.State)
				}
				return
			}
			if hs.rec.State == fencing.LeaseExpired {
				var lv LeaseView
				for _, v := range b.tr.View(start).Hosts {
					if v.Host == victim {
						lv = v
					}
				}
				t.Fatalf("the live %s (released and back, renewing at epoch 1 incarnation 2 until the rollback) taken as DECLARED at the fresh start: the listed pre-release declaration (epoch %d, older than the bar %v) did not give way to its last trusted renewal (KeepBar: only a host-written listed record does); view %s epoch %d; its agent takes the same record as its declaration on its next renewal and fences",
					victim, hs.rec.Epoch, hs.rollbackBar, lv.State, lv.Epoch)
			}
		})
	}
}

// TestX47RaisedDeclarationTakenOnce (control, passes): the fresh tracker's
// declaration after a rollback — its epoch raised past a bar that is the
// controller's own pre-rollback RELEASE (rank 2) — lands and is taken,
// once: no re-declaration every DeclareRetry (the bar does not refuse
// it), and the agent's epoch rule (expired, epoch not below its own)
// takes it.
func TestX47RaisedDeclarationTakenOnce(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	b, hosts := x11Fleet(t, 10, 5)
	const victim = "h3"
	others := x11Without(hosts, victim)
	at := t0.Add(5 * time.Second)
	backup, backupRev := maps.Clone(b.keys), b.rev
	_, rel, at, _ := x46Cycle(t, b, victim, others, at)
	b.rollBack(backup, backupRev) // h3 died at the rollback
	start := at.Add(time.Second)
	b.detectRollback(at.Add(500*time.Millisecond), start)
	t.Logf("bar %v, release epoch %d", b.tr.hosts[victim].rollbackBar, rel.Epoch)
	declared := 0
	for s := 0; s < 120; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		for _, h := range others {
			b.write(now, h, fencing.LeaseActive, b.guard.Ref())
		}
		b.publish()
		for _, d := range b.tr.Tick(now) {
			if d.Op != OpDeclare || d.Host != victim {
				continue
			}
			declared++
			r := d.Record
			cur := b.keys[victim]
			r.Sig, r.PrevRev = "controller-sig-redeclare", cur.rev
			b.land(now.Add(100*time.Millisecond), victim, x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
			hs := b.tr.hosts[victim]
			t.Logf("declared at %v after the fresh start: epoch %d inc %d seq %d; taken: %s", now.Sub(start), r.Epoch, r.Incarnation, r.Seq, hs.rec.State)
			if hs.rec.State != fencing.LeaseExpired {
				t.Fatalf("the fresh tracker's own declaration refused: rec %s", hs.rec.State)
			}
			if r.Epoch < rel.Epoch {
				t.Fatalf("declaration epoch %d below the agent's %d: not taken by it", r.Epoch, rel.Epoch)
			}
		}
	}
	if declared != 1 {
		t.Fatalf("declared %d times", declared)
	}
}

// x47JudgeMutated: with judgeBarMutation the monitor-only h3 must be
// declared (the hole shows); it reports whether the case was that one.
func x47JudgeMutated(t *testing.T, c x47Case, declared bool, after time.Duration) bool {
	t.Helper()
	if !slices.Contains(c.muts, &judgeBarMutation) {
		return false
	}
	if !declared {
		t.Fatal("with judgeBarMutation the monitor-only h3 was not declared: the test no longer shows the hole")
	}
	t.Logf("with judgeBarMutation: h3 declared %v after its last renewal", after)
	return true
}
