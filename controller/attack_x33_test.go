package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X33: attacks on 921da64 (companionsChecked through the watch's
// skips, ownAfterSkip, FenceBy bound). Helpers: attack_x32_test.go
// (x32Sim), beaconmiss_test.go. Findings (each test fails while the hole
// is open; "held/…" subtests are controls that pass):
//   - (S, conditional: an agent whose renewals peers relay, or a Held
//     agent) TestX33RelayedWithdrawerStaleAlive: `alive` is not an upper
//     bound of the withdrawer's last sign of life;
//   - (S, conditional: mixed timings) TestX33SlowCompanionBeyondCompanionDelay:
//     companionDelay (5 s) is shorter than a slow companion's renewal
//     interval;
//   - (S, conditional: a withdrawal during a starting controller's first
//     listing) TestX33WithdrawalBeaconDuringListing: beacons of hosts not
//     tracked yet are dropped;
//   - (c, servers without the stream info's clock)
//     TestX33NoServerClockSparseBursts: +30 s steps make sparse bursts
//     keep a garbled dead host undeclared.

// x33Relayed runs TestX33RelayedWithdrawerStaleAlive's scenario: h3
// renews directly until A, then (relayed) through peers' relays the
// node's flood supersedes before delivery (no beacon), withdraws at W
// (its beacon lost with h5's R2's, the withdrawal hidden), h5 blocked and
// the watch flooded until W + 30 s. anchor: reviewer X34's garbage G0
// over h3's key, delivered 4 s into the relayed phase; reconnect: h3's
// relayed-landing beacons (8f3f9bd), buffered while it was cut off,
// arrive 1 s before W. It returns how long after W h3 was declared (0:
// never) and the simulator.
func x33Relayed(t *testing.T, relayed, anchor, reconnect bool) (time.Duration, *x32Sim) {
	t.Helper()
	A := t0.Add(40 * time.Second)        // h3's last direct renewal (and beacon)
	W := t0.Add(70 * time.Second)        // the withdrawal
	R2 := W.Add(time.Second)             // h5's renewal, its beacon lost with W's
	end := W.Add(30 * time.Second)       // the flood and h5's blocking end
	G0 := A.Add(4100 * time.Millisecond) // just after h3's relay stored at A+3.5 s (written at A+4 s)
	lag := func(stored time.Time) time.Duration {
		switch {
		case anchor && !stored.Before(A.Add(3400*time.Millisecond)) && !stored.After(G0):
			return 300 * time.Millisecond // the flood paused: G0 delivered (its relay superseded)
		case relayed && !stored.Before(A.Add(-time.Second)) && stored.Before(W.Add(-1500*time.Millisecond)):
			return 2500 * time.Millisecond // relays superseded before delivery
		case !stored.Before(W.Add(-3*time.Second)) && stored.Before(W):
			return 600 * time.Millisecond // W hidden by G before delivery
		case stored.After(W.Add(600*time.Millisecond)) && stored.Before(end):
			return 8 * time.Second // the flood after the hiding
		}
		return 0
	}
	s := newX32SimDefault(t, lag)
	may := set("h5") // blocked: it may fence
	var relays []uint64
	var declared time.Duration
	for ms := 1000; ms <= 180000 && declared == 0; ms += 10 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if ms%1000 == 0 {
			for i := range 10 {
				name := fmt.Sprintf("h%d", i)
				if name == "h3" || name == "h5" && !now.Before(R2) && now.Before(end) {
					continue
				}
				s.renew(now.Add(time.Duration(i)*10*time.Millisecond), name, false)
			}
		}
		if ms%2000 == 0 && now.Before(W) {
			switch {
			case !now.After(A) || !relayed:
				s.renew(now.Add(-500*time.Millisecond), "h3", false)
			default:
				relays = append(relays, s.write(now.Add(-500*time.Millisecond), "h3", s.recs["h3"])) // relayed by a peer: no beacon
			}
		}
		if reconnect && now.Equal(W.Add(-time.Second)) {
			for _, r := range relays { // published while cut off, sent at reconnection
				s.tr.BeaconChain(now, "h3", r, s.prev["h3"])
				s.tr.ObserveBeacon(now, "h3", r)
				s.prev["h3"] = r
			}
		}
		if anchor && now.Equal(G0) {
			s.write(now.Add(-60*time.Millisecond), "fake-anchor", nil) // a burst: a skip…
			s.write(now.Add(-30*time.Millisecond), "fake-anchor", nil)
			s.write(now, "h3", nil) // …and the node anchors h3's first hidden write early
		}
		if now.Equal(W) {
			w := *s.recs["h3"]
			w.State = fencing.LeaseWithdrawn
			s.prev["h3"] = s.write(now, "h3", &w)            // its beacon lost on a route…
			s.write(now.Add(50*time.Millisecond), "h3", nil) // …hidden by the node
		}
		if now.Equal(R2) {
			s.renew(now, "h5", true) // …with h5's R2's
		}
		if now.After(R2) && now.Before(end) && ms%100 == 0 {
			s.write(now.Add(50*time.Millisecond), "h5", nil) // h5 kept from renewing
		}
		if now.After(W.Add(50*time.Millisecond)) && !now.After(W.Add(600*time.Millisecond)) && ms%50 == 0 {
			s.write(now, fmt.Sprintf("quiet-%d", ms), nil) // delivered: a place the watch passed with no skip
		}
		if now.After(W.Add(600*time.Millisecond)) && now.Before(end) && ms%100 == 0 {
			s.write(now, fmt.Sprintf("fake-%d", ms), nil) // the flood (made-up keys)
		}
		if ms%100 == 0 && s.step(now, may) {
			declared = now.Sub(W)
		}
		if h := s.tr.hosts["h3"]; ms%1000 == 0 && testing.Verbose() && now.After(W) {
			t.Logf("%s: hidden %+v cc %t refused %t lost %d skips %d", now.Sub(W), h.hidden, s.tr.companionsChecked(now, h), s.refusedH3, h.lostBeacon, len(s.tr.frontier.skips))
		}
	}
	return declared, s
}

