package fencing

import (
	"encoding/json"
	"fmt"
	"time"
)

// BeaconSchema is the version of Beacon.
const BeaconSchema = 1

// Beacon is an agent's word that it wrote its own lease key at Revision:
// published (core NATS, best effort) on proto.BeaconSubject(host) after
// every renewal the agent wrote itself.
//
// It is signed by the host's key (Signer.SealBeacon, Keyring.VerifyBeacon),
// so a beacon is evidence no other node can make: the NATS permissions
// (only host's own user may publish on host's beacon subject) are not
// enough alone — a JetStream API request naming that subject as its reply
// makes the server publish a stored forgery there (reviewer X12). The
// controller uses it (controller/invalid.go): with
// signatures required, a value of a host's key it cannot verify (garbage,
// unsigned, an unknown signer) counts as that host's renewal only when the
// host's beacon names its revision — a live host whose key or release this
// controller does not know is never declared, and a compromised node
// writing such values into a dead host's key no longer keeps it
// undeclared (issue 11, docs/security.md).
type Beacon struct {
	Schema      int       `json:"schema"`
	Host        string    `json:"host"`
	BootID      string    `json:"boot_id,omitempty"`
	Incarnation uint64    `json:"incarnation,omitempty"`
	Revision    uint64    `json:"revision"`
	At          time.Time `json:"at"`
	// State is the state of the record written at Revision when it is not
	// active: "withdrawn" for an orderly stop's withdrawal (the controller
	// then knows of the withdrawal even if a compromised node overwrote
	// the record before its watch delivered it: reviewer X11).
	State LeaseState `json:"state,omitempty"`
	// Prev is the revision the beacon this agent process published before
	// this one named (0: its first since it started, or an agent from
	// before Prev). A controller that received this beacon and not that
	// one knows a beacon was lost on the way — on its subscription, or on
	// a NATS route or leaf connection it cannot see (the chain,
	// controller/beaconloss.go).
	Prev uint64 `json:"prev,omitempty"`
	// Epoch and Seq (with Incarnation) identify the record the agent wrote
	// at Revision. A controller that received this beacon knows the host
	// wrote that record: if the lease stream rolls back, a copy of it (or
	// of any older record of the host) put back by a compromised node is
	// not newer than what the controller carries across the rollback, so
	// it ends no carry (controller/memory.go, CarriedHost.Wrote; reviewer
	// X44). 0: an agent from before them.
	Epoch uint64 `json:"epoch,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
	// RecSig signs the whole beacon (every field above, Prev, Epoch and
	// Seq included) by the same key: a controller that knows it checks
	// this one signature; one from before it checks Sig over the fields
	// it knows, and PrevSig.
	RecSig string `json:"rec_sig,omitempty"`
	// PrevSig signs Prev (with Host, Revision and Signer) by the same key:
	// outside Sig, which a controller from before Prev checks over the
	// fields it knows (sign.go beaconPayload).
	PrevSig string `json:"prev_sig,omitempty"`
	// Signer and Sig: the host key that signed the beacon and its
	// signature (sign.go SealBeacon; absent when signing is off). NATS
	// permissions alone do not authenticate a beacon: any user allowed a
	// JetStream API request can have the server publish the answer on a
	// reply subject of its choice — another host's beacon subject
	// (reviewer X12, the "reflection").
	Signer string `json:"signer,omitempty"`
	Sig    string `json:"sig,omitempty"`
}

// Encode returns the JSON encoding of b.
func (b Beacon) Encode() ([]byte, error) {
	out, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("encode beacon: %w", err)
	}
	return out, nil
}

// maxBeaconSize bounds what DecodeBeacon reads: a beacon is ~150 bytes.
const maxBeaconSize = 4096

// DecodeBeacon decodes a Beacon, rejecting unknown schemas, a missing host
// and revision 0 (no write has it).
func DecodeBeacon(b []byte) (Beacon, error) {
	var e Beacon
	if len(b) > maxBeaconSize {
		return e, fmt.Errorf("decode beacon: %d bytes (at most %d)", len(b), maxBeaconSize)
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("decode beacon: %w", err)
	}
	if e.Schema != BeaconSchema || e.Host == "" || e.Revision == 0 {
		return e, fmt.Errorf("decode beacon: schema %d host %q revision %d", e.Schema, e.Host, e.Revision)
	}
	if e.Prev >= e.Revision {
		return e, fmt.Errorf("decode beacon: prev %d not below revision %d", e.Prev, e.Revision)
	}
	if e.State != "" && e.State != LeaseWithdrawn {
		return e, fmt.Errorf("decode beacon: state %q (only withdrawn, or none)", e.State)
	}
	return e, nil
}
