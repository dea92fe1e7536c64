package controller

import (
	"fmt"
	"time"

	"hvguard/fencing"
)

// A host whose lease key was deleted or purged (docs/fencing.md, "Key
// deleted"). There is no record to declare by CAS, so the host is never
// declared while its key is absent: it is unprotected, which the tracker
// says once (OpLeaseDeleted). It is not forgotten, though: its agent may
// still run, cut off and unaware of the delete, Held by its peers and
// confirming their holds; if the controller stopped counting it, the
// others' silence alone could fall to the threshold and the controller
// would declare hosts that are Held. So a deleted host keeps counting
// toward the mass-failure guard exactly as a host whose renewals stopped
// at its last observed record (silent from suspect_after on, until its key
// comes back, then for one more guard window), but not toward the
// membership (N: a delete shrinks it, which lowers the threshold at once).
// When the agent re-creates its key, the host is tracked again as a new
// observation (its clock restarts).
//
// With signatures required and a trusted record of the host signed by its
// key seen (Tracker.pinned), a delete is no longer a reason not to
// declare: any agent may delete any host's key (relays need the
// permission), so a dead host would be kept undeclared by a delete every
// lease_ttl + grace (issue 11's invariant c). Its declaration clock runs
// on from its last trusted renewal and it is declared by CAS on the newest
// marker's revision; a live agent re-creates its key at its next renewal
// (docs/fencing.md, "Key deleted"), which restarts the clock. The
// membership and the guard count it as above. Decommissioning a host is
// then an orderly stop (withdrawn: never declared) before the delete. Forget drops a deleted host for good
// (decommissioned: withdraw or stop its agent first). The deleted hosts
// that count travel in the published guard (fencing.Guard.Deleted), so a
// controller that restarts or takes over restores them (RestoreGuard) and
// counts them as silent at once.

// keyDeleteMutation switches the rule above off, for the simulation's
// mutation checks only (sim_membership_test.go). Never set outside tests.
// fakeMarkerMutation (reviewer X5): with signatures required, a marker
// of a host never seen still counts silent, as before. Tests only.
var fakeMarkerMutation bool

var keyDeleteMutation struct {
	// forget: a deleted host is forgotten (counts toward nothing), as
	// before.
	forget bool
}

// defaultSilentAfter is when a host the controller has no trusted record
// of counts silent for the guard: a little before an agent with the
// default timing suspects itself (as Observe computes it from a record).
func (t *Tracker) defaultSilentAfter() time.Duration {
	return time.Duration(float64(fencing.DefaultTiming().SuspectAfter()) * (1 - 2*t.cfg.Drift))
}

// unenrolled reports whether, with signatures required, host has no key
// in host_keys_file (Tracker.SetEnrolled): its delete markers count for
// nothing (observeDeleted).
func (t *Tracker) unenrolled(host string) bool {
	return t.required && t.enrolled != nil && !t.enrolled(host) && !fakeMarkerMutation
}

// observeDeleted records that host's key was deleted or purged at rev.
func (t *Tracker) observeDeleted(now time.Time, host string, rev uint64) {
	h := t.hosts[host]
	if h == nil && t.unenrolled(host) {
		// With signatures required, a marker of a host this controller
		// never saw and that has no key in host_keys_file counts for
		// nothing: a delete is a publish any agent may make to any
		// single-token key (relays), and markers of made-up names, each
		// counted silent for ever, held the guard — no host declared
		// again, fleet-wide (reviewer X5, TestX5FakeDeleteMarkersHoldForever).
		// An enrolled host's marker still counts (deleted while no
		// controller ran: its agent may be Held and confirming —
		// reviewer X6, TestX6DeletesWhileNoControllerEndHold).
		t.out = append(t.out, Decision{Op: OpLeaseDeleted, Host: host, Revision: rev, Reason: "lease-deleted: a marker of a host this controller never saw and that has no key in host_keys_file: ignored (signatures required: any agent may write such a marker)"})
		return
	}
	if h == nil {
		// A marker of a host this controller never saw (deleted while it
		// was down, before a guard listing it was published): its agent
		// may still run cut off and confirm its peers' holds, so it counts
		// like any deleted host (restoreDeleted), silent from now.
		t.restoreDeleted([]fencing.DeletedHost{{Host: host}})
		if h = t.hosts[host]; h != nil {
			h.rev = rev
		}
		return
	}
	if rev <= h.rev {
		t.regress(h, host, rev)
		return // a stale delivery
	}
	t.afterSkip(now, host, h, rev)                            // a withdrawal may be what a skip hid (beaconloss.go)
	h.laterValue(laterValue{rev: rev, at: now, marker: true}) // vouch.go
	if h.deleted {
		h.rev = rev // deleted again: a declaration is a CAS on the newest marker
		t.pin(host, h, rev, true, true)
		return
	}
	if keyDeleteMutation.forget {
		delete(t.hosts, host)
		return
	}
	h.deleted, h.rev, h.deletedRev = true, rev, rev
	h.declaring = time.Time{}
	t.pin(host, h, rev, true, true)
	if t.pinned(h) && h.rec.State == fencing.LeaseActive {
		t.out = append(t.out, Decision{Op: OpLeaseDeleted, Host: host, Reason: fmt.Sprintf(
			"lease-deleted: its key was deleted or purged (last record %s, epoch %d, signed by its key); signatures are required, so the delete stops nothing: declared on the marker's revision once silent for lease_ttl + grace since its last trusted renewal, unless its agent re-creates the key; it keeps counting toward the mass-failure guard",
			h.rec.State, h.rec.Epoch)})
		return
	}
	t.out = append(t.out, Decision{Op: OpLeaseDeleted, Host: host, Reason: fmt.Sprintf(
		"lease-deleted: host unprotected: its key was deleted or purged (last record %s, epoch %d); never declared until its agent re-creates it; it keeps counting toward the mass-failure guard",
		h.rec.State, h.rec.Epoch)})
}

