package controller

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// lagWatch simulates a lease watch that delivers every write `lag`
// after it was stored, skipping a write superseded (a later write of the
// same key stored) before then — KV history 1: the consumer never sees
// it, and the next delivered value follows a gap (Skipped).
type lagWatch struct {
	// due: when a value stored at s is delivered, if not superseded by
	// then (monotone).
	due    func(s time.Time) time.Time
	writes []lagWrite
	next   int
	gap    bool
}

// lagWrite: host's key written at rev, stored at at; rec nil: garbage.
type lagWrite struct {
	host   string
	rev    uint64
	at     time.Time
	rec    *fencing.LeaseRecord
	hidden bool // superseded before delivery (set by deliver)
}

func (w *lagWatch) write(host string, rev uint64, at time.Time, rec *fencing.LeaseRecord) {
	w.writes = append(w.writes, lagWrite{host: host, rev: rev, at: at, rec: rec})
}

// latest is the revision of host's key at now (what a compare-and-set
// must name to land).
func (w *lagWatch) latest(host string, now time.Time) uint64 {
	var r uint64
	for _, x := range w.writes {
		if x.host == host && !x.at.After(now) {
			r = max(r, x.rev)
		}
	}
	return r
}

// latestAll is the stream's last revision at now.
func (w *lagWatch) latestAll(now time.Time) uint64 {
	var r uint64
	for _, x := range w.writes {
		if !x.at.After(now) {
			r = max(r, x.rev)
		}
	}
	return r
}

// deliver hands tr every write due by now, in revision order.
func (w *lagWatch) deliver(tr *Tracker, now time.Time) {
	sort.SliceStable(w.writes[w.next:], func(i, j int) bool { return w.writes[w.next+i].rev < w.writes[w.next+j].rev })
	for w.next < len(w.writes) {
		x := w.writes[w.next]
		due := w.due(x.at)
		if due.After(now) {
			return
		}
		w.next++
		superseded := false
		for _, y := range w.writes[w.next:] {
			if y.host == x.host && y.rev > x.rev && !y.at.After(due) {
				superseded = true
				break
			}
		}
		if superseded {
			w.gap = true
			continue
		}
		if w.gap {
			tr.Skipped(x.rev)
			w.gap = false
		}
		missStored(tr, due, x.host, x.rev, x.at)
		if strings.HasPrefix(x.host, "x") {
			continue // a made-up key: no member (only the watch's progress)
		}
		if x.rec == nil {
			tr.ObserveInvalid(due, x.host, x.rev, "undecodable value (garbage)", false)
		} else {
			tr.Observe(due, x.host, x.rev, x.rec)
		}
	}
}