// TestX33RelayedWithdrawerStaleAlive (S). companionsChecked bounds the
// withdrawal by the host's last sign of life the tracker knows: its
// newest beacon's arrival or its previous delivered value's stored time
// (alive), + FenceBy. An agent whose renewals a peer relays (its own
// connection to NATS down: AskingPeers, fencing.types) holds its lease —
// it does not fence — and sends no beacon; when the watch lags more than
// its renewal interval (the compromised node's flood), each relayed
// renewal is superseded by the next before the watch reaches it, so the
// tracker's `alive` stays at h3's last direct renewal, 30 s before its
// withdrawal. h3's connection comes back and its orderly stop lands the
// withdrawal W (its beacon lost on a route with the beacon of h5's
// renewal R2, 1 s later: within a renewal interval, as companionDelay
// assumes); the node hides W at once. need = alive + FenceBy + 5 s lies
// 15 s before W; the walk through the skips (h3's relays, the hosts'
// renewals) reaches W's skip, and the first step after it — the 0.5 s
// the watch needs to deliver the garbage — has no skip: companionsChecked
// holds once the watch has passed that place + 10 s. The node then
// floods (lag 8 s) and keeps h5 from renewing (its key overwritten, each
// superseded before delivery — X32's blocked companion); R2's loss is
// found only after the flood: h3 is declared at HiddenWriteWait /
// the frontier's bound, 20 s after its withdrawal, guests running.
// "held/direct": h3 renews directly (with beacons) up to W: alive is
// fresh, need lies past R2 — refused.
// Fix (sketch): a host's last sign of life is not only what the tracker
// saw: a skip over the host's key since its last delivered value (its
// values superseded unseen — a relayed renewal, a blocked agent's
// nothing) leaves it unknown — take alive as the place the watch reached
// when it delivered the hidden write (the stored stamp of the value
// after the gap, i.e. hidden.before) when a skip lies between
// hidden.after and it; or bound need by hidden.before + FenceBy + 5 s
// (the withdrawal was hidden before hidden.before, and a companion lost
// beside it was written within companionDelay of it).
func TestX33RelayedWithdrawerStaleAlive(t *testing.T) {
	for _, c := range []struct {
		name         string
		relayed      bool
		wantDeclared bool
		mut          *bool // a mutation reopening the hole (want declared)
	}{
		{name: "relayed-30s", relayed: true},
		{name: "held/direct", relayed: false},
		{name: "relayed-30s/firstBeforeMutation", relayed: true, wantDeclared: true, mut: &firstBeforeMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			declared, s := x33Relayed(t, c.relayed, false, false)
			s.verdict(declared, c.wantDeclared, "the withdrawal", "h3's relayed renewals (no beacon) superseded before delivery left `alive` 30 s before the withdrawal: companionsChecked's walk ended right after the hidden withdrawal, before R2 (lost with it) was delivered")
		})
	}
}

