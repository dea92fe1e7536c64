package proto

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// TransitionInventory marks a full report: every domain the agent knows and
// the state consumers last heard for it (a domain whose stop is still held
// in the window is "running"), as of the message's seq. A consumer replaces
// its view of the host with it (proto/doc.go's consumer rules): it is how a
// view that went stale (a new incarnation, missing seqs, a gap marker)
// becomes complete again. Agents send one after every full domain listing
// (start, libvirt reconnect, event overflow), after a gap marker, and every
// InventoryInterval.
//
// A full report may not fit one message (MaxMessageSize): it is sent as
// InventoryParts messages with consecutive seqs, parts 1..InventoryParts,
// each with at most InventoryChunk domains. A consumer applies it when it
// has every part in sequence; a report with a part missing is ignored (the
// view stays stale until the next one).
//
// Added within schema 1 (issue 12): a consumer built before it rejects the
// unknown transition as undecodable (the demo's printer was the only one).
const TransitionInventory Transition = "inventory"

// InventoryChunk is the most domains one inventory message carries: 256
// domains of ~100 bytes stay well below MaxMessageSize (64 KiB).
const InventoryChunk = 256

// InventoryDomain is one domain of a full report.
type InventoryDomain struct {
	UUID  string `json:"uuid"`
	Name  string `json:"name,omitempty"`
	State string `json:"state"`
}

// validateInventory checks an inventory message's own fields.
func (e *LifecycleEvent) validateInventory() error {
	if e.DomainUUID != "" || e.DomainName != "" {
		return errors.New("domain_uuid/domain_name: must be empty on an inventory message (the domains are in \"domains\")")
	}
	if e.GapFirstSeq != 0 || e.GapLastSeq != 0 || e.GapCount != 0 {
		return errors.New("gap_first_seq/gap_last_seq/gap_count: set on an inventory message")
	}
	switch {
	case e.InventoryParts < 1:
		return fmt.Errorf("inventory_parts: %d, must be >= 1", e.InventoryParts)
	case e.InventoryPart < 1 || e.InventoryPart > e.InventoryParts:
		return fmt.Errorf("inventory_part: %d, must be in 1..inventory_parts (%d)", e.InventoryPart, e.InventoryParts)
	case uint64(e.InventoryPart) > e.Seq:
		return fmt.Errorf("inventory_part: %d is above the message's seq %d (parts have consecutive seqs)", e.InventoryPart, e.Seq)
	case len(e.Domains) > InventoryChunk:
		return fmt.Errorf("domains: %d, at most %d per message", len(e.Domains), InventoryChunk)
	}
	for i, d := range e.Domains {
		if !ValidUUID(d.UUID) {
			return fmt.Errorf("domains[%d].uuid: invalid UUID %s", i, quote(d.UUID))
		}
		if d.State == "" || len(d.State) > maxShortValue || !utf8.ValidString(d.State) || !utf8.ValidString(d.Name) {
			return fmt.Errorf("domains[%d].state: %s: must be 1..%d bytes of UTF-8", i, quote(d.State), maxShortValue)
		}
	}
	return nil
}

// InventoryMessages splits a full report of domains into its messages
// (seq, incarnation and times are set by the caller / the outbox).
func InventoryMessages(host, reason string, domains []InventoryDomain) []LifecycleEvent {
	parts := max(1, (len(domains)+InventoryChunk-1)/InventoryChunk)
	out := make([]LifecycleEvent, 0, parts)
	for p := range parts {
		chunk := domains[min(p*InventoryChunk, len(domains)):min((p+1)*InventoryChunk, len(domains))]
		if len(chunk) == 0 {
			chunk = nil // an empty host: "domains" omitted
		}
		out = append(out, LifecycleEvent{Schema: SchemaVersion, Host: host, Transition: TransitionInventory, Reason: reason,
			InventoryPart: p + 1, InventoryParts: parts, Domains: chunk})
	}
	return out
}
