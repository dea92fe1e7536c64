package lifecycle

import "fmt"

// checkInvariants verifies the internal invariants stated in doc.go.
func (d *Debouncer) checkInvariants() error {
	h := d.timers.items
	if len(h) > len(d.doms) {
		return fmt.Errorf("heap %d > domains %d", len(h), len(d.doms))
	}
	for i, dom := range h {
		if dom.hidx != i {
			return fmt.Errorf("heap[%d] %s has hidx %d", i, dom.uuid, dom.hidx)
		}
		if i > 0 && d.timers.less(i, (i-1)/2) {
			return fmt.Errorf("heap order broken at %d", i)
		}
		if d.doms[dom.uuid] != dom {
			return fmt.Errorf("heap holds forgotten domain %s", dom.uuid)
		}
	}
	pending := 0
	for u, dom := range d.doms {
		if u != dom.uuid {
			return fmt.Errorf("map key %s holds %s", u, dom.uuid)
		}
		if dom.pending != (dom.hidx >= 0) {
			return fmt.Errorf("%s: pending=%v hidx=%d", u, dom.pending, dom.hidx)
		}
		if dom.pending {
			pending++
			if dom.checks > d.cfg.MaxChecks {
				return fmt.Errorf("%s: %d checks > MaxChecks", u, dom.checks)
			}
		} else if dom.check != 0 || dom.checks != 0 || dom.deferred {
			return fmt.Errorf("%s: not pending but check=%d checks=%d deferred=%v", u, dom.check, dom.checks, dom.deferred)
		}
		if dom.check > d.nextCheck {
			return fmt.Errorf("%s: token %d from the future", u, dom.check)
		}
	}
	if pending != len(h) {
		return fmt.Errorf("pending %d != heap %d", pending, len(h))
	}
	return nil
}

// belief tracks, per domain, what the reports said; it detects a stop
// reported twice and reports out of event order.
type belief struct {
	off map[string]bool // last report left the domain off
	// stop: a stop was reported since the domain was last reported alive
	// (or learnt). A defined report with an off state (a resync learning
	// a domain) is not a stop: the stop that took the domain off may still
	// be reported, once (doc.go, "learnt off").
	stop    map[string]bool
	lastAt  map[string]int64
	stopped map[string]int // stopped reports
}

func newBelief() *belief {
	return &belief{off: map[string]bool{}, stop: map[string]bool{}, lastAt: map[string]int64{}, stopped: map[string]int{}}
}

// apply folds one decision in; it returns an error for a stop reported
// while already reported off, or a report whose cause precedes the
// previous report's cause.
func (b *belief) apply(dc Decision) error {
	if dc.Op != OpReport {
		return nil
	}
	at := dc.Cause.At.UnixNano()
	if last, ok := b.lastAt[dc.UUID]; ok && at < last {
		return fmt.Errorf("%s: %v reported after a report caused at %d (cause at %d)", dc.UUID, dc, last, at)
	}
	b.lastAt[dc.UUID] = at
	switch dc.Transition {
	case TransitionStopped:
		if b.stop[dc.UUID] {
			return fmt.Errorf("%s: stop reported twice: %v", dc.UUID, dc)
		}
		b.off[dc.UUID], b.stop[dc.UUID] = true, true
		b.stopped[dc.UUID]++
	case TransitionUndefined:
		delete(b.off, dc.UUID)
		delete(b.stop, dc.UUID)
	case TransitionDefined:
		if dc.State.Off() {
			b.off[dc.UUID] = true
		} else if dc.State.Alive() {
			b.off[dc.UUID], b.stop[dc.UUID] = false, false
		}
	default: // started, rebooted, resumed, suspended, pmsuspended
		b.off[dc.UUID], b.stop[dc.UUID] = false, false
	}
	return nil
}
