package lifecycle

import (
	"errors"
	"slices"
	"strings"
)

// Known returns what the Debouncer believes it has reported about each
// tracked domain, sorted by UUID: the state of its last report (a stop that
// is still pending has not been reported, so such a domain is still believed
// alive). Domains never placed (first seen through an inconclusive event)
// are left out.
//
// The agent persists Known and Seeds a new Debouncer with it after a
// restart, so that the first Resync reports what changed while the agent was
// not running (a domain that stopped meanwhile goes through the usual stop
// window and check) instead of re-announcing every domain.
func (d *Debouncer) Known() []DomainSnapshot {
	out := make([]DomainSnapshot, 0, len(d.doms))
	for _, dom := range d.doms {
		if dom.phase == phaseUnknown {
			continue
		}
		out = append(out, DomainSnapshot{UUID: dom.uuid, Name: dom.name, State: dom.phase.state()})
	}
	slices.SortFunc(out, func(a, b DomainSnapshot) int { return strings.Compare(a.UUID, b.UUID) })
	return out
}

// ErrNotEmpty is returned by Seed on a Debouncer that already tracks domains.
var ErrNotEmpty = errors.New("lifecycle: Seed on a debouncer that already tracks domains")

// Seed sets the Debouncer's beliefs from a previous Known without reporting
// anything. It is only valid before any other call. Rows with an empty UUID
// or a state that does not place a domain (unknown, nostate, shutdown) are
// skipped. A domain seeded off is learnt off (see AppendResync): the stop
// reported before the restart was an earlier one, so a STOPPED delivered in
// this run is reported.
func (d *Debouncer) Seed(known []DomainSnapshot) error {
	if len(d.doms) > 0 {
		return ErrNotEmpty
	}
	for _, s := range known {
		p, ok := phaseOf(s.State)
		if s.UUID == "" || !ok {
			continue
		}
		// Believed off from the file: a STOPPED delivered now is a later
		// stop than the one reported before the restart (learnedOff).
		d.doms[s.UUID] = &domain{uuid: s.UUID, name: s.Name, phase: p, hidx: -1, learnedOff: p == phaseOff}
	}
	return nil
}

// Tracks reports whether the Debouncer currently tracks the domain.
func (d *Debouncer) Tracks(uuid string) bool {
	_, ok := d.doms[uuid]
	return ok
}
