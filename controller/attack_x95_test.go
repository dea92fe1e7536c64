package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X95 (attack, (S)): reviewer X94's escape in Tracker.adjacent
// (a record sealed at or above h.beacons.maxRev is adjacent even when
// older than h.beacons.wrote) assumes wrote and maxRev move together. They
// do on the runner's path (observeBeacons: ObserveBeacon, BeaconWrote) but
// not for a host not tracked yet: BeaconWrote keeps the write in
// t.earlyWrote until the host is tracked, for ever, while ObserveBeacon's
// kept call (the one that raises maxRev) is dropped after earlyKeep
// (10 min) — and the withdrawal beacon (earlyWithdrawn) is kept for ever
// too. Tracked later, the host is withdrawn by its beacon, wrote names
// the withdrawal, maxRev is 0: every adjacent record escapes the wrote
// bar, X93's copy included.
//
// The scenario: V (compute-3) comes back in the stream's life 1 — an
// anchored create R1 sealed for its key's marker at X, then its orderly
// withdrawal W (guests run on) — while C1's watch lags behind X (V not
// tracked: its beacons of R1 and W are kept early). The stream rolls back
// to a backup before X (C1 never saw any revision it lost: nothing for
// its rollback check to find). The compromised node deletes V's key so
// the marker lands at revision X again in life 2, fills the stream past
// W's revision with writes of its own key, and puts a copy of R1. C1's
// watch, 10+ minutes behind V's beacons, delivers the marker live (V
// tracked: its kept withdrawal replayed, wrote = W, maxRev 0) and then
// the copy with After = X: adjacent, written fresh, trusted — its
// revision above W's, the withdrawal ends and V, its guests running, is
// declared lease_ttl + grace later (the runner's receipt check,
// SealedBefore, stops it only if V's withdrawal receipt survived the
// rollback and is read: X93's "none" residual otherwise — but here V's
// beacons did arrive, the case X93's wrote bar exists for).
//
// Fix: BeaconWrote raises the bar the escape compares with
// (beaconState.wroteMax, early ones carried with earlyWrote);
// with adjacentWroteMaxMutation (the escape on maxRev alone) V is
// declared.
func TestX95EarlyWroteEscapesAdjacencyBar(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mut   *bool
		mut2  *bool         // a second mutation on (the withdrawnBar layer off too)
		early time.Duration // beacons before V is tracked
		want  bool          // declared
	}{
		{name: "kept-beacons", early: time.Minute, want: false},
		{name: "expired-beacons", early: earlyKeep + time.Minute, want: false},
		// V is withdrawn by its beacon: reviewer X96's rule (no escape
		// while withdrawn) stops it too — off, to show this layer.
		{name: "expired-beacons/adjacentWroteMaxMutation", mut: &adjacentWroteMaxMutation, early: earlyKeep + time.Minute, want: false},
		{name: "expired-beacons/adjacentWroteMaxMutation+withdrawnFreshMutation", mut: &adjacentWroteMaxMutation, mut2: &withdrawnFreshMutation, early: earlyKeep + time.Minute, want: true},
		{name: "expired-beacons/adjacentMutation", mut: &adjacentMutation, early: earlyKeep + time.Minute, want: false},
		{name: "expired-beacons/adjacentBootMutation", mut: &adjacentBootMutation, early: earlyKeep + time.Minute, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x32Mutate(t, tc.mut)
			x32Mutate(t, tc.mut2)
			cfg := DefaultConfig()
			cfg.GuardCount, cfg.GuardShare = 100, 1
			tr, err := NewTracker(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			x := &x71Rig{t: t, tr: tr, now: t0}
			tr.WatchStarted(x.now)

			// Life 1: V's create R1 on its marker at X, then W.
			const X = 200
			r := rec(x71Host, fencing.BackstopWatchdog)
			r.Signer, r.Sig, r.BootID, r.Epoch, r.Incarnation = x71Host+"-key", "signed", "boot-1", 1, 1
			r1 := *r
			r1.Seq, r1.PrevRev, r1.State = 1, X, fencing.LeaseActive
			w := *r
			w.Seq, w.PrevRev, w.State, w.Reason = 2, X+1, fencing.LeaseWithdrawn, "orderly-stop"
			x.now = x.now.Add(time.Second)
			x.beacon(X+1, r1) // V not tracked: kept early
			x.now = x.now.Add(100 * time.Millisecond)
			x.beacon(X+2, w)
			if tr.hosts[x71Host] != nil {
				t.Fatalf("rig: V tracked before its marker")
			}
			// C1's watch lags; ticks go on.
			for end := x.now.Add(tc.early); x.now.Before(end); {
				x.now = x.now.Add(10 * time.Second)
				x.keep(tr.Tick(x.now))
			}

			// Life 2: the node's marker at X, delivered live.
			x.del(X)
			h := tr.hosts[x71Host]
			if h == nil {
				t.Fatalf("rig: V not tracked at its marker")
			}
			t.Logf("V tracked at %d: wrote %+v maxRev %d withdrawnRev %d", h.rev, h.beacons.wrote, h.beacons.maxRev, h.beacons.withdrawnRev)
			if h.beacons.withdrawnRev != X+2 {
				t.Fatalf("rig: V's withdrawal beacon not replayed (withdrawnRev %d)", h.beacons.withdrawnRev)
			}
			// The copy of R1 past W's revision (the node's own writes
			// between: nothing of the bucket skipped), After = X.
			x.now = x.now.Add(time.Second)
			cp := r1
			x.value(X+5, cp, fencing.Written{After: X})
			h = tr.hosts[x71Host] // recreated over the marker
			t.Logf("after the copy at %d: V judged by %q seq %d at %d, withdrawn by beacon %t", X+5, h.rec.State, h.rec.Seq, h.trustedRev, h.beaconWithdrawn())
			// The runner's receipt layer, when V's withdrawal receipt
			// survived the rollback (not in this case: restored from the
			// same backup, or unread), would stop the declaration.
			rc := fencing.Beacon{Host: x71Host, BootID: w.BootID, State: fencing.LeaseWithdrawn, Revision: X + 2, Epoch: 1, Incarnation: 1, Seq: w.Seq}
			t.Logf("a surviving receipt of W: SealedBefore %t", tr.SealedBefore(x71Host, rc))
			d, after, ok := x.tick(5 * time.Minute)
			if ok {
				t.Logf("declared %s after the copy: %s", after, d.Reason)
			}
			if ok != tc.want {
				t.Errorf("(S) V withdrawn by its own beacon (W at %d), copy of R1 at %d: declared %t, want %t", X+2, X+5, ok, tc.want)
			}
		})
	}
}
