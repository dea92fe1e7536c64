package classify

import (
	"strconv"
	"strings"
	"time"
)

// Classification is what a reported stop was, in Nova's light.
type Classification string

// Classifications.
const (
	// Rebooted: the domain went down and came back (a Nova reboot, rebuild,
	// start, ... that completed, or a start seen while classifying): not a
	// stop.
	Rebooted Classification = "rebooted"
	// StoppedByNova: Nova stopped it on purpose (stop API, shelve, suspend,
	// delete, migration away, ...), or is still operating on it after
	// Config.MaxHold (reason held-too-long). A recovery controller leaves
	// it alone.
	StoppedByNova Classification = "stopped-by-nova"
	// StoppedUnexpectedly: nothing Nova did explains it. The one a recovery
	// controller acts on.
	StoppedUnexpectedly Classification = "stopped-unexpectedly"
	// Unknown: no Nova view of the instance could be used (Nova unreachable,
	// slow, or lost while a hold waited for it). Reported when the core
	// debouncer alone would have reported the stop.
	Unknown Classification = "unknown"
)

// Reason says why a stop was held or classified as it was. Logs and
// metrics carry it.
type Reason string

// Reasons.
const (
	// Holds.

	// ReasonOperationInFlight: Nova's task_state names an operation that
	// explains the stop (Decision.Task): held until it finishes.
	ReasonOperationInFlight Reason = "operation-in-flight"

	// Reports after a hold.

	// ReasonOperationCompleted: the held operation finished and Nova
	// records the instance active and running (Nova reads the power state
	// from the hypervisor when a reboot ends): rebooted.
	ReasonOperationCompleted Reason = "operation-completed"
	// ReasonStartedDuringOperation: libvirt showed the domain alive again
	// while an operation explained the stop: rebooted.
	ReasonStartedDuringOperation Reason = "started-during-operation"
	// ReasonOperationLeftDomainOff: the held operation finished (no task)
	// with vm_state active but the domain still off: unexpected.
	ReasonOperationLeftDomainOff Reason = "operation-left-domain-off"
	// ReasonHeldTooLong: the operation was still in flight after
	// Config.MaxHold: stopped-by-nova (Nova still owns the instance).
	ReasonHeldTooLong Reason = "held-too-long"

	// Reports from Nova's view.

	// ReasonStartedBeforeClassified: libvirt showed the domain alive again
	// before Nova's view was in: rebooted.
	ReasonStartedBeforeClassified Reason = "started-before-classified"
	// ReasonNoOperation: vm_state active, no task: Nova did not do it (its
	// power_state may not even have caught up): unexpected.
	ReasonNoOperation Reason = "no-operation"
	// ReasonStopRequested: vm_state stopped (or powering-off) after a stop
	// API request a user made before the domain went down: stopped-by-nova.
	ReasonStopRequested Reason = "stop-requested"
	// ReasonNovaSyncedStop: vm_state stopped (or powering-off) because Nova
	// itself reacted to the stop (its power-state sync calls the stop API
	// without a user, after the domain went down) or the stop request came
	// after the stop: unexpected.
	ReasonNovaSyncedStop Reason = "nova-synced-stop"
	// ReasonNovaVMState: vm_state shelved, shelved_offloaded, suspended,
	// soft-delete, deleted or resized: Nova put it there (Decision.VMState):
	// stopped-by-nova.
	ReasonNovaVMState Reason = "nova-vm-state"
	// ReasonNotOnHost: Nova does not list the instance on this host
	// (deleted, migrated or resized away, offloaded, or not a Nova
	// instance): stopped-by-nova.
	ReasonNotOnHost Reason = "not-on-host"
	// ReasonNovaError: vm_state error (a failed operation left it off):
	// unexpected.
	ReasonNovaError Reason = "nova-error"
	// ReasonVMStateMismatch: vm_state paused, rescued or a value this
	// package does not know, with the domain off and no operation:
	// unexpected.
	ReasonVMStateMismatch Reason = "vm-state-mismatch"

	// Reports without Nova (classification unknown).

	// ReasonNovaUnavailable: the query failed (unreachable, 5xx, auth,
	// malformed answer), or failed within Config.RetryBackoff before.
	ReasonNovaUnavailable Reason = "nova-unavailable"
	// ReasonNovaSlow: no answer within Config.QueryTimeout.
	ReasonNovaSlow Reason = "nova-slow"
	// ReasonNovaLost: held, and no successful Nova view for
	// Config.NovaLostAfter.
	ReasonNovaLost Reason = "nova-lost-while-held"
	// ReasonAgentStopping: the caller is shutting down (Drain) before the
	// stop was classified; it is reported rather than lost.
	ReasonAgentStopping Reason = "agent-stopping"
)

