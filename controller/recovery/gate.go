package recovery

import (
	"fmt"
	"regexp"
	"time"
)

// Lease states and the agent state as the lease record spells them
// (fencing.LeaseState, fencing.StateHealthy; the core imports only the
// standard library, controller's tests check they match).
const (
	LeaseActive    = "active"
	LeaseExpired   = "expired"
	LeaseReleased  = "released"
	LeaseWithdrawn = "withdrawn"
	AgentHealthy   = "healthy"
)

// Lease is what the controller knows of a host's lease at one instant:
// the record (from the tracker's watch, or read from the bucket right
// before a destructive step) and this controller's own tracker's verdict.
type Lease struct {
	Host string
	// Present: a record was read. False: the key is absent (deleted or
	// purged) or, with ReadErr, the read failed.
	Present    bool
	ReadErr    string
	State      string
	Epoch      uint64
	Revision   uint64
	AgentState string
	// Reason is the record's reason: a controller's declaration ends
	// with "(declared by controller <id>, term <n>)".
	Reason string
	// Refused says why this controller does not honour the host's
	// constants (a backstop it does not accept, ...): "" when accepted.
	Refused string
	// SilentFor is how long this controller's tracker has observed no
	// renewal of the host (its watch running); Due is the lease_ttl +
	// grace it grants the host.
	SilentFor, Due time.Duration
	// Holding: this controller's mass-failure guard holds now.
	Holding bool
	// SharedNovaHost names the other lease hosts whose nova-compute host
	// is this host's too (Config.SharedNovaHost): "" when none.
	SharedNovaHost string
	// AliveAs names the renewing (active) lease hosts whose record carries
	// this host's boot id: the same running machine under another name
	// (renamed): "" when none.
	AliveAs string
}

// Why is the kind of a refusal to act.
type Why string

// Refusals. Each is said in the status and an event.
const (
	// WhyNotDeclared: the lease is not expired (active: not declared, or
	// not yet past grace; released: given back).
	WhyNotDeclared Why = "not-declared"
	// WhyWithdrawn: the agent withdrew its lease (orderly stop): the host
	// is unprotected and never recovered.
	WhyWithdrawn Why = "withdrawn"
	// WhyNotConfirmed: the lease key holds no record (deleted, purged) or
	// could not be read: the declaration cannot be confirmed.
	WhyNotConfirmed Why = "not-confirmed"
	// WhyNotController: the expired record is not a controller's
	// declaration (an agent's own after its key was deleted).
	WhyNotController Why = "not-a-controller-declaration"
	// WhyBackstop: this controller refuses the host's constants (its
	// backstop, drift, grace): it would never have declared it.
	WhyBackstop Why = "backstop-not-accepted"
	// WhyGuardHolding: the mass-failure guard holds (its expiry may be
	// held too): nothing destructive until the hold ends.
	WhyGuardHolding Why = "guard-holding"
	// WhySilenceNotSeen: this controller's own tracker has not observed
	// the host silent for lease_ttl + grace yet (it started, or its watch
	// restarted, after the declaration): it waits until it has.
	WhySilenceNotSeen Why = "silence-not-confirmed"
	// WhyNovaHostShared: another lease host maps to the same nova-compute
	// host (recovery.nova_hosts, host names compared as Nova's database
	// does, without case): whose servers they are is ambiguous, and the
	// other host may be alive.
	WhyNovaHostShared Why = "nova-host-shared"
	// WhyAliveAs: another lease host renews with this host's boot id:
	// the same machine, alive under another name (the agent's host was
	// renamed): never recovered.
	WhyAliveAs Why = "alive-under-another-name"
	// WhyChanged: the lease record is not the declaration the recovery
	// was started for (released, renewed, withdrawn, deleted, declared
	// again): the lease came back; no further destructive step.
	WhyChanged Why = "declaration-changed"
)

// Temporary reports whether a refusal may pass by itself (the recovery
// waits) rather than end the recovery's destructive steps.
func (w Why) Temporary() bool {
	return w == WhyGuardHolding || w == WhySilenceNotSeen || w == WhyNotConfirmed
}

var signatureRE = regexp.MustCompile(`\(declared by controller ([^,()]+), term \d+\)$`)

// DeclaredBy returns the controller id a declaration's reason names ("":
// none, not a controller's declaration).
func DeclaredBy(reason string) string {
	if m := signatureRE.FindStringSubmatch(reason); m != nil {
		return m[1]
	}
	return ""
}

// Confirm says whether a new recovery may start for l's declaration: ""
// if so, else why not (and the details).
func Confirm(l Lease) (Why, string) {
	if w, s := declared(l); w != "" {
		return w, s
	}
	switch {
	case DeclaredBy(l.Reason) == "":
		return WhyNotController, fmt.Sprintf("the expired record (epoch %d) is not a controller's declaration (%q): recover by hand", l.Epoch, l.Reason)
	case l.SilentFor < l.Due:
		return WhySilenceNotSeen, fmt.Sprintf("this controller has seen the host silent for %s of the %s (lease_ttl + grace) it requires", l.SilentFor.Round(time.Millisecond), l.Due)
	}
	return "", ""
}

// Check says whether rec's next destructive step may proceed given l, a
// fresh read of the lease key: "" if so.
func Check(rec *Record, l Lease) (Why, string) {
	if l.Present && (l.Epoch != rec.Epoch || l.Revision != rec.LeaseRevision) {
		return WhyChanged, fmt.Sprintf("the lease is now %s epoch %d revision %d, not the declaration of epoch %d revision %d this recovery is for",
			l.State, l.Epoch, l.Revision, rec.Epoch, rec.LeaseRevision)
	}
	w, s := declared(l)
	switch {
	case w == WhyNotConfirmed && l.ReadErr == "":
		// The key is gone: the declaration with it.
		return WhyChanged, s
	case w == WhyNotDeclared || w == WhyWithdrawn:
		return WhyChanged, s
	}
	return w, s
}

// declared checks what both Confirm and Check need.
func declared(l Lease) (Why, string) {
	switch {
	case !l.Present && l.ReadErr != "":
		return WhyNotConfirmed, "the lease record could not be read: " + l.ReadErr
	case !l.Present:
		return WhyNotConfirmed, "the lease key holds no record (deleted or purged): nothing confirms a declaration"
	case l.State == LeaseWithdrawn:
		return WhyWithdrawn, "the agent withdrew its lease (orderly stop): unprotected, not recovered"
	case l.State != LeaseExpired:
		return WhyNotDeclared, fmt.Sprintf("the lease is %s, not declared expired", l.State)
	case l.Refused != "":
		return WhyBackstop, "this controller does not accept the host's constants: " + l.Refused
	case l.AliveAs != "":
		return WhyAliveAs, "its machine (the same boot id) renews as lease host " + l.AliveAs + ": alive under another name (renamed?), never recovered"
	case l.SharedNovaHost != "":
		return WhyNovaHostShared, "its nova-compute host is also that of lease host(s) " + l.SharedNovaHost + " (recovery.nova_hosts): not recovered until the mapping is fixed"
	case l.Holding:
		return WhyGuardHolding, "the mass-failure guard holds: nothing destructive until it ends"
	}
	return "", ""
}

// back reports whether l shows the host back after rec's declaration: its
// lease active again (released, then renewed) with the agent healthy (it
// rejoined and ran its reconciliation).
func back(rec *Record, l Lease) bool {
	return l.Present && l.State == LeaseActive && l.AgentState == AgentHealthy && l.Epoch >= rec.Epoch && l.Revision > rec.LeaseRevision
}
