package controller

import (
	"slices"

	"hvguard/fencing"
)

// Versioned guards (docs/fencing.md, "Guard versions").
//
// Agents decide whether they are Held with the guard they last read from
// fencing.GuardKey; one cut off keeps the one it had. So the controller
// must never hold with a larger threshold than any guard an agent may
// still act on. Every guard it publishes has a new Version when its
// content changes; agents never go back to an older version and name the
// version (and threshold) they act on in each lease record. The
// controller keeps every version that may be in use — published, or whose
// publish failed with a possibly unknown outcome — and holds with the
// minimum of:
//
//   - the threshold for the current membership (a shrink lowers it at once);
//   - every kept version >= the oldest version named by a member's latest
//     record (a member naming none — an agent from before versions — keeps
//     every kept version in);
//   - every threshold named by a member's latest record.
//
// So growth raises the threshold only once every member named the new
// version (a member cut off before it saw it keeps the old one in force).
// Declared (expired) and withdrawn records do not count (counts); deleted
// hosts' last records do (keydelete.go).
// The kept versions travel in the published guard (History), pruned below
// that oldest named version and merged beyond maxGuardHistory (an entry
// merged into a newer one keeps the smaller threshold: never less
// conservative), so a restarted controller restores them (RestoreGuard).

// maxGuardHistory bounds the versions kept (and published): a guard value
// stays small even if some member never names a version.
const maxGuardHistory = 16

// guardMutation switches one rule of the versioned guard off, for the
// simulation's mutation checks only (sim_test.go); each must make a safety
// property fail. Never set outside tests.
var guardMutation struct {
	// latestOnly: hold with the threshold of the latest proposed guard,
	// whatever was published and whatever the members act on (the code
	// before guard versions).
	latestOnly bool
}

// guardClaimMutation (reviewer X5): with signatures required, versions
// members name are taken as they come (maxGuardJump off), as before.
var guardClaimMutation bool

type guardVersions struct {
	kept    []fencing.GuardVersion // ascending versions
	adopted fencing.Guard          // the last guard published successfully
	last    fencing.Guard          // the last guard whose publish was tried
	maxSeen uint64                 // highest version proposed, restored or named
	latestN int                    // members of the latest proposal (mutation)
}

// maxGuardJump bounds how far a version a member names may move maxSeen
// with signatures required: versions grow by one per guard change, so a
// jump of a million is not a version any controller published — a
// compromised node naming 2^64-1 in its own record wrapped the next
// version to 0 and froze every agent's guard (reviewer X5,
// TestX5OwnRecordNamesHugeGuardVersion).
const maxGuardJump = 1 << 20

// named notes the version a record names (required: signatures required).
func (g *guardVersions) named(rec *fencing.LeaseRecord, required bool) {
	if rec.Guard == nil {
		return
	}
	if required && rec.Guard.Version > g.maxSeen+maxGuardJump && !guardClaimMutation {
		return
	}
	g.maxSeen = max(g.maxSeen, rec.Guard.Version)
}

// counts reports whether h's record constrains the threshold: not a
// declared host (it gives no confirmation that counts) nor a withdrawn one
// (its agent is stopped; it names its guard again when it takes its lease
// back).
func counts(h *hostState) bool {
	return h.rec.Host != "" && h.rec.State != fencing.LeaseExpired && h.rec.State != fencing.LeaseWithdrawn
}

// floor returns the oldest version a member may act on (0: any kept).
func floor(hosts map[string]*hostState) uint64 {
	var f uint64
	first := true
	for _, h := range hosts {
		if !counts(h) {
			continue
		}
		var v uint64
		if h.rec.Guard != nil {
			v = h.rec.Guard.Version
		}
		if first || v < f {
			f, first = v, false
		}
	}
	return f
}

// effective returns th lowered to every threshold an agent may act on.
// A threshold a member's record names counts as named, even for a
// version this controller no longer keeps: an agent back from a
// withdrawal acts on the guard it cached until it reads a newer one, and
// counting only kept versions declared such a host while Held (reviewer
// X6, TestX6ReturningHostNamesPrunedGuardVersion); keeping every version
// a withdrawn or declared host named, instead, pinned a low threshold for
// ever (reviewer X7, TestX7StaleHostPinsLowGuardForEver). The price: a
// compromised node naming threshold 0 in its own renewals makes the
// controller hold on any one silent host (docs/security.md, What is
// left) — the safe direction.
func (g *guardVersions) effective(th int, hosts map[string]*hostState) int {
	f := floor(hosts)
	for _, v := range g.kept {
		if v.Version >= f {
			th = min(th, v.Threshold)
		}
	}
	for _, h := range hosts {
		if counts(h) && h.rec.Guard != nil {
			th = min(th, h.rec.Guard.Threshold)
		}
	}
	return th
}

// forHost returns th lowered to every threshold h's agent may act on: the
// threshold h's latest record names and every kept version at or after
// the version it names (an agent never goes back to an older guard; a
// record naming none — no guard known yet, an agent from before versions —
// keeps every kept version in). The same rules as effective, for one
// host: h is declared only when the silent hosts are more than this, so
// the guard h's agent acts on holds it (docs/fencing.md, "Guard
// versions"); what another member names cannot hold h.
func (g *guardVersions) forHost(th int, h *hostState) int {
	var v uint64
	if h.rec.Guard != nil {
		v = h.rec.Guard.Version
		th = min(th, h.rec.Guard.Threshold)
	}
	for _, k := range g.kept {
		if k.Version >= v {
			th = min(th, k.Threshold)
		}
	}
	return th
}