// TestLateSupersededCompanion (S): the companion's renewal R5, whose
// beacon a route dropped with h3's withdrawal beacon, is superseded
// before the lagging watch delivers it, and the value superseding it is
// delivered only much later: the compromised node keeps h5 from renewing
// (garbage into its key every second, X29's blocked companion) for a
// minute while its bursts of writes to made-up keys keep the watch 20 s
// behind (no skip of their own). Each garbage value of h5 is superseded
// before delivery; the last comes 80 s after the withdrawal. h3's garbage
// (over its withdrawal) is delivered 20.5 s after it. Counted from the
// host's last sign of life alone (companionsChecked before), h3 was due
// and declared long before h5's hidden write was noted and its
// expectation checked. The bursts stop 60 s after the withdrawal.
// "quiet": h5 renews on (its beacons chain): the dead h3, nothing lost
// beside it, is declared once the watch has caught up (while it skips,
// a hidden write's host waits: the (c) side).
// "blocked-companion/lateSupersederMutation": counted until the watch
// passed need alone, the withdrawn h3 is declared.
func TestLateSupersededCompanion(t *testing.T) {
	for _, c := range []struct {
		name              string
		blockH5, mutation bool
		wantDeclared      bool
	}{
		{"blocked-companion", true, false, false},
		{"quiet", false, false, true},
		{"blocked-companion/lateSupersederMutation", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lateSupersederMutation = c.mutation
			defer func() { lateSupersederMutation = false }()
			tr, rev := beaconFleet(t)
			tr.WatchStarted(t0)
			at := t0.Add(20 * time.Minute)
			w := &lagWatch{due: func(s time.Time) time.Time {
				// 20 s behind while the bursts last (until at+60 s),
				// caught up 20 s after they stopped.
				if !s.After(at.Add(60 * time.Second)) {
					return s.Add(20 * time.Second)
				}
				return maxTime(s.Add(50*time.Millisecond), at.Add(80*time.Second))
			}}
			prev := map[string]uint64{}
			for i := range 10 {
				prev[fmt.Sprintf("h%d", i)] = uint64(1 + i) // beaconFleet's beacons: the chains start there
			}
			type beacon struct {
				host      string
				rev, prev uint64
				at        time.Time
			}
			var beacons []beacon
			renew := func(host string, s time.Time, lose bool) {
				rev++
				r := rec(host, fencing.BackstopReset)
				r.Signer = host + "-key"
				w.write(host, rev, s, r)
				if !lose {
					beacons = append(beacons, beacon{host, rev, prev[host], s})
				}
				prev[host] = rev
			}
			start := at.Add(-60 * time.Second)
			for s := start; !s.After(at.Add(200 * time.Second)); s = s.Add(time.Second) {
				for i := range 10 {
					host := fmt.Sprintf("h%d", i)
					switch {
					case host == "h3" && !s.Before(at):
					case host == "h5" && !s.Before(at) && c.blockH5:
					default:
						renew(host, s, false)
					}
				}
				if s.Equal(at) {
					rev++ // h3's withdrawal: its beacon lost on the route
					if c.blockH5 {
						renew("h5", s.Add(10*time.Millisecond), true) // R5: its beacon lost with h3's
					}
					rev++
					w.write("h3", rev, s.Add(500*time.Millisecond), nil) // the garbage over the withdrawal
				}
				for ms := 0; ms < 1000 && !s.After(at.Add(60*time.Second)); ms += 100 {
					rev++ // the burst keeping the watch behind: made-up keys, each written once
					w.write(fmt.Sprintf("x%d", rev), rev, s.Add(time.Duration(ms)*time.Millisecond), nil)
				}
				if c.blockH5 && s.After(at) && !s.After(at.Add(60*time.Second)) {
					rev++
					w.write("h5", rev, s.Add(500*time.Millisecond), nil) // keeps h5 from renewing
				}
			}
			var declared time.Duration
			refused := false
			bi := 0
			var checked time.Time
			for now := start; !now.After(at.Add(200*time.Second)) && declared == 0; now = now.Add(100 * time.Millisecond) {
				for bi < len(beacons) && !beacons[bi].at.After(now) {
					b := beacons[bi]
					bi++
					if tr.BeaconChain(b.at, b.host, b.rev, b.prev) {
						tr.RefuseCovered()
					}
					tr.ObserveBeacon(b.at, b.host, b.rev)
				}
				w.deliver(tr, now)
				if now.Sub(checked) >= RollbackCheckInterval {
					// The runner's rollback check: the stream's last
					// revision and the server's clock (the runner's here).
					checked = now
					tr.ServerTime(now, now.Add(time.Millisecond), now, w.latestAll(now))
				}
				tr.BeaconsMissing(now)
				for _, d := range tr.Tick(now) {
					switch {
					case d.Op == OpRefusedDue && d.Host == "h3":
						refused = true
					case d.Op == OpDeclare && d.Host == "h3" && d.Revision == w.latest("h3", now):
						declared = now.Sub(at) // its compare-and-set lands
					case d.Op == OpDeclare && d.Host == "h3":
						// On a revision the key has moved past: the
						// compare-and-set fails (retried).
					case d.Op == OpDeclare && d.Host != "h5":
						t.Fatalf("declared the live %s at %s", d.Host, now.Sub(at))
					}
				}
			}
			t.Logf("h3 declared %s after its withdrawal (0: never); refused-due: %t; windows %d", declared, refused, len(tr.lossWindows))
			if c.wantDeclared && declared == 0 {
				t.Fatal("h3 was never declared (the dead h3 with nothing lost beside it; or, with the mutation, the test does not show the hole)")
			}
			if !c.wantDeclared && declared != 0 {
				t.Fatalf("the withdrawn h3 declared %s after its withdrawal: h5's renewal, whose beacon was lost with h3's, was superseded before the lagging watch delivered it and its superseder came only later", declared)
			}
		})
	}
}

