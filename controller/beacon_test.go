package controller

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"hvguard/fencing"
)

// enrolledH: the test fleets' hosts h0, h1, … have keys in
// host_keys_file (Tracker.SetEnrolled); made-up names ("fake-0") do not.
func enrolledH(host string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(host, "h"))
	return strings.HasPrefix(host, "h") && err == nil && n >= 0
}

// beaconFleet is pinnedFleet with every host's beacon naming its
// record's revision at t0.
func beaconFleet(t *testing.T) (*Tracker, uint64) {
	return pinnedFleet(t, true)
}

// pinnedFleet is a tracker (signatures required) with h0..h9 pinned
// (trusted records signed by their keys) at t0, and (beacons) each
// host's beacon naming its record's revision; it returns the next free
// revision.
func pinnedFleet(t interface {
	Helper()
	Fatal(...any)
}, beacons bool) (*Tracker, uint64) {
	t.Helper()
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr.SetSigningRequired(true)
	tr.SetEnrolled(enrolledH)
	for i := range 10 {
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		r.Signer = fmt.Sprintf("h%d-key", i)
		tr.Observe(t0, r.Host, uint64(1+i), r)
		if beacons {
			tr.ObserveBeacon(t0, r.Host, uint64(1+i))
		}
	}
	tr.GuardPublished(tr.Guard(), nil)
	return tr, 100
}

// renewOthers renews h1..h9 (trusted) at now.
func renewOthers(tr *Tracker, now time.Time, rev *uint64) {
	for i := 1; i < 10; i++ {
		*rev++
		r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
		r.Signer = fmt.Sprintf("h%d-key", i)
		tr.Observe(now, r.Host, *rev, r)
	}
}

// TestBeaconsLetLiveHostRenewUnverifiably: h0's agent beacons; then its
// renewals become unverifiable here (its key rotated before this
// controller re-read host_keys_file, or its signing turned off), each
// named by h0's beacon — before the value arrives, after it, or
// alternately. h0 is never declared.
func TestBeaconsLetLiveHostRenewUnverifiably(t *testing.T) {
	for _, c := range []struct {
		why, order string
		before     func(s int) bool
		// supersede: a compromised node writes garbage right after each
		// renewal, before its beacon arrives.
		supersede bool
	}{
		{"unsigned (signing off on the agent)", "beacon first", func(int) bool { return true }, false},
		{"signed by unknown key h0-new (rotated before host_keys_file reload)", "beacon after the value", func(int) bool { return false }, false},
		{"unsigned (signing off on the agent)", "alternately", func(s int) bool { return s%2 == 1 }, false},
		{"unsigned (signing off on the agent)", "each renewal superseded by garbage before its beacon", func(int) bool { return false }, true},
	} {
		why := c.why
		t.Run(c.why+", "+c.order, func(t *testing.T) {
			tr, rev := beaconFleet(t)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
				rev++
				if c.before(s) {
					tr.ObserveBeacon(now, "h0", rev)
				}
				ds := tr.ObserveInvalid(now, "h0", rev, why, false)
				if c.supersede {
					tr.ObserveInvalid(now.Add(time.Millisecond), "h0", rev+1, "garbage", false)
				}
				if !c.before(s) {
					tr.ObserveBeacon(now.Add(30*time.Millisecond), "h0", rev)
				}
				if c.supersede {
					rev++
				}
				for _, d := range ds {
					if d.Op == OpInvalid && s < 3 {
						t.Logf("%s", d.Reason)
					}
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Fatalf("h0 declared at %s while its agent renewed every second and named each value in its beacon (%s): %s", now.Sub(t0), why, d.Reason)
					}
				}
			}
		})
	}
}

// declareH0 lets h0 fall silent at t0 (h1..h9 renewing) while values
// nobody's beacon names arrive in its key every second (write), and
// returns when h0 was declared (the expired record observed) and the
// next free revision; zero time if it never was within 60 s.
func declareH0(t *testing.T, tr *Tracker, rev uint64, write func(now time.Time, rev uint64)) (time.Time, uint64) {
	t.Helper()
	for ms := 250; ms <= 60_000; ms += 250 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if ms%1000 == 0 {
			renewOthers(tr, now, &rev)
			rev++
			write(now, rev)
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h0" {
				rev++
				tr.Observe(now, "h0", rev, &d.Record)
				return now, rev
			}
		}
	}
	return time.Time{}, rev
}