// TestX33SlowCompanionBeyondCompanionDelay (S, conditional: mixed timings
// — a companion on the route renews more slowly than every 2.5 s).
// companionDelay (5 s) assumes a renewal lost beside a withdrawal was
// written within "a renewal interval or two" of it — of 2 s. A host may
// run a longer renew_interval (here h5: 10 s, lease_ttl 45 s); the route
// (a leaf connection carrying h3's and h5's beacons) stalls from h3's
// withdrawal W and is closed as a slow consumer 8 s later, dropping W's
// beacon and h5's renewal R2 written 7 s after W. h3 runs the ×0.1 timing:
// need = alive + FenceBy (1 s) + 5 s ≈ W + 5.8 s; the watch passes it with
// no skip, and h3 is declared at ≈ W + 15.8 s (HiddenWriteWait from the
// garbage: W + 15.1 s). R2's beacon is found missing 10 s after its
// delivery (W + 17 s) and h5's next beacon (W + 17 s) shows the chain's
// gap — both too late. No flood, no lag: one burst to hide W.
// "held/h5-default": h5 renews every 2 s (R2 at W + 1 s): refused.
// Fix (sketch): companionDelay from the fleet's timings — the longest
// renew_interval among hosts whose beacons bind them (×2), or per
// companion: need = alive + FenceBy + max over hosts of 2×renew_interval;
// or bound renew_interval (Config.Validate / fencing.Timing) at 2.5 s for
// beacon-bound hosts.
func TestX33SlowCompanionBeyondCompanionDelay(t *testing.T) {
	for _, c := range []struct {
		name         string
		h5Renew      time.Duration
		r2After      time.Duration
		wantDeclared bool
	}{
		{name: "h5-renew-10s", h5Renew: 10 * time.Second, r2After: 7 * time.Second},
		{name: "held/h5-default", h5Renew: 2 * time.Second, r2After: time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newX32Sim(t, func(time.Time) time.Duration { return 0 })
			declared := x33SlowCompanion(t, s, c.h5Renew, 45*time.Second, c.r2After)
			s.verdict(declared, c.wantDeclared, "the withdrawal", fmt.Sprintf("h5 (renew_interval %s) wrote the renewal lost with the withdrawal's beacon %s after it: beyond companionDelay", c.h5Renew, c.r2After))
		})
	}
}

