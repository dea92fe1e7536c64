package proto

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
)

// Incarnation identifies one outbox of one host: a random 64-bit number
// drawn when the outbox is created, never zero; zero means "none" (events
// of agents, and of outboxes created by agents, from before incarnations).
// A host's sequence numbers are strictly increasing within an incarnation;
// a new one starts again at 1. In JSON it is a string of IncarnationLen
// lower-case hex digits, not a number: 64-bit integers do not survive JSON
// readers that use doubles (jq, JavaScript).
type Incarnation uint64

// IncarnationLen is the length of an incarnation's text form.
const IncarnationLen = 16

// NewIncarnation returns a random incarnation from crypto/rand. 64 random
// bits make two outboxes of one host sharing an incarnation (and so
// sequence numbers and Msg-Ids) a 2^-64 event per pair.
func NewIncarnation() (Incarnation, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("new incarnation: %w", err)
		}
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return Incarnation(v), nil
		}
	}
}

// String returns the IncarnationLen hex digits ("" for none).
func (i Incarnation) String() string {
	if i == 0 {
		return ""
	}
	return fmt.Sprintf("%016x", uint64(i))
}

// MarshalText encodes i as String does. The zero value is omitted from
// events (omitempty), so it is never written.
func (i Incarnation) MarshalText() ([]byte, error) { return []byte(i.String()), nil }

// UnmarshalText accepts exactly IncarnationLen lower-case hex digits, not
// all zero (the form MarshalText writes, so that a decoded event
// re-encodes to the same bytes); the error names the field.
func (i *Incarnation) UnmarshalText(b []byte) error {
	bad := len(b) != IncarnationLen
	for _, c := range b {
		bad = bad || !('0' <= c && c <= '9' || 'a' <= c && c <= 'f')
	}
	if bad {
		return fmt.Errorf("incarnation: %s is not %d lower-case hex digits", quote(string(b)), IncarnationLen)
	}
	v, err := strconv.ParseUint(string(b), 16, 64)
	if err != nil || v == 0 {
		return fmt.Errorf("incarnation: %q is zero", b)
	}
	*i = Incarnation(v)
	return nil
}