// recreated returns the state of a deleted host whose key holds a record
// again: a new observation, whose silence while deleted (if it counted)
// ends now and counts for one more guard window.
func (t *Tracker) recreated(now time.Time, old *hostState) *hostState {
	h := &hostState{lastSeen: now, rev: old.rev}
	if !recreatedCarryMutation {
		// A rollback's carries outlive a delete: a delete marker and a
		// copy of an older genuine record ended the counted-silent carry
		// of a Held rack's host, the hold ended and a Held host was
		// declared (reviewer X38, TestX38DeleteEndsCountedCarry). The
		// record that ends them must be newer than the carried one.
		h.countedCarry, h.countFrom, h.carried = old.countedCarry, old.countFrom, old.carried
	}
	h.rollbackBar = old.rollbackBar // a copy from before the rollback stays one after a delete
	h.before = old.bound()          // a create after the delete counts from it (coverStart)
	if t.counted(old, now) {
		h.silentEnd = now
	}
	// The host's beacons go on binding it: a delete and a replay of its
	// last genuine record must not make the tracker lenient for it
	// (reviewer X4, TestX4DeleteAndReplayDropBeacons: garbage then kept
	// the dead host undeclared for ever).
	h.beacons = old.beacons
	return h
}

// Forget drops a host whose key was deleted (decommissioned for good) at
// now. It keeps counting toward the guard for one more guard window, then
// is gone: a peer that was Held on its confirmations may rely on them for
// up to held_recheck + peer_timeout + fence_deadline (13 s) after the last
// one, and the guard window (60 s) is what covers that (found by the
// simulation: a rack of two Held hosts, one decommissioned; forgetting it
// at once ended the hold and the other was declared while its domain ran).
// It refuses a host whose key exists.
func (t *Tracker) Forget(now time.Time, host string) error {
	h := t.hosts[host]
	switch {
	case h == nil:
		return fmt.Errorf("forget %s: unknown host", host)
	case !h.deleted:
		return fmt.Errorf("forget %s: its lease key exists (delete it first)", host)
	}
	if h.forgotten.IsZero() {
		h.forgotten = now
	}
	return nil
}

// purgeForgotten drops the forgotten hosts whose guard window is over.
func (t *Tracker) purgeForgotten(now time.Time) {
	for name, h := range t.hosts {
		if !h.forgotten.IsZero() && now.Sub(h.forgotten) > t.cfg.GuardWindow {
			delete(t.hosts, name)
			delete(t.stored, name)
		}
	}
}

// deletedHosts lists the deleted hosts whose last record counts toward the
// guard (not declared, not withdrawn), sorted, for the published guard.
func (t *Tracker) deletedHosts() []fencing.DeletedHost {
	var out []fencing.DeletedHost
	for _, name := range t.Hosts() {
		if h := t.hosts[name]; h.deleted && countsDeleted(h) {
			out = append(out, fencing.DeletedHost{Host: name, Guard: h.rec.Guard})
		}
	}
	return out
}

// countsDeleted reports whether h's last record, if its key is deleted,
// counts toward the guard: not a host that never held a trusted record (a
// made-up name seen once as garbage, then deleted: published, every later
// controller counted it silent for ever — reviewer X6,
// TestX6GarbageThenDeleteFakesHoldAfterRestart), not a declared or a
// withdrawn one.
func countsDeleted(h *hostState) bool {
	return h.rec.State != "" && h.rec.State != fencing.LeaseExpired && h.rec.State != fencing.LeaseWithdrawn
}

func sameDeleted(a, b fencing.DeletedHost) bool {
	return a.Host == b.Host && (a.Guard == nil) == (b.Guard == nil) && (a.Guard == nil || *a.Guard == *b.Guard)
}

// restoreDeleted adds the published deleted hosts this tracker does not
// know (its watch showed only their delete markers): silent from now on
// (lastSeen zero), never declared, their named guard version in force.
func (t *Tracker) restoreDeleted(ds []fencing.DeletedHost) {
	for _, d := range ds {
		if t.unenrolled(d.Host) {
			continue // see observeDeleted
		}
		if h, ok := t.hosts[d.Host]; ok || d.Host == "" {
			if ok && h.deleted && h.rec.Guard == nil {
				h.rec.Guard = d.Guard // its marker came first: the guard it named
			}
			continue
		}
		t.hosts[d.Host] = t.keyGone(d.Host, d.Guard)
	}
}

// keyGone is a host known only as one whose key is gone (restoreDeleted,
// KeepCounted): silent from now on (lastSeen zero), never declared (no
// trusted record), the guard version it named in force, until
// Tracker.Forget (decommissioning) or its key is re-created.
func (t *Tracker) keyGone(host string, guard *fencing.GuardVersion) *hostState {
	return &hostState{deleted: true, silentAft: t.defaultSilentAfter(),
		rec: fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: host, State: fencing.LeaseActive, Guard: guard}}
}

// recreatedCarryMutation: a re-created key's host drops the rollback's
// carries, as before (reviewer X38). Tests only.
var recreatedCarryMutation bool
