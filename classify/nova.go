package classify

import (
	"strconv"
	"strings"
	"time"
)

// Nova's instance states, as the compute API shows them in
// OS-EXT-STS:task_state, OS-EXT-STS:vm_state and OS-EXT-STS:power_state.
// The values are Nova's own strings and numbers: nova/objects/fields.py
// (InstanceTaskState, InstanceState, InstancePowerState), re-exported by
// nova/compute/task_states.py, vm_states.py and power_state.py — read from
// Debian 12's python3-nova 26.2.2 (Zed), the Nova this project tests
// against, and unchanged in upstream openstack/nova master.

// TaskState is Nova's task_state: what Nova is doing to the instance right
// now. TaskNone ("", JSON null) means no operation in flight.
type TaskState string

// Task states (nova/objects/fields.py InstanceTaskState).
const (
	TaskNone                       TaskState = ""
	TaskScheduling                 TaskState = "scheduling"
	TaskBlockDeviceMapping         TaskState = "block_device_mapping"
	TaskNetworking                 TaskState = "networking"
	TaskSpawning                   TaskState = "spawning"
	TaskImageSnapshot              TaskState = "image_snapshot"
	TaskImageSnapshotPending       TaskState = "image_snapshot_pending"
	TaskImagePendingUpload         TaskState = "image_pending_upload"
	TaskImageUploading             TaskState = "image_uploading"
	TaskImageBackup                TaskState = "image_backup"
	TaskUpdatingPassword           TaskState = "updating_password"
	TaskResizePrep                 TaskState = "resize_prep"
	TaskResizeMigrating            TaskState = "resize_migrating"
	TaskResizeMigrated             TaskState = "resize_migrated"
	TaskResizeFinish               TaskState = "resize_finish"
	TaskResizeReverting            TaskState = "resize_reverting"
	TaskResizeConfirming           TaskState = "resize_confirming"
	TaskRebooting                  TaskState = "rebooting"
	TaskRebootPending              TaskState = "reboot_pending"
	TaskRebootStarted              TaskState = "reboot_started"
	TaskRebootingHard              TaskState = "rebooting_hard"
	TaskRebootPendingHard          TaskState = "reboot_pending_hard"
	TaskRebootStartedHard          TaskState = "reboot_started_hard"
	TaskPausing                    TaskState = "pausing"
	TaskUnpausing                  TaskState = "unpausing"
	TaskSuspending                 TaskState = "suspending"
	TaskResuming                   TaskState = "resuming"
	TaskPoweringOff                TaskState = "powering-off"
	TaskPoweringOn                 TaskState = "powering-on"
	TaskRescuing                   TaskState = "rescuing"
	TaskUnrescuing                 TaskState = "unrescuing"
	TaskRebuilding                 TaskState = "rebuilding"
	TaskRebuildBlockDeviceMapping  TaskState = "rebuild_block_device_mapping"
	TaskRebuildSpawning            TaskState = "rebuild_spawning"
	TaskMigrating                  TaskState = "migrating"
	TaskDeleting                   TaskState = "deleting"
	TaskSoftDeleting               TaskState = "soft-deleting"
	TaskRestoring                  TaskState = "restoring"
	TaskShelving                   TaskState = "shelving"
	TaskShelvingImagePendingUpload TaskState = "shelving_image_pending_upload"
	TaskShelvingImageUploading     TaskState = "shelving_image_uploading"
	TaskShelvingOffloading         TaskState = "shelving_offloading"
	TaskUnshelving                 TaskState = "unshelving"
)

// taskExplains says, for each task state Nova defines, whether the operation
// can take the domain down (or keep it down) on this host — so a stop seen
// while it is in flight is Nova's doing and is held until it finishes. Only
// pausing, unpausing and updating_password never power a guest off.
// powering-off is special (see explainsStop): it is also what Nova's own
// power-state sync sets when it reacts to an unexpected stop.
var taskExplains = map[TaskState]bool{
	TaskScheduling: true, TaskBlockDeviceMapping: true, TaskNetworking: true, TaskSpawning: true,
	// libvirt cold snapshots managed-save the domain (STOPPED/SAVED) until the image is extracted
	TaskImageSnapshot: true, TaskImageSnapshotPending: true, TaskImagePendingUpload: true,
	TaskImageUploading: true, TaskImageBackup: true,
	TaskUpdatingPassword: false,
	TaskResizePrep:       true, TaskResizeMigrating: true, TaskResizeMigrated: true, TaskResizeFinish: true,
	TaskResizeReverting: true, TaskResizeConfirming: true,
	// soft reboot: ACPI shutdown then start (STOPPED/SHUTDOWN); hard: destroy then start (STOPPED/DESTROYED)
	TaskRebooting: true, TaskRebootPending: true, TaskRebootStarted: true,
	TaskRebootingHard: true, TaskRebootPendingHard: true, TaskRebootStartedHard: true,
	TaskPausing: false, TaskUnpausing: false,
	TaskSuspending: true, TaskResuming: true, // suspend = managed save (STOPPED/SAVED)
	TaskPoweringOff: true, TaskPoweringOn: true,
	TaskRescuing: true, TaskUnrescuing: true, // rescue destroys the domain and boots a rescue one
	TaskRebuilding: true, TaskRebuildBlockDeviceMapping: true, TaskRebuildSpawning: true,
	TaskMigrating: true, // live migration: STOPPED/MIGRATED on the source
	TaskDeleting:  true, TaskSoftDeleting: true, TaskRestoring: true,
	TaskShelving: true, TaskShelvingImagePendingUpload: true, TaskShelvingImageUploading: true,
	TaskShelvingOffloading: true, TaskUnshelving: true,
}

