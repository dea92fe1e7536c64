package controller

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// The simulation's membership part (issue 10 items 3 and 4): the
// controller publishes its guard into the KV (publishes fail with
// probability pGuardFail; a failed one may still land later, its outcome
// being unknown), agents read the membership and the guard every
// simMembersRefresh while their link is up, hosts join ("grow": the
// event's dur is unused, its hosts list gives how many join), operators
// delete or purge keys ("delete-key": the agent keeps running;
// "decommission": the host is shut down, its key deleted and the
// controller told to forget it).

// simMembersRefresh is the agents' membership refresh (the agent's
// default fence.members_refresh).
const simMembersRefresh = 10 * time.Second

// simGuardRepublish is how often the guard is published again
// (GuardPublishInterval).
const simGuardRepublish = 30 * time.Second

// simShellMutation switches a fix off in the simulated shell/KV, for the
// mutation checks: each must make a property fail.
type simShellMutation struct {
	// oldCreate: a create (CAS on revision 0) is rejected by a delete
	// marker, as natslease's Update on 0 was (the lock-out).
	oldCreate bool
	// hideDelete: a renewal on a deleted key is applied as if its CAS
	// matched: a shell that "recovers" from the marker without telling
	// the core, which then cannot know a declaration may be gone.
	hideDelete bool
}

type simMembership struct {
	kvGuard     fencing.Guard // the value of fencing.GuardKey
	pubVersion  uint64        // last version published successfully
	pubAt       time.Time
	pGuardFail  float64
	failedLost  bool // failed publishes never land (else half of them land late)
	guardFails  int
	shellMut    simShellMutation
	grown       int
	keyDeletes  int
	nextRefresh map[string]time.Time
	rackSize    int
}

