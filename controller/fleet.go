package controller

import (
	"fmt"
	"sort"
	"time"

	"hvguard/proto"
)

// The fleet view: per host, what the controller knows of its domains from
// the agents' event stream, and whether that knowledge is complete. Pure:
// the consumer (a JetStream shell) decodes each message into a FleetEvent
// and applies it with the time it was received; nothing here does I/O.
//
// Sequence rules (proto/doc.go's consumer rules, per host):
//   - A message of another incarnation than the current one that stands
//     earlier in the stream than the current incarnation's first message
//     (a redelivery) is old: dropped. Incarnations are random, so only
//     the stream's own sequence orders them.
//   - A message of another incarnation that stands later in the stream:
//     a new incarnation (the agent lost its state directory). The host's
//     domains are forgotten and its view is stale until the agent's next
//     full report; the new incarnation's seq starts over.
//   - seq ≤ last: a duplicate (JetStream redelivery, a re-send): dropped.
//   - seq > last+1: events are missing: applied, and the view is stale.
//   - A gap marker (the agent's outbox overflowed): stale.
//   - A host's view is stale from its first event until its first full
//     report.
//   - A full report (transition "inventory": every domain the agent sees
//     and its state, at that seq) replaces the host's domains and ends
//     staleness; later events apply on top.
//
// Stale means "a domain's state here may be wrong": a consumer that acts
// on single events (a classified stop) still may; one that acts on the
// whole view (a host with no running domain) must not while it is stale.

// FleetEvent is one message of the stream, decoded.
type FleetEvent struct {
	// StreamSeq is the message's sequence in the JetStream stream (its
	// metadata; kept by redeliveries).
	StreamSeq   uint64
	Host        string
	Incarnation uint64
	Seq         uint64
	Transition  string // proto.Transition values, and "inventory"
	Reason      string
	State       string
	DomainUUID  string
	DomainName  string
	// Classification, ClassificationReason: only on classified stops.
	Classification, ClassificationReason string
	LibvirtEvent, LibvirtDetail          string
	ObservedAt                           time.Time
	// GapCount: on a gap marker, the number of events dropped.
	GapCount uint64
	// Inventory: on a full report, the domains of this part;
	// InventoryPart/InventoryParts: which part (0/0 = the whole report in
	// one message).
	Inventory                     []DomainState
	InventoryPart, InventoryParts int
}

// FleetEventOf converts a decoded lifecycle message, stored at streamSeq
// in the stream, into the view's input. A full report split into parts
// (proto.TransitionInventory) is given part by part: see Fleet.Apply.
func FleetEventOf(streamSeq uint64, e proto.LifecycleEvent) FleetEvent {
	fe := FleetEvent{StreamSeq: streamSeq, Host: e.Host, Incarnation: uint64(e.Incarnation), Seq: e.Seq,
		Transition: string(e.Transition), Reason: e.Reason, State: e.State, DomainUUID: e.DomainUUID, DomainName: e.DomainName,
		Classification: string(e.Classification), ClassificationReason: e.ClassificationReason,
		LibvirtEvent: e.LibvirtEvent, LibvirtDetail: e.LibvirtDetail, ObservedAt: e.ObservedAt, GapCount: e.GapCount,
		InventoryPart: e.InventoryPart, InventoryParts: e.InventoryParts}
	if e.Transition == proto.TransitionInventory {
		fe.Inventory = make([]DomainState, len(e.Domains))
		for i, d := range e.Domains {
			fe.Inventory[i] = DomainState{UUID: d.UUID, Name: d.Name, State: d.State}
		}
	}
	return fe
}

// DomainState is one domain in a full report.
type DomainState struct {
	UUID, Name, State string
}

// Transitions the view treats specially.
const (
	fleetGap       = "gap"
	fleetUndefined = "undefined"
	// FleetInventory is the transition of a full report.
	FleetInventory = "inventory"
)

// Verdict says what Apply did with an event.
type Verdict int

// Verdicts.
const (
	// Applied: in sequence.
	Applied Verdict = iota
	// Duplicate: seq not above the last applied one; dropped.
	Duplicate
	// OldIncarnation: from an incarnation older than the current one;
	// dropped.
	OldIncarnation
	// AppliedAfterMissing: applied, but events before it are missing.
	AppliedAfterMissing
	// AppliedNewIncarnation: the first event of a new incarnation.
	AppliedNewIncarnation
)

var verdictNames = [...]string{"applied", "duplicate", "old-incarnation", "applied-after-missing", "applied-new-incarnation"}

// MarshalText encodes a verdict by name (status JSON).
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText decodes a verdict's name.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if n == string(b) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("unknown verdict %q", b)
}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// DomainView is the controller's knowledge of one domain.
type DomainView struct {
	UUID, Name                           string
	State                                string // the state when last reported
	Transition, Reason                   string
	Classification, ClassificationReason string
	Seq                                  uint64
	ObservedAt                           time.Time
}

// HostEvent is one entry of a host's recent history.
type HostEvent struct {
	Seq                      uint64
	Incarnation              uint64
	Domain, Transition, Note string
	ObservedAt, ReceivedAt   time.Time
	Verdict                  Verdict
}

// HostView is the controller's knowledge of one host's domains.
type HostView struct {
	Host        string
	Incarnation uint64
	LastSeq     uint64
	// Stale: the domains below may be incomplete or wrong (StaleReason,
	// since StaleSince) until the next full report.
	Stale       bool
	StaleReason string
	StaleSince  time.Time
	LastEvent   time.Time // when the last event was received
	Domains     map[string]*DomainView
	History     []HostEvent // most recent last, at most FleetHistory
	incStart    uint64      // stream seq of the current incarnation's first message
	// A full report being collected: its parts so far (consecutive seqs).
	inv      []DomainState
	invParts int    // 0: none being collected
	invNext  int    // the part expected next
	invSeq   uint64 // seq of the last part collected
}

