package controller

import (
	"slices"
	"time"

	"hvguard/fencing"
)

// The controller's memory across restarts (issue 11, docs/security.md
// "Restart memory"). The lease bucket keeps one value per key, and any
// agent may write any host's key (relays): when a controller starts (or
// a standby that never watched takes over) while a compromised node
// keeps garbage in a dead host's key, the new tracker has no trusted
// record of it — nothing to declare it with (its constants, epoch) — and
// no beacon of it, so it was never declared (invariant c). So the leader
// keeps, in a bucket only controllers may write (MemoryBucket), each
// host's last trusted record and whether its beacons bound it, written
// when they change (not at every renewal: the constants, state, epoch,
// incarnation or named guard), and a controller restores them once its
// watch listed the lease bucket (RestoreMemory):
//
//   - a host whose beacons bound it is bound again at once (its beacons
//     must still arrive: the fleet-wide BeaconTrustWindow applies), so a
//     value of its key no beacon names restarts nothing;
//   - an enrolled host whose key holds only untrusted values takes its
//     remembered active record as its last trusted one: it is declared by
//     CAS over the untrusted value once silent for lease_ttl + grace from
//     the watch start, unless it renews (a trusted record, or — bound — a
//     value its beacon names). Until a trusted record arrives it keeps
//     counting silent for the guard as a host with no trusted record does
//     (X8, invalid.go). A remembered withdrawal is taken too: the host is
//     then neither declared nor counted silent.
//
// The memory is the leader's own write and its records are verified
// against host_keys_file when read (a record signed by its host's key);
// a host with no memory is handled as before.

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
// (see above), at now; rec must be verified by the caller (signed by a
// key allowed to write it). Call it after the watch's first listing and
// RestoreGuard.
func (t *Tracker) RestoreMemory(now time.Time, host string, m Memory) {
	h := t.hosts[host]
	if h == nil || !t.required || m.Record.Host != host || m.Record.Signer == "" || memoryMutation {
		return
	}
	if m.Beacons {
		h.beacons.remembered = true
	}
	if h.rec.State != "" || h.deleted || !t.silentUntrusted(host) || m.Record.State != fencing.LeaseActive && m.Record.State != fencing.LeaseWithdrawn {
		return // it has a trusted record; a deleted key; not an enrolled host; neither active nor withdrawn
	}
	h.rec = m.Record
	h.declaredAt, h.declaring = time.Time{}, time.Time{}
	h.silentUntrusted = t.silentUntrusted(host)
	t.judge(host, h, fencing.LeaseRecord{})
	t.guards.named(&h.rec, t.required)
}
