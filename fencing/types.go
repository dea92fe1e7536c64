package fencing

import (
	"fmt"
	"time"
)

// State is the agent's fencing state.
type State string

// Agent states. Healthy/Starting/Suspect hold (or may hold) the lease;
// AskingPeers decides; Held and Fencing/Fenced are the two outcomes of
// isolation; Rejoining and AwaitingRelease are the two ways back.
const (
	// StateStarting: the agent (re)started and has no acknowledged renewal
	// in this process yet; the lease age is taken from the durable state.
	StateStarting State = "starting"
	// StateHealthy: the last renewal was acknowledged.
	StateHealthy State = "healthy"
	// StateSuspect: a renewal timed out or failed; the lease is still held.
	StateSuspect State = "suspect"
	// StateAskingPeers: no acknowledged renewal for SuspectAfter; peers are
	// asked whether they can renew (and relay ours).
	StateAskingPeers State = "asking-peers"
	// StateHeld: more hosts than the controller's guard threshold confirmed
	// they cannot renew: the controller must hold, so the agent does not
	// fence (and asks again every HeldRecheck).
	StateHeld State = "held"
	// StateFencing: the fence action is in progress.
	StateFencing State = "fencing"
	// StateFenced: the fence action completed (or, monitor-only, would
	// have).
	StateFenced State = "fenced"
	// StateRejoining: renewals succeed again and the host was not declared
	// expired: waiting for the rejoin reconciliation before resuming.
	StateRejoining State = "rejoining"
	// StateAwaitingRelease: the controller declared the host expired; it
	// stays fenced until an explicit release (controller or `hvguard
	// unfence`).
	StateAwaitingRelease State = "awaiting-release"
	// StateWithdrawn: the agent stopped in order and its withdrawn record
	// landed: the controller will not declare the host, nothing renews
	// any more, the process may leave (and disarm the watchdog).
	StateWithdrawn State = "withdrawn"
)

// Reason says why a transition happened (published with it).
type Reason string

// Reasons.
const (
	ReasonStarted                              Reason = "Started"
	ReasonRestartedFenced                      Reason = "RestartedFenced"
	ReasonRestartedHeld                        Reason = "RestartedHeld"
	ReasonRenewed                              Reason = "Renewed"
	ReasonRenewTimedOut                        Reason = "RenewTimedOutOutcomeUnknown"
	ReasonRenewFailed                          Reason = "RenewFailed"
	ReasonNoRenewalForSuspectAfter             Reason = "NoAcknowledgedRenewalForSuspectAfter"
	ReasonRelayedByPeer                        Reason = "RelayedByPeer"
	ReasonHeldBecauseMostPeersCantRenew        Reason = "HeldBecauseMostPeersCantRenew"
	ReasonIsolatedBecauseMostPeersCanRenew     Reason = "IsolatedBecauseMostPeersCanRenew"
	ReasonIsolatedBecauseTooFewPeersCantRenew  Reason = "IsolatedBecauseTooFewPeersCantRenew"
	ReasonIsolatedBecauseNoPeerAnswered        Reason = "IsolatedBecauseNoPeerAnswered"
	ReasonIsolatedBecauseNoGuardKnown          Reason = "IsolatedBecauseNoGuardOrMembershipKnown"
	ReasonIsolatedAtFenceDeadline              Reason = "IsolatedBecauseFenceStartDeadlineReached"
	ReasonIsolatedBecauseHoldNoLongerConfirmed Reason = "IsolatedBecauseHoldNoLongerConfirmed"
	ReasonDeclaredExpired                      Reason = "DeclaredExpiredByController"
	ReasonDeclaredWhileHoldingLease            Reason = "DeclaredExpiredWhileHoldingLease"
	ReasonDomainRunningWhileFenced             Reason = "DomainRunningWhileFenced"
	ReasonFenceComplete                        Reason = "FenceComplete"
	ReasonFenceDeadlineMissedResettingHost     Reason = "FenceDeadlineMissedResettingHost"
	ReasonFenceDeadlineMissedNoReset           Reason = "FenceDeadlineMissedNoResetAllowed"
	ReasonRenewedAfterFence                    Reason = "RenewedAfterFenceNotDeclared"
	ReasonLeaseLostWhileRejoining              Reason = "LeaseLostWhileRejoining"
	ReasonResumedAfterReconcile                Reason = "ResumedAfterReconcile"
	ReasonReleased                             Reason = "ReleasedAfterDeclaration"
	ReasonReleasedReconciled                   Reason = "ReleasedAndReconciled"
	// Lease key deleted or purged (keydelete.go).
	ReasonLeaseKeyDeletedRecreated    Reason = "LeaseKeyDeletedRecreated"
	ReasonLeaseKeyDeletedWhileFenced  Reason = "LeaseKeyDeletedWhileFencedOrLapsed"
	ReasonSelfDeclaredAfterKeyDeleted Reason = "SelfDeclaredAfterKeyDeleted"
	ReasonWithdrawn                   Reason = "WithdrawnOnStop"
	ReasonWithdrawalNotConfirmed      Reason = "FencedOnStopWithdrawalNotConfirmed"
	ReasonStartedFromWithdrawn        Reason = "StartedFromWithdrawnLease"
	ReasonWatchdogNotArmedLeaseLapsed Reason = "WatchdogNotFedAtStartLeaseLapsed"
	// ReasonInvalidLeaseRecord (an alert): the host's key holds a record
	// this agent does not trust (sign.go): handled like a deleted key.
	ReasonInvalidLeaseRecord Reason = "InvalidLeaseRecord"
)