// keep adds v to the kept versions and prunes them.
func (g *guardVersions) keep(v fencing.GuardVersion, hosts map[string]*hostState) {
	g.maxSeen = max(g.maxSeen, v.Version)
	i, found := slices.BinarySearchFunc(g.kept, v.Version, func(e fencing.GuardVersion, x uint64) int { return cmpU(e.Version, x) })
	if found {
		g.kept[i].Threshold = min(g.kept[i].Threshold, v.Threshold)
	} else {
		g.kept = slices.Insert(g.kept, i, v)
	}
	f := floor(hosts)
	// Versions below the floor are out of use; keep the newest always.
	for len(g.kept) > 1 && g.kept[0].Version < f {
		g.kept = g.kept[1:]
	}
	for len(g.kept) > maxGuardHistory {
		i := mergeable(g.kept)
		g.kept[i+1].Threshold = min(g.kept[i+1].Threshold, g.kept[i].Threshold)
		g.kept = slices.Delete(g.kept, i, i+1)
	}
}

// mergeMutation (reviewer X10): merge the oldest kept version into the
// next, whatever their thresholds, as before. Tests only.
var mergeMutation bool

// mergeable returns the kept version to merge into the next one: the
// oldest whose threshold is not below the next one's, which loses
// nothing — a host naming a version up to it still sees the lower
// threshold after it, one naming a version after it never needed it. Only
// if thresholds rise at every step (more versions than distinct
// thresholds up to count: not with the default count 10) the oldest,
// whose threshold the next one then takes (never less conservative).
// Merging the oldest always carried a low threshold forward past newer
// versions: a compromised node naming a threshold-0 version (pinning it
// as the oldest) and churning versions by deletes held every host for good
// (reviewer X10, TestX10GarbageAtRestartMintsZeroThreshold/pin-and-churn).
func mergeable(kept []fencing.GuardVersion) int {
	if !mergeMutation {
		for i := 0; i+1 < len(kept); i++ {
			if kept[i].Threshold >= kept[i+1].Threshold {
				return i
			}
		}
	}
	return 0
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Guard returns the guard to publish under fencing.GuardKey: the last one
// tried again (same version) if nothing changed, else a new version for
// the current membership. It changes nothing: report the publish's
// outcome with GuardPublished.
func (t *Tracker) Guard() fencing.Guard {
	g := fencing.Guard{Count: t.cfg.GuardCount, Share: t.cfg.GuardShare, Window: t.cfg.GuardWindow, Members: t.Members()}
	g.Deleted = t.deletedHosts()
	l := t.guards.last
	if l.Version > 0 && l.Version == t.guards.maxSeen && l.Count == g.Count && l.Share == g.Share && l.Window == g.Window && l.Members == g.Members &&
		slices.EqualFunc(l.Deleted, g.Deleted, sameDeleted) {
		g.Version = l.Version
	} else {
		g.Version = t.guards.maxSeen + 1
	}
	g.History = slices.Clone(t.guards.kept)
	ref := g.Ref() // nil for an empty bucket: agents ignore such a guard
	if i := slices.IndexFunc(g.History, func(v fencing.GuardVersion) bool { return v.Version == g.Version }); i < 0 && ref != nil {
		g.History = append(g.History, *ref)
	}
	t.guards.latestN = g.Members
	return g
}

// GuardPublished reports the outcome of publishing g (from Guard). On
// success g is adopted. Either way its version is kept from now on: a
// failed write may still land (a timeout's outcome is unknown), and a
// version kept for nothing only makes the threshold more conservative.
func (t *Tracker) GuardPublished(g fencing.Guard, err error) {
	t.guards.maxSeen = max(t.guards.maxSeen, g.Version)
	if ref := g.Ref(); ref != nil {
		t.guards.keep(*ref, t.hosts)
	}
	t.guards.last = g
	if err == nil {
		t.guards.adopted = g
	}
}

// RestoreGuard takes over the guard found under fencing.GuardKey at start
// (a restarted or new controller): its version and history are kept, so
// agents still acting on them are honoured and versions go on from there.
func (t *Tracker) RestoreGuard(g fencing.Guard) {
	for _, v := range g.History {
		t.guards.keep(v, t.hosts)
	}
	if ref := g.Ref(); ref != nil {
		t.guards.keep(*ref, t.hosts)
		t.guards.adopted, t.guards.last = g, g
	}
	t.restoreDeleted(g.Deleted)
}

// GuardNamed reports whether a version of a guard was restored, proposed
// or named by a trusted record: then some agent may act on a guard, and a
// controller must not start without the published one (Runner).
func (t *Tracker) GuardNamed() bool { return t.guards.maxSeen > 0 }

// GuardVersions returns the versions kept (for tests and status).
func (t *Tracker) GuardVersions() []fencing.GuardVersion { return slices.Clone(t.guards.kept) }
