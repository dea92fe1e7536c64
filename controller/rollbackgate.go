package controller

import (
	"fmt"
	"slices"
	"time"

	"hvguard/fencing"
)

// The rollback gate. A tracker started afresh because the lease stream
// rolled back (AfterRollback), or running while the controllers' rollback
// marker stands, declares a host only on positive evidence that the
// record it judges the host by is the host's own newest, written since
// the rollback — the host's beacons to this tracker name exactly that
// record as the newest, nothing later of the host's (a beacon's revision,
// a refused record of its own, a later value of its key) is there, and
// the record is newer than everything the stopped tracker knew the host
// wrote (its rollback bar) — or on an operator's confirmation
// (ConfirmRollback, `hvguard-controller confirm-rollback HOST`).
//
// Why: after a rollback the stream may hold anything a backup, or a
// compromised node's aligned copies, put back; revisions prove nothing.
// Eight review rounds (X22–X49) each found a way the carries and bars
// judged a host by a record that was not its newest — a withdrawn host,
// a host reconfigured since, an agent restarted with its state lost —
// and declared it while its guests ran (docs/security.md). The gate
// turns every such case into "not declared until evidence or an
// operator": the price (c) is that a host that died before, or around,
// the rollback is not declared by itself; the alert
// (OpRefusedDue, "rollback gate") names the command.
//
// A live host passes while the record it is judged by is the newest its
// beacons named since the fresh start — exactly that one, re-checked at
// every tick: a record older than what the host announced is not its
// newest (a copy a compromised node put back: reviewer X50), and a pass
// that stuck let a later copy through. What stays gated: dead hosts, hosts
// withdrawn before the rollback, cut-off hosts, a host whose last beacon
// was lost, hosts whose agent lost its state (their records fall below
// the bar: reviewer X49), agents without beacon identities (before seq).
//
// The gate lives with the tracker and, through the controllers' rollback
// marker (rollbackconfirm.go), with every controller started while the
// marker stands: an operator clears it (hvguard-controller mark-rollback
// --clear), after rotating the fleet's host keys.

// rollbackGateMutation: no gate, as before. Tests only.
var rollbackGateMutation bool

// rollbackGated reports whether h may not be declared now because the
// lease stream rolled back and nothing since shows that the record h is
// judged by is its own newest (see above), nor has an operator confirmed
// it (since it last showed signs of life: expireConfirmation). No side
// effects (View calls it).
func (t *Tracker) rollbackGated(name string, h *hostState) bool {
	if !t.gate || rollbackGateMutation {
		return false
	}
	if c, ok := t.confirmed[name]; ok && !c.spent(h) {
		return false
	}
	if h.trustedRev == 0 || h.beacons.wrote.zero() {
		return true // no record of its own, or no beacon named one
	}
	if h.rev > h.trustedRev && !h.beacons.revs.has(h.rev) && !rollbackUnvouchedMutation {
		// The key holds a later value than the record it is judged by,
		// and no beacon of the host names it: garbage over a withdrawal
		// the watch skipped, a delete and a create, a value refused for
		// any reason — its newest write may be under it (reviewer X53).
		// A compromised node's garbage keeps a dead host gated: (c).
		return true
	}
	if h.barRefusedRev > h.trustedRev {
		// A record of the host's own, refused as a replay, landed since
		// its trusted record (ownRefused): an agent restarted with its
		// state lost wrote it (its first write a withdrawal whose beacon
		// was lost: reviewer X52) — or a compromised node's copy, which
		// costs only this (c).
		return true
	}
	if h.beacons.maxRev > h.trustedRev && !rollbackLaterMutation {
		// A beacon named a later write than the record it is judged by:
		// the host wrote since (an agent restarted with its state lost
		// writes identities below the newest it named before, which
		// stays beacons.wrote: reviewer X51) — not its newest.
		return true
	}
	if !h.beacons.revs.has(h.trustedRev) && !rollbackLandedMutation {
		// No beacon of the host named the revision the judged record
		// landed at: a compromised node's copy of its newest record,
		// landed as a create after a delete (which the first-value check
		// cannot tell from the host's own), has the right identity at
		// the wrong revision — a withdrawn host was declared 23.5 s
		// after withdrawing (reviewer X54). The price (c): a host whose
		// last beacon was lost, or named a revision the ring no longer
		// holds, is gated.
		return true
	}
	id := idOf(h.rec)
	if id != h.beacons.wrote && !rollbackExactMutation {
		return true // not the newest record its beacons named: unproven
	}
	if rollbackExactMutation && id.newer(h.beacons.wrote) {
		return true
	}
	if b := h.rollbackBar; b != nil && !id.newer(*b) {
		return true // not newer than what it wrote before the rollback
	}
	return false
}

