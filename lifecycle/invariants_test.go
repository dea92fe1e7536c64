package lifecycle

import (
	"fmt"
	"time"
)

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
	pending, held := 0, 0
	for u, dom := range d.doms {
		if u != dom.uuid {
			return fmt.Errorf("map key %s holds %s", u, dom.uuid)
		}
		if dom.pending && dom.rbEvents > 0 {
			return fmt.Errorf("%s: a pending stop and a held REBOOT burst (%d events)", u, dom.rbEvents)
		}
		if (dom.pending || dom.rbEvents > 0) != (dom.hidx >= 0) {
			return fmt.Errorf("%s: pending=%v rebootsHeld=%d hidx=%d", u, dom.pending, dom.rbEvents, dom.hidx)
		}
		if dom.rbEvents > 0 {
			held++
			if !dom.deadline.Equal(d.rebootDeadline(dom)) {
				return fmt.Errorf("%s: burst deadline %v, want %v", u, dom.deadline, d.rebootDeadline(dom))
			}
			if dom.deadline.Sub(dom.rbStart) > d.cfg.Window {
				return fmt.Errorf("%s: burst held past the window: first at %v, deadline %v", u, dom.rbStart, dom.deadline)
			}
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
	if pending+held != len(h) || pending != d.stops {
		return fmt.Errorf("pending %d + held %d != heap %d (stops %d)", pending, held, len(h), d.stops)
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

// rebootLedger checks the coalescing of REBOOT events (doc.go, invariant 8)
// from the outside: every REBOOT observed is counted in exactly one
// reboot-event report (the reports' RebootEvents add up to the REBOOTs),
// reported no later than the window after it was observed, and a domain
// that only resets gets at most one reboot-event report per window (a
// held burst is reported early, before the domain's next report or stop,
// so another event or a resync in between lifts that limit).
type rebootLedger struct {
	window time.Duration
	// onTime: the driver calls Tick at every deadline (the simulation), so
	// a report's time is when it was due. The fuzz test ticks at random
	// times; checkInvariants bounds its held bursts' deadlines instead.
	onTime     bool
	unreported map[string][]time.Time // when each REBOOT not yet counted was observed
	last       map[string]time.Time   // last reboot-event report, if only REBOOTs came since
}

func newRebootLedger(window time.Duration, onTime bool) *rebootLedger {
	return &rebootLedger{window: window, onTime: onTime, unreported: map[string][]time.Time{}, last: map[string]time.Time{}}
}

// observed records an event passed to Observe at now.
func (l *rebootLedger) observed(ev Event, now time.Time) {
	if ev.Kind == KindReboot && ev.UUID != "" {
		l.unreported[ev.UUID] = append(l.unreported[ev.UUID], now)
	} else {
		delete(l.last, ev.UUID)
	}
}

// resynced records a Resync.
func (l *rebootLedger) resynced() { clear(l.last) }

// apply checks one decision returned at now.
func (l *rebootLedger) apply(dc Decision, now time.Time) error {
	if dc.Op != OpReport || dc.Reason != ReasonRebootEvent {
		if dc.RebootEvents != 0 {
			return fmt.Errorf("%s: RebootEvents %d on %v", dc.UUID, dc.RebootEvents, dc)
		}
		if dc.Op == OpReport { // another transition (undefined: forgotten) lifts the limit
			delete(l.last, dc.UUID)
		}
		return nil
	}
	q := l.unreported[dc.UUID]
	switch {
	case dc.Transition != TransitionRebooted:
		return fmt.Errorf("%s: reboot-event on %v", dc.UUID, dc)
	case dc.RebootEvents < 1 || dc.RebootEvents > len(q):
		return fmt.Errorf("%s: %v counts %d REBOOTs, %d unreported were observed", dc.UUID, dc, dc.RebootEvents, len(q))
	case l.onTime && now.Sub(q[0]) > l.window:
		return fmt.Errorf("%s: a REBOOT observed at %v reported at %v, later than the window %v", dc.UUID, q[0], now, l.window)
	}
	if last, ok := l.last[dc.UUID]; ok && l.window > 0 && now.Sub(last) < l.window {
		return fmt.Errorf("%s: two reboot-event reports %v apart, within the window %v", dc.UUID, now.Sub(last), l.window)
	}
	l.last[dc.UUID] = now
	l.unreported[dc.UUID] = q[dc.RebootEvents:]
	return nil
}

// settled reports REBOOTs never reported.
func (l *rebootLedger) settled() error {
	for u, q := range l.unreported {
		if len(q) > 0 {
			return fmt.Errorf("%s: %d REBOOT events never reported (first observed at %v)", u, len(q), q[0])
		}
	}
	return nil
}
