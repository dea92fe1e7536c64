package controller

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// Reviewer X44: a live host carried by a rollback (NeedsWritten while a
// carry holds) whose key a compromised node deletes before each renewal:
// every genuine renewal is then a create over a marker (Written.Fresh
// refuses it), so none is trusted while the carry holds.
func TestX44DeleteBeforeRenewalCarriedLiveHost(t *testing.T) {
	for _, c := range []struct {
		name     string
		deletes  bool
		silent   int
		mut      *bool
		withdraw bool
	}{
		{"withdrawn-carry/deletes", true, 0, nil, true},
		{"attack/superseded-by-garbage", false, 12, nil, false},
		{"withdrawn-carry/no-deletes", false, 0, nil, true},
		{"control/no-deletes", false, 12, nil, false},
		{"attack/deletes", true, 12, nil, false},
		{"attack/deletes/carryWrittenMutation", true, 12, &carryWrittenMutation, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			b, hosts := x11Fleet(t, 60, 5)
			victim := "h1"
			live := x11Without(hosts, victim)
			at := t0.Add(5 * time.Second)
			var seq uint64
			var backup map[string]x11Entry
			var backupRev uint64
			for s := 0; s < 30; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 2, seq)
				if s == 20 {
					backup, backupRev = maps.Clone(b.keys), b.rev
				}
				b.run(now, 1, live, nil)
			}
			at = at.Add(30 * time.Second)
			if c.withdraw {
				seq++
				x38Put(b, at.Add(100*time.Millisecond), victim, fencing.LeaseWithdrawn, 2, seq)
			}
			if h, _ := b.run(at, c.silent, live, x10Set([]string{victim})); h != "" {
				t.Fatalf("C1 declared %s (rig)", h)
			}
			at = at.Add(time.Duration(c.silent) * time.Second)
			detect := at.Add(500 * time.Millisecond)
			t.Logf("C1: silent %d threshold %d", b.tr.Silent(detect), b.tr.Threshold())
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			carry := b.detectRollback(detect, start)
			for _, ch := range carry.counted {
				if ch.Host == victim {
					t.Logf("carried counted %s seq %d From +%v", victim, ch.Record.Seq, ch.From.Sub(start))
				}
			}
			for _, w := range carry.withdrawn {
				if w.Host == victim {
					t.Logf("carried withdrawn %s", w.Why)
				}
			}
			now := start
			var seq3 uint64
			for s := 0; s < 150; s++ {
				seq3++
				if c.deletes {
					b.del(now.Add(200*time.Millisecond), victim)
				}
				if c.name == "attack/superseded-by-garbage" {
					r := rec(victim, fencing.BackstopReset)
					r.Signer, r.Guard, r.State = victim+"-key", b.guard.Ref(), fencing.LeaseActive
					r.Sig = "sig-x44"
					r.Incarnation, r.Seq = 3, seq3
					r.PrevRev = b.keys[victim].rev
					b.land(now.Add(500*time.Millisecond), victim, x11Entry{rec: r, w: fencing.Written{}})
					b.tr.ObserveBeacon(now.Add(500*time.Millisecond), victim, b.rev)
					b.garbage(now.Add(600*time.Millisecond), victim)
					b.flush()
				} else {
					x38Put(b, now.Add(500*time.Millisecond), victim, fencing.LeaseActive, 3, seq3)
				}
				h, _ := b.run(now, 1, live, x10Set([]string{victim}))
				now = now.Add(time.Second)
				if h != "" {
					hs := b.tr.hosts[victim]
					t.Fatalf("LIVE %s (renewing every second, beacons naming each write) declared %v after the fresh start: trustedRev %d rec seq %d countedCarry %t carried %t",
						h, now.Sub(start), hs.trustedRev, hs.rec.Seq, hs.countedCarry != nil, hs.carried != nil)
				}
			}
			hs := b.tr.hosts[victim]
			t.Logf("not declared; trustedRev %d seq %d countedCarry %t carried %t", hs.trustedRev, hs.rec.Seq, hs.countedCarry != nil, hs.carried != nil)
		})
	}
}

