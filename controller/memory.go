package controller

import "slices"

// The controller's memory across restarts (issue 11, docs/security.md
// "Restart memory"). A host's beacons bind it (invalid.go) only once this
// controller received one: a controller that starts (or a standby that
// takes over without having watched) after a host died is lenient for it,
// and a compromised node writing garbage into its key every lease_ttl +
// grace kept it undeclared (invariant c). So the leader remembers, in a
// bucket only controllers may write (MemoryBucket), each host whose
// beacons bound it — written when its first beacon arrives — and a
// controller restores that once its watch listed the lease bucket and it
// restored the guard (RestoreMemory): such a host is bound again at once
// if this controller holds a trusted record of it (beaconsBind), so a
// value of its key no beacon names restarts nothing (its beacons must
// still arrive: the fleet-wide BeaconTrustWindow applies).
//
// Nothing else is remembered: a memory says what was, not what is. Taking
// a remembered record as the host's record declared a host that withdrew
// while no controller ran and let a remembered withdrawal end a hold over
// a rack that took its leases back meanwhile (reviewer X11,
// TestX11UnobservedWithdrawal*, TestX11StaleWithdrawnMemoryEndsHold), so a
// host whose key holds only untrusted values at a restart stays
// undeclared (docs/security.md, What is left).

// MemoryBucket is the controllers' bucket of Memory values, one per host
// token. Only controllers may read or write it (controller/natsperm).
const MemoryBucket = "hvguard-controller-memory"

// Memory is what the controller remembers of a host across restarts.
type Memory struct {
	// Beacons: the host's beacons bound it (invalid.go beaconsBind).
	Beacons bool `json:"beacons"`
}

// memoryMutation (issue 11): RestoreMemory does nothing, as before.
// Tests only.
var memoryMutation bool

// rememberHost notes that host's memory is due to be written (Memories).
func (t *Tracker) rememberHost(host string) {
	if t.required {
		t.dirtyMemory[host] = true
	}
}

// Memories returns, sorted by host, the memories changed since the last
// call, for the leader to write to MemoryBucket (with signatures required
// only: beacons bind nothing without them). A write that fails is
// retried by handing the memory back with MemoryFailed.
func (t *Tracker) Memories() (out []string, ms []Memory) {
	for host := range t.dirtyMemory {
		if t.hosts[host] != nil {
			out = append(out, host)
		}
	}
	clear(t.dirtyMemory)
	slices.Sort(out)
	for range out {
		ms = append(ms, Memory{Beacons: true}) // dirty only when its beacons came to bind it (ObserveBeacon)
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
// (see above). Call it after the watch's first listing and RestoreGuard.
func (t *Tracker) RestoreMemory(host string, m Memory) {
	if h := t.hosts[host]; h != nil && t.required && m.Beacons && !memoryMutation {
		h.beacons.remembered = true
	}
}