// Transition is one fence-state transition, to be published.
type Transition struct {
	At       time.Time
	From, To State
	Reason   Reason
	Epoch    uint64
	// Detail is a short human-readable elaboration (counts, domains).
	Detail string
}

func (t Transition) String() string {
	s := fmt.Sprintf("%s -> %s (%s)", t.From, t.To, t.Reason)
	if t.Detail != "" {
		s += ": " + t.Detail
	}
	return s
}

// RenewRequest asks the caller to write Record to the host's key by
// compare-and-set on Revision (0: create the key). The caller reports the
// outcome with Agent.Renewed(Seq, ...). The lease is counted from the time
// the core emitted the request, which is no later than the real send.
type RenewRequest struct {
	Seq      uint64
	Revision uint64
	Record   LeaseRecord
}

// PeerRound asks the caller to ask each of Peers whether it can renew,
// and to relay Renewal (a CAS of Renewal.Record on Renewal.Revision) if it
// can. Answers go to Agent.PeerAnswered(ID, peer, ...). A peer not
// answering by Deadline counts as unreachable.
type PeerRound struct {
	ID       uint64
	Peers    []string
	Renewal  RenewRequest
	Deadline time.Time
}

// Alert is a condition to log at the highest level (and count).
type Alert struct {
	Reason Reason
	Detail string
}

// Ready is what one call into the Agent asks the caller to do, in this
// order: Persist (durably, before anything else), then the domain
// operations and ResetHost, then Renew, AskPeers, Reconcile, and publish
// Transitions and Alerts. Empty fields mean nothing to do.
type Ready struct {
	// Persist is the new durable state; write it (atomically) before
	// performing Pause: it records which domains hvguard is pausing.
	Persist *Durable
	// Pause, Destroy and Resume list domain UUIDs to act on; report each
	// Pause/Destroy with Agent.FenceDone.
	Pause, Destroy, Resume []string
	// WouldFence lists what a monitor-only agent would have fenced (and
	// how, in Transitions): publish it, touch nothing.
	WouldFence []string
	// ResetHost asks for an immediate host reset (sysrq 'b').
	ResetHost bool
	// Renew is a renewal to send.
	Renew *RenewRequest
	// AskPeers is a peer round to run.
	AskPeers *PeerRound
	// Reconcile asks the caller to run the rejoin reconciliation hook and
	// answer with Agent.Reconciled(ReconcileID, ...).
	Reconcile   bool
	ReconcileID uint64
	// LeftPaused lists domains hvguard paused before a declaration and
	// does not resume after the release (they were evacuated elsewhere);
	// the operator or the reconciliation decides about them.
	LeftPaused []string
	// Transitions are the state changes, in order.
	Transitions []Transition
	// Alerts are to be logged at the highest level.
	Alerts []Alert
	// Relayed is a renewal of ours a peer relayed, taken as landed: the
	// shell publishes its beacon (Beacon) as for a renewal it wrote
	// itself. A relay writes no beacon, and a controller takes the
	// host's beacons as its signs of life: a host whose own writes a
	// compromised node keeps failing, alive on relays the node then hides
	// from the controller's watch, lived on unseen past the bound the
	// controller gives a withdrawal (controller/beaconloss.go,
	// companionsChecked). Only with LyingPeers ≥ 1: one liar's claim,
	// taken as a landing at 0, would put a made-up revision in a beacon.
	Relayed *RelayedLanding
}

// RelayedLanding: the renewal Seq, relayed by a peer, landed at Revision;
// Record is the record it wrote (for its beacon).
type RelayedLanding struct {
	Seq, Revision uint64
	Record        LeaseRecord
}

// Empty reports whether r asks for nothing.
func (r Ready) Empty() bool {
	return r.Persist == nil && len(r.Pause) == 0 && len(r.Destroy) == 0 && len(r.Resume) == 0 &&
		len(r.WouldFence) == 0 && !r.ResetHost && r.Renew == nil && r.AskPeers == nil &&
		!r.Reconcile && len(r.LeftPaused) == 0 && len(r.Transitions) == 0 && len(r.Alerts) == 0 &&
		r.Relayed == nil
}