// FleetHistory is how many recent events `status HOST` shows per host.
const FleetHistory = 50

// Fleet is the view of every host.
type Fleet struct {
	hosts map[string]*HostView
}

// NewFleet returns an empty view.
func NewFleet() *Fleet { return &Fleet{hosts: map[string]*HostView{}} }

// Host returns host's view (nil if none).
func (f *Fleet) Host(host string) *HostView { return f.hosts[host] }

// Hosts returns the hosts with a view, sorted.
func (f *Fleet) Hosts() []string {
	out := make([]string, 0, len(f.hosts))
	for h := range f.hosts {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// StaleHosts returns the number of hosts whose view is stale.
func (f *Fleet) StaleHosts() int {
	n := 0
	for _, h := range f.hosts {
		if h.Stale {
			n++
		}
	}
	return n
}

func (h *HostView) stale(now time.Time, reason string) {
	if !h.Stale {
		h.StaleSince = now
	}
	h.Stale, h.StaleReason = true, reason
}

// Apply applies e, received at now, and says what it did.
func (f *Fleet) Apply(now time.Time, e FleetEvent) Verdict {
	h := f.hosts[e.Host]
	v := Applied
	switch {
	case h == nil:
		// Until its first full report, a host's view is incomplete: the
		// consumer may have started after the agent, and the agent reports
		// only changes between its reports.
		h = &HostView{Host: e.Host, Incarnation: e.Incarnation, Domains: map[string]*DomainView{}, incStart: e.StreamSeq}
		f.hosts[e.Host] = h
		h.stale(now, "no full report seen yet")
	case e.Incarnation != h.Incarnation:
		if e.StreamSeq <= h.incStart {
			f.record(h, now, e, OldIncarnation, "")
			return OldIncarnation
		}
		h.Incarnation, h.incStart = e.Incarnation, e.StreamSeq
		h.inv, h.invParts = h.inv[:0], 0
		h.Domains = map[string]*DomainView{}
		h.stale(now, fmt.Sprintf("new incarnation %d (the agent's state directory was recreated)", e.Incarnation))
		v = AppliedNewIncarnation
	case e.Seq <= h.LastSeq:
		f.record(h, now, e, Duplicate, "")
		return Duplicate
	case e.Seq > h.LastSeq+1:
		h.stale(now, fmt.Sprintf("seq %d..%d missing", h.LastSeq+1, e.Seq-1))
		v = AppliedAfterMissing
	}
	h.LastSeq, h.LastEvent = e.Seq, now
	note := ""
	switch e.Transition {
	case FleetInventory:
		parts, part := max(e.InventoryParts, 1), max(e.InventoryPart, 1)
		switch {
		case part == 1:
			h.inv, h.invParts, h.invNext, h.invSeq = append(h.inv[:0], e.Inventory...), parts, 2, e.Seq
		case h.invParts == parts && part == h.invNext && e.Seq == h.invSeq+1 && v == Applied:
			h.inv, h.invNext, h.invSeq = append(h.inv, e.Inventory...), h.invNext+1, e.Seq
		default:
			// A part out of sequence: this report is incomplete.
			h.inv, h.invParts = h.inv[:0], 0
			note = fmt.Sprintf("full report part %d/%d out of sequence: ignored", part, parts)
		}
		if h.invParts == 0 || h.invNext <= h.invParts {
			break // wait for the other parts
		}
		h.Domains = make(map[string]*DomainView, len(h.inv))
		for _, d := range h.inv {
			h.Domains[d.UUID] = &DomainView{UUID: d.UUID, Name: d.Name, State: d.State, Transition: FleetInventory,
				Reason: e.Reason, Seq: e.Seq, ObservedAt: e.ObservedAt}
		}
		h.inv, h.invParts = h.inv[:0], 0
		if h.Stale {
			note = "full report: no longer stale (was: " + h.StaleReason + ")"
		}
		h.Stale, h.StaleReason, h.StaleSince = false, "", time.Time{}
	case fleetGap:
		h.inv, h.invParts = h.inv[:0], 0
		h.stale(now, fmt.Sprintf("gap marker: the agent dropped %d events", e.GapCount))
	case fleetUndefined:
		delete(h.Domains, e.DomainUUID)
	default:
		if e.DomainUUID != "" {
			h.Domains[e.DomainUUID] = &DomainView{UUID: e.DomainUUID, Name: e.DomainName, State: e.State,
				Transition: e.Transition, Reason: e.Reason, Classification: e.Classification,
				ClassificationReason: e.ClassificationReason, Seq: e.Seq, ObservedAt: e.ObservedAt}
		}
	}
	if note == "" && h.Stale && v != Applied {
		note = h.StaleReason
	}
	f.record(h, now, e, v, note)
	return v
}

func (f *Fleet) record(h *HostView, now time.Time, e FleetEvent, v Verdict, note string) {
	if note == "" {
		note = e.Reason
	}
	h.History = append(h.History, HostEvent{Seq: e.Seq, Incarnation: e.Incarnation, Domain: e.DomainName,
		Transition: e.Transition, Note: note, ObservedAt: e.ObservedAt, ReceivedAt: now, Verdict: v})
	if len(h.History) > FleetHistory {
		h.History = h.History[len(h.History)-FleetHistory:]
	}
}
