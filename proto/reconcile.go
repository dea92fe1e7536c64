package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"
)

// ReconcileOutcome is what a rejoin reconciliation did about one domain
// (issue 4; docs/reconcile.md).
type ReconcileOutcome string

// Reconcile outcomes that are published. Domains that were kept or skipped
// are not events: they are in the agent's status file.
const (
	// ReconcileDestroyed: the stale copy was powered off and marked.
	ReconcileDestroyed ReconcileOutcome = "destroyed"
	// ReconcileAlreadyOff: the stale copy was already off; only marked.
	ReconcileAlreadyOff ReconcileOutcome = "already-off"
	// ReconcileWouldDestroy: reconcile.action report; nothing was done.
	ReconcileWouldDestroy ReconcileOutcome = "would-destroy"
	// ReconcileDestroyFailed: the destroy failed (Error says why); the
	// reconciliation is not OK and is retried.
	ReconcileDestroyFailed ReconcileOutcome = "destroy-failed"
)

// Valid reports whether o is a known outcome.
func (o ReconcileOutcome) Valid() bool {
	switch o {
	case ReconcileDestroyed, ReconcileAlreadyOff, ReconcileWouldDestroy, ReconcileDestroyFailed:
		return true
	}
	return false
}

// ReconcileEvent is published on ReconcileSubject(host) for each domain a
// reconciliation destroyed, found already off, would destroy (report mode),
// or failed to destroy, with the evidence from Nova it rests on. It is a
// notification: the authoritative records are the domain's hvguard mark
// (libvirt metadata) and the agent's state_dir/reconcile-last.json.
type ReconcileEvent struct {
	// Schema is SchemaVersion.
	Schema int `json:"schema"`
	// Host is the agent's host (RFC 1123, see HostToken).
	Host string `json:"host"`
	// DomainUUID is the libvirt domain UUID (= Nova instance UUID).
	DomainUUID string           `json:"domain_uuid"`
	DomainName string           `json:"domain_name,omitempty"`
	Outcome    ReconcileOutcome `json:"outcome"`
	// Reason is the reconciliation's typed reason, e.g. "evacuated-elsewhere".
	Reason string `json:"reason"`
	// Trigger is why the reconciliation ran: start, rejoin, periodic, retry.
	Trigger string `json:"trigger"`
	// Evidence: the evacuation record and the server's current host.
	MigrationID     int64  `json:"migration_id,omitempty"`
	MigrationUUID   string `json:"migration_uuid,omitempty"`
	MigrationStatus string `json:"migration_status,omitempty"`
	SourceCompute   string `json:"source_compute,omitempty"`
	DestCompute     string `json:"dest_compute,omitempty"`
	DestHost        string `json:"dest_host,omitempty"`
	ServerHost      string `json:"server_host,omitempty"`
	// Error is the destroy or mark error, if any.
	Error string `json:"error,omitempty"`
	// ObservedAt is when the reconciliation finished.
	ObservedAt time.Time `json:"observed_at"`
}

// Validate reports the first problem with e, or nil.
func (e *ReconcileEvent) Validate() error {
	if e.Schema != SchemaVersion {
		return fmt.Errorf("schema: unsupported version %d (want %d)", e.Schema, SchemaVersion)
	}
	if _, err := HostToken(e.Host); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if !ValidUUID(e.DomainUUID) {
		return fmt.Errorf("domain_uuid: invalid UUID %s (want lower-case 8-4-4-4-12 hex)", quote(e.DomainUUID))
	}
	if !e.Outcome.Valid() {
		return fmt.Errorf("outcome: unknown value %s", quote(string(e.Outcome)))
	}
	if e.Reason == "" {
		return errors.New("reason: missing")
	}
	if e.Trigger == "" {
		return errors.New("trigger: missing")
	}
	for _, f := range []struct{ name, v string }{
		{"domain_name", e.DomainName}, {"reason", e.Reason}, {"trigger", e.Trigger},
		{"migration_uuid", e.MigrationUUID}, {"migration_status", e.MigrationStatus},
		{"source_compute", e.SourceCompute}, {"dest_compute", e.DestCompute},
		{"dest_host", e.DestHost}, {"server_host", e.ServerHost}, {"error", e.Error},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%s: not valid UTF-8", f.name)
		}
	}
	return checkTime("observed_at", e.ObservedAt)
}

// MsgID is the event's Nats-Msg-Id: one per (host, domain, migration,
// outcome), so a re-published event is dropped by the stream's duplicate
// window while a new outcome for the same domain is not. It names the fact,
// not a position in a sequence, so it needs no incarnation (issue 10): an
// agent whose state directory was lost can only publish the same fact
// under the same ID (dropped within the window as the duplicate it is),
// never another event under an old one.
func (e *ReconcileEvent) MsgID() string {
	return e.Host + ":reconcile:" + e.DomainUUID + ":" + e.MigrationUUID + ":" + string(e.Outcome)
}

// Encode validates e and returns its JSON encoding.
func (e *ReconcileEvent) Encode() ([]byte, error) { return encode("reconcile event", e) }

// DecodeReconcile decodes and validates one JSON reconcile message (unknown
// fields ignored, as DecodeLifecycle).
func DecodeReconcile(data []byte) (ReconcileEvent, error) {
	var e ReconcileEvent
	if len(data) > MaxMessageSize {
		return e, fmt.Errorf("decode reconcile event: %d bytes exceeds %d", len(data), MaxMessageSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&e); err != nil {
		return ReconcileEvent{}, fmt.Errorf("decode reconcile event: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return ReconcileEvent{}, errors.New("decode reconcile event: trailing data after the JSON object")
	}
	e.ObservedAt = e.ObservedAt.UTC()
	if err := e.Validate(); err != nil {
		return ReconcileEvent{}, fmt.Errorf("decode reconcile event: %w", err)
	}
	return e, nil
}
