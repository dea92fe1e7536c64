package controller

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Lost beacons (issue 11, docs/security.md "Signed leases", the hidden
// withdrawal). A host whose beacons bind it (invalid.go) is known
// withdrawn by its withdrawal record or, if a compromised node overwrote
// that record before the watch delivered it (a watch skip), by its
// withdrawal beacon alone (ObserveWithdrawal). Beacons travel on core
// NATS: one the runner's subscription dropped (slow consumer, its queue
// full) or that was published while its connection was down is gone, and
// the withdrawn host looked like a host that stopped renewing with
// garbage in its key — declared lease_ttl + grace later while its guests
// ran, unfenced (S).
//
// So the runner tells the tracker when beacons may have been lost
// (BeaconsLost: a window of its clock), and the tracker keeps, per host
// its beacons have bound (hasBeaconed: even after BeaconTrustWindow
// lapsed — an outage longer than it delivers the watch's backlog before
// any beacon; reviewer X26, TestX26OutageLongerThanTrustWindow), the write the watch may have hidden: an untrusted value or a
// delete marker delivered after a skip, not named by the host's beacon
// (hiddenWrite: when the host's previous value and that one were
// stored). A host whose hidden write falls in a loss window (within
// BeaconLossSlack) is not declared (OpRefusedDue, loud) until a trusted
// record of it or its beacon naming that revision or a later one
// arrives. The price is (c): a compromised node that makes the runner
// lose beacons (flooding its own beacon subject) and makes the watch skip
// (a burst of writes) keeps a dead host whose key it overwrites
// undeclared — loudly: invalid-record for every value, refused-due.

// BeaconLossSlack widens a loss window on both sides: the NATS server's
// stored times (server clock) are compared with the runner's clock, and a
// beacon leaves its agent right after the write it names returned (the
// agent flushes a withdrawal's beacon for at most 1 s). 30 s: far above
// the clock offsets NTP keeps, and a wider window only makes a hidden
// write refused-due more often (the safe side).
const BeaconLossSlack = 30 * time.Second

// maxLossWindows bounds the loss windows kept: windows within
// BeaconLossSlack of each other are merged (a long outage is one), and
// at the bound the two oldest merge — none is dropped (reviewer X26,
// TestX26EvictedLossWindow: 64 later windows evicted the one that covered
// a write hidden while the watch was down). A merged window covers more
// than was lost: only the (c) side grows.
const maxLossWindows = 64

// beaconLossMutation: the tracker ignores lost beacons (the hole, as
// before). Tests only.
var beaconLossMutation bool

// lossWindow: beacons may have been lost between from and to (the
// runner's clock).
type lossWindow struct{ from, to time.Time }

// hiddenWrite: a write of the host's key the watch may have hidden: rev is
// the newest value delivered after a skip (untrusted or a marker, not
// named by the host's beacon); the hidden writes were stored after `after`
// (its previous value's stored time, Unix ns; 0: unknown, any time) and
// no later than `before` (rev's stored time; 0: unknown).
type hiddenWrite struct {
	rev           uint64
	after, before int64
}

// noteHidden records that h's value at rev (stored at before, its
// previous one at after; 0: unknown) came after a watch skip and no
// beacon of h named it; h is refused-due at once if a known loss window
// covers it.
func (t *Tracker) noteHidden(h *hostState, rev uint64, after, before int64) {
	if beaconLossMutation {
		return
	}
	hw := &h.hidden
	if hw.rev == 0 {
		*hw = hiddenWrite{rev: rev, after: after, before: before}
	} else {
		// Merged: the earliest start, the latest end.
		hw.rev = max(hw.rev, rev)
		if after == 0 || after < hw.after {
			hw.after = after
		}
		if before == 0 || hw.before == 0 {
			hw.before = 0
		} else {
			hw.before = max(hw.before, before)
		}
	}
	for _, w := range t.lossWindows {
		if covers(w, *hw) {
			h.lostBeacon = hw.rev
			return
		}
	}
}

// covers reports whether a beacon lost in w may have named a write hidden
// as hw.
func covers(w lossWindow, hw hiddenWrite) bool {
	slack := BeaconLossSlack.Nanoseconds()
	if hw.after != 0 && w.to.UnixNano()+slack < hw.after {
		return false // lost before the hidden write was made
	}
	return hw.before == 0 || w.from.UnixNano()-slack <= hw.before+slack
}

// clearHidden ends h's hidden write once its host wrote at rev or later
// (a trusted record, or its beacon naming that revision): it was alive
// after it, so the hidden write was not its last.
func (h *hostState) clearHidden(rev uint64) {
	if h.hidden.rev != 0 && rev >= h.hidden.rev {
		h.hidden, h.lostBeacon = hiddenWrite{}, 0
	}
}

// BeaconsLost tells the tracker that beacons received by the runner may
// have been lost between from and to (its clock): dropped by its
// subscription, published while its connection was down, or refused by a
// full beacon queue. It returns the hosts whose hidden write that window
// covers (not declared from now on; Tick says refused-due when they are
// due).
func (t *Tracker) BeaconsLost(from, to time.Time) []string {
	if beaconLossMutation {
		return nil
	}
	w := lossWindow{from: from, to: to}
	if n := len(t.lossWindows); n > 0 && !from.After(t.lossWindows[n-1].to.Add(BeaconLossSlack)) {
		// Contiguous with the last one (a connection down for many
		// ticks): one window, so a long outage is never evicted piecemeal.
		last := &t.lossWindows[n-1]
		if from.Before(last.from) {
			last.from = from
		}
		if to.After(last.to) {
			last.to = to
		}
		w = *last
	} else {
		if n == maxLossWindows {
			t.lossWindows[1].from = t.lossWindows[0].from // the two oldest merged, never dropped
			t.lossWindows = t.lossWindows[1:]
		}
		t.lossWindows = append(t.lossWindows, w)
	}
	var refused []string
	for _, name := range t.Hosts() {
		h := t.hosts[name]
		if h.hidden.rev == 0 || h.lostBeacon != 0 || !covers(w, h.hidden) {
			continue
		}
		h.lostBeacon = h.hidden.rev
		refused = append(refused, name)
	}
	return refused
}

// beaconLosses is the runner's side: it compares, at each tick, what may
// have lost beacons since the last one.
type beaconLosses struct {
	nc  *nats.Conn
	sub *nats.Subscription
	box *beaconBox
	// last: the last tick; dropped, reconnects, full: the counters then.
	last       time.Time
	dropped    int
	reconnects uint64
	full       uint64
}

// check returns, if beacons may have been lost since the last check, the
// window's start and why ("" otherwise). Nothing without a subscription.
func (l *beaconLosses) check(now time.Time) (time.Time, string) {
	if l.sub == nil {
		return time.Time{}, ""
	}
	var why []string
	if d, err := l.sub.Dropped(); err == nil && d > l.dropped {
		why = append(why, fmt.Sprintf("%d dropped by the subscription (slow consumer)", d-l.dropped))
		l.dropped = d
	} else if err != nil {
		why = append(why, "subscription: "+err.Error())
	}
	if rc := l.nc.Stats().Reconnects; rc != l.reconnects {
		why = append(why, "the beacon connection reconnected")
		l.reconnects = rc
	}
	if !l.nc.IsConnected() {
		why = append(why, "the beacon connection is down")
	}
	l.box.mu.Lock()
	full := l.box.lost
	l.box.mu.Unlock()
	if full != l.full {
		why = append(why, fmt.Sprintf("%d refused by the full beacon queue", full-l.full))
		l.full = full
	}
	from := l.last
	l.last = now
	return from, strings.Join(why, "; ")
}

// hasBeaconed reports whether h's beacons have bound it at some time
// (beaconsBind without the fleet-wide BeaconTrustWindow): a hidden write
// of such a host is kept even when no beacon arrived for longer than the
// window (an outage of the controller's connection).
func (t *Tracker) hasBeaconed(h *hostState) bool {
	return t.pinned(h) && (!h.beacons.at.IsZero() || h.beacons.remembered)
}

// afterSkip notes h's untrusted value or marker at rev (not yet applied:
// h.rev is the previous one) as a hidden write if the watch skipped a
// revision since h's last one, its beacons have bound it and none names
// rev.
func (t *Tracker) afterSkip(host string, h *hostState, rev uint64) {
	if t.skippedRev > h.rev && t.hasBeaconed(h) && !h.beacons.revs.has(rev) {
		prev, stored := t.storedAround(host, rev)
		t.noteHidden(h, rev, prev, stored)
	}
}