// memberNames lists the hosts whose key holds a record (KV Keys()).
func (s *sim) memberNames() []string {
	var out []string
	for name, e := range s.kv {
		if !e.deleted {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// casConflict applies the KV's CAS rules (natslease: revision 0 is a
// create, accepted over a delete marker, never over a record).
func (s *sim) casConflict(host string, rev uint64, rec fencing.LeaseRecord) (fencing.RenewResult, bool) {
	e, ok := s.kv[host]
	conflict := func() (fencing.RenewResult, bool) {
		res := fencing.RenewResult{Outcome: fencing.RenewConflict, Revision: e.rev}
		if ok && !e.deleted {
			res.Current = ptr(e.rec)
		}
		return res, true
	}
	switch {
	case !ok:
		if rev != 0 {
			return conflict()
		}
	case e.deleted:
		if s.shellMut.hideDelete && rec.State == fencing.LeaseActive {
			return fencing.RenewResult{}, false
		}
		if rev != 0 && rev != e.rev || rev == 0 && s.shellMut.oldCreate {
			return conflict()
		}
	case e.rev != rev:
		return conflict()
	}
	return fencing.RenewResult{}, false
}

// deleteKey deletes (or purges: the same marker) host's key.
func (s *sim) deleteKey(host string) {
	e, ok := s.kv[host]
	if !ok || e.deleted {
		return
	}
	s.keyDeletes++
	s.rev++
	s.kv[host] = kvEntry{rev: s.rev, rec: e.rec, deleted: true}
	rv := s.rev
	s.after(s.delay(500*time.Millisecond), func() { s.observe(host, rv, nil) })
}

// startGlobalEvent handles the events that concern no existing host:
// "grow" (len(e.hosts) hosts join), "guard-fail" (every guard publish
// fails from now on, none lands) and "guard-stale" (the first guard
// lands again, late, and connected agents read it); it reports whether e
// was one.
func (s *sim) startGlobalEvent(e simEvent) bool {
	switch e.kind {
	case "guard-fail":
		s.pGuardFail, s.failedLost = 1, true
		return true
	case "guard-stale":
		// An old publish of the first guard lands late; connected agents
		// read it at once.
		s.kvGuard = s.guard
		names := s.memberNames()
		for _, h := range s.hosts {
			if h.agentUp(s.now) && h.cut == 0 {
				h.agent.SetMembers(names, s.kvGuard)
			}
		}
		return true
	case "grow":
	default:
		return false
	}
	for range len(e.hosts) {
		i := len(s.hosts)
		h := &simHost{name: fmt.Sprintf("h%02d", i), rack: i / s.rackSize, rate: s.hosts[i%len(s.hosts)].rate,
			doms: make([]domState, len(s.hosts[0].doms))}
		s.hosts = append(s.hosts, h)
		s.grown++
		s.startAgent(h) // a first start: no durable state, the key is created
	}
	return true
}

// startMembershipEvent handles the per-host membership events.
func (s *sim) startMembershipEvent(e simEvent, h *simHost) {
	switch e.kind {
	case "delete-key":
		s.deleteKey(h.name)
	case "decommission":
		if !h.dead {
			s.kill(h)
			h.agent = nil
		}
		s.deleteKey(h.name)
		s.after(time.Second, func() { _ = s.ctrl.Forget(s.ctrlNow(), h.name) })
	}
}

// errGuardPublish is a failed guard publish.
var errGuardPublish = errors.New("publish guard: timeout")

// membershipStep publishes the guard (as controller.Runner does) and lets
// agents whose link is up refresh their membership and guard.
func (s *sim) membershipStep() {
	if s.now.Sub(t0)%time.Second == 0 {
		g := s.ctrl.Guard()
		if g.Version != s.pubVersion || s.now.Sub(s.pubAt) >= simGuardRepublish {
			if s.rnd.Float64() < s.pGuardFail {
				s.guardFails++
				s.logf("controller guard v%d (%d members) publish FAILED", g.Version, g.Members)
				s.ctrl.GuardPublished(g, errGuardPublish)
				if !s.failedLost && s.rnd.IntN(2) == 0 {
					// The outcome was unknown: it lands later.
					s.after(s.delay(s.maxLate), func() { s.kvGuard = g })
				}
			} else {
				s.logf("controller guard v%d (%d members, threshold %d) published", g.Version, g.Members, g.Threshold(g.Members))
				s.kvGuard = g
				s.ctrl.GuardPublished(g, nil)
				s.pubVersion, s.pubAt = g.Version, s.now
			}
		}
	}
	if s.nextRefresh == nil {
		s.nextRefresh = map[string]time.Time{}
	}
	names := s.memberNames()
	for i, h := range s.hosts {
		at, ok := s.nextRefresh[h.name]
		if !ok {
			// Spread the refreshes over the period.
			at = s.now.Add(time.Duration(i) * simMembersRefresh / time.Duration(len(s.hosts)+1))
			s.nextRefresh[h.name] = at
		}
		if s.now.Before(at) {
			continue
		}
		s.nextRefresh[h.name] = s.now.Add(simMembersRefresh)
		if h.agentUp(s.now) && h.cut == 0 {
			h.agent.SetMembers(names, s.kvGuard)
		}
	}
}

// runSim runs s to simDuration (or until the first violation) and returns
// the first violation ("" if none).
func (s *sim) runToEnd() string {
	for s.now.Before(t0.Add(simDuration)) {
		s.step()
		if len(s.errs) > 0 {
			return s.errs[0]
		}
	}
	return ""
}

// growthSim is the schedule: 20 hosts (racks of 6; guard 10 / 20 %:
// threshold 4) grow to 50 (threshold 10) at 10 s, and at the same moment
// rack 0 (6 hosts) is cut off from NATS and from the other racks, before
// its agents could read the new guard. They reach each other: 6 > 4, so
// they are Held by the guard they know. failPublish: from the growth on,
// every guard publish fails (the cut comes at 30 s then: nobody could read
// the new guard anyway).
func growthSim(seed uint64, failPublish bool) *sim {
	cut := 10 * time.Second
	if failPublish {
		cut = 30 * time.Second
	}
	s := newSim(seed, 20, 6, 1, 0, DefaultConfig(), []simEvent{
		{at: 10 * time.Second, kind: "grow", hosts: make([]int, 30)},
		{at: cut, kind: "cut-rack", hosts: []int{0, 1, 2, 3, 4, 5}, dur: 150 * time.Second},
	})
	s.maxLate = 0 // no late writes: the schedule is about the guard
	if failPublish {
		s.events = append(s.events, simEvent{at: 9 * time.Second, kind: "guard-fail"})
	}
	return s
}

// TestSimGuardGrowthHeldNotDeclared: the 20 → 50 growth with six
// hosts cut off before they saw the new guard (and, second, with every
// publish of the new guard failing): the six are Held by their peers under
// the old guard (threshold 4), and the controller, which keeps every
// version a member still names, holds with 4 and declares none of them.
// With guardMutation.latestOnly (the code before guard versions: the
// controller holds with the threshold of the membership it last tried to
// publish, 10) the six are declared while Held with running domains.
func TestSimGuardGrowthHeldNotDeclared(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("publish-fails=%t", fail), func(t *testing.T) {
			s := growthSim(3, fail)
			if v := s.runToEnd(); v != "" {
				t.Fatalf("%s\n%s", v, strings.Join(s.tail(60), "\n"))
			}
			held := 0
			for _, l := range s.trace {
				if strings.Contains(l, "-> held (") {
					held++
				}
			}
			if held < 6 || len(s.declared) > 0 || len(s.hosts) != 50 {
				t.Fatalf("held transitions %d (want >= 6), declared %v, hosts %d\n%s", held, s.declared, len(s.hosts), strings.Join(s.tail(60), "\n"))
			}
			if fail && s.guardFails == 0 {
				t.Fatal("no guard publish failed")
			}
		})
	}
}

// TestSimMembershipMutations: each fix of items 3 and 4 is needed —
// switching one off makes the simulation's safety (or, for the lock-out,
// liveness) property fail on its schedule (some seed of the first 30),
// while the schedule passes with the fix (the first 3 seeds).
func TestSimMembershipMutations(t *testing.T) {
	cases := []struct {
		name string
		sim  func(seed uint64) *sim
		set  func(s *sim, on bool)
		// caught reports the failure the mutation must cause ("" none).
		caught func(s *sim, violation string) string
	}{
		{"controller holds with the latest guard only (growth)", func(seed uint64) *sim { return growthSim(seed, false) },
			func(_ *sim, on bool) { guardMutation.latestOnly = on }, violated},
		{"controller holds with the latest guard only (failed publish)", func(seed uint64) *sim { return growthSim(seed, true) },
			func(_ *sim, on bool) { guardMutation.latestOnly = on }, violated},
		{"agent takes an older guard", staleGuardSim,
			func(_ *sim, on bool) { fencing.Mutations.AcceptOlderGuard = on }, violated},
		{"controller forgets a deleted host", deletedHeldSim,
			func(_ *sim, on bool) { keyDeleteMutation.forget = on }, violated},
		{"agent re-creates its key whatever its state", deletedDeclaredSim,
			func(_ *sim, on bool) { fencing.Mutations.KeyDeleteAlwaysRecreates = on }, violated},
		{"shell hides a delete from the agent", deletedDeclaredSim,
			func(s *sim, on bool) { s.shellMut.hideDelete = on }, violated},
		{"self-declaration before the fence completed", deletedLapsedSim,
			func(_ *sim, on bool) { fencing.Mutations.SelfDeclareBeforeFence = on }, violated},
		// A relayed create anchored on the marker (a CAS on it) lands even
		// where a create is rejected: the lock-out needs relayed creates
		// unanchored too.
		{"create rejected by the delete marker (lock-out)", deletedHealthySim,
			func(s *sim, on bool) {
				s.shellMut.oldCreate, fencing.Mutations.KeyAbsentRevisionIgnored = on, on
			}, fencedAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(3) {
				s := tc.sim(seed)
				if got := tc.caught(s, s.runToEnd()); got != "" {
					t.Fatalf("seed %d, without the mutation: %s\n%s", seed, got, strings.Join(s.tail(60), "\n"))
				}
			}
			found := ""
			for seed := uint64(0); seed < 30 && found == ""; seed++ {
				s := tc.sim(seed)
				tc.set(s, true)
				found = tc.caught(s, s.runToEnd())
				tc.set(s, false)
				if found != "" {
					found = fmt.Sprintf("seed %d: %s", seed, found)
				}
			}
			if found == "" {
				t.Fatalf("mutation %q survived 30 seeds: the property cannot see it", tc.name)
			}
			t.Logf("caught: %s", found)
		})
	}
}

