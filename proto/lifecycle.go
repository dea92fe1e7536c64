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

// SchemaVersion is the version of the message schema this package writes and
// the only one it accepts. See the package doc for when it changes.
const SchemaVersion = 1

// MaxMessageSize bounds an encoded message. A lifecycle event is a few hundred
// bytes; 64 KiB leaves room for future optional fields while keeping a
// malicious or corrupt message from costing a decoder real memory. It is also
// well under NATS's default max_payload (1 MiB).
const MaxMessageSize = 64 << 10

// maxShortValue is how much of an offending value an error message quotes.
const maxShortValue = 64

// Transition is what hvguard decided happened to a domain.
type Transition string

// Transitions. TransitionGap is not a domain transition: it is a marker
// telling the consumer that events of this host were lost (the agent's
// outbox was full) and it must resync the host.
const (
	TransitionStarted     Transition = "started"
	TransitionStopped     Transition = "stopped"
	TransitionRebooted    Transition = "rebooted"
	TransitionSuspended   Transition = "suspended"
	TransitionResumed     Transition = "resumed"
	TransitionPMSuspended Transition = "pmsuspended"
	TransitionDefined     Transition = "defined"
	TransitionUndefined   Transition = "undefined"
	TransitionGap         Transition = "gap"
)

// Valid reports whether t is one of the known transitions.
func (t Transition) Valid() bool {
	switch t {
	case TransitionStarted, TransitionStopped, TransitionRebooted,
		TransitionSuspended, TransitionResumed, TransitionPMSuspended,
		TransitionDefined, TransitionUndefined, TransitionGap, TransitionInventory:
		return true
	}
	return false
}

// Classification is what a reported stop was in Nova's light (Nova-aware
// stop classification, docs/classification.md). Set only on "stopped" and
// "rebooted" events of an agent with classification enabled; absent
// otherwise.
type Classification string

// Classifications.
const (
	// ClassificationRebooted: the domain went down and came back (a Nova
	// operation completed, or libvirt showed it running again while the
	// stop was classified). Only on a "rebooted" event.
	ClassificationRebooted Classification = "rebooted"
	// ClassificationStoppedByNova: Nova stopped it on purpose (stop API,
	// shelve, suspend, delete, moved away) or still operates on it after
	// the agent's maximum hold. A recovery controller leaves it alone.
	ClassificationStoppedByNova Classification = "stopped-by-nova"
	// ClassificationStoppedUnexpectedly: nothing Nova did explains it: the
	// stop a recovery controller acts on.
	ClassificationStoppedUnexpectedly Classification = "stopped-unexpectedly"
	// ClassificationUnknown: no Nova view could be used (unreachable, slow,
	// the agent stopping); reported when the debouncer alone would have.
	ClassificationUnknown Classification = "unknown"
)

// Valid reports whether c is one of the known classifications.
func (c Classification) Valid() bool {
	switch c {
	case ClassificationRebooted, ClassificationStoppedByNova, ClassificationStoppedUnexpectedly, ClassificationUnknown:
		return true
	}
	return false
}

// MaxClassificationReason bounds classification_reason: the reasons are
// short typed tokens ("nova-synced-stop"); a consumer may use them as metric
// labels, so an unbounded value is refused rather than passed on.
const MaxClassificationReason = 64

