package fencing

import (
	"encoding/json"
	"fmt"
	"time"
)

// Lease bucket layout.
const (
	// Bucket is the JetStream KV bucket holding one lease per host (key:
	// the host token, proto.HostToken) and the guard (GuardKey).
	Bucket = "hvguard-leases"
	// GuardKey holds the controller's published Guard. It cannot collide
	// with a host token, which never starts with '_'.
	GuardKey = "_guard"
	// RecordSchema is the version of LeaseRecord.
	RecordSchema = 1
)

// LeaseState is the state field of a lease record.
type LeaseState string

// Lease states.
const (
	// LeaseActive: written by the agent (or a peer relaying for it).
	LeaseActive LeaseState = "active"
	// LeaseExpired: written by the controller (CAS, new epoch): the host
	// was declared dead; its renewals fail from now on.
	LeaseExpired LeaseState = "expired"
	// LeaseReleased: written by the controller or `hvguard unfence` (CAS,
	// same epoch as the declaration): the agent may take the lease again.
	LeaseReleased LeaseState = "released"
	// LeaseWithdrawn: written only by the agent for itself on an orderly
	// stop (or a failed start), by CAS on the revision of its last landed
	// record, same epoch, with Reason. The controller never declares a
	// withdrawn host (it alerts: unprotected, not recovered); the agent
	// takes the lease back from it on its next start (a renewal by CAS).
	LeaseWithdrawn LeaseState = "withdrawn"
)

// LeaseRecord is the value of a host's key in the lease bucket.
type LeaseRecord struct {
	Schema int        `json:"schema"`
	Host   string     `json:"host"`
	BootID string     `json:"boot_id"`
	Epoch  uint64     `json:"epoch"`
	State  LeaseState `json:"state"`
	// Incarnation is the agent process's Durable.Incarnation.
	Incarnation uint64 `json:"incarnation"`
	// Seq is the agent's renewal sequence number: it identifies which
	// renewal (own or relayed) a record is, so a late write can be
	// recognised as ours.
	Seq uint64 `json:"seq"`
	// FencingEnabled, Action and Backstop say what the host does when it
	// loses its lease; Timing carries its constants.
	FencingEnabled bool     `json:"fencing_enabled"`
	Action         Action   `json:"action"`
	Backstop       Backstop `json:"backstop"`
	Timing         Timing   `json:"timing"`
	// AgentState is the agent's fencing state when it wrote the record.
	AgentState State `json:"agent_state,omitempty"`
	// Reason says why the controller wrote an expired or released record,
	// or why the agent withdrew.
	Reason string `json:"reason,omitempty"`
	// Guard is the controller's guard version the agent acts on, and its
	// threshold (absent: no valid guard known, or an agent from before
	// guard versions). The controller never uses a larger threshold than
	// any guard a member may still act on.
	Guard *GuardVersion `json:"guard,omitempty"`
	// AgentVersion is the agent's version (informational: the
	// controller's fleet view shows it; nothing decides on it).
	AgentVersion string `json:"agent_version,omitempty"`
	// PrevRev is the revision this record was written on by CAS (0: a
	// create), Signer the ID of the key that signed it, Sig the signature
	// (sign.go). Set by Signer.Seal; absent when signing is off.
	PrevRev uint64 `json:"prev_rev,omitempty"`
	Signer  string `json:"signer,omitempty"`
	Sig     string `json:"sig,omitempty"`
}

// RelayRetryOver is the relay contract's retry rule: r, the key's current
// record after a relay's CAS conflict, is an active record of the very
// agent process that asked (host, epoch, boot and incarnation of asker):
// one of its own renewals landed meanwhile, so the relay is retried once
// on r's revision. Never over a record of another process of the same host
// (a restart, maybe with other timing constants): a question of an earlier
// process relayed late would put that process's stale record, and its
// constants, in front of the controller.
func (r LeaseRecord) RelayRetryOver(asker LeaseRecord) bool {
	return r.State == LeaseActive && r.Host == asker.Host && r.Epoch == asker.Epoch &&
		r.BootID == asker.BootID && r.Incarnation == asker.Incarnation
}

