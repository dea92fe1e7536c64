package controller

import (
	"slices"

	"hvguard/fencing"
)

// The controller's memory across restarts (issue 11, docs/security.md
// "Restart memory"). A host's beacons bind it (invalid.go) only once this
// controller received one: a controller that starts (or a standby that
// takes over without having watched) after a host died is lenient for it,
// and a compromised node writing garbage into its key every lease_ttl +
// grace kept it undeclared (invariant c). So the leader keeps, in a
// bucket only controllers may write (MemoryBucket), each host's last
// trusted record and whether its beacons bound it, written at once when
// they change (not at every renewal: the constants, state, epoch,
// incarnation or named guard), and a controller restores them once its
// watch listed the lease bucket and it restored the guard
// (RestoreMemory): a host whose beacons bound it is bound again at once —
// if this controller holds a trusted record of it — so a value of its key
// no beacon names restarts nothing (its beacons must still arrive: the
// fleet-wide BeaconTrustWindow applies).
//
// The memory is never taken as the host's record: a host whose key holds
// only untrusted values at a restart stays undeclared. Taking the
// remembered active record declared a host that withdrew while no
// controller ran (its withdrawal overwritten, or created over a marker:
// not verifiable), and a remembered withdrawal ended a hold over a rack
// that took its leases back meanwhile (reviewer X11,
// TestX11UnobservedWithdrawal*, TestX11StaleWithdrawnMemoryEndsHold): a
// memory says what was, not what is, and (S) comes first. The record is
// kept in it for the operator (status) and verified against
// host_keys_file when read.

// MemoryBucket is the controllers' bucket of Memory values, one per host
// token. Only controllers may read or write it (controller/natsperm).
const MemoryBucket = "hvguard-controller-memory"

// Memory is what the controller remembers of a host across restarts.
type Memory struct {
	// Record is the host's last trusted record (signed by its writer).
	Record fencing.LeaseRecord `json:"record"`
	// Beacons: the host's beacons bound it (invalid.go beaconsBind).
	Beacons bool `json:"beacons,omitempty"`
}

// memoryMutation (issue 11): RestoreMemory does nothing, as before.
// Tests only.
var memoryMutation bool

// remembers reports whether r differs from was in what Memory keeps.
func remembers(was, r fencing.LeaseRecord) bool {
	return was.State != r.State || was.Epoch != r.Epoch || was.Incarnation != r.Incarnation || was.BootID != r.BootID ||
		was.Timing != r.Timing || was.Backstop != r.Backstop || was.Action != r.Action || was.FencingEnabled != r.FencingEnabled ||
		was.Signer != r.Signer || (was.Guard == nil) != (r.Guard == nil) || was.Guard != nil && *was.Guard != *r.Guard
}

// rememberHost notes that host's memory is due to be written (Memories).
func (t *Tracker) rememberHost(host string) {
	if t.required {
		t.dirtyMemory[host] = true
	}
}

// Memories returns, sorted by host, the memories changed since the last
// call, for the leader to write to MemoryBucket (with signatures required
// only: without them nothing is trusted to remember). A write that fails
// is retried by handing the memory back with MemoryFailed.
func (t *Tracker) Memories() (out []string, ms []Memory) {
	hosts := make([]string, 0, len(t.dirtyMemory))
	for host := range t.dirtyMemory {
		hosts = append(hosts, host)
	}
	slices.Sort(hosts)
	for _, host := range hosts {
		delete(t.dirtyMemory, host)
		if h := t.hosts[host]; h != nil && h.rec.Signer != "" {
			out = append(out, host)
			ms = append(ms, Memory{Record: h.rec, Beacons: !h.beacons.at.IsZero() || h.beacons.remembered})
		}
	}
	return out, ms
}

// MemoryFailed hands back a memory whose write failed: it is returned by
// the next Memories.
func (t *Tracker) MemoryFailed(host string) {
	if t.hosts[host] != nil {
		t.dirtyMemory[host] = true
	}
}

// RestoreMemory takes over what an earlier controller remembered of host
// (see above); rec must be verified by the caller (signed by a key allowed
// to write it). Call it after the watch's first listing and RestoreGuard.
func (t *Tracker) RestoreMemory(host string, m Memory) {
	h := t.hosts[host]
	if h == nil || !t.required || m.Record.Host != host || m.Record.Signer == "" || memoryMutation {
		return
	}
	if m.Beacons {
		h.beacons.remembered = true
	}
}