// rollbackExactMutation: a record not newer than the beacons' newest
// passes, as the gate's first version did (reviewer X50);
// rollbackLaterMutation: a beacon naming a later revision than the
// judged record does not keep it gated (reviewer X51). Tests only.
var rollbackExactMutation, rollbackLaterMutation bool

// rollbackRefusedMutation: a record of the host's own refused as a
// replay neither keeps it gated nor spends a confirmation (reviewer X52);
// rollbackUnvouchedMutation: a later value of the key no beacon names
// does not (reviewer X53). Tests only.
var rollbackRefusedMutation, rollbackUnvouchedMutation bool

// rollbackLandedMutation: the judged record's revision need not be one a
// beacon of the host named (reviewer X54). Tests only.
var rollbackLandedMutation bool

// ownRefused: a signed record host writes (active, withdrawn), refused
// as a replay — or as not verified written fresh — landed at rev,
// observed at now. While the gate is on it is taken for the host's own:
// written since by an agent restarted with its state lost, or a copy
// (then it costs only the gate's c). The host stays gated, and it spends a
// confirmation — after a delete and a create too, which the first-value
// check refuses (reviewer X53).
func (t *Tracker) ownRefused(now time.Time, host string, rev uint64, rec *fencing.LeaseRecord) {
	if h := t.hosts[host]; h != nil && t.gate && rec.Sig != "" && hostWritten(rec.State) && !rollbackRefusedMutation {
		h.barRefusedRev = max(h.barRefusedRev, rev)
		if t.listed {
			h.ownAt = now // not the first listing's (Observe)
		}
	}
}

// expireConfirmation drops host's confirmation once the host showed signs
// of life after it was taken (a trusted record, a beacon): the operator
// confirmed a dead host, and it is not dead — a later copy would pass the
// gate on an old word (reviewer X50). The same confirmation is not taken
// again (ConfirmRollback: its marker and revision).
func (t *Tracker) expireConfirmation(name string, h *hostState) {
	if c, ok := t.confirmed[name]; ok && c.spent(h) {
		delete(t.confirmed, name)
	}
}

// confirmation is an operator's confirmation the tracker took: when it
// was written, and the host's trusted revision then.
type confirmation struct {
	at         time.Time
	trustedRev uint64
}

// confirmRef names a confirmation in the control bucket: the rollback
// marker it names and its revision.
type confirmRef struct {
	marker string
	rev    uint64
}

// spent: h showed signs of life since c was written — a record of its
// own (trusted, or refused by the bar but written on the key) or a beacon
// (not a watch restart, which moves lastSeen for every host and spent a
// confirmation whose declaration's write had failed: reviewer X51). c.at
// is when the operator wrote it, in the tracker's clock, not when a poll
// took it: signs of life between the two (a control bucket unreadable for
// a while, a mass-failure hold that kept the host off the polled list)
// were missed and a withdrawn host declared (reviewer X52).
func (c confirmation) spent(h *hostState) bool {
	return h.trustedRev != c.trustedRev || h.ownAt.After(c.at) || h.beacons.at.After(c.at)
}

// confirmTakenMutation: a confirmation is stamped when taken, not when
// written, as before (reviewer X52). Tests only (Runner).
var confirmTakenMutation bool

// ConfirmRollback records an operator's confirmation (hvguard-controller
// confirm-rollback, naming the rollback marker that stands — marker —,
// at rev in the control bucket: Runner's poll) that host may be declared
// although the lease stream rolled back: they checked it is down, or its
// guests are gone. It holds until the host shows signs of life
// (expireConfirmation); one of the same marker at a revision not above
// the last one taken for host is not taken again (a re-created control
// bucket restarts its revisions under a new marker: reviewer X51). It
// reports whether it changed anything.
func (t *Tracker) ConfirmRollback(host, marker string, rev uint64, now time.Time) bool {
	if !t.gate || t.ConfirmTooEarly(now) {
		return false
	}
	if c, ok := t.confirmedRev[host]; ok && c.marker == marker && rev <= c.rev {
		return false
	}
	if t.confirmed == nil {
		t.confirmed, t.confirmedRev = map[string]confirmation{}, map[string]confirmRef{}
	}
	c := confirmation{at: now}
	if h := t.hosts[host]; h != nil {
		c.trustedRev = h.trustedRev
	}
	t.confirmed[host], t.confirmedRev[host] = c, confirmRef{marker, rev}
	return true
}

