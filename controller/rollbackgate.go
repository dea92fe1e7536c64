package controller

import (
	"fmt"
	"slices"
	"time"
)

// The rollback gate. A tracker started afresh because the lease stream
// rolled back (AfterRollback) declares a host only once it has positive
// evidence that the record it judges the host by is the host's own and
// written since the rollback — a beacon the host published to this tracker
// names that record or a newer one, and that record is newer than
// everything the stopped tracker knew the host wrote (its rollback bar) —
// or once an operator confirmed the host (ConfirmRollback,
// `hvguard-controller confirm-rollback HOST`).
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
// A live host leaves the gate at its first beacon naming a record newer
// than its bar (a renewal: lease_ttl/3 or so). What stays gated: dead
// hosts, hosts withdrawn before the rollback, cut-off hosts, hosts whose
// agent lost its state (its records fall below the bar: reviewer X49),
// agents without beacon identities (before seq). The gate lives with the
// tracker: a controller restarted by hand after a rollback has none (as
// it has no carry: docs/security.md).

// rollbackGateMutation: no gate, as before. Tests only.
var rollbackGateMutation bool

// rollbackGated reports whether h may not be declared because the lease
// stream rolled back under this tracker's predecessor and nothing since
// shows h's record is its own (see above). Once it holds no more it never
// holds again for h (rollbackOK).
func (t *Tracker) rollbackGated(name string, h *hostState) bool {
	if t.rolledBackRev == 0 || h.rollbackOK || rollbackGateMutation {
		return false
	}
	if t.confirmed[name] {
		h.rollbackOK = true
		return false
	}
	if h.trustedRev == 0 || h.beacons.wrote.zero() {
		return true // no record of its own, or no beacon named one
	}
	id := idOf(h.rec)
	if id.newer(h.beacons.wrote) {
		return true // its beacons named an older record: this one is unproven
	}
	if b := h.rollbackBar; b != nil && !id.newer(*b) {
		return true // not newer than what it wrote before the rollback
	}
	h.rollbackOK = true
	return false
}

// ConfirmRollback records an operator's confirmation (hvguard-controller
// confirm-rollback, written to the control bucket after this tracker
// started: Runner.pollConfirmations) that host may be declared although
// the lease stream rolled back: they checked it is down, or its
// guests are gone. Known or not yet tracked, it holds for this tracker's
// life, a re-created key's too. It reports whether it changed anything.
func (t *Tracker) ConfirmRollback(host string) bool {
	if t.rolledBackRev == 0 || t.confirmed[host] {
		return false
	}
	if t.confirmed == nil {
		t.confirmed = map[string]bool{}
	}
	t.confirmed[host] = true
	return true
}

// RollbackGated lists the hosts the gate keeps undeclared now (they are
// due: Tick said so, OpRefusedDue): the runner looks for an operator's
// confirmation of each.
func (t *Tracker) RollbackGated() []string {
	var out []string
	for name, h := range t.hosts {
		if h.saidGate && !h.rollbackOK && !t.confirmed[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// gateReason says why a due host is not declared (OpRefusedDue).
func (t *Tracker) gateReason(name string, h *hostState, now time.Time) string {
	return fmt.Sprintf("silent for %s but not declared: the lease stream rolled back (this controller's watch had reached revision %d), and no beacon of this host since named its record (epoch %d, incarnation %d, seq %d) newer than what it wrote before — the record may be a copy or a lost write's predecessor. Declared only once an operator has checked the host is down: hvguard-controller confirm-rollback %s",
		now.Sub(h.lastSeen).Round(time.Millisecond), t.rolledBackRev, h.rec.Epoch, h.rec.Incarnation, h.rec.Seq, name)
}