// RenewOutcome classifies the result of a renewal.
type RenewOutcome int

// Renewal outcomes.
const (
	// RenewAcked: the server acknowledged the CAS; Revision is the new
	// revision.
	RenewAcked RenewOutcome = iota
	// RenewTimedOut: no answer in time. The outcome is UNKNOWN: the write
	// may still land (measured: 16 s later).
	RenewTimedOut
	// RenewFailed: definitely not applied (e.g. not connected, with the
	// reconnect buffer disabled).
	RenewFailed
	// RenewConflict: the CAS was rejected (wrong last sequence, err 10071);
	// Current and Revision are what the key holds now (Current nil: the
	// key does not exist).
	RenewConflict
)

// RenewResult is the outcome of a renewal (own or, via PeerAnswer, relayed).
type RenewResult struct {
	Outcome  RenewOutcome
	Revision uint64
	Current  *LeaseRecord
	// Invalid (RenewConflict, Current nil): the key holds a record at
	// Revision that is not trusted (undecodable, unsigned, wrong signer,
	// bad signature): why. The agent treats it like a deleted key whose
	// marker is at Revision (keydelete.go).
	Invalid string
	// A conflict with Current nil and no Invalid is a key that holds no
	// record (deleted or purged): Revision is then its delete marker's
	// revision, which the next relayed write is sealed for (an anchored
	// create, docs/security.md), or 0 when no marker was read.
	//
	// peer: the conflict is a peer's report (PeerAnswered), not our own
	// store's answer: its revision is a claim nothing verifies, so it
	// never lowers the revision our store reports (reviewer X4).
	peer bool
}

// PeerAnswerKind is what a peer answered.
type PeerAnswerKind int

// Peer answers.
const (
	// PeerUnreachable: no answer (timeout, connection refused, bad auth).
	PeerUnreachable PeerAnswerKind = iota
	// PeerCannotRenew: the peer itself has had no acknowledged renewal for
	// SuspectAfter and was not declared expired.
	PeerCannotRenew
	// PeerRelayFailed: the peer can renew but its relay of our renewal did
	// not succeed.
	PeerRelayFailed
	// PeerRelayed: the peer wrote our renewal; Revision is its revision.
	PeerRelayed
	// PeerDeclared: the peer was itself declared expired (it proves
	// nothing about a mass failure).
	PeerDeclared
	// PeerLeaseLapsed: the peer cannot renew, is not Held, and its lease
	// is older than Timing.ConfirmableAge: it may have been declared
	// without knowing it, so it does not count toward a hold.
	PeerLeaseLapsed
)

// PeerAnswer is one peer's answer. Revision is the relayed record's
// revision (PeerRelayed); on a relay rejected by the CAS, Current and
// Revision are what the key holds (the agent may recognise one of its own
// renewals there, exactly as on its own conflict).
type PeerAnswer struct {
	Kind     PeerAnswerKind
	Revision uint64
	Current  *LeaseRecord
	// KeyAbsent (PeerRelayFailed): the relay's CAS was rejected because
	// the key holds no record at all (deleted or purged by an operator),
	// exactly as a RenewConflict with Current nil: Revision is the delete
	// marker's (0: none read), or that of a record the relayer did not
	// trust.
	KeyAbsent bool
	// Invalid (PeerRelayFailed): the relay's conflict showed a record the
	// asker does not trust at Revision (RenewResult.Invalid).
	Invalid string
}

// PeerStatus is what this agent answers a peer that asks.
type PeerStatus struct {
	// CanRenew: this agent holds a fresh lease; it should relay.
	CanRenew bool
	// Declared: this host was declared expired.
	Declared bool
	// Held: this agent is Held (by induction it is not declared: a Held
	// host being declared is exactly what the protocol rules out).
	Held bool
	// Lapsed: the lease is older than Timing.ConfirmableAge (and the
	// agent is not Held).
	Lapsed bool
}

// Answer maps the status to the answer kind for a peer (before relaying).
func (s PeerStatus) Answer() PeerAnswerKind {
	switch {
	case s.Declared:
		return PeerDeclared
	case s.CanRenew:
		return PeerRelayFailed // upgraded to PeerRelayed if the relay succeeds
	case s.Held:
		return PeerCannotRenew
	case s.Lapsed:
		return PeerLeaseLapsed
	}
	return PeerCannotRenew
}

// Domain is one domain of the host inventory.
type Domain struct {
	UUID string
	// Running: the domain can run guest code (running, blocked); false for
	// paused, shut off, crashed.
	Running bool
}