// Known reports whether t is one of Nova's task states (or TaskNone).
func (t TaskState) Known() bool {
	if t == TaskNone {
		return true
	}
	_, ok := taskExplains[t]
	return ok
}

// Explains reports whether an operation in this task state can explain a
// stopped domain: every known task state but pausing, unpausing and
// updating_password, and any task state this package does not know (a
// newer Nova's operation: held, bounded by Config.MaxHold, rather than
// reported as unexpected). TaskNone explains nothing.
func (t TaskState) Explains() bool {
	if t == TaskNone {
		return false
	}
	e, ok := taskExplains[t]
	return e || !ok
}

// Reboot reports whether t is one of Nova's soft or hard reboot states
// (task_states.soft_reboot_states, hard_reboot_states).
func (t TaskState) Reboot() bool {
	switch t {
	case TaskRebooting, TaskRebootPending, TaskRebootStarted, TaskRebootingHard, TaskRebootPendingHard, TaskRebootStartedHard:
		return true
	}
	return false
}

// VMState is Nova's vm_state: the instance's stable state when no
// operation is in flight.
type VMState string

// VM states (nova/objects/fields.py InstanceState).
const (
	VMActive           VMState = "active"
	VMBuilding         VMState = "building"
	VMPaused           VMState = "paused"
	VMSuspended        VMState = "suspended"
	VMStopped          VMState = "stopped"
	VMRescued          VMState = "rescued"
	VMResized          VMState = "resized"
	VMSoftDeleted      VMState = "soft-delete"
	VMDeleted          VMState = "deleted"
	VMError            VMState = "error"
	VMShelved          VMState = "shelved"
	VMShelvedOffloaded VMState = "shelved_offloaded"
)

// PowerState is Nova's power_state: the hypervisor's state as Nova last
// recorded it (a snapshot of the recent past; Nova updates it at the end of
// each task and from its periodic/event-driven sync).
type PowerState int

// Power states (nova/objects/fields.py InstancePowerState, by index; 2 and
// 5 are unused).
const (
	PowerNoState   PowerState = 0
	PowerRunning   PowerState = 1
	PowerPaused    PowerState = 3
	PowerShutdown  PowerState = 4
	PowerCrashed   PowerState = 6
	PowerSuspended PowerState = 7
)

// String returns Nova's name of the power state.
func (p PowerState) String() string {
	switch p {
	case PowerNoState:
		return "pending"
	case PowerRunning:
		return "running"
	case PowerPaused:
		return "paused"
	case PowerShutdown:
		return "shutdown"
	case PowerCrashed:
		return "crashed"
	case PowerSuspended:
		return "suspended"
	}
	return "power(" + strconv.Itoa(int(p)) + ")"
}

// Server is Nova's view of one instance on this host, as one row of
// GET /servers/detail?all_tenants=1&host=<host>.
type Server struct {
	UUID       string
	VMState    VMState
	TaskState  TaskState
	PowerState PowerState
}

// Action is one instance action (GET /servers/{id}/os-instance-actions):
// which API operation was requested, by whom and when. Nova records one for
// every API request that changes an instance, and also when Nova itself
// calls its API: its power-state sync stops an instance it found shut off
// ("Instance shutdown by itself. Calling the stop API",
// nova/compute/manager.py _stop_unexpected_shutdown_instance) with an admin
// context that has no user (nova/context.py get_admin_context:
// user_id=None), so such an action has no UserID.
type Action struct {
	Name   string    // "stop", "reboot", "start", ... (nova/compute/instance_actions.py)
	UserID string    // "" when Nova itself requested it
	Start  time.Time // start_time, UTC
}

// ActionStop is the action Nova records for the stop API (and for its own
// power-state sync's stop).
const ActionStop = "stop"

// Detail is the libvirt detail of the stop, as hvguard reports it.
type Detail string

// Details.
const (
	DetailShutdown     Detail = "shutdown-by-guest" // STOPPED/SHUTDOWN: the guest powered off (also Nova's soft reboot and stop: ACPI)
	DetailDestroyed    Detail = "destroyed"         // STOPPED/DESTROYED: virDomainDestroy (also Nova's hard reboot)
	DetailCrashed      Detail = "crashed"           // CRASHED or STOPPED/CRASHED
	DetailFailed       Detail = "failed"            // STOPPED/FAILED: QEMU died
	DetailSaved        Detail = "saved"             // STOPPED/SAVED: managed save (Nova suspend, cold snapshot)
	DetailMigrated     Detail = "migrated"          // STOPPED/MIGRATED: live-migrated away
	DetailFromSnapshot Detail = "from-snapshot"     // STOPPED/FROM_SNAPSHOT
	DetailUnknown      Detail = "unknown"
)

// ParseDetail maps the libvirt detail of a stop as the lifecycle debouncer
// reports it (Cause.Detail, merged stops as "PANICKED+CRASHED") onto a
// Detail. A crash anywhere in a merged detail wins.
func ParseDetail(libvirtDetail string) Detail {
	d := strings.ToUpper(libvirtDetail)
	if strings.Contains(d, "CRASHED") || strings.Contains(d, "PANICKED") {
		return DetailCrashed
	}
	first, _, _ := strings.Cut(d, "+")
	switch first {
	case "SHUTDOWN":
		return DetailShutdown
	case "DESTROYED":
		return DetailDestroyed
	case "FAILED":
		return DetailFailed
	case "SAVED":
		return DetailSaved
	case "MIGRATED":
		return DetailMigrated
	case "FROM_SNAPSHOT":
		return DetailFromSnapshot
	}
	return DetailUnknown
}
