package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X36: attacks on the early beacons (commit 90f701e: keepEarly,
// replayEarly at WatchStarted and at each Tick) and their interaction
// with the loss windows, the hidden-write notes and the chain.

// signedTracker: a fresh tracker, signatures required, the test hosts
// enrolled (enrolledH).
func signedTracker(t *testing.T) *Tracker {
	t.Helper()
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	tr.SetEnrolled(enrolledH)
	return tr
}

// boundFleet: h0..h9 listed (trusted, signed) at t0, the listing over, the
// memory restored (their beacons bind them), the guard published. It
// returns the tracker and the next free revision.
func boundFleet(t *testing.T) (*Tracker, uint64) {
	t.Helper()
	tr := signedTracker(t)
	for i := range 10 {
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		r.Signer = fmt.Sprintf("h%d-key", i)
		tr.Skipped(uint64(1 + i))
		missStored(tr, t0, r.Host, uint64(1+i), t0.Add(-time.Second))
		tr.Observe(t0, r.Host, uint64(1+i), r)
	}
	tr.WatchStarted(t0)
	for _, name := range tr.Hosts() {
		tr.RestoreMemory(t0, name, Memory{Beacons: true})
	}
	tr.GuardPublished(tr.Guard(), nil)
	return tr, 100
}

// x36Tick is the runner's tick at now: the missing beacons, then Tick.
// It reports victim's declaration and refusal, and fails on any other
// host declared.
func x36Tick(t *testing.T, tr *Tracker, now time.Time, victim string, declared *time.Time, refused *bool) {
	t.Helper()
	if m, r := tr.BeaconsMissing(now); len(m) > 0 || len(r) > 0 {
		t.Logf("%s: BeaconsMissing: missing %v, refused %v", now.Format("15:04:05.000"), m, r)
	}
	for _, d := range tr.Tick(now) {
		if d.Host == victim && d.Op != OpDeclare && d.Op != OpRefusedDue {
			t.Logf("%s: %s %s: %s", now.Format("15:04:05.000"), d.Op, victim, d.Reason)
		}
		switch {
		case d.Op == OpRefusedDue && d.Host == victim:
			if !*refused {
				t.Logf("%s: %s refused-due: %s", now.Format("15:04:05.000"), victim, d.Reason)
			}
			*refused = true
		case d.Op == OpDeclare && d.Host == victim:
			if declared.IsZero() {
				*declared = now
				t.Logf("%s: %s DECLARED: %s", now.Format("15:04:05.000"), victim, d.Reason)
			}
		case d.Op == OpDeclare:
			t.Fatalf("declared the live %s", d.Host)
		}
	}
}

// TestX36HiddenWriteBeforeReplayUnnoted (S1: a compromised node + a
// beacon loss the runner SEES — the node may cause it by flooding its own
// beacon subject past the subscription's pending limit; the timing of
// X35's new-host case). 90f701e keeps the beacons of a host not tracked
// yet and replays them at the next Tick after its first value — but
// whether a hidden write is noted (afterSkip → noteHidden, the write a
// loss window refuses) is decided when the write is DELIVERED, by
// hasBeaconed, i.e. by the beacons already applied. A new host h10
// (first record A, its beacon received and kept early), withdraws (W,
// its beacon dropped by the runner's subscription: the runner's counters
// see it — BeaconsLost, a loss window over W's time); the compromised
// node overwrites W with G. The lagging watch delivers A and then G in
// the same 250 ms tick interval (the backlog drained): at G's delivery
// h10's kept beacon is not replayed yet, hasBeaconed is false, no hidden
// write is noted, G takes observeInvalid's lenient path (clock restarted)
// — the loss window, which covers W, covers nothing of h10's, and h10 is
// declared lease_ttl + grace after G while its guests run. For a tracked
// host the same loss is refused-due (the control: G delivered after the
// tick that replayed h10's beacon).
// Fix (sketch): replay a host's kept beacons as soon as it becomes
// tracked (in Observe / ObserveWritten / ObserveInvalid / observeDeleted
// of an untracked host, before afterSkip decides), not at the next Tick;
// or have the replay re-run afterSkip for a value delivered after a skip
// since the host was tracked.
// Closed: both (whenTracked, bindLate); the mutation undoes both.
func TestX36HiddenWriteBeforeReplayUnnoted(t *testing.T) {
	for _, c := range []struct {
		name      string
		gAfterTik bool // G delivered after the tick that replayed h10's kept beacon
		muts      []*bool
	}{
		{name: "G-same-tick-as-A"},
		{name: "control-G-after-next-tick", gAfterTik: true},
		{name: "G-same-tick-as-A/earlyReplayAtTickMutation+lateBindMutation", muts: []*bool{&earlyReplayAtTickMutation, &lateBindMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			tr, rev := boundFleet(t)
			at := t0.Add(time.Second)
			aRev, wRev, gRev := rev+1, rev+2, rev+3
			rev += 3
			r10 := rec("h10", fencing.BackstopReset)
			r10.Signer = "h10-key"
			dl := at.Add(20 * time.Second) // the watch's backlog reaches A
			var declared time.Time
			refused := false
			for ms := 0; ms <= 200_000; ms += 10 {
				now := at.Add(time.Duration(ms) * time.Millisecond)
				switch now.Sub(at) {
				case 50 * time.Millisecond:
					// A's beacon: h10 not tracked yet → kept (keepEarly).
					tr.BeaconChain(now, "h10", aRev, 0)
					tr.ObserveBeacon(now, "h10", aRev)
					t.Logf("%s: h10's beacon of A (rev %d) received, h10 not tracked: kept early", now.Format("15:04:05.000"), aRev)
				case 2000 * time.Millisecond:
					t.Logf("%s: h10 withdraws (W, rev %d); its withdrawal beacon is dropped by the subscription (slow consumer); the node overwrites W with G (rev %d)", now.Format("15:04:05.000"), wRev, gRev)
				case 2250 * time.Millisecond:
					// The runner's tick sees the subscription's drop.
					refusedNow := tr.BeaconsLost(at.Add(2000*time.Millisecond), now)
					t.Logf("%s: runner: beacons lost (slow consumer) in [%s, %s]; refused now: %v", now.Format("15:04:05.000"),
						at.Add(2000*time.Millisecond).Format("15:04:05.000"), now.Format("15:04:05.000"), refusedNow)
				}
				switch now {
				case dl.Add(10 * time.Millisecond):
					tr.Stored("h10", aRev, at)
					tr.ObserveWritten(now, "h10", aRev, r10, fencing.Written{Known: true, HasExpected: true, Expected: r10.PrevRev})
					t.Logf("%s: the watch delivers A (h10's first record): h10 tracked; its kept beacon waits for the next Tick", now.Format("15:04:05.000"))
				case dl.Add(30 * time.Millisecond), dl.Add(280 * time.Millisecond):
					if (now == dl.Add(280*time.Millisecond)) != c.gAfterTik {
						break
					}
					tr.Skipped(gRev)
					tr.Stored("h10", gRev, at.Add(2100*time.Millisecond))
					tr.ObserveInvalid(now, "h10", gRev, "undecodable value (garbage)", false)
					t.Logf("%s: the watch delivers G after a skip (W superseded): hasBeaconed(h10)=%t, hidden write noted: rev %d, lostBeacon %d",
						now.Format("15:04:05.000"), tr.hasBeaconed(tr.hosts["h10"]), tr.hosts["h10"].hidden.rev, tr.hosts["h10"].lostBeacon)
				}
				if ms%1000 == 0 {
					x26Renew(tr, now, &rev, true, "")
				}
				if ms%250 == 0 {
					x36Tick(t, tr, now, "h10", &declared, &refused)
					if !declared.IsZero() {
						break
					}
				}
			}
			h := tr.hosts["h10"]
			t.Logf("h10: beaconed %t, hidden %+v, lostBeacon %d, windows %+v", tr.hasBeaconed(h), h.hidden, h.lostBeacon, tr.lossWindows)
			if x36Mutated(t, c.muts, !declared.IsZero(), declared.Sub(at.Add(2*time.Second))) {
				return
			}
			if !declared.IsZero() {
				t.Fatalf("the withdrawn h10 (guests running) declared %s after its withdrawal: a loss window the runner saw covers W, but G came before the tick that replayed h10's kept beacon, so no hidden write was noted", declared.Sub(at.Add(2*time.Second)))
			}
			if !refused {
				t.Logf("(not refused-due within the run either)")
			}
		})
	}
}

// TestX36StartLossBeforeMemoryRestore (S1: a compromised node, a
// controller (re)starting — or the fresh tracker after a rollback — and
// a beacon loss the runner SEES, which the node may cause by flooding its
// own beacon subject). X35's TestX35EarlyCapDropsWithdrawalUnnoted was
// closed by keeping withdrawal beacons past maxEarlyBeacons; the hole it
// rode is still there for any other loss. While the fresh tracker lists
// the fleet, h3 (listed with its active record) withdraws after the
// listing's snapshot; its withdrawal beacon (and its renewals' beacons
// during the listing) are dropped by the runner's subscription — the
// runner's counters see it, a loss window over W. The node overwrites W
// with G, delivered right after the listing (the watch's backlog) and
// before the first acting tick restores the memory: h3 has no beacon in
// this tracker and is not remembered yet, hasBeaconed is false, no hidden
// write is noted, G restarts its clock; the loss window covers nothing
// of h3's. h3 is declared lease_ttl + grace later while its guests run.
// Control: G delivered after the memory restore — noted, covered,
// refused-due.
// Fix (sketch): restore the memory's Beacons flags at the listing's end
// (WatchStarted, before anything after the listing is observed), or keep
// the values delivered after a skip of hosts not yet bound and re-run
// afterSkip when RestoreMemory/replayEarly binds them.
// Closed: the latter (bindLate; lateBindMutation).
func TestX36StartLossBeforeMemoryRestore(t *testing.T) {
	for _, c := range []struct {
		name         string
		gAfterMemory bool
		muts         []*bool
	}{
		{name: "G-before-memory-restore"},
		{name: "control-G-after-memory-restore", gAfterMemory: true},
		{name: "G-before-memory-restore/lateBindMutation", muts: []*bool{&lateBindMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			tr := signedTracker(t)
			start := t0.Add(100 * time.Second)
			const wRev, gRev = 11, 12
			// The runner's ticks during the listing: its subscription
			// dropped beacons (the node's flood) — h3's withdrawal beacon
			// at start+300ms among them.
			lost := tr.BeaconsLost(start.Add(250*time.Millisecond), start.Add(500*time.Millisecond))
			t.Logf("%s: runner: beacons lost (slow consumer) in [+250ms, +500ms] — h3's withdrawal beacon (W rev %d, written +250ms) among them; refused now: %v", start.Add(500*time.Millisecond).Format("15:04:05.000"), wRev, lost)
			recs, prev := listFleet(tr, start)
			tr.WatchStarted(start.Add(500 * time.Millisecond))
			t.Logf("%s: listing over (h3 listed active, rev 10)", start.Add(500*time.Millisecond).Format("15:04:05.000"))
			g := func(now time.Time) {
				tr.Skipped(gRev)
				missStored(tr, now, "h3", gRev, start.Add(400*time.Millisecond))
				tr.ObserveInvalid(now, "h3", gRev, "undecodable value (garbage)", false)
				h := tr.hosts["h3"]
				t.Logf("%s: G (rev %d, over W) delivered after a skip: hasBeaconed(h3)=%t, hidden rev %d, lostBeacon %d", now.Format("15:04:05.000"), gRev, tr.hasBeaconed(h), h.hidden.rev, h.lostBeacon)
			}
			if !c.gAfterMemory {
				g(start.Add(600 * time.Millisecond)) // the watch's backlog, before the first tick
			}
			for _, name := range tr.Hosts() { // the first acting tick
				tr.RestoreMemory(start.Add(750*time.Millisecond), name, Memory{Beacons: true})
			}
			tr.GuardPublished(tr.Guard(), nil)
			if c.gAfterMemory {
				g(start.Add(800 * time.Millisecond))
			}
			d, refused := fleetRun(t, tr, start, gRev, recs, prev, "h3")
			var declared time.Time
			if d != 0 {
				declared = start.Add(d)
			}
			t.Logf("windows %+v", tr.lossWindows)
			if x36Mutated(t, c.muts, !declared.IsZero(), declared.Sub(start)) {
				return
			}
			if !declared.IsZero() {
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the controller started: the runner saw the loss of its withdrawal beacon, but G came before the memory restore bound h3, so no hidden write was noted", declared.Sub(start))
			}
			if !refused {
				t.Fatalf("h3 neither declared nor refused-due")
			}
		})
	}
}

// TestX36RollbackBeforeHostExistedDropsCarry (S1: a lease-stream
// rollback to before a host's first record — a backup older than the
// host, or a NATS failure losing the recent writes of a host that joined
// recently — plus a compromised node). The stopped tracker knew h10
// withdrawn (its withdrawn record, or — 90f701e's new carry — its
// withdrawal beacon kept early while h10 was not tracked yet) and carries
// it (Withdrawals). The fresh tracker lists the rolled-back stream, in
// which h10's key holds nothing at all (no record, no marker): h10 is not
// tracked, and KeepWithdrawn drops the carry (h == nil). The compromised
// node then writes a copy of h10's genuine first record A (prev_rev 0,
// signed by h10 — it read it with a message get before the rollback) as
// a create on the now empty key, with Nats-Expected-Last-Subject-Sequence
// 0: WrittenOn shows a compare-and-set on revision 0 = A's prev_rev, so
// ObserveWritten takes it as h10's FRESH first record, nothing to compare
// it with (no carry, no pin). h10's agent is stopped (withdrawn, guests
// running): it renews nothing and h10 is declared lease_ttl + grace later,
// by CAS on the node's revision — which holds. Control: the rollback
// leaves h10's key holding a value (listed): the carry is kept, the
// replayed A is refused as not newer than the carried record.
// Fix (sketch): keep the carried withdrawals of hosts not listed yet (a
// carry table looked up when the host is first tracked — Observe,
// ObserveWritten, ObserveInvalid, observeDeleted), as the early beacons
// are; and/or after a rollback, take no create (prev_rev 0) as a fresh
// first record of a host the stopped tracker knew.
// Closed: the former (Tracker.carriedEarly, taken by replayHost;
// carryUntrackedMutation).
func TestX36RollbackBeforeHostExistedDropsCarry(t *testing.T) {
	gateOff(t) // the layers beneath the rollback gate (rollbackgate_test.go)
	for _, c := range []struct {
		name       string
		early      bool // the stopped tracker knew the withdrawal by its kept (early) beacon only
		keyInStore bool // control: the rolled-back stream still holds A in h10's key
		muts       []*bool
	}{
		{name: "withdrawn-record-key-gone"},
		{name: "early-withdrawal-beacon-key-gone", early: true},
		{name: "control-withdrawn-record-key-kept", keyInStore: true},
		{name: "withdrawn-record-key-gone/carryUntrackedMutation", muts: []*bool{&carryUntrackedMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			tr, rev := boundFleet(t)
			at := t0.Add(time.Second)
			x26Renew(tr, at, &rev, true, "")
			a := rec("h10", fencing.BackstopReset)
			a.Signer, a.Sig, a.Incarnation, a.Seq = "h10-key", "sig-a", 1, 1
			aRev := rev + 1
			rev++
			wRec := *a
			wRec.State, wRec.Sig, wRec.Seq, wRec.PrevRev = fencing.LeaseWithdrawn, "sig-w", 2, aRev
			wRev := rev + 1
			rev++
			if c.early {
				// h10 not tracked yet (the lagging watch): its beacons kept.
				tr.BeaconChain(at.Add(100*time.Millisecond), "h10", aRev, 0)
				tr.ObserveBeacon(at.Add(100*time.Millisecond), "h10", aRev)
				tr.BeaconChain(at.Add(2*time.Second), "h10", wRev, aRev)
				tr.ObserveBeacon(at.Add(2*time.Second), "h10", wRev)
				tr.ObserveWithdrawal(at.Add(2*time.Second), "h10", wRev)
				t.Logf("h10 joins (A rev %d) and withdraws (W rev %d); its beacons came before the watch delivered A: kept early", aRev, wRev)
			} else {
				tr.ObserveWritten(at.Add(100*time.Millisecond), "h10", aRev, a, fencing.Written{Known: true, HasExpected: true, Expected: 0})
				tr.ObserveBeacon(at.Add(100*time.Millisecond), "h10", aRev)
				tr.Observe(at.Add(2*time.Second), "h10", wRev, &wRec)
				tr.ObserveBeacon(at.Add(2*time.Second), "h10", wRev)
				t.Logf("h10 joins (A rev %d) and withdraws (W rev %d, seen)", aRev, wRev)
			}
			now := at.Add(3 * time.Second)
			withdrawn := tr.Withdrawals()
			counted := tr.CountedSilent(now)
			tr.StreamRolledBack(now, "test rollback")
			t.Logf("rollback found: carried withdrawals %v", withdrawn)

			nt := signedTracker(t)
			nt.AfterRollback(wRev)
			nstart := now.Add(2 * time.Second)
			nrev := uint64(0)
			for i := range 10 { // the backup: h0..h9's records, from before h10 joined
				r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
				r.Signer = fmt.Sprintf("h%d-key", i)
				nrev++
				nt.ObserveWritten(nstart, r.Host, nrev, r, fencing.Written{Known: true, HasExpected: true, Expected: r.PrevRev})
			}
			if c.keyInStore {
				nrev++
				nt.ObserveWritten(nstart, "h10", nrev, a, fencing.Written{Known: true, HasExpected: true, Expected: 0})
			}
			nt.WatchStarted(nstart)
			for _, w := range withdrawn {
				ds := nt.KeepWithdrawn(w, wRev)
				t.Logf("fresh tracker: KeepWithdrawn(%s) → %d decisions (h10 tracked: %t)", w.Host, len(ds), nt.hosts[w.Host] != nil)
			}
			for _, h := range counted {
				nt.KeepCounted(h)
			}
			nt.GuardPublished(nt.Guard(), nil)
			// The compromised node: a copy of A, as a create on the key.
			nrev++
			cp := *a
			for _, d := range nt.ObserveWritten(nstart.Add(500*time.Millisecond), "h10", nrev, &cp, fencing.Written{Known: true, HasExpected: true, Expected: 0}) {
				t.Logf("node's copy of A at rev %d: %s %s", nrev, d.Op, d.Reason)
			}
			h := nt.hosts["h10"]
			t.Logf("after the node's copy of A at rev %d: h10 state %q trustedRev %d, withdrawnRev %d, carried %t", nrev, h.rec.State, h.trustedRev, h.beacons.withdrawnRev, h.carried != nil)
			declared, _ := x26Run(t, nt, nstart, 120, &nrev, "h10")
			if x36Mutated(t, c.muts, declared != 0, declared) {
				return
			}
			if declared != 0 {
				t.Fatalf("the withdrawn h10 (guests running) declared %s after the fresh tracker started: the rollback emptied its key, KeepWithdrawn dropped the carry (h10 not listed), and a compromised node's copy of its first record was taken as fresh", declared)
			}
		})
	}
}

// x36Ev is one event of x36Sim at `at`.
type x36Ev struct {
	at time.Time
	fn func(now time.Time)
}

// TestX36ReplayOrderHidesChainGap (S1, narrow: a compromised node + a
// route/leaf loss the runner's counters do not see that drops the
// withdrawing host's beacon and a beacon of a host new to the controller;
// timing: the new host's first delivered record and its next beacon
// before the same tick). h3 withdraws (W), the node overwrites W with G;
// the same route loss drops h3's withdrawal beacon and h10's beacon B3
// (h10: a host that joined recently, not tracked yet under the lagging
// watch: its beacons B1, B2 kept early). The evidence the design relies
// on for such a loss is h10's chain: B4 names B3 (prev), above B2, the
// last received — a gap, a loss window covering G. But h10 becomes
// tracked when the watch delivers R3 (its first delivered record; R1, R2
// were superseded under the lag) and B4 arrives before the next Tick:
// processed directly, it is this tracker's first beacon of h10 (last 0:
// chainFrom = prev, no gap). At the Tick, B1 and B2 are replayed —
// BeaconChain ignores them (rev <= chainRev). No gap is ever seen; R3
// expected no beacon (h10 had not beaconed at its delivery); h3's own
// expectation is by h3. h3 is declared while its guests run. Control: B4
// arriving after that Tick: the replay comes first, B4 shows the gap, h3
// refused-due.
// Fix (sketch): replay a host's kept beacons when it becomes tracked
// (before any later beacon of it is processed), or have BeaconChain keep
// early beacons' chain state (chainRev/chainAt) for untracked hosts so
// order is preserved.
// Closed: the former (whenTracked; earlyReplayAtTickMutation).
func TestX36ReplayOrderHidesChainGap(t *testing.T) {
	for _, c := range []struct {
		name    string
		b4Later bool
		muts    []*bool
	}{
		{name: "B4-before-tick"},
		{name: "control-B4-after-tick", b4Later: true},
		{name: "B4-before-tick/earlyReplayAtTickMutation", muts: []*bool{&earlyReplayAtTickMutation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x36Mutate(t, c.muts...)
			tr, rev := boundFleet(t)
			S := t0.Add(time.Second)
			const lag = 2 * time.Second
			T := S.Add(10 * time.Second) // h3 withdraws; ticks at S + k*250ms
			recs := map[string]*fencing.LeaseRecord{}
			for i := range 11 {
				r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
				r.Signer = fmt.Sprintf("h%d-key", i)
				recs[r.Host] = r
			}
			// The writes, in stream order: the others (h0..h9; h3 until
			// T) every second, h10 every 2 s from T-4s, h3's W at T and
			// the node's G over it at T+100ms.
			type wr struct {
				at     time.Time
				host   string
				kind   string // "rec", "W", "G"
				beacon time.Duration
				lost   bool
			}
			var ws []wr
			for s := S; s.Before(S.Add(120 * time.Second)); s = s.Add(time.Second) {
				for i := range 10 {
					host := fmt.Sprintf("h%d", i)
					if host == "h3" && !s.Before(T.Add(-500*time.Millisecond)) {
						continue
					}
					ws = append(ws, wr{at: s.Add(time.Duration(i) * 5 * time.Millisecond), host: host, kind: "rec", beacon: 10 * time.Millisecond})
				}
			}
			ws = append(ws, wr{at: T, host: "h3", kind: "W", lost: true}, wr{at: T.Add(100 * time.Millisecond), host: "h3", kind: "G"})
			b4 := 20 * time.Millisecond // B4 processed at T+2.02s, before the tick at T+2.25s
			if c.b4Later {
				b4 = 270 * time.Millisecond // after it
			}
			for k := range 50 {
				w := wr{at: T.Add(time.Duration(k-2) * 2 * time.Second).Add(-10 * time.Millisecond), host: "h10", kind: "rec", beacon: 10 * time.Millisecond}
				switch k {
				case 2:
					w.lost = true // B3, lost on the route with h3's withdrawal beacon
				case 3:
					w.beacon = b4
				}
				ws = append(ws, w)
			}
			for i := 1; i < len(ws); i++ {
				for j := i; j > 0 && ws[j].at.Before(ws[j-1].at); j-- {
					ws[j], ws[j-1] = ws[j-1], ws[j]
				}
			}
			var evs []x36Ev
			add := func(at time.Time, fn func(time.Time)) { evs = append(evs, x36Ev{at, fn}) }
			prev := map[string]uint64{}
			for i := range 10 {
				prev[fmt.Sprintf("h%d", i)] = uint64(1 + i) // their beacons chain on from the listed records' (boundFleet)
			}
			h10n := 0
			for _, w := range ws {
				rev++
				r, p, host, stored := rev, prev[w.host], w.host, w.at
				prev[w.host] = r
				if w.kind == "G" {
					add(stored.Add(lag), func(now time.Time) {
						tr.Skipped(r)
						missStored(tr, now, host, r, stored)
						tr.ObserveInvalid(now, host, r, "undecodable value (garbage)", false)
						t.Logf("%s: G (rev %d, over h3's W) delivered after a skip: h3's hidden write noted %t", now.Format("15:04:05.000"), r, tr.hosts["h3"].hidden.rev != 0)
					})
					continue
				}
				if w.kind == "W" {
					t.Logf("%s: h3 withdraws (W rev %d): its beacon lost on a route; the node overwrites W", w.at.Format("15:04:05.000"), r)
					continue
				}
				if !w.lost {
					add(w.at.Add(w.beacon), func(now time.Time) {
						gap := tr.BeaconChain(now, host, r, p)
						if gap {
							tr.RefuseCovered()
						}
						tr.ObserveBeacon(now, host, r)
						if host == "h10" && now.Before(T.Add(5*time.Second)) {
							t.Logf("%s: h10's beacon (rev %d, prev %d): tracked %t, chain gap seen %t", now.Format("15:04:05.000"), r, p, tr.hosts["h10"] != nil, gap)
						}
					})
				} else if host == "h10" {
					t.Logf("%s: h10's beacon of rev %d lost on the route", w.at.Format("15:04:05.000"), r)
				}
				if host == "h10" {
					h10n++
					switch {
					case h10n < 3:
						continue // R1, R2: superseded before the lagging watch reached them
					case h10n == 3:
						pr := p
						add(T.Add(2005*time.Millisecond), func(now time.Time) {
							missStored(tr, now, host, r, stored)
							r10 := *recs["h10"]
							r10.PrevRev = pr
							tr.Skipped(r)
							tr.ObserveWritten(now, host, r, &r10, fencing.Written{Known: true, HasExpected: true, Expected: pr})
							t.Logf("%s: the watch delivers R3 (rev %d), h10's first delivered record: tracked; its kept beacons wait for the next Tick", now.Format("15:04:05.000"), r)
						})
						continue
					}
				}
				add(stored.Add(lag), func(now time.Time) {
					missStored(tr, now, host, r, stored)
					if host == "h10" {
						r10 := *recs["h10"]
						r10.PrevRev = p
						tr.Observe(now, host, r, &r10)
						return
					}
					tr.Observe(now, host, r, recs[host])
				})
			}
			declared, refused := x36RunEvents(t, tr, evs, S, 120, "h3")
			t.Logf("h10 chain: from %d to %d; refused %t; windows %+v", tr.hosts["h10"].beacons.chainFrom, tr.hosts["h10"].beacons.chainRev, refused, tr.lossWindows)
			if x36Mutated(t, c.muts, !declared.IsZero(), declared.Sub(T)) {
				return
			}
			if !declared.IsZero() {
				t.Fatalf("the withdrawn h3 (guests running) declared %s after its withdrawal: the route loss that dropped its withdrawal beacon also dropped h10's B3, but h10's B4 was processed before its kept beacons were replayed, so the chain saw no gap", declared.Sub(T))
			}
		})
	}
}

// x36RunEvents runs evs in time order with the runner's ticks every
// 250 ms from S for secs seconds (the server's clock sampled every 2 s),
// until victim is declared; it returns when (zero: never) and whether it
// was refused-due.
func x36RunEvents(t *testing.T, tr *Tracker, evs []x36Ev, S time.Time, secs int, victim string) (time.Time, bool) {
	t.Helper()
	var declared time.Time
	refused := false
	for k := 0; k <= secs*4; k++ {
		at := S.Add(time.Duration(k) * 250 * time.Millisecond)
		evs = append(evs, x36Ev{at.Add(time.Nanosecond), func(now time.Time) {
			if k%8 == 0 {
				tr.ServerTime(now, now.Add(time.Millisecond), now.Add(-time.Millisecond), 0)
			}
			x36Tick(t, tr, now, victim, &declared, &refused)
		}})
	}
	slicesSortEvs(evs)
	for _, e := range evs {
		if !declared.IsZero() {
			break
		}
		e.fn(e.at)
	}
	return declared, refused
}

func slicesSortEvs(evs []x36Ev) {
	for i := 1; i < len(evs); i++ { // stable insertion sort by time
		for j := i; j > 0 && evs[j].at.Before(evs[j-1].at); j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
}

// x36Mutate turns the mutations on for t.
func x36Mutate(t *testing.T, muts ...*bool) {
	for _, m := range muts {
		x32Mutate(t, m)
	}
}

// x36Mutated: under mutations the hole must show (declared); it reports
// whether the case was a mutation case (checked here).
func x36Mutated(t *testing.T, muts []*bool, declared bool, after time.Duration) bool {
	t.Helper()
	if len(muts) == 0 {
		return false
	}
	if !declared {
		t.Fatalf("with the mutation the withdrawn host was not declared: the test no longer shows the hole")
	}
	t.Logf("with the mutation: declared %s", after)
	return true
}

// TestReplayKeepsLastBeacon (X36's "replay moves t.lastBeacon back",
// (c)): a new host's beacon kept 6 minutes before a lagging watch tracks
// it, replayed then, must not set the fleet's last beacon back past
// BeaconTrustWindow — the tracker would turn lenient for every host.
func TestReplayKeepsLastBeacon(t *testing.T) {
	tr, rev := boundFleet(t)
	early := t0.Add(time.Minute)
	tr.BeaconChain(early, "h10", rev+1, 0)
	tr.ObserveBeacon(early, "h10", rev+1) // h10 not tracked: kept
	now := early.Add(6 * time.Minute)
	x26Renew(tr, now, &rev, true, "") // the fleet's beacons, now
	r10 := rec("h10", fencing.BackstopReset)
	r10.Signer = "h10-key"
	tr.Stored("h10", 101, early)
	tr.ObserveWritten(now.Add(time.Second), "h10", 101, r10, fencing.Written{Known: true, HasExpected: true, Expected: r10.PrevRev})
	if got := tr.lastBeacon; got.Before(now) {
		t.Fatalf("the fleet's last beacon is %s after h10's kept beacon was replayed, want %s or later: beaconsBind lapses (%t)", got.Sub(t0), now.Sub(t0), tr.beaconsBind(tr.hosts["h0"], now.Add(2*time.Second)))
	}
	if tr.hosts["h10"].beacons.at.IsZero() {
		t.Fatalf("h10's kept beacon was not replayed when the watch tracked it")
	}
}