// x33SlowCompanion runs TestX33SlowCompanionBeyondCompanionDelay's
// scenario on s: h5 renews every h5Renew (lease_ttl h5TTL when longer
// than the default 2 s); h3 withdraws at W = t0+60 s, its beacon lost on
// a route that also drops h5's renewal R2, written r2After after W; the
// compromised node hides W with garbage. It returns how long after W h3
// was declared (0: not within 90 s after it).
func x33SlowCompanion(t *testing.T, s *x32Sim, h5Renew, h5TTL, r2After time.Duration) time.Duration {
	t.Helper()
	W := t0.Add(60 * time.Second)
	R2 := W.Add(r2After)
	r5 := *s.recs["h5"]
	if h5Renew > 2*time.Second {
		r5.Timing.RenewInterval, r5.Timing.LeaseTTL = h5Renew, h5TTL
	}
	s.recs["h5"] = &r5
	h5Next := t0.Add(R2.Sub(t0) % h5Renew)
	if h5Next.Before(t0.Add(time.Second)) {
		h5Next = h5Next.Add(h5Renew)
	}
	lostR2 := false
	var declared time.Duration
	for ms := 1000; ms <= 150000 && declared == 0; ms += 10 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if ms%1000 == 0 {
			for i := range 10 {
				if name := fmt.Sprintf("h%d", i); name != "h3" && name != "h5" {
					s.renew(now.Add(time.Duration(i)*10*time.Millisecond), name, false)
				}
			}
		}
		if !now.Before(h5Next) {
			s.renew(now, "h5", now.Equal(R2)) // R2's beacon lost with W's
			lostR2 = lostR2 || now.Equal(R2)
			h5Next = h5Next.Add(h5Renew)
		}
		if now.Before(W) && ms%200 == 0 {
			s.renew(now, "h3", false) // ×0.1 timing
		}
		if now.Equal(W) {
			w := *s.recs["h3"]
			w.State = fencing.LeaseWithdrawn
			s.prev["h3"] = s.write(now, "h3", &w)            // its beacon lost on the route…
			s.write(now.Add(30*time.Millisecond), "h3", nil) // …hidden by the node
		}
		if ms%100 == 0 && s.step(now, set()) {
			declared = now.Sub(W)
		}
	}
	if !lostR2 {
		t.Fatal("R2 not written")
	}
	return declared
}

// TestX33WithdrawalBeaconDuringListing (S, conditional: a withdrawal
// within the watch's first listing of a starting controller — a rolling
// upgrade restarts controllers and agents together). The runner
// subscribes to beacons before it starts the watch; a beacon of a host
// the tracker does not track yet is ignored (ObserveBeacon,
// ObserveWithdrawal: h == nil). A fresh tracker learns its hosts from the
// listing, which delivers keys in stream order — a renewing host's key,
// written last, comes near its end (10 000 keys: seconds). h3's orderly
// stop writes W after the listing's snapshot (so W is not listed: h3's
// listed value is its last renewal R) and its withdrawal beacon comes
// while the listing is still under way: dropped. The compromised node
// overwrites W before the watch gets to it (it delivers live values only
// after the listing: no burst needed). Nothing was lost on any route —
// no companion, no counter, no chain gap: no loss window can ever cover
// h3's hidden write, and h3 is declared (HiddenWriteWait /
// companionsChecked, then lease_ttl + grace) while its guests run.
// "held/beacon-after-listing": the same beacon processed after h3's
// listed value: withdrawn, never declared.
// Fix (sketch): keep the beacons (at least the withdrawal beacons) of
// hosts not tracked yet while the watch's first listing is under way, and
// apply them (BeaconChain, ObserveBeacon, ObserveWithdrawal) when the
// host's listed value is observed or at WatchStarted; or take beacons
// only after the listing and treat the listing's duration as a loss
// window (BeaconsLost(subscribed, listed)) so that a hidden write of a
// host whose value was listed is refused-due.
func TestX33WithdrawalBeaconDuringListing(t *testing.T) {
	for _, c := range []struct {
		name          string
		beaconInTrack bool // the beacon is processed after h3's listed value
		wantDeclared  bool
		mut           *bool // a mutation reopening the hole (want declared)
	}{
		{name: "beacon-before-h3-listed"},
		{name: "held/beacon-after-listing", beaconInTrack: true},
		{name: "beacon-before-h3-listed/earlyMutation", wantDeclared: true, mut: &earlyMutation},
	} {
		t.Run(c.name, func(t *testing.T) {
			x32Mutate(t, c.mut)
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			tr.SetEnrolled(enrolledH)
			start := t0.Add(100 * time.Second) // the controller starts
			// The stream before the start: h0..h9's last renewals at
			// revisions 1..10 (h3's last: 10), W at 11 (after the
			// listing's snapshot), G at 12 over it.
			const wRev, gRev = 11, 12
			beacon := func() {
				for _, d := range tr.ObserveWithdrawal(start.Add(300*time.Millisecond), "h3", wRev) {
					t.Logf("beacon: %s", d)
				}
				tr.BeaconChain(start.Add(300*time.Millisecond), "h3", wRev, 10)
				tr.ObserveBeacon(start.Add(300*time.Millisecond), "h3", wRev)
			}
			if !c.beaconInTrack {
				beacon() // while the listing is under way, before h3's value
			}
			recs, listed := listFleet(tr, start)
			tr.WatchStarted(start.Add(500 * time.Millisecond))
			for _, name := range tr.Hosts() { // the first acting tick
				tr.RestoreMemory(start.Add(600*time.Millisecond), name, Memory{Beacons: true})
			}
			tr.GuardPublished(tr.Guard(), nil)
			if c.beaconInTrack {
				beacon()
			}
			// G, delivered after the listing (W superseded: a skip).
			tr.Skipped(gRev)
			missStored(tr, start.Add(700*time.Millisecond), "h3", gRev, start.Add(400*time.Millisecond))
			tr.ObserveInvalid(start.Add(700*time.Millisecond), "h3", gRev, "undecodable value (garbage)", false)
			declared, _ := fleetRun(t, tr, start, gRev, recs, listed, "h3")
			t.Logf("declared %s after the start; windows %+v", declared, tr.lossWindows)
			if declared != 0 && !c.wantDeclared {
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the controller started: its withdrawal beacon came during the listing, before h3 was tracked, and was dropped; the node hid W", declared)
			}
		})
	}
}

