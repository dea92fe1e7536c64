package lifecycle

import (
	"fmt"
	"strconv"
	"strings"
)

// Op says what the caller must do with a Decision.
type Op uint8

const (
	// OpReport: publish the transition (to Nova, metrics, logs). The core
	// has already updated its own belief; nothing must be answered.
	OpReport Op = iota + 1
	// OpCheckState: read the domain's real state from libvirt, off the
	// event-callback goroutine, and answer with Debouncer.Resolve passing
	// the Decision's Check token back.
	OpCheckState
)

// String returns "report" or "check".
func (o Op) String() string {
	switch o {
	case OpReport:
		return "report"
	case OpCheckState:
		return "check"
	}
	return "op(" + fmt.Sprint(uint8(o)) + ")"
}

// Transition is what happened to a domain, as hvguard reports it.
type Transition string

// Transitions reported by the Debouncer.
const (
	TransitionStarted     Transition = "started"     // domain began to run
	TransitionStopped     Transition = "stopped"     // domain is really off (reported once per stop)
	TransitionRebooted    Transition = "rebooted"    // domain went down and came back, or a REBOOT event
	TransitionSuspended   Transition = "suspended"   // paused (SUSPENDED event)
	TransitionResumed     Transition = "resumed"     // running again after a pause
	TransitionPMSuspended Transition = "pmsuspended" // guest-initiated S3/S4 suspend
	TransitionDefined     Transition = "defined"     // domain (re)defined, or first learned from a resync
	TransitionUndefined   Transition = "undefined"   // domain removed; the core forgets it
)

// Reason says why a Decision was taken. Logs and metrics carry it so that a
// suppressed or reported stop can always be explained.
type Reason string

// Reasons carried by Decisions.
const (
	// ReasonEvent: the report follows directly from a libvirt event.
	ReasonEvent Reason = "event"
	// ReasonStartedWithinWindow: a STARTED event cancelled a pending stop.
	ReasonStartedWithinWindow Reason = "started-within-window"
	// ReasonResumedWithinWindow: a RESUMED event cancelled a pending stop.
	ReasonResumedWithinWindow Reason = "resumed-within-window"
	// ReasonSuspendedWithinWindow: a SUSPENDED or PMSUSPENDED event proved
	// the domain alive while a stop was pending.
	ReasonSuspendedWithinWindow Reason = "suspended-within-window"
	// ReasonRebootEvent: libvirt REBOOT events (the first of them cancelled
	// a pending stop if there was one, as on_crash=restart does). A burst
	// of them is one report, Decision.RebootEvents says how many.
	ReasonRebootEvent Reason = "reboot-event"
	// ReasonRunningAtWindowEnd: the state check at window end found the
	// domain alive (running, blocked, paused or PM-suspended; see the
	// Decision's State): the stop is suppressed.
	ReasonRunningAtWindowEnd Reason = "running-at-window-end"
	// ReasonOffAtWindowEnd: the state check at window end found the domain
	// off: the stop is real.
	ReasonOffAtWindowEnd Reason = "off-at-window-end"
	// ReasonStateCheckFailed: Config.MaxChecks state checks failed, timed
	// out or were inconclusive; the stop is reported rather than held
	// forever.
	ReasonStateCheckFailed Reason = "state-check-failed"
	// ReasonUndefinedWithinWindow: the domain was undefined (UNDEFINED
	// event, missing from a resync listing, or gone at the check) while a
	// stop was pending: the stop is reported at once.
	ReasonUndefinedWithinWindow Reason = "undefined-within-window"
	// ReasonPassThrough: Config.Window is 0, stops are reported unchecked.
	ReasonPassThrough Reason = "pass-through"
	// ReasonResync: synthesised by Resync from a full domain listing.
	ReasonResync Reason = "resync"
	// ReasonWindowEnd: an OpCheckState decision (a window or a recheck
	// interval ended).
	ReasonWindowEnd Reason = "window-end"
)

