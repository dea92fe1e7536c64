package libvirtx

import (
	"strconv"

	"hvguard/lifecycle"
)

// libvirt's lifecycle event numbers (virDomainEventType) and their detail
// numbers, copied from libvirt-domain.h (plus the newer values that the
// binding knows and libvirt 9.0.0 does not). Mapped here, by number, because
// the binding's String() is wrong for SHUTDOWN details and CRASHED.
var lifecycleEvents = []struct {
	name    string
	kind    lifecycle.Kind
	details []string
}{
	0: {"DEFINED", lifecycle.KindDefined, []string{"ADDED", "UPDATED", "RENAMED", "FROM_SNAPSHOT"}},
	1: {"UNDEFINED", lifecycle.KindUndefined, []string{"REMOVED", "RENAMED"}},
	2: {"STARTED", lifecycle.KindStarted, []string{"BOOTED", "MIGRATED", "RESTORED", "FROM_SNAPSHOT", "WAKEUP", "RECREATED"}},
	3: {"SUSPENDED", lifecycle.KindSuspended, []string{"PAUSED", "MIGRATED", "IOERROR", "WATCHDOG", "RESTORED", "FROM_SNAPSHOT", "API_ERROR", "POSTCOPY", "POSTCOPY_FAILED", "GUEST_SHUTDOWN"}},
	4: {"RESUMED", lifecycle.KindResumed, []string{"UNPAUSED", "MIGRATED", "FROM_SNAPSHOT", "POSTCOPY", "POSTCOPY_FAILED"}},
	5: {"STOPPED", lifecycle.KindStopped, []string{"SHUTDOWN", "DESTROYED", "CRASHED", "MIGRATED", "SAVED", "FAILED", "FROM_SNAPSHOT", "RECREATED"}},
	6: {"SHUTDOWN", lifecycle.KindShutdown, []string{"FINISHED", "GUEST", "HOST"}},
	7: {"PMSUSPENDED", lifecycle.KindPMSuspended, []string{"MEMORY", "DISK"}},
	8: {"CRASHED", lifecycle.KindCrashed, []string{"PANICKED", "CRASHLOADED"}},
}

// mapLifecycle maps a libvirt lifecycle event number and detail number to
// hvguard's kind and libvirt's event and detail names. Unknown numbers give
// KindUnknown (for an unknown event) and names "EVENT_<n>" / "DETAIL_<n>";
// it never panics.
func mapLifecycle(event, detail int) (kind lifecycle.Kind, eventName, detailName string) {
	if event < 0 || event >= len(lifecycleEvents) {
		return lifecycle.KindUnknown, "EVENT_" + strconv.Itoa(event), "DETAIL_" + strconv.Itoa(detail)
	}
	e := lifecycleEvents[event]
	detailName = "DETAIL_" + strconv.Itoa(detail)
	if detail >= 0 && detail < len(e.details) {
		detailName = e.details[detail]
	}
	return e.kind, e.name, detailName
}

// mapState maps libvirt's virDomainState number to lifecycle.State.
func mapState(s int) lifecycle.State {
	switch s {
	case 0:
		return lifecycle.StateNoState
	case 1:
		return lifecycle.StateRunning
	case 2:
		return lifecycle.StateBlocked
	case 3:
		return lifecycle.StatePaused
	case 4:
		return lifecycle.StateShutdown
	case 5:
		return lifecycle.StateShutoff
	case 6:
		return lifecycle.StateCrashed
	case 7:
		return lifecycle.StatePMSuspended
	}
	return lifecycle.StateUnknown
}

// closeReasonName names libvirt's virConnectCloseReason.
func closeReasonName(r int) string {
	switch r {
	case 0:
		return "close: error on socket"
	case 1:
		return "close: end of file (daemon gone)"
	case 2:
		return "close: keepalive timeout (daemon not answering)"
	case 3:
		return "close: client requested"
	}
	return "close: reason " + strconv.Itoa(r)
}
