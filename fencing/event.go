package fencing

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
)

// Signed events (docs/security.md, "Signed events"; docs/events.md).
//
// An agent signs every event it publishes on its own subjects (lifecycle,
// reconcile) with its host key: the signature covers a domain string, the
// subject and the payload bytes exactly as published, and travels in two
// NATS headers (proto.EventSignerHeader, proto.EventSigHeader), so the
// payload — and the outbox that stores it — is unchanged. NATS
// permissions alone do not authenticate an event: a JetStream API request
// naming a host's lifecycle subject as its reply makes the server publish
// a stored value there, and the event stream stores it as that host's
// event (reviewer X13, the "reflection"). The subject binds the signature
// to the host (its token) and to the kind: a host's signed event stored
// again on another host's subject, or a reconcile event on a lifecycle
// subject, does not verify.

// ErrInvalidEvent wraps every reason an event is not trusted (EventError).
var ErrInvalidEvent = errors.New("invalid event")

// Reasons an event is refused (EventError.Reason; the label reason of
// hvguard_controller_events_refused_total).
const (
	// EventUnsigned: no signature (signing: required).
	EventUnsigned = "unsigned"
	// EventForeignKey: signed by a known key of another host — certainly
	// not this host's agent (a compromised node's own key).
	EventForeignKey = "foreign-key"
	// EventUnknownSigner: signed by a key this reader does not list for
	// the host (a key not provisioned here yet, or a forgery).
	EventUnknownSigner = "unknown-signer"
	// EventBadSignature: the host's key, but the signature does not match
	// the subject and payload (tampered, moved to another subject, or
	// garbage).
	EventBadSignature = "bad-signature"
)

// EventError is an event refused by VerifyEvent.
type EventError struct {
	Reason  string // one of the Event* reasons above
	Host    string // the host the subject names
	Subject string
	Signer  string // the signer the event names ("" when unsigned)
	// Of: the host whose key Signer is (EventForeignKey only).
	Of string
}

func (e *EventError) Error() string {
	switch e.Reason {
	case EventUnsigned:
		return fmt.Sprintf("%v: event on %s is not signed by %s's host key (signing: required)", ErrInvalidEvent, e.Subject, e.Host)
	case EventForeignKey:
		return fmt.Sprintf("%v: event on %s (host %s) is signed by %s's key %q", ErrInvalidEvent, e.Subject, e.Host, e.Of, e.Signer)
	case EventUnknownSigner:
		return fmt.Sprintf("%v: event on %s signed by %q, not one of %s's keys", ErrInvalidEvent, e.Subject, e.Signer, e.Host)
	}
	return fmt.Sprintf("%v: event on %s: bad signature by %s's key %q", ErrInvalidEvent, e.Subject, e.Host, e.Signer)
}

// Unwrap makes errors.Is(err, ErrInvalidEvent) hold.
func (e *EventError) Unwrap() error { return ErrInvalidEvent }

const eventDomain = "hvguard event v1\n"

// eventPayload is what an event's signature covers: the domain, the
// subject, a newline (no subject contains one) and the payload.
func eventPayload(subject string, data []byte) []byte {
	p := make([]byte, 0, len(eventDomain)+len(subject)+1+len(data))
	p = append(append(append(p, eventDomain...), subject...), '\n')
	return append(p, data...)
}

// SignEvent returns the signer ID and the signature (base64, no padding)
// of the event data published on subject; both "" for the zero Signer.
// ed25519 signatures are deterministic: a re-sent event carries the same
// signature.
func (s Signer) SignEvent(subject string, data []byte) (signer, sig string) {
	if s.Key == nil {
		return "", ""
	}
	return s.ID, base64.RawStdEncoding.EncodeToString(ed25519.Sign(s.Key, eventPayload(subject, data)))
}

// VerifyEvent checks the event data received on subject, a subject of
// host (the caller derives host from the subject's host token), carrying
// signer and sig (its headers). Off (or a nil Keyring): nothing is
// checked. Optional: an unsigned event is accepted, a signed one must
// verify (as records and beacons). Required: only an event signed by one
// of host's keys over exactly this subject and payload is accepted.
// Errors are *EventError.
func (k *Keyring) VerifyEvent(host, subject string, data []byte, signer, sig string) error {
	if !k.Enabled() {
		return nil
	}
	if sig == "" && signer == "" {
		if k.Required() {
			return &EventError{Reason: EventUnsigned, Host: host, Subject: subject}
		}
		return nil
	}
	key := find(k.Hosts[host], signer)
	if key == nil {
		for h, keys := range k.Hosts {
			if h != host && find(keys, signer) != nil {
				return &EventError{Reason: EventForeignKey, Host: host, Subject: subject, Signer: signer, Of: h}
			}
		}
		return &EventError{Reason: EventUnknownSigner, Host: host, Subject: subject, Signer: signer}
	}
	if !verifySig(key, eventPayload(subject, data), sig) {
		return &EventError{Reason: EventBadSignature, Host: host, Subject: subject, Signer: signer}
	}
	return nil
}