// TestX33NoServerClockSparseBursts (c, servers without the stream info's
// clock — nats-server before 2.10, now said once at WARN). serverLatest
// without a measured lead is the runner's time + BeaconLossSlack (30 s):
// each step of companionsChecked's walk spans 30 s of the server's clock
// (p_k+1 = passed(p_k) + 30 s), and a skip anywhere in it takes another
// step. A compromised node that makes the watch skip once every 20 s (a
// burst: one made-up key written twice, no lag) — breaks of 20 s between
// skips, which keep no garbled dead host undeclared with the server's
// clock known — keeps the dead h3, its key garbled once, undeclared for
// as long as it goes on (64 steps, then false: for ever). "held/ts": the
// same with the clock known: declared.
// Fix (sketch): without a measured lead, take the step's end from the
// delivery lag measured on the stamps (the clockLag estimate serverWindow
// uses) rather than +30 s, or cap a step at the sample's own stored
// stamp + the lag; or accept and document next to the WARN.
func TestX33NoServerClockSparseBursts(t *testing.T) {
	for _, c := range []struct {
		name string
		noTS bool
	}{{"no-ts/bursts-every-20s", true}, {"held/ts/bursts-every-20s", false}} {
		t.Run(c.name, func(t *testing.T) {
			if c.noTS {
				t.Skip("open (c), reviewer X33: without the server's clock each step spans 30 s, and skips every 20 s keep a garbled dead host undeclared — docs/security.md")
			}
			at := t0.Add(60 * time.Second) // h3 dies
			s := newX32SimDefault(t, func(time.Time) time.Duration { return 0 })
			var declared time.Duration
			for ms := 1000; ms <= 600000 && declared == 0; ms += 100 {
				now := t0.Add(time.Duration(ms) * time.Millisecond)
				if ms%1000 == 0 {
					s.renewOthers(now, "h3")
				}
				if now.Before(at) && ms%2000 == 0 {
					s.renew(now, "h3", false)
				}
				if ms%20000 == 10500 || now.Equal(at.Add(500*time.Millisecond)) {
					s.write(now.Add(-20*time.Millisecond), "fake-burst", nil) // a burst: a skip
					s.write(now.Add(-10*time.Millisecond), "fake-burst", nil)
				}
				if now.Equal(at.Add(500 * time.Millisecond)) {
					s.write(now, "h3", nil) // the garbage over the dead host's key, after the burst
				}
				s.noTS = c.noTS
				if s.step(now, nil) {
					declared = now.Sub(at)
				}
				if h := s.tr.hosts["h3"]; ms%10000 == 0 && testing.Verbose() && now.After(at) {
					t.Logf("%s: hidden rev %d cc %t", now.Sub(at), h.hidden.rev, s.tr.companionsChecked(now, h))
				}
			}
			t.Logf("declared %s after its death; skips %d, hidden %+v", declared, len(s.tr.frontier.skips), s.tr.hosts["h3"].hidden)
			if declared == 0 {
				t.Fatalf("the dead h3 (garbled once) never declared in 9 minutes of one skip every 20 s")
			}
		})
	}
}