// TestX44AlignedCopiesEndHold: X43's hidden-renewal copies, but the node
// hides the last N renewals of h1, h2 and, after the rollback, lands each
// copy by a compare-and-set on a garbage value it placed at exactly the
// copy's prev_rev (filler writes advance the stream): Written.Fresh
// passes, prev_rev < rev passes, each copy is newer than the last. Closed
// by the beacons' record identity (fencing.Beacon.Seq, Tracker.BeaconWrote):
// the old tracker knew h1/h2 wrote seq 90, the carries' bar, and every
// copy is older. With beaconBarMutation the Held host is declared again.
func TestX44AlignedCopiesEndHold(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name   string
		copies bool
		muts   []*bool
	}{
		{"control-no-copies", false, nil},
		{"attack/aligned-copies", true, nil},
		{"attack/aligned-copies/beaconBarMutation", true, []*bool{&beaconBarMutation, &rollbackBarMutation}},
		// The rollback gate alone holds the hole the mutations reopen:
		// the cut-off rack's hosts publish no beacon after the rollback.
		{"attack/aligned-copies/beaconBarMutation/gated", true, []*bool{&beaconBarMutation, &rollbackBarMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			gated := strings.HasSuffix(c.name, "/gated")
			if gated {
				gateOn(t)
			}
			x36Mutate(t, c.muts...)
			if gated {
				c.muts = nil // expect nothing declared: the gate holds
			}
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			targets := []string{"h1", "h2"}
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			backup, backupRev := maps.Clone(b.keys), b.rev
			var seq uint64
			hidden := map[string][]fencing.LeaseRecord{}
			for s := 0; s < 90; s++ {
				now := at.Add(time.Duration(s) * time.Second)
				seq++
				for _, h := range targets {
					if s < 30 {
						x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
						continue
					}
					c1 := b.tr
					b.tr = nil
					r := x38Put(b, now.Add(500*time.Millisecond), h, fencing.LeaseActive, 2, seq)
					hidden[h] = append(hidden[h], r)
					wRev := b.rev
					b.tr = c1
					b.tr.Skipped(wRev + 1)
					b.garbage(now.Add(600*time.Millisecond), h)
					b.tr.ObserveBeacon(now.Add(600*time.Millisecond), h, wRev)
					b.tr.BeaconWrote(h, wRev, r.Epoch, r.Incarnation, r.Seq) // the runner passes the beacon's record identity on
					b.flush()
				}
				b.run(now, 1, x11Without(hosts, targets...), nil)
			}
			at = at.Add(90 * time.Second)
			if host, _ := b.run(at, 2, live, x10Set(rack)); host != "" {
				t.Fatalf("C1 declared %q (rig)", host)
			}
			at = at.Add(2 * time.Second)
			detect := at.Add(500 * time.Millisecond)
			t.Logf("C1 silent %d threshold %d holding %t", b.tr.Silent(detect), b.tr.Threshold(), b.tr.Holding())
			b.rollBack(backup, backupRev)
			start := at.Add(time.Second)
			b.detectRollback(detect, start)
			protect := x10Set(rack)
			now := start
			next := map[string]int{}
			t.Logf("b.rev %d h1 P %d..%d h2 P %d..%d", b.rev, hidden["h1"][0].PrevRev, hidden["h1"][59].PrevRev, hidden["h2"][0].PrevRev, hidden["h2"][59].PrevRev)
			for s := 0; s < 240; s++ {
				if c.copies {
					order := []string{"h1", "h2"}
					if next["h2"] < len(hidden["h2"]) && next["h1"] < len(hidden["h1"]) && hidden["h2"][next["h2"]].PrevRev < hidden["h1"][next["h1"]].PrevRev {
						order = []string{"h2", "h1"}
					}
					for _, h := range order {
						for next[h] < len(hidden[h]) && hidden[h][next[h]].PrevRev <= b.rev {
							next[h]++ // passed: a later copy
						}
						i := next[h]
						if i >= len(hidden[h]) {
							continue
						}
						cp := hidden[h][i]
						if b.rev >= cp.PrevRev {
							continue
						}
						next[h]++
						b.rev = cp.PrevRev - 1 // filler writes
						b.garbage(now.Add(50*time.Millisecond), h)
						b.land(now.Add(100*time.Millisecond), h, x11Entry{rec: &cp, w: fencing.Written{Known: true, HasExpected: true, Expected: b.keys[h].rev}})
					}
				}
				host, _ := b.run(now, 1, live, protect)
				now = now.Add(time.Second)
				if host != "" {
					if len(c.muts) > 0 {
						t.Logf("with the mutation: the Held %s declared %v after the fresh start (copies landed %v)", host, now.Sub(start), next)
						return
					}
					for _, h := range targets {
						hs := b.tr.hosts[h]
						t.Logf("%s: trustedRev %d rev %d seq %d countedCarry %t", h, hs.trustedRev, hs.rev, hs.rec.Seq, hs.countedCarry != nil)
					}
					t.Fatalf("the Held %s (rack cut off, guests running) declared %v after the fresh start: the node landed copies of h1/h2's hidden renewals, each by a CAS on garbage it placed at the copy's prev_rev (Written.Fresh passes, prev_rev < rev), ending the counted carries and keeping h1/h2 fresh (copies landed %v; silent %d threshold %d)", host, now.Sub(start), next, b.tr.Silent(now), b.tr.Threshold())
				}
			}
			if len(c.muts) > 0 {
				t.Fatalf("with the mutation no Held host was declared: the test no longer shows the hole (copies landed %v)", next)
			}
			t.Logf("none declared; copies landed %v; holding %t", next, b.tr.Holding())
		})
	}
}