func violated(_ *sim, v string) string { return v }

func fencedAny(s *sim, v string) string {
	if v != "" {
		return v
	}
	if ops, resets := s.fenced(); ops+resets > 0 {
		return fmt.Sprintf("key deletes of healthy hosts fenced: %d fence ops, %d resets", ops, resets)
	}
	return ""
}

// deletedHeldSim: 5 hosts, guard threshold 1; rack 0 (h00, h01) is cut
// off together: 2 > 1, both Held, the controller holds (2 silent). At 20 s
// an operator deletes h00's key. The controller must keep counting h00:
// forgetting it leaves 1 silent host, not more than 1, and h01 — Held,
// domains running — is declared.
func deletedHeldSim(seed uint64) *sim {
	gc := DefaultConfig()
	gc.GuardCount, gc.GuardShare = 1, 0.8
	s := newSim(seed, 5, 2, 1, 0, gc, []simEvent{
		{at: 5 * time.Second, kind: "cut-rack", hosts: []int{0, 1}, dur: 100 * time.Second},
		{at: 20 * time.Second, kind: "delete-key", hosts: []int{0}},
	})
	s.maxLate = 0
	return s
}

// deletedDeclaredSim: h00 is cut off alone, fences and is declared; an
// operator deletes its key (erasing the declaration) before the link
// heals. The agent must not resume: a shell that makes the renewal land
// over the marker without telling the core lets it rejoin and resume the
// domains of a declared host.
func deletedDeclaredSim(seed uint64) *sim {
	gc := DefaultConfig()
	gc.GuardCount, gc.GuardShare = 2, 0.8
	s := newSim(seed, 5, 1, 1, 0, gc, []simEvent{
		{at: 5 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 60 * time.Second},
		{at: 50 * time.Second, kind: "delete-key", hosts: []int{0}},
	})
	s.maxLate = 0
	return s
}

