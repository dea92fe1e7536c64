package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// fleetAgent models one agent: the truth of its domains, what it reported
// at each seq of each incarnation, and the messages it put on the stream.
type fleetAgent struct {
	host     string
	inc      uint64
	seq      uint64
	truth    map[string]string // uuid → state
	reported map[[2]uint64]map[string]string
	stream   []FleetEvent
	// afterInventory: the reports since the incarnation's last full report
	// were all emitted (none dropped by a gap).
}

func newFleetAgent(host string, inc uint64, doms int) *fleetAgent {
	a := &fleetAgent{host: host, inc: inc, truth: map[string]string{}, reported: map[[2]uint64]map[string]string{}}
	for i := range doms {
		a.truth[fmt.Sprintf("d%d", i)] = "running"
	}
	return a
}

func (a *fleetAgent) emit(e FleetEvent, drop bool) {
	a.seq++
	e.Host, e.Incarnation, e.Seq = a.host, a.inc, a.seq
	a.reported[[2]uint64{a.inc, a.seq}] = maps.Clone(a.truth)
	if !drop {
		e.StreamSeq = uint64(len(a.stream) + 1)
		a.stream = append(a.stream, e)
	}
}

// inventory emits a full report in parts of at most 2 domains.
func (a *fleetAgent) inventory() {
	var inv []DomainState
	for u, s := range a.truth {
		inv = append(inv, DomainState{UUID: u, Name: "n-" + u, State: s})
	}
	parts := max(1, (len(inv)+1)/2)
	for p := range parts {
		chunk := inv[min(2*p, len(inv)):min(2*p+2, len(inv))]
		a.emit(FleetEvent{Transition: FleetInventory, Reason: "start", Inventory: chunk, InventoryPart: p + 1, InventoryParts: parts}, false)
	}
}

// change applies one transition to the truth and reports it (or drops it:
// an outbox overflow).
func (a *fleetAgent) change(t *rapid.T, drop bool) {
	u := rapid.SampledFrom([]string{"d0", "d1", "d2", "d3"}).Draw(t, "dom")
	tr := rapid.SampledFrom([]string{"started", "stopped", "suspended", "undefined"}).Draw(t, "tr")
	state := map[string]string{"started": "running", "stopped": "shutoff", "suspended": "paused"}[tr]
	if tr == "undefined" {
		delete(a.truth, u)
	} else {
		a.truth[u] = state
	}
	a.emit(FleetEvent{Transition: tr, DomainUUID: u, DomainName: "n-" + u, State: state, Reason: "event"}, drop)
}

func viewStates(h *HostView) map[string]string {
	out := map[string]string{}
	for u, d := range h.Domains {
		out[u] = d.State
	}
	return out
}