// TestBeaconRecordIdentityCarried: the runner's link for X44's bar. A
// host's beacon, as its agent publishes it (natslease.BeaconMsg, signed
// by the host key), names the record it wrote; the runner hands it to the
// tracker (Runner.beacon, observeBeacons) and a rollback's carry takes it
// as its bar (CountedSilent's Wrote, barOf). A beacon whose seq was raised
// without the host's key is refused by the runner and sets no bar.
func TestBeaconRecordIdentityCarried(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	signer := fencing.Signer{ID: "h1-key", Key: priv}
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{"h1": {{ID: "h1-key", Key: pub}}}}
	b, _ := x11Fleet(t, 3, 5)
	r := &Runner{Tracker: b.tr, Store: &natslease.Store{Keys: ring}}
	var refused []error
	r.OnBeacon = func(_ string, _ fencing.Beacon, err error) {
		if err != nil {
			refused = append(refused, err)
		}
	}
	listed := b.tr.hosts["h1"].rec
	now := t0.Add(6 * time.Second)
	beacon := func(seq uint64, tamper func([]byte) []byte) {
		t.Helper()
		w := listed
		w.Seq = seq
		m, err := natslease.BeaconMsg(signer, w, b.rev+1, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		if tamper != nil {
			m.Data = tamper(m.Data)
		}
		box := newBeaconBox()
		r.beacon(m, box)
		revs, _ := box.take()
		r.observeBeacons(now, revs)
	}
	bar := func() fencing.LeaseRecord {
		t.Helper()
		for _, c := range b.tr.CountedSilent(now) {
			if c.Host == "h1" {
				return barOf(c.Record, c.Wrote)
			}
		}
		t.Fatal("h1, active, not carried by CountedSilent")
		return fencing.LeaseRecord{}
	}
	if got := bar().Seq; got != listed.Seq {
		t.Fatalf("before any beacon with a seq: bar seq %d, want the trusted record's %d", got, listed.Seq)
	}
	beacon(listed.Seq+40, nil)
	if len(refused) != 0 {
		t.Fatalf("genuine beacon refused: %v", refused)
	}
	if got := bar(); got.Seq != listed.Seq+40 || got.Incarnation != listed.Incarnation || got.Epoch != listed.Epoch {
		t.Fatalf("after h1's beacon naming seq %d: bar %d/%d/%d, want %d/%d/%d", listed.Seq+40, got.Epoch, got.Incarnation, got.Seq, listed.Epoch, listed.Incarnation, listed.Seq+40)
	}
	beacon(listed.Seq+10, nil) // an older one (a delayed or replayed beacon) lowers nothing
	if got := bar().Seq; got != listed.Seq+40 {
		t.Fatalf("an older beacon set the bar back to seq %d", got)
	}
	beacon(listed.Seq+41, func(d []byte) []byte {
		return bytes.Replace(d, fmt.Appendf(nil, `"seq":%d`, listed.Seq+41), fmt.Appendf(nil, `"seq":%d`, listed.Seq+900), 1)
	})
	if len(refused) != 1 || !strings.Contains(refused[0].Error(), "not signed") {
		t.Fatalf("a beacon whose seq was raised without h1's key: refused %v, want one 'not signed' refusal", refused)
	}
	if got := bar().Seq; got != listed.Seq+40 {
		t.Fatalf("the tampered beacon moved the bar to seq %d", got)
	}
}