// Durable is the fence state that must survive an agent restart. Time
// values are on the caller's clock, which must be monotonic across agent
// restarts within one boot (CLOCK_BOOTTIME); BootID tells boots apart.
type Durable struct {
	Host   string `json:"host"`
	BootID string `json:"boot_id"`
	Epoch  uint64 `json:"epoch"`
	// Incarnation counts agent starts; records carry it so that a
	// restarted agent never mistakes an earlier process's renewal for one
	// of its own.
	Incarnation uint64 `json:"incarnation"`
	// Writes counts the durable states written (across processes of one
	// host): of two copies (state_dir and the per-boot runtime copy,
	// ChooseDurable) the one with more writes is newer.
	Writes uint64 `json:"writes,omitempty"`
	// Revision is the latest revision of our key known to hold our record
	// (the next CAS expects it), for a restart while NATS is unreachable.
	Revision uint64 `json:"revision"`
	// HaveLease and LastAck: the send time of the last acknowledged
	// renewal. Only an agent crash (not a host crash) leaves domains
	// running, so this needs no fsync, only an atomic rename.
	HaveLease bool      `json:"have_lease"`
	LastAck   time.Time `json:"last_ack"`
	// Fenced: a fence was started (and not ended by a rejoin).
	Fenced bool `json:"fenced"`
	// Held: the agent was Held; HeldUntil: until when its last
	// confirmation lets it stay Held (boot clock). A restart never holds
	// longer than that: a crash-looping Held agent must not renew its own
	// hold (and keep feeding the watchdog) without new confirmations.
	Held      bool      `json:"held"`
	HeldUntil time.Time `json:"held_until,omitzero"`
	// Declared: the controller declared this host expired (not released).
	Declared bool `json:"declared"`
	// Released: the declaration was released; waiting to renew.
	Released bool `json:"released"`
	// Paused: domains hvguard paused (recorded before pausing); only these
	// are ever resumed.
	Paused []string `json:"paused"`
	Reason Reason   `json:"reason"`
	// Withdrawn: the agent's withdrawn record landed (orderly stop); the
	// next start, finding the key withdrawn (or NATS unreachable), starts
	// with a fresh lease age: the controller declares nothing until it has
	// seen a renewal of the new process.
	Withdrawn bool `json:"withdrawn,omitempty"`
	// KeyWithdrawn: the key holds a withdrawn record of ours and no
	// renewal landed on it since: the controller does not count the host
	// for its guard, so the agent confirms no peer's hold. Unlike
	// Withdrawn it does not restart the lease age: a start from a
	// withdrawn record keeps it until its first renewal lands, so a crash
	// and a restart with NATS unreachable still confirm nothing.
	KeyWithdrawn bool `json:"key_withdrawn,omitempty"`
	// Timing: the constants LastAck is counted with (the agent's). A
	// restart with other constants counts the inherited lease so that no
	// deadline the controller derived from these moves later (absent in
	// files written before it existed: taken as unchanged).
	Timing *Timing `json:"timing,omitempty"`
	// FeedUntil (zero: none): the lease may feed the watchdog only before
	// it (a restart with a longer watchdog_timeout than the record the
	// controller saw last, until a renewal of the new process lands).
	FeedUntil time.Time `json:"feed_until,omitzero"`
}

// StopOutcome is how an orderly stop (Agent.Stop) ended.
type StopOutcome int

// Stop outcomes.
const (
	// StopPending: not stopping, or the stop is still in progress.
	StopPending StopOutcome = iota
	// StopWithdrawn: the withdrawn record landed: the controller will not
	// declare the host; the watchdog may be disarmed (magic close).
	StopWithdrawn
	// StopFenced: the host is fenced (every domain paused/destroyed, or a
	// monitor-only host would be); the controller may declare it, which
	// is safe as long as nothing starts a domain afterwards: the watchdog
	// stays armed and unfed (MagicClose), so the host resets
	// watchdog_timeout after the process left unless an agent starts
	// again and feeds it.
	StopFenced
	// StopUnfenced: the fence did not complete by its deadline (escalated:
	// a reset was requested if allowed): the watchdog must be left armed
	// and unfed.
	StopUnfenced
)

// MagicClose reports whether the stop's outcome allows disarming the
// hardware watchdog: only a confirmed withdrawal. After a fenced stop the
// controller may declare the host while no agent runs; a domain started
// afterwards (an operator, Nova) would run into that declaration, so the
// watchdog is left armed: the host resets unless an agent starts again
// (which carries on fenced and re-fences what runs before it feeds).
func (o StopOutcome) MagicClose() bool {
	return o == StopWithdrawn || (o == StopFenced && Mutations.FencedStopMagicCloses)
}

var stopNames = [...]string{"pending", "withdrawn", "fenced", "unfenced"}

func (o StopOutcome) String() string {
	if int(o) < len(stopNames) {
		return stopNames[o]
	}
	return fmt.Sprintf("stop(%d)", int(o))
}