// listingOrder is the order a fresh tracker's listing delivers the
// fleet's keys in: h3, renewing, written last, comes last.
var listingOrder = []string{"h0", "h1", "h2", "h4", "h5", "h6", "h7", "h8", "h9", "h3"}

// listFleet is a fresh tracker's listing at start+500ms: h0..h9's last
// renewals at revisions 1..10 in listingOrder (stored before start). It
// returns their records and revisions (each host's last beacon named its
// listed value: the chains' prev).
func listFleet(tr *Tracker, start time.Time) (map[string]*fencing.LeaseRecord, map[string]uint64) {
	recs, listed := map[string]*fencing.LeaseRecord{}, map[string]uint64{}
	for i, name := range listingOrder {
		r := rec(name, fencing.BackstopReset)
		r.Signer = name + "-key"
		recs[name] = r
		rev := uint64(1 + i)
		tr.Skipped(rev) // the listing
		missStored(tr, start.Add(500*time.Millisecond), name, rev, start.Add(-2*time.Second+time.Duration(i)*100*time.Millisecond))
		tr.Observe(start.Add(500*time.Millisecond), name, rev, r)
		listed[name] = rev
	}
	return recs, listed
}

// fleetRun runs tr for 120 s after start in 100 ms ticks: every host but
// victim renews every second with its chained beacon (revisions after
// rev), the server's clock is sampled every 2 s, BeaconsMissing before
// each Tick. It returns when victim was declared (0: never) and whether
// it was refused-due; declaring another host fails t.
func fleetRun(t *testing.T, tr *Tracker, start time.Time, rev uint64, recs map[string]*fencing.LeaseRecord, prev map[string]uint64, victim string) (time.Duration, bool) {
	t.Helper()
	var declared time.Duration
	refused := false
	for ms := 1000; ms <= 120000 && declared == 0; ms += 100 {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		if ms%1000 == 0 {
			for i := range 10 {
				name := fmt.Sprintf("h%d", i)
				if name == victim {
					continue
				}
				rev++
				at := now.Add(time.Duration(i) * 10 * time.Millisecond)
				missStored(tr, at, name, rev, at)
				tr.Observe(at, name, rev, recs[name])
				tr.BeaconChain(at, name, rev, prev[name])
				tr.ObserveBeacon(at, name, rev)
				prev[name] = rev
			}
		}
		if ms%2000 == 0 {
			tr.ServerTime(now, now.Add(time.Millisecond), now, rev)
		}
		tr.BeaconsMissing(now)
		for _, d := range tr.Tick(now) {
			switch {
			case d.Op == OpRefusedDue && d.Host == victim:
				refused = true
			case d.Op == OpDeclare && d.Host == victim:
				declared = now.Sub(start)
			case d.Op == OpDeclare:
				t.Fatalf("declared the live %s", d.Host)
			}
		}
	}
	return declared, refused
}