// Op says what the caller must do with a Decision.
type Op uint8

// Ops.
const (
	// OpReport: publish the classified stop. The stop is forgotten.
	OpReport Op = iota + 1
	// OpHold: a hold began (or its operation changed): log and count; the
	// report comes later.
	OpHold
	// OpQueryServers: list Nova's servers on this host (one request for
	// every stop waiting) and answer ServersResult with Decision.Token.
	OpQueryServers
	// OpQueryActions: list the instance actions of Decision.UUID and answer
	// ActionsResult with Decision.Token.
	OpQueryActions
)

// String returns the op's name.
func (o Op) String() string {
	switch o {
	case OpReport:
		return "report"
	case OpHold:
		return "hold"
	case OpQueryServers:
		return "query-servers"
	case OpQueryActions:
		return "query-actions"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Decision is one thing the caller must do.
type Decision struct {
	Op             Op
	UUID           string // Report, Hold, QueryActions
	Classification Classification
	Reason         Reason
	Detail         Detail    // the stop's libvirt detail (Report, Hold)
	Began          time.Time // when the stop began (Report, Hold)
	// Task is the Nova operation that explained the stop (Hold; Report
	// after a hold: the last one seen), TaskNone otherwise.
	Task TaskState
	// VMState is Nova's vm_state in the view the report was based on, ""
	// without one.
	VMState VMState
	// Held is how long the report came after Add (the classification's
	// delay beyond the debouncer's window). Report only.
	Held time.Duration
	// Token is the query to answer (OpQueryServers, OpQueryActions).
	Token uint64
}

// String renders the decision compactly, e.g.
// "report stopped-unexpectedly no-operation detail=destroyed vm=active",
// as the scenario tests compare them.
func (d Decision) String() string {
	var b strings.Builder
	b.WriteString(d.Op.String())
	switch d.Op {
	case OpQueryServers:
		return b.String()
	case OpQueryActions:
		return b.String() + " " + d.UUID
	}
	if d.Classification != "" {
		b.WriteString(" " + string(d.Classification))
	}
	b.WriteString(" " + string(d.Reason))
	if d.Detail != "" {
		b.WriteString(" detail=" + string(d.Detail))
	}
	if d.Task != TaskNone {
		b.WriteString(" task=" + string(d.Task))
	}
	if d.VMState != "" {
		b.WriteString(" vm=" + string(d.VMState))
	}
	return b.String()
}

// Counters are cumulative counts for metrics. Pending and Held are gauges.
type Counters struct {
	Added     uint64 // stops handed over (Add)
	Duplicate uint64 // Add for a stop already being classified (ignored)

	Reports     map[Classification]uint64 // reports by classification (allocated by New)
	Holds       uint64                    // holds begun
	HeldTooLong uint64                    // of the reports: held-too-long
	FromCache   uint64                    // stops classified from a listing younger than CacheTTL

	ServerQueries uint64 // OpQueryServers issued
	ActionQueries uint64 // OpQueryActions issued
	QueryFailures uint64 // answers with an error
	QueryTimeouts uint64 // queries not answered within QueryTimeout
	StaleAnswers  uint64 // answers with an unknown or outdated token (ignored)

	Pending int // gauge: stops being classified (waiting for Nova or held)
	Held    int // gauge: of which held
}