// validReasonToken reports whether s is a non-empty lower-case token of
// letters, digits and '-' of at most MaxClassificationReason bytes.
func validReasonToken(s string) bool {
	if s == "" || len(s) > MaxClassificationReason {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// LifecycleEvent is one lifecycle event of one domain on one host, or a gap
// marker (Transition == TransitionGap) for that host.
//
// For a domain event, DomainUUID is required and the Gap* fields are zero.
// For a gap marker, DomainUUID and DomainName are empty and the Gap* fields
// describe the lost sequence numbers: GapFirstSeq..GapLastSeq (inclusive),
// GapCount of them, all below Seq. Lost events consume sequence numbers, so
// GapCount == GapLastSeq-GapFirstSeq+1.
type LifecycleEvent struct {
	// Schema is SchemaVersion.
	Schema int `json:"schema"`
	// Host is the compute host's RFC 1123 name (see HostToken).
	Host string `json:"host"`
	// Incarnation identifies the agent's outbox that assigned Seq: random,
	// fixed when the outbox is created, kept with it on disk. Seq is
	// strictly increasing within one incarnation only: a new incarnation
	// (state directory lost, agent reinstalled) starts again at 1. Schema 1
	// optional field (issue 10): absent (zero) from agents before it and
	// from outboxes they created. See the package doc's consumer rules.
	Incarnation Incarnation `json:"incarnation,omitempty"`
	// Seq is the per-host sequence number, >= 1, strictly increasing across
	// agent restarts within an incarnation. A hole means lost events.
	Seq uint64 `json:"seq"`
	// DomainUUID is the libvirt domain UUID (= Nova instance UUID) in
	// canonical lower-case 8-4-4-4-12 form.
	DomainUUID string `json:"domain_uuid,omitempty"`
	// DomainName is the libvirt domain name, e.g. "instance-0000002a".
	DomainName string `json:"domain_name,omitempty"`
	// Transition is what hvguard decided happened.
	Transition Transition `json:"transition"`
	// Reason says why hvguard decided this, e.g. "running-at-window-end" or,
	// for a gap marker, "outbox-full".
	Reason string `json:"reason,omitempty"`
	// State is the domain's final state as read from libvirt, e.g. "shutoff".
	State string `json:"state,omitempty"`
	// LibvirtEvent and LibvirtDetail are libvirt's raw names of the event
	// that caused this one, e.g. "STOPPED" / "DESTROYED".
	LibvirtEvent  string `json:"libvirt_event,omitempty"`
	LibvirtDetail string `json:"libvirt_detail,omitempty"`
	// OccurredAt is when libvirt emitted the event that caused this one
	// (for a gap marker: when the first lost event occurred).
	OccurredAt time.Time `json:"occurred_at"`
	// ObservedAt is when the agent decided and reported this event.
	ObservedAt time.Time `json:"observed_at"`
	// Classification and ClassificationReason are Nova's view of a stop
	// (schema 1 optional fields, added compatibly: absent = not
	// classified). Present together or not at all; only on "stopped"
	// (stopped-by-nova, stopped-unexpectedly, unknown) and "rebooted"
	// (rebooted) events. The reason is a typed token such as
	// "nova-synced-stop" (docs/classification.md lists them).
	Classification       Classification `json:"classification,omitempty"`
	ClassificationReason string         `json:"classification_reason,omitempty"`
	// RebootEvents is, on a "rebooted" event with reason "reboot-event",
	// the number of libvirt REBOOT events it stands for: one guest reset
	// makes 2–4, which the agent reports as one "rebooted"; more than 4
	// means several resets within the agent's window (a reset loop is
	// reported once per window, with this count). Schema 1 optional field
	// (issue 15): absent from older agents, which sent one "rebooted" per
	// REBOOT event (read absent as 1), and on every other event.
	RebootEvents uint64 `json:"reboot_events,omitempty"`
	// Gap marker fields; zero (and omitted) for domain events.
	GapFirstSeq uint64 `json:"gap_first_seq,omitempty"`
	GapLastSeq  uint64 `json:"gap_last_seq,omitempty"`
	GapCount    uint64 `json:"gap_count,omitempty"`
	// Full report fields (TransitionInventory only; see inventory.go).
	InventoryPart  int               `json:"inventory_part,omitempty"`
	InventoryParts int               `json:"inventory_parts,omitempty"`
	Domains        []InventoryDomain `json:"domains,omitempty"`
}

// Time bounds accepted by Validate. Outside them a time is certainly a bug
// (an uninitialised or garbage clock), and beyond year 9999 it could not be
// encoded as RFC 3339 at all.
var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// Validate reports the first problem with e, naming the field (and quoting
// its value when short), or nil if e is a well-formed schema 1 message.
func (e *LifecycleEvent) Validate() error {
	if e.Schema == 0 {
		return errors.New("schema: missing")
	}
	if e.Schema != SchemaVersion {
		return fmt.Errorf("schema: unsupported version %d (want %d)", e.Schema, SchemaVersion)
	}
	if _, err := HostToken(e.Host); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if e.Seq == 0 {
		return errors.New("seq: must be >= 1")
	}
	if !e.Transition.Valid() {
		return fmt.Errorf("transition: unknown value %s", quote(string(e.Transition)))
	}
	for _, f := range []struct{ name, v string }{
		{"domain_name", e.DomainName}, {"reason", e.Reason}, {"state", e.State},
		{"libvirt_event", e.LibvirtEvent}, {"libvirt_detail", e.LibvirtDetail},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%s: not valid UTF-8", f.name)
		}
	}
	if err := checkTime("occurred_at", e.OccurredAt); err != nil {
		return err
	}
	if err := checkTime("observed_at", e.ObservedAt); err != nil {
		return err
	}
	if err := e.validateClassification(); err != nil {
		return err
	}
	if e.RebootEvents != 0 && e.Transition != TransitionRebooted {
		return fmt.Errorf("reboot_events: %d on a %q event (only on %q)", e.RebootEvents, e.Transition, TransitionRebooted)
	}
	if e.Transition == TransitionInventory {
		return e.validateInventory()
	}
	if e.InventoryPart != 0 || e.InventoryParts != 0 || len(e.Domains) != 0 {
		return fmt.Errorf("inventory_part/inventory_parts/domains: set on a %q event (only allowed on %q)", e.Transition, TransitionInventory)
	}
	if e.Transition == TransitionGap {
		return e.validateGap()
	}
	if !ValidUUID(e.DomainUUID) {
		return fmt.Errorf("domain_uuid: invalid UUID %s (want lower-case 8-4-4-4-12 hex)", quote(e.DomainUUID))
	}
	if e.GapFirstSeq != 0 || e.GapLastSeq != 0 || e.GapCount != 0 {
		return fmt.Errorf("gap_first_seq/gap_last_seq/gap_count: set on a %q event (only allowed on %q)", e.Transition, TransitionGap)
	}
	return nil
}

func (e *LifecycleEvent) validateClassification() error {
	if e.Classification == "" && e.ClassificationReason == "" {
		return nil
	}
	switch {
	case !e.Classification.Valid():
		return fmt.Errorf("classification: unknown value %s", quote(string(e.Classification)))
	case !validReasonToken(e.ClassificationReason):
		return fmt.Errorf("classification_reason: %s: must be a token of a-z, 0-9 and '-', 1 to %d bytes, with classification", quote(e.ClassificationReason), MaxClassificationReason)
	case e.Transition == TransitionRebooted && e.Classification != ClassificationRebooted,
		e.Transition == TransitionStopped && e.Classification == ClassificationRebooted,
		e.Transition != TransitionStopped && e.Transition != TransitionRebooted:
		return fmt.Errorf("classification: %q on a %q event (rebooted only on rebooted, the others only on stopped)", e.Classification, e.Transition)
	}
	return nil
}

func (e *LifecycleEvent) validateGap() error {
	if e.DomainUUID != "" || e.DomainName != "" {
		return errors.New("domain_uuid/domain_name: must be empty on a gap marker")
	}
	switch {
	case e.GapFirstSeq == 0:
		return errors.New("gap_first_seq: must be >= 1 on a gap marker")
	case e.GapLastSeq < e.GapFirstSeq:
		return fmt.Errorf("gap_last_seq: %d is below gap_first_seq %d", e.GapLastSeq, e.GapFirstSeq)
	case e.GapLastSeq >= e.Seq:
		return fmt.Errorf("gap_last_seq: %d is not below the marker's seq %d", e.GapLastSeq, e.Seq)
	case e.GapCount != e.GapLastSeq-e.GapFirstSeq+1:
		return fmt.Errorf("gap_count: %d does not match gap_first_seq..gap_last_seq (%d..%d)", e.GapCount, e.GapFirstSeq, e.GapLastSeq)
	}
	return nil
}

func checkTime(field string, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("%s: missing", field)
	}
	if t.Before(minTime) || t.After(maxTime) {
		return fmt.Errorf("%s: %s is outside 1970..9999", field, t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// ValidUUID reports whether s is a UUID in canonical lower-case form
// (8-4-4-4-12 hex digits), as libvirt and Nova print them.
func ValidUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// Encode validates e and returns its JSON encoding.
func (e *LifecycleEvent) Encode() ([]byte, error) { return encode("lifecycle event", e) }

// encode validates m and returns its JSON encoding, at most MaxMessageSize
// bytes; what names the message kind in errors.
func encode(what string, m interface{ Validate() error }) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", what, err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", what, err)
	}
	if len(b) > MaxMessageSize {
		return nil, fmt.Errorf("encode %s: %d bytes exceeds %d", what, len(b), MaxMessageSize)
	}
	return b, nil
}

