package lifecycle

import "time"

// Kind is the class of a libvirt domain event as hvguard sees it. The
// numbering is hvguard's own: libvirtx maps libvirt's event numbers onto
// these values, so nothing outside libvirtx depends on libvirt's constants.
type Kind uint8

// Event kinds. KindReboot is libvirt's separate REBOOT event
// (VIR_DOMAIN_EVENT_ID_REBOOT), which a guest reboot with on_reboot=restart
// produces instead of any lifecycle event.
const (
	KindUnknown Kind = iota
	KindDefined
	KindUndefined
	KindStarted
	KindSuspended
	KindResumed
	KindStopped
	KindShutdown
	KindPMSuspended
	KindCrashed
	KindReboot
)

var kindNames = [...]string{
	KindUnknown:     "unknown",
	KindDefined:     "defined",
	KindUndefined:   "undefined",
	KindStarted:     "started",
	KindSuspended:   "suspended",
	KindResumed:     "resumed",
	KindStopped:     "stopped",
	KindShutdown:    "shutdown",
	KindPMSuspended: "pmsuspended",
	KindCrashed:     "crashed",
	KindReboot:      "reboot",
}

// String returns the kind's lower-case name, "unknown" if out of range.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Event is one observation of a domain, copied out of a libvirt callback (or
// synthesised by a resync). It holds only values: no libvirt handle.
type Event struct {
	UUID   string    // domain UUID (= Nova instance UUID), canonical lower-case form
	Name   string    // domain name, e.g. instance-0000002a
	Kind   Kind      // hvguard's class of the event
	Event  string    // libvirt's event name, e.g. "STOPPED", "REBOOT"
	Detail string    // libvirt's detail name, e.g. "DESTROYED", "SHUTDOWN"
	At     time.Time // wall-clock time at which libvirt delivered the event
}

// State is a domain's real state as read from libvirt (virDomainGetState).
type State uint8

// Domain states. StateGone means the domain does not exist (any more).
const (
	StateUnknown State = iota
	StateNoState
	StateRunning
	StateBlocked
	StatePaused
	StateShutdown // being shut down: still has a live process
	StateShutoff
	StateCrashed
	StatePMSuspended
	StateGone
)

var stateNames = [...]string{
	StateUnknown:     "unknown",
	StateNoState:     "nostate",
	StateRunning:     "running",
	StateBlocked:     "blocked",
	StatePaused:      "paused",
	StateShutdown:    "shutdown",
	StateShutoff:     "shutoff",
	StateCrashed:     "crashed",
	StatePMSuspended: "pmsuspended",
	StateGone:        "gone",
}

// String returns the state's lower-case name, "unknown" if out of range.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Alive reports whether a domain in this state still has a guest that can
// run: running, blocked, paused, being shut down or PM-suspended.
func (s State) Alive() bool {
	switch s {
	case StateRunning, StateBlocked, StatePaused, StateShutdown, StatePMSuspended:
		return true
	}
	return false
}

// Off reports whether the domain certainly cannot run: shut off, crashed
// (and not restarted) or gone.
func (s State) Off() bool {
	return s == StateShutoff || s == StateCrashed || s == StateGone
}

// DomainSnapshot is one row of a full domain listing, used to resync after
// events may have been lost (reconnect, hand-off overflow).
type DomainSnapshot struct {
	UUID  string
	Name  string
	State State
}