// TestFleetViewProperty: over random agent histories (changes, full
// reports, outbox overflows with gap markers, restarts with a lost state
// directory = new incarnation) delivered with redeliveries of earlier
// messages and swapped neighbours (JetStream redelivery, the agent's rare
// out-of-order re-send):
//   - whenever the view is not stale, it equals what the agent reported
//     at the last applied seq;
//   - a redelivered message (duplicate, or of an older incarnation) never
//     changes the view;
//   - after a final full report is delivered, the view is not stale and
//     equals the truth.
func TestFleetViewProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := newFleetAgent("node1", 1000, rapid.IntRange(0, 4).Draw(t, "domains"))
		nextInc := uint64(1001)
		if rapid.Bool().Draw(t, "starts_with_inventory") {
			a.inventory()
		}
		for range rapid.IntRange(0, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 9).Draw(t, "what") {
			case 0:
				a.inventory()
			case 1: // outbox overflow: some events dropped, then a gap marker
				n := rapid.IntRange(1, 4).Draw(t, "dropped")
				for range n {
					a.change(t, true)
				}
				a.emit(FleetEvent{Transition: fleetGap, GapCount: uint64(n)}, false)
			case 2: // state dir lost: new incarnation, seq starts over
				a.inc, a.seq = nextInc, 0
				nextInc++
				if rapid.Bool().Draw(t, "restart_inventory") {
					a.inventory()
				}
			default:
				a.change(t, false)
			}
		}
		// Delivery: redeliveries and swapped neighbours.
		var deliver []FleetEvent
		for i, e := range a.stream {
			deliver = append(deliver, e)
			if i > 0 && rapid.IntRange(0, 9).Draw(t, "redeliver") == 0 {
				deliver = append(deliver, a.stream[rapid.IntRange(0, i-1).Draw(t, "which")])
			}
		}
		for i := 0; i+1 < len(deliver); i++ {
			if rapid.IntRange(0, 19).Draw(t, "swap") == 0 {
				deliver[i], deliver[i+1] = deliver[i+1], deliver[i]
			}
		}
		f := NewFleet()
		now := time.Unix(0, 0)
		check := func(where string) {
			h := f.Host("node1")
			if h == nil || h.Stale {
				return
			}
			want := a.reported[[2]uint64{h.Incarnation, h.LastSeq}]
			if got := viewStates(h); !maps.Equal(got, want) {
				t.Fatalf("%s: view not stale but %v, agent reported %v at inc %d seq %d\nhistory %+v", where, got, want, h.Incarnation, h.LastSeq, h.History)
			}
		}
		seen := map[uint64]bool{}
		for i, e := range deliver {
			now = now.Add(time.Millisecond)
			before := f.Host("node1")
			var snap map[string]string
			var inc uint64
			if before != nil {
				snap, inc = viewStates(before), before.Incarnation
			}
			v := f.Apply(now, e)
			if seen[e.StreamSeq] && v != OldIncarnation && v != Duplicate {
				t.Fatalf("redelivered message %d (inc %d seq %d) was applied: %s", i, e.Incarnation, e.Seq, v)
			}
			seen[e.StreamSeq] = true
			if v == OldIncarnation || v == Duplicate {
				if h := f.Host("node1"); !maps.Equal(viewStates(h), snap) || h.Incarnation != inc {
					t.Fatalf("dropped message %d (%s) changed the view", i, v)
				}
			}
			check(fmt.Sprintf("after message %d (%s inc %d seq %d: %s)", i, e.Transition, e.Incarnation, e.Seq, v))
		}
		n := len(a.stream)
		a.inventory()
		for _, e := range a.stream[n:] {
			f.Apply(now.Add(time.Second), e)
		}
		h := f.Host("node1")
		if h.Stale || !maps.Equal(viewStates(h), a.truth) {
			t.Fatalf("after a final full report: stale=%v (%s) view %v truth %v", h.Stale, h.StaleReason, viewStates(h), a.truth)
		}
	})
}

func gapEv(e FleetEvent, n uint64) FleetEvent { e.GapCount = n; return e }

func redelivered(e FleetEvent, streamSeq uint64) FleetEvent { e.StreamSeq = streamSeq; return e }

// The stale reasons an operator reads.
func TestFleetStaleReasons(t *testing.T) {
	f := NewFleet()
	t0 := time.Unix(100, 0)
	ss := uint64(0)
	ev := func(inc, seq uint64, tr string) FleetEvent {
		ss++
		return FleetEvent{StreamSeq: ss, Host: "h", Incarnation: inc, Seq: seq, Transition: tr, DomainUUID: "u", State: "running"}
	}
	inv := func(inc, seq uint64) FleetEvent {
		e := ev(inc, seq, FleetInventory)
		e.DomainUUID = ""
		return e
	}
	steps := []struct {
		e       FleetEvent
		verdict Verdict
		stale   string
	}{
		{ev(7, 1, "started"), Applied, "no full report seen yet"},
		{inv(7, 2), Applied, ""},
		{ev(7, 2, "started"), Duplicate, ""},
		{ev(7, 5, "started"), AppliedAfterMissing, "seq 3..4 missing"},
		{inv(7, 6), Applied, ""},
		{gapEv(ev(7, 7, fleetGap), 3), Applied, "gap marker: the agent dropped 3 events"},
		{inv(7, 8), Applied, ""},
		{ev(9, 1, "started"), AppliedNewIncarnation, "new incarnation 9 (the agent's state directory was recreated)"},
		{redelivered(ev(7, 9, "stopped"), 3), OldIncarnation, "new incarnation 9 (the agent's state directory was recreated)"},
	}
	for i, s := range steps {
		v := f.Apply(t0, s.e)
		h := f.Host("h")
		if v != s.verdict || h.StaleReason != s.stale || h.Stale != (s.stale != "") {
			t.Fatalf("step %d: verdict %s stale %v %q, want %s %q", i, v, h.Stale, h.StaleReason, s.verdict, s.stale)
		}
	}
	if got := len(f.Host("h").History); got != len(steps) {
		t.Fatalf("history has %d entries, want %d", got, len(steps))
	}
}