// DecodeLifecycle decodes and validates one JSON lifecycle message. Unknown
// fields are ignored (see the package doc); trailing data after the object,
// messages over MaxMessageSize and anything Validate rejects are errors.
// Times are returned in UTC.
func DecodeLifecycle(data []byte) (LifecycleEvent, error) {
	var e LifecycleEvent
	if len(data) > MaxMessageSize {
		return e, fmt.Errorf("decode lifecycle event: %d bytes exceeds %d", len(data), MaxMessageSize)
	}
	// Times are decoded separately so that a malformed one is reported
	// with its field name (encoding/json's time errors do not name it).
	type plain LifecycleEvent
	w := struct {
		*plain
		OccurredAt json.RawMessage `json:"occurred_at"`
		ObservedAt json.RawMessage `json:"observed_at"`
	}{plain: (*plain)(&e)}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&w); err != nil {
		return LifecycleEvent{}, fmt.Errorf("decode lifecycle event: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return LifecycleEvent{}, errors.New("decode lifecycle event: trailing data after the JSON object")
	}
	var err error
	if e.OccurredAt, err = decodeTime("occurred_at", w.OccurredAt); err != nil {
		return LifecycleEvent{}, err
	}
	if e.ObservedAt, err = decodeTime("observed_at", w.ObservedAt); err != nil {
		return LifecycleEvent{}, err
	}
	if err := e.Validate(); err != nil {
		return LifecycleEvent{}, fmt.Errorf("decode lifecycle event: %w", err)
	}
	return e, nil
}

// decodeTime decodes an RFC 3339 JSON string (absent or null = zero time)
// and returns it in UTC.
func decodeTime(field string, raw json.RawMessage) (time.Time, error) {
	var t time.Time
	if len(raw) == 0 {
		return t, nil
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return time.Time{}, fmt.Errorf("decode lifecycle event: %s: %w", field, err)
	}
	return t.UTC(), nil
}

// quote quotes v for an error message, eliding the middle of long values.
func quote(v string) string {
	if len(v) > maxShortValue {
		return fmt.Sprintf("%q... (%d bytes)", v[:maxShortValue], len(v))
	}
	return fmt.Sprintf("%q", v)
}