// Decision is one thing the caller must do. Decisions for one domain are
// returned in the order of the events that caused them (see doc.go).
type Decision struct {
	Op         Op
	UUID       string
	Name       string
	Transition Transition // empty for OpCheckState
	Reason     Reason
	// State is the state the report leaves the domain in: for a stop
	// resolved by a check, the checked state (shutoff, crashed, gone, or
	// unknown when the check failed); for other reports hvguard's belief.
	State State
	// Cause is the event that started it: for a stop, a suppressed stop
	// (rebooted from a pending stop) and OpCheckState, the first stop-like
	// event (its At is when the stop was delivered; later stop-like events
	// of the same stop are merged into Detail as "A+B"). Resync synthesises
	// a Cause with Event "RESYNC".
	Cause Event
	// Shutdown is the detail of the SHUTDOWN event seen before this stop
	// ("GUEST": ACPI/guest shutdown, "HOST": destroy), empty if none.
	Shutdown string
	// Check is the token to pass back to Resolve (OpCheckState only).
	Check uint64
	// RebootEvents is, on a rebooted report with ReasonRebootEvent, the
	// number of libvirt REBOOT events it stands for (>= 1; one reset makes
	// 2–4, more than RebootEventsPerReset means several resets within the
	// Window: a reboot loop); 0 on every other decision.
	RebootEvents int
}

// String renders the decision compactly, e.g.
// "report stopped off-at-window-end state=shutoff cause=STOPPED/DESTROYED",
// as used by the scenario tests and handy in logs.
func (d Decision) String() string {
	var b strings.Builder
	b.WriteString(d.Op.String())
	if d.Transition != "" {
		b.WriteByte(' ')
		b.WriteString(string(d.Transition))
	}
	b.WriteByte(' ')
	b.WriteString(string(d.Reason))
	if d.Op == OpReport {
		b.WriteString(" state=")
		b.WriteString(d.State.String())
	}
	if d.Cause.Event != "" {
		b.WriteString(" cause=")
		b.WriteString(d.Cause.Event)
		if d.Cause.Detail != "" {
			b.WriteByte('/')
			b.WriteString(d.Cause.Detail)
		}
	}
	if d.Shutdown != "" {
		b.WriteString(" shutdown=")
		b.WriteString(d.Shutdown)
	}
	if d.RebootEvents != 0 {
		b.WriteString(" events=")
		b.WriteString(strconv.Itoa(d.RebootEvents))
	}
	return b.String()
}

// Counters are cumulative counts for metrics. StopsPending is a gauge.
type Counters struct {
	Events        uint64 // events passed to Observe
	Ignored       uint64 // events with an empty UUID or KindUnknown
	Redundant     uint64 // events that changed nothing (duplicate stop, RESUMED while running, ...)
	Folded        uint64 // STARTED events folded into an already reported start or reboot
	Annotated     uint64 // SHUTDOWN events (annotate the next stop only)
	Deferred      uint64 // DEFINED events held back behind a pending stop to keep order
	UndefinesHeld uint64 // UNDEFINED events held behind a pending stop (Nova's hard reboot undefines and redefines)
	StopsBegun    uint64 // pending stops opened (windows started)
	StopsMerged   uint64 // stop-like events merged into an already pending stop
	// StopsOfLearnedOff: pending stops opened by a STOPPED/CRASHED of a
	// domain believed off only from a listing or a Seed (the stop raced
	// the listing: never reported, so not redundant).
	StopsOfLearnedOff uint64

	StopsPending int // gauge: stops currently pending (window, check or recheck)
	RebootsHeld  int // gauge: domains whose REBOOT burst is held, not yet reported

	StopsReported       uint64 // stopped reports, all reasons
	StopsOffAtWindowEnd uint64 // of which confirmed off by a check
	StopsCheckFailed    uint64 // of which state-check-failed
	StopsUndefined      uint64 // of which undefined-within-window
	StopsPassThrough    uint64 // of which pass-through (Window 0)

	SuppressedStarted   uint64 // pending stops cancelled by STARTED
	SuppressedResumed   uint64 // ... by RESUMED
	SuppressedSuspended uint64 // ... by SUSPENDED/PMSUSPENDED
	SuppressedReboot    uint64 // ... by REBOOT
	RebootsCoalesced    uint64 // REBOOT events folded into an earlier one's report (a burst)
	SuppressedRunning   uint64 // ... by a check finding the domain alive

	ChecksIssued       uint64 // OpCheckState decisions returned
	ChecksStale        uint64 // Resolve calls ignored (stale or unknown token)
	ChecksInconclusive uint64 // answers with an error, StateShutdown or an unclassified state
	ChecksTimedOut     uint64 // checks not answered within Config.CheckTimeout

	Resyncs uint64 // Resync calls
}
