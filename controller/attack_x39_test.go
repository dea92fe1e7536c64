package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X39: attacks on f4e606d (recreated keeps the carries, a
// counted carry ends once declaredAt is set, KeepCounted's key-gone host).

// x39Put: as x38Put with the epoch the agent writes (an agent that comes
// back after a declaration adopts the declared epoch, fencing/agent.go).
func x39Put(b *x11Bucket, now time.Time, host string, epoch, inc, seq uint64) fencing.LeaseRecord {
	r := rec(host, fencing.BackstopReset)
	r.Signer, r.Guard, r.State = host+"-key", b.guard.Ref(), fencing.LeaseActive
	r.Sig = fmt.Sprintf("sig-%s-%d-%d-%d", host, epoch, inc, seq)
	r.Epoch, r.Incarnation, r.Seq = epoch, inc, seq
	return x38Land(b, now, r)
}

// x39Declare: the controller's declaration of host lands (signed by it,
// epoch+1, the host's constants, incarnation and seq copied from its
// last active record), as TestX38CountedCarryCountsForever's declare.
func x39Declare(b *x11Bucket, now time.Time, host string) fencing.LeaseRecord {
	cur := b.keys[host]
	r := *cur.rec
	r.Epoch++
	r.State = fencing.LeaseExpired
	r.Sig, r.PrevRev = fmt.Sprintf("controller-sig-%s-%d", host, r.Epoch), cur.rev
	b.land(now, host, x11Entry{rec: &r, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
	return r
}

// TestX39ExpiredRecordEndsCountedCarry (S1).
//
// f4e606d: counted() ignores a KeepCounted carry once h.declaredAt is set
// ("until this tracker declares it"). But declaredAt is not "this tracker
// declared it": Observe sets it for ANY trusted expired record it is
// delivered — the listing of a rolled-back stream, or a copy put back —
// and does so whether or not that record is newer than the carried one
// (the countedCarry rule `!notNewer(*rec, *c)` keeps the carry, but the
// carry no longer counts). One guard window later the host leaves the
// guard's count: the "counted until a record NEWER than c.Record comes"
// promise (KeepCounted) is gone for every host whose key can show an
// older declaration.
//
// Timeline (x11 rig, 60 hosts, threshold 10, rack h1..h12): h1..h3 died
// once and were declared (controller-signed expired records, epoch 1,
// incarnation 1); their agents came back (epoch 1, incarnation 2). Rack
// cut off, Held: C1 holds (12 silent). The stream is rolled back.
//   - "fault/backup-while-declared" (no attacker): the backup was taken
//     while h1..h3's keys held their declarations. The fresh tracker
//     lists them (declaredAt = its start), KeepCounted carries their
//     incarnation-2 records; one guard window later the three drop out
//     of the count, 9 < 10: the hold ends and a Held host (guests
//     running) is declared.
//   - "attack/delete-then-old-declaration": the backup holds h1..h3
//     active (before the declarations); the compromised node writes a
//     delete marker on their keys and, once the stream passes the
//     declarations' prev_rev, copies of their OLD declarations (its kept
//     bytes; X24's class of replay, but older than the carried record —
//     the class KeepCounted and f4e606d's recreated claim to refuse).
//
// Controls: no rollback — held; "fault/declaredCarryMutation" (the carry
// stands once declared, as before f4e606d) — held; "fault/backup-after-
// return" (the backup holds h1..h3 active) — held.
// Fix direction: end a counted carry only on a declaration this tracker
// performed (its own OpDeclare landing, epoch above the carried record's),
// or on a record newer than the carry — never on declaredAt set by a
// listed or replayed expired record not newer than c.
func TestX39ExpiredRecordEndsCountedCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name     string
		rollback bool
		backupAt string // "declared", "before", "after"
		attack   bool
		muts     []*bool
		wantHole bool // a mutation reopening the hole: a Held host declared
		wantHeld bool
	}{
		{name: "control-no-rollback", backupAt: "declared", wantHeld: true},
		{name: "control-backup-after-return", rollback: true, backupAt: "after", wantHeld: true},
		{name: "control-rollback-no-attack", rollback: true, backupAt: "before", wantHeld: true},
		{name: "fault/backup-while-declared", rollback: true, backupAt: "declared"},
		{name: "fault/backup-while-declared/declaredCarryMutation", rollback: true, backupAt: "declared", muts: []*bool{&declaredCarryMutation}, wantHeld: true},
		{name: "attack/delete-then-old-declaration", rollback: true, backupAt: "before", attack: true},
		{name: "fault/backup-while-declared/olderDeclEndsCarryMutation", rollback: true, backupAt: "declared", muts: []*bool{&olderDeclEndsCarryMutation, &listedDeclMutation}, wantHole: true}, // KeepBar gives the listed old declaration way too (reviewer X47)
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, m := range c.muts {
				x32Mutate(t, m)
			}
			b, hosts := x11Fleet(t, 60, 5)
			targets := x10Names(1, 4)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			others := x11Without(hosts, targets...)
			at := t0.Add(5 * time.Second)
			seq := map[string]uint64{}
			var backup map[string]x11Entry
			var backupRev uint64
			takeBackup := func() { backup, backupRev = maps.Clone(b.keys), b.rev }
			tick := func(secs int, epoch, inc uint64, on bool) {
				for s := 0; s < secs; s++ {
					now := at.Add(time.Duration(s) * time.Second)
					if on {
						for _, h := range targets {
							seq[h]++
							x39Put(b, now.Add(500*time.Millisecond), h, epoch, inc, seq[h])
						}
					}
					b.run(now, 1, others, nil)
				}
				at = at.Add(time.Duration(secs) * time.Second)
			}
			tick(3, 0, 1, true) // h1..h3 renew (epoch 0, incarnation 1)
			if c.backupAt == "before" {
				takeBackup()
			}
			tick(3, 0, 1, true)
			decls := map[string]fencing.LeaseRecord{}
			for _, h := range targets { // they die and are declared (epoch 1)
				decls[h] = x39Declare(b, at, h)
			}
			if h1 := b.tr.hosts["h1"]; h1.rec.State != fencing.LeaseExpired {
				t.Fatalf("rig: C1 sees h1 %q", h1.rec.State)
			}
			tick(2, 0, 0, false)
			if c.backupAt == "declared" {
				takeBackup()
			}
			for _, h := range targets { // back: rebooted agents, the declared epoch, incarnation 2
				seq[h] = 0
			}
			tick(30, 1, 2, true)
			if c.backupAt == "after" {
				takeBackup()
			}
			tick(5, 1, 2, true)
			if host, _ := b.run(at, 40, live, x10Set(rack)); host != "" || !b.tr.Holding() {
				t.Fatalf("C1 declared %q / not holding (rig)", host)
			}
			at = at.Add(40 * time.Second)
			t.Logf("C1 holding: silent %d, threshold %d", b.tr.Silent(at), b.tr.Threshold())
			now := at
			if c.rollback {
				b.rollBack(backup, backupRev)
				start := at.Add(time.Second)
				carry := b.detectRollback(at.Add(500*time.Millisecond), start)
				h1 := b.tr.hosts["h1"]
				t.Logf("rollback to rev %d; carried counted %d; fresh tracker: h1 %q (epoch %d inc %d), countedCarry %t (inc %d), declaredAt %v; silent %d, threshold %d",
					backupRev, len(carry.counted), h1.rec.State, h1.rec.Epoch, h1.rec.Incarnation, h1.countedCarry != nil, h1.countedCarry.Incarnation, !h1.declaredAt.IsZero(), b.tr.Silent(start), b.tr.Threshold())
				now = start
				if c.attack {
					now = now.Add(100 * time.Millisecond)
					for _, h := range targets {
						b.del(now, h)
					}
					for b.rev <= decls[targets[len(targets)-1]].PrevRev {
						b.run(now, 1, live, nil)
						now = now.Add(time.Second)
					}
					for _, h := range targets {
						d := decls[h]
						cur := b.keys[h]
						b.land(now, h, x11Entry{rec: &d, w: fencing.Written{Known: true, HasExpected: true, Expected: cur.rev}})
						hs := b.tr.hosts[h]
						t.Logf("%s: copy of %s's old declaration (epoch %d inc %d, prev_rev %d) put back at rev %d: state %q, countedCarry %t (epoch %d inc %d), declaredAt set %t",
							now.Format("15:04:05.000"), h, d.Epoch, d.Incarnation, d.PrevRev, b.rev, hs.rec.State, hs.countedCarry != nil, hs.countedCarry.Epoch, hs.countedCarry.Incarnation, !hs.declaredAt.IsZero())
					}
				}
			}
			host, after := b.run(now, 180, live, x10Set(rack))
			t.Logf("after: silent %d, threshold %d, holding %t", b.tr.Silent(now.Add(after)), b.tr.Threshold(), b.tr.Holding())
			switch {
			case c.wantHole && host == "":
				t.Fatalf("with the mutation no Held host was declared: the case shows nothing")
			case c.wantHole:
				t.Logf("with the mutation: the Held %s declared %s after the fresh start", host, after)
			case c.wantHeld && host != "":
				t.Fatalf("control: the Held %s declared %s after (rig)", host, after)
			case !c.wantHeld && host != "":
				t.Fatalf("the fresh tracker declared the Held %s %s after its start: an expired record NOT newer than the carried one set declaredAt, the counted carry stopped counting one guard window later and the hold ended (counted: declaredAt is not 'this tracker declared it')", host, after)
			case !c.wantHeld:
				t.Logf("no Held host declared")
			}
		})
	}
}