// deletedHealthySim: an operator deletes the keys of healthy hosts (h00
// at 10 s, h01 at 20 s, h02 twice): nobody fences. With creates rejected
// by the marker (natslease before the fix) they are locked out and fence.
func deletedHealthySim(seed uint64) *sim {
	s := newSim(seed, 5, 1, 1, 0, DefaultConfig(), []simEvent{
		{at: 10 * time.Second, kind: "delete-key", hosts: []int{0}},
		{at: 20 * time.Second, kind: "delete-key", hosts: []int{1}},
		{at: 30 * time.Second, kind: "delete-key", hosts: []int{2}},
		{at: 60 * time.Second, kind: "delete-key", hosts: []int{2}},
	})
	s.maxLate = 0
	return s
}

// staleGuardSim: 20 hosts grow to 50 at 10 s (guard version 2, threshold
// 10); every member reads and names version 2, and the controller stops
// keeping version 1 (threshold 4). At 70 s an old publish of version 1
// lands late and every connected agent reads it; at that moment rack 0 (6
// hosts) is cut off. The agents must keep version 2 (6 is not more than
// 10: they fence, and may be declared); an agent taking the older version
// is Held with 6 > 4 while the controller, which no member told about
// version 1 again, declares it.
func staleGuardSim(seed uint64) *sim {
	s := newSim(seed, 20, 6, 1, 0, DefaultConfig(), []simEvent{
		{at: 10 * time.Second, kind: "grow", hosts: make([]int, 30)},
		{at: 70 * time.Second, kind: "guard-stale"},
		{at: 70 * time.Second, kind: "cut-rack", hosts: []int{0, 1, 2, 3, 4, 5}, dur: 100 * time.Second},
	})
	s.maxLate = 0
	return s
}

// deletedLapsedSim (found by the safety property): 3 hosts, guard
// threshold 0 (h00 alone is Held: 1 > 0); h00 is cut off, its key is
// deleted meanwhile, and after 35 s the link heals: its lease lapsed long
// ago, so it fences and declares itself — the expired record must wait
// until its pauses completed, or a record says "declared" while its
// domain runs.
func deletedLapsedSim(seed uint64) *sim {
	gc := DefaultConfig()
	gc.GuardCount, gc.GuardShare = 1, 0.2
	s := newSim(seed, 3, 1, 1, 0, gc, []simEvent{
		{at: 5 * time.Second, kind: "delete-key", hosts: []int{0}},
		{at: 5 * time.Second, kind: "cut-rack", hosts: []int{0}, dur: 35 * time.Second},
	})
	s.maxLate = 0
	return s
}