// BenchmarkCompanionsChecked: the cost of one due host's check
// (companionsChecked, every tick while a host with a hidden write is
// due) at its worst: 3 minutes of deliveries every 10 ms, 1 s behind,
// every other one after a skip (spans at the 4 096 bound), the host last
// alive 3 minutes ago — every step finds skips, up to maxFrontierSteps.
func BenchmarkCompanionsChecked(b *testing.B) {
	tr, err := NewTracker(resetConfig())
	if err != nil {
		b.Fatal(err)
	}
	base := t0.Add(time.Hour)
	for i := range 18000 {
		now := base.Add(time.Duration(i) * 10 * time.Millisecond)
		if i%2 == 1 {
			tr.Skipped(uint64(i + 1))
		}
		tr.ClockSample(now, uint64(i+1), now.Add(-time.Second))
	}
	h := &hostState{rec: *rec("h3", fencing.BackstopReset), hidden: hiddenWrite{rev: 1, after: base.UnixNano()}}
	now := base.Add(3 * time.Minute)
	b.Logf("samples %d, skip spans %d", len(tr.frontier.samples), len(tr.frontier.skips))
	for b.Loop() {
		if tr.companionsChecked(now, h) {
			b.Fatal("checked while skipping")
		}
	}
}

// TestFrontierBusyStream ((c)): a busy stream — values delivered every
// 10 ms, as a large fleet's renewals are — must not keep a dead host
// whose key a compromised node garbled after a skip undeclared. A frontier
// sample merged with each delivery within 50 ms of its LAST time slid for
// ever (one sample, always now): the host was never declared.
func TestFrontierBusyStream(t *testing.T) {
	at := t0.Add(20 * time.Minute)
	tr, rev := missFleet(t, at, 0) // h3's last renewal at `at`; it dies
	missHide(tr, at, 0, &rev)      // garbage over its key after a skip
	var declared time.Duration
	for ms := 2010; ms <= 120000 && declared == 0; ms += 10 {
		now := at.Add(time.Duration(ms) * time.Millisecond)
		rev++
		tr.ClockSample(now, rev, now) // another key's value (the busy fleet)
		if ms%1000 == 0 {
			missRenew(tr, now, 0, &rev, "", "h3")
		}
		if ms%100 != 0 {
			continue
		}
		tr.BeaconsMissing(now)
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare && d.Host == "h3" {
				declared = now.Sub(at)
			}
		}
	}
	t.Logf("the dead h3 declared %s after its last renewal (samples %d)", declared, len(tr.frontier.samples))
	if declared == 0 {
		t.Fatal("the dead h3 was never declared in a busy stream")
	}
}

// TestEarlyBeaconsKeptForNewHost: a host new to a running controller
// (its listing long over) whose withdrawal beacon arrives before the
// watch delivers its first value has that beacon kept and replayed at
// the next Tick (reviewer X35's TestX35NewHostBeaconsBeforeFirstDelivery;
// the same during a re-watch's listing). "earlyMutation": dropped, as
// before.
func TestEarlyBeaconsKeptForNewHost(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		t.Run(fmt.Sprintf("earlyMutation=%t", mutation), func(t *testing.T) {
			earlyMutation = mutation
			defer func() { earlyMutation = false }()
			tr, rev := beaconFleet(t)
			tr.WatchStarted(t0)
			at := t0.Add(time.Minute)
			rev += 5
			w := rev // h10's withdrawal, after its first record at w-1
			tr.ObserveWithdrawal(at, "h10", w)
			tr.BeaconChain(at, "h10", w, w-1)
			tr.ObserveBeacon(at, "h10", w)
			r := rec("h10", fencing.BackstopReset)
			r.Signer = "h10-key"
			missStored(tr, at.Add(100*time.Millisecond), "h10", w-1, at.Add(-time.Second))
			tr.Observe(at.Add(100*time.Millisecond), "h10", w-1, r)
			withdrawn := false
			for _, d := range tr.Tick(at.Add(300 * time.Millisecond)) {
				withdrawn = withdrawn || d.Op == OpWithdrawn && d.Host == "h10"
			}
			h := tr.hosts["h10"]
			if h == nil {
				t.Fatal("h10 not tracked after its first value")
			}
			kept := h.beacons.withdrawnRev == w
			t.Logf("withdrawal beacon kept: %t; withdrawn said: %t", kept, withdrawn)
			if kept == mutation || withdrawn == mutation {
				t.Fatalf("earlyMutation %t: h10's withdrawal beacon (received before its first value) kept %t, said %t", mutation, kept, withdrawn)
			}
		})
	}
}