// TestBeaconsBindDeadHost: h0 (pinned, beaconing) dies at t0; a
// compromised node writes into its key every second a value this
// controller cannot verify (garbage, unsigned, an unknown signer) that no
// beacon of h0 names. h0 is declared lease_ttl + grace after its last
// renewal, as if nothing had been written (beaconMutation: never).
func TestBeaconsBindDeadHost(t *testing.T) {
	for _, why := range []string{"undecodable", "unsigned", "unknown signer"} {
		t.Run(why, func(t *testing.T) {
			tr, rev := beaconFleet(t)
			due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
			at, _ := declareH0(t, tr, rev, func(now time.Time, rev uint64) { tr.ObserveInvalid(now, "h0", rev, why, false) })
			if at.IsZero() {
				t.Fatalf("h0 never declared in 60 s while a compromised node wrote %s values into its key (due after %s)", why, due)
			}
			if got := at.Sub(t0); got > due+time.Second {
				t.Errorf("h0 declared %s after its death, want ≤ lease_ttl + grace (%s) + 1 s", got, due)
			}
		})
	}
}

// TestBeaconsLapse: beacons bind a host only while some host's beacon
// arrived within BeaconTrustWindow. Once the whole fleet's beacons are
// gone (this controller's NATS account lacks the beacon subscription) an
// agent renewing with records this controller cannot verify is not
// declared — the tracker is lenient again.
func TestBeaconsLapse(t *testing.T) {
	tr, rev := beaconFleet(t)
	start := t0.Add(BeaconTrustWindow + time.Second)
	for s := 0; s <= 120; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		renewOthers(tr, now, &rev)
		rev++
		tr.ObserveInvalid(now, "h0", rev, "unsigned", false)
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h0" {
				t.Fatalf("h0 declared %s into its unverifiable renewals, its last beacon %s before them", now.Sub(start), start.Sub(t0))
			}
		}
	}
}

// TestContestedDeclarationWaits: a declaration made while values of the
// host's key were discounted (no beacon named them) is confirmed for host
// recovery only lease_ttl + grace after it was observed: an agent that
// wrote those values (one whose renewals this controller cannot verify
// and whose beacons did not arrive) has seen the expired record and
// fenced by then. Further values do not push it back (an attacker's
// writes cannot stall the recovery). contestMutation: confirmed at once.
func TestContestedDeclarationWaits(t *testing.T) {
	tr, rev := beaconFleet(t)
	declared, rev := declareH0(t, tr, rev, func(now time.Time, rev uint64) { tr.ObserveInvalid(now, "h0", rev, "unsigned", false) })
	if declared.IsZero() {
		t.Fatal("h0 never declared")
	}
	h := tr.hosts["h0"]
	due := h.rec.Timing.LeaseTTL + h.grace
	lv := func(now time.Time) LeaseView {
		for _, l := range tr.View(now).Hosts {
			if l.Host == "h0" {
				return l
			}
		}
		t.Fatal("h0 not in the view")
		return LeaseView{}
	}
	if l := lv(declared.Add(time.Second)); l.SilentFor >= l.Due {
		t.Fatalf("contested declaration confirmable 1 s after it: silent for %s, due %s", l.SilentFor, l.Due)
	}
	// More discounted values after the declaration.
	for s := 1; s <= int(due/time.Second)+2; s++ {
		rev++
		tr.ObserveInvalid(declared.Add(time.Duration(s)*time.Second), "h0", rev, "garbage", false)
	}
	if l := lv(declared.Add(due + 10*time.Millisecond)); l.SilentFor < l.Due {
		t.Errorf("contested declaration not confirmable lease_ttl + grace (%s) after it while values kept coming: silent for %s", due, l.SilentFor)
	}
	if l := lv(declared.Add(due + 10*time.Millisecond)); !l.DeclarationStands {
		t.Errorf("the declaration does not stand over values no beacon named")
	}
	// h0's beacon names the latest value: h0 is alive: it no longer stands.
	tr.ObserveBeacon(declared.Add(due+20*time.Millisecond), "h0", rev)
	if l := lv(declared.Add(due + 30*time.Millisecond)); l.DeclarationStands {
		t.Errorf("the declaration still stands after h0's beacon named the latest value of its key")
	}
}

// An uncontested declaration (nothing discounted) is confirmable as soon
// as the host was silent for lease_ttl + grace, as before.
func TestUncontestedDeclarationConfirmable(t *testing.T) {
	tr, rev := beaconFleet(t)
	declared, _ := declareH0(t, tr, rev, func(time.Time, uint64) {})
	if declared.IsZero() {
		t.Fatal("h0 never declared")
	}
	for _, l := range tr.View(declared).Hosts {
		if l.Host == "h0" && l.SilentFor < l.Due {
			t.Errorf("uncontested declaration not confirmable at once: silent for %s, due %s", l.SilentFor, l.Due)
		}
	}
}