// ConfirmTooEarly reports whether a confirmation written at at (its
// stamp, confirmStamp) is before this tracker's watch ended its first
// listing: signs of life before then — a record listed, a beacon before
// the subscription — are not the tracker's to see, and one may have spent
// it already. A controller started after an operator confirmed, or after
// the host it confirmed came back, took the confirmation again, and a
// copy of the host's old record (or a second restore) got a withdrawn
// host declared 27.5 s after it withdrew (reviewer X55,
// TestX55ConfirmationRetakenAfterRestart). The price (c): a confirmation
// counts only for the controllers running when it was written — after a
// restart or a takeover the operator confirms again (said at WARN).
func (t *Tracker) ConfirmTooEarly(at time.Time) bool {
	return !confirmStartMutation && (t.listedAt.IsZero() || at.Before(t.listedAt))
}

// confirmStartMutation: a confirmation written before the tracker's first
// listing is taken, as before (reviewer X55). Tests only.
var confirmStartMutation bool

// RollbackGated lists the hosts the gate kept undeclared at the last Tick
// (they were due: OpRefusedDue said so): the runner looks for an
// operator's confirmation of each.
func (t *Tracker) RollbackGated() []string {
	var out []string
	for name, h := range t.hosts {
		if h.saidGate {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// gateReason says why a due host is not declared (OpRefusedDue).
func (t *Tracker) gateReason(name string, h *hostState, now time.Time) string {
	return fmt.Sprintf("silent for %s but not declared: %s, and no beacon of this host since named the record it is judged by (epoch %d, incarnation %d, seq %d) as its newest, newer than what it wrote before — the record may be a copy or a lost write's predecessor. Declared only once an operator has checked the host is down: hvguard-controller confirm-rollback %s",
		now.Sub(h.lastSeen).Round(time.Millisecond), t.gateWhy, h.rec.Epoch, h.rec.Incarnation, h.rec.Seq, name)
}

// MarkerReading is what the runner read of the controllers' rollback
// marker (SetRollbackGate).
type MarkerReading int

const (
	// MarkerUnread: not read yet, or unreadable — the gate is on until
	// it is read.
	MarkerUnread MarkerReading = iota
	// MarkerStands: the marker stands — the gate is on for the tracker's
	// life.
	MarkerStands
	// MarkerAbsent: no marker — the gate is off, unless a marker stood
	// when read before (markerSeen) or this tracker started afresh on a
	// rolled-back stream (AfterRollback).
	MarkerAbsent
)

// SetRollbackGate turns the rollback gate on (why: the controllers'
// rollback marker stands, or could not be read) or off (no marker). A
// gate AfterRollback turned on, or one a standing marker turned on, stays
// on for the tracker's life: a marker gone (cleared by an operator, or
// the control bucket re-created or restored from before it) is not
// evidence that the stream is sound again, and a tracker started behind
// the marker has none of the carries and bars the controller that found
// the rollback kept — the gate alone held its hosts, and a withdrawn
// host lost in the rollback was declared the moment the marker
// vanished (reviewer X55, TestX55MarkerLossOpensRestartedGate). A
// cleared marker ends the gate of controllers started since. It reports
// whether a standing marker's gate outlived the marker now (said once by
// the runner).
func (t *Tracker) SetRollbackGate(m MarkerReading, why string) (kept bool) {
	switch {
	case m == MarkerStands:
		t.gate, t.gateWhy, t.markerSeen = true, why, !markerStickyMutation
	case m == MarkerUnread:
		if !t.markerSeen {
			t.gate, t.gateWhy = true, why
		}
	case t.markerSeen:
		kept = !t.markerGone
		t.markerGone = true
	case t.rolledBackRev == 0:
		t.gate, t.gateWhy = false, ""
	}
	if m == MarkerStands {
		t.markerGone = false
	}
	return kept
}

// markerStickyMutation: a standing marker's gate ends when the marker is
// gone, as before (reviewer X55). Tests only.
var markerStickyMutation bool

// RollbackGateOn reports whether the rollback gate is on.
func (t *Tracker) RollbackGateOn() bool { return t.gate }