// Encode returns the JSON encoding of r.
func (r LeaseRecord) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode lease record: %w", err)
	}
	return b, nil
}

// DecodeRecord decodes a lease record, rejecting unknown schemas and
// records without a host; every error wraps ErrInvalidRecord.
func DecodeRecord(b []byte) (LeaseRecord, error) {
	var r LeaseRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: decode: %w", ErrInvalidRecord, err)
	}
	if r.Schema != RecordSchema {
		return r, fmt.Errorf("%w: decode: schema %d (want %d)", ErrInvalidRecord, r.Schema, RecordSchema)
	}
	if r.Host == "" {
		return r, fmt.Errorf("%w: decode: no host", ErrInvalidRecord)
	}
	switch r.State {
	case LeaseActive, LeaseExpired, LeaseReleased, LeaseWithdrawn:
	default:
		return r, fmt.Errorf("%w: decode: state %q", ErrInvalidRecord, r.State)
	}
	return r, nil
}

// DecodeVerified decodes a lease record and verifies it with keys (nil:
// not verified).
func DecodeVerified(b []byte, keys *Keyring) (LeaseRecord, error) {
	r, err := DecodeRecord(b)
	if err != nil {
		return r, err
	}
	return r, keys.VerifyRecord(r)
}

// EncodeGuard and DecodeGuard (de)serialise the published Guard.
func EncodeGuard(g Guard) ([]byte, error) {
	b, err := json.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("encode guard: %w", err)
	}
	return b, nil
}

// DecodeGuard decodes a Guard published under GuardKey.
func DecodeGuard(b []byte) (Guard, error) {
	var g Guard
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("decode guard: %w", err)
	}
	return g, nil
}

// EventSchema is the version of FenceEvent.
const EventSchema = 1

// FenceEvent is the published form of a Transition (one message per
// fence-state transition), for the subject proto.FenceSubject(host) —
// hvguard.v1.<host>.fence — or a stream the controller reads. Decoders
// tolerate unknown fields.
type FenceEvent struct {
	Schema int    `json:"schema"`
	Host   string `json:"host"`
	BootID string `json:"boot_id"`
	Epoch  uint64 `json:"epoch"`
	From   State  `json:"from"`
	To     State  `json:"to"`
	Reason Reason `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Paused is the durable paused set after the transition (what hvguard
	// would resume on a rejoin), WouldFence what a monitor-only agent
	// would have fenced.
	Paused     []string  `json:"paused,omitempty"`
	WouldFence []string  `json:"would_fence,omitempty"`
	At         time.Time `json:"at"`
}

// NewFenceEvent builds the event of tr for host (wall is the wall-clock time
// of the transition: Transition.At is on the agent's boot clock).
func NewFenceEvent(host, bootID string, tr Transition, paused, wouldFence []string, wall time.Time) FenceEvent {
	return FenceEvent{Schema: EventSchema, Host: host, BootID: bootID, Epoch: tr.Epoch, From: tr.From, To: tr.To,
		Reason: tr.Reason, Detail: tr.Detail, Paused: paused, WouldFence: wouldFence, At: wall.UTC()}
}

// Encode returns the JSON encoding of e.
func (e FenceEvent) Encode() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode fence event: %w", err)
	}
	return b, nil
}

// DecodeFenceEvent decodes a FenceEvent, rejecting unknown schemas.
func DecodeFenceEvent(b []byte) (FenceEvent, error) {
	var e FenceEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("decode fence event: %w", err)
	}
	if e.Schema != EventSchema || e.Host == "" || e.To == "" {
		return e, fmt.Errorf("decode fence event: schema %d host %q to %q", e.Schema, e.Host, e.To)
	}
	return e, nil
}