// TestPropertyBeacons (rapid): h0 pinned and beaconing among h1..h9.
// Live phase: h0 renews every 0.5–3 s, each value trusted or one this
// controller cannot verify, its beacon delivered 0–2 s later (before the
// value, reordered, or after) or lost (never two in a row); a compromised
// node writes garbage at random times, often right after a renewal; the
// watch may skip. h0 is never declared. Dead phase: h0 stops at a random
// time; the attacker keeps writing: h0 is declared within lease_ttl +
// grace + HiddenWriteWait + 1 s of its last renewal.
func TestPropertyBeacons(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, rev := pinnedFleet(rt, true)
		due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
		deathAt := t0.Add(time.Duration(rapid.IntRange(30, 120).Draw(rt, "death_s")) * time.Second)
		type ev struct {
			at time.Time
			do func(now time.Time)
		}
		var evs []ev
		nextRev := func() uint64 { rev++; return rev }
		// Others renew every second (trusted).
		for s := 1; s <= 200; s++ {
			at := t0.Add(time.Duration(s) * time.Second)
			evs = append(evs, ev{at, func(now time.Time) { renewOthers(tr, now, &rev) }})
		}
		var lastRenewal time.Time
		lost := false
		for at := t0.Add(time.Second); at.Before(deathAt); at = at.Add(time.Duration(rapid.IntRange(500, 3000).Draw(rt, "renew_ms")) * time.Millisecond) {
			trusted := rapid.Bool().Draw(rt, "trusted")
			delay := time.Duration(rapid.IntRange(-500, 2000).Draw(rt, "beacon_delay_ms")) * time.Millisecond
			drop := !lost && rapid.IntRange(0, 9).Draw(rt, "beacon_lost") == 0
			lost = drop
			skip := rapid.IntRange(0, 19).Draw(rt, "skip") == 0
			garbage := rapid.IntRange(0, 2).Draw(rt, "garbage_after") == 0
			lastRenewal = at
			var r uint64
			evs = append(evs, ev{at, func(now time.Time) {
				r = nextRev()
				if skip {
					tr.Skipped(r)
				}
				if trusted {
					x := rec("h0", fencing.BackstopReset)
					x.Signer = "h0-key"
					tr.Observe(now, "h0", r, x)
				} else {
					tr.ObserveInvalid(now, "h0", r, "unsigned", false)
				}
				if garbage {
					tr.ObserveInvalid(now, "h0", nextRev(), "garbage", false)
				}
			}})
			if !drop {
				bat := at.Add(max(delay, time.Millisecond))
				evs = append(evs, ev{bat, func(now time.Time) { tr.ObserveBeacon(now, "h0", r) }})
			}
		}
		// The attacker's writes throughout (and after the death).
		for at := t0.Add(time.Duration(rapid.IntRange(100, 3000).Draw(rt, "att0_ms")) * time.Millisecond); at.Before(t0.Add(200 * time.Second)); at = at.Add(time.Duration(rapid.IntRange(200, 5000).Draw(rt, "att_ms")) * time.Millisecond) {
			why := rapid.SampledFrom([]string{"garbage", "unsigned", "unknown signer"}).Draw(rt, "att_kind")
			evs = append(evs, ev{at, func(now time.Time) { tr.ObserveInvalid(now, "h0", nextRev(), why, false) }})
		}
		slices.SortStableFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
		i := 0
		for now := t0; now.Before(t0.Add(200 * time.Second)); now = now.Add(TickInterval) {
			for ; i < len(evs) && !evs[i].at.After(now); i++ {
				evs[i].do(evs[i].at)
			}
			for _, d := range tr.Tick(now) {
				if d.Op != OpDeclare || d.Host != "h0" {
					continue
				}
				if now.Before(deathAt) {
					rt.Fatalf("live h0 declared at %s (dies at %s): %s", now.Sub(t0), deathAt.Sub(t0), d.Reason)
				}
				// HiddenWriteWait: a write after a skip waits for beacons a
				// loss may have dropped with it (beaconloss.go).
				if now.After(lastRenewal.Add(due + HiddenWriteWait + time.Second)) {
					rt.Fatalf("dead h0 declared at %s, %s after its last renewal (due %s)", now.Sub(t0), now.Sub(lastRenewal), due)
				}
				return
			}
		}
		h := tr.hosts["h0"]
		rt.Fatalf("dead h0 (last renewal at %s) never declared: lastSeen %s unverifiedAt %s rev %d skipped %d state %s refused %q held %v", lastRenewal.Sub(t0), h.lastSeen.Sub(t0), h.unverifiedAt.Sub(t0), h.rev, tr.skippedRev, h.rec.State, h.refused, tr.holding)
	})
}
