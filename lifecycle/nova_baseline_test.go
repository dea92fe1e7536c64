package lifecycle

import "time"

// novaDelay is the baseline hvguard is measured against: Nova's libvirt
// driver rule (nova/virt/libvirt/host.py _event_emit_delayed). A STOPPED
// event is held for a fixed delay (LIFECYCLE_DELAY, 15 s); any later event
// of the same domain cancels it; a new STOPPED re-arms it; if the delay
// expires the stop is emitted and Nova syncs the instance to "shutdown"
// (stopping a guest that had in fact come back). It never looks at the
// domain's real state. Test-only: it is not product code.
type novaDelay struct {
	delay   time.Duration
	gen     uint64
	pending map[string]uint64 // uuid -> generation of the armed timer
}

func newNovaDelay(delay time.Duration) *novaDelay {
	return &novaDelay{delay: delay, pending: map[string]uint64{}}
}

// observe feeds an event. For a STOPPED it returns the timer to arm:
// deadline and generation (armed true).
func (n *novaDelay) observe(ev Event, now time.Time) (deadline time.Time, gen uint64, armed bool) {
	delete(n.pending, ev.UUID) // any event cancels a delayed stop
	if ev.Kind != KindStopped {
		return time.Time{}, 0, false
	}
	n.gen++
	n.pending[ev.UUID] = n.gen
	return now.Add(n.delay), n.gen, true
}

// fire is called when the timer (uuid, gen) expires; it reports whether
// Nova emits the stop (the timer was not cancelled or re-armed).
func (n *novaDelay) fire(uuid string, gen uint64) bool {
	if g, ok := n.pending[uuid]; !ok || g != gen {
		return false
	}
	delete(n.pending, uuid)
	return true
}
