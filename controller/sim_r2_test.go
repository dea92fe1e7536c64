package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// TestSimDomainStartedAfterFencedStop (reviewer R2): h00 is cut off from
// NATS and its peers and stopped (systemctl stop): the withdrawal cannot
// land, so it fences before leaving (StopFenced). The agent stays stopped.
// Nine seconds later an operator (or Nova, which does not go through
// NATS) starts a domain on the host: nothing fences it, and the controller
// declares the host when its lease lapses. The fix: a fenced stop leaves
// the watchdog armed (only a confirmed withdrawal magic-closes it), so the
// host resets watchdog_timeout after the process left — before the
// declaration. With the old magic close (mutation fenced-stop-magic-closes)
// the host is declared while the domain runs.
func TestSimDomainStartedAfterFencedStop(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{
		{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
		{at: 21 * time.Second, kind: "stop", hosts: []int{0}, dur: 170 * time.Second},
		{at: 30 * time.Second, kind: "domain-start", hosts: []int{0}},
	}}
	err, s := sc.run(t, "", false)
	if err != "" {
		t.Fatalf("%s (stops %v)", err, s.host("h00").stops)
	}
	s = sc.mustFailOnlyMutated(t, "fenced-stop-magic-closes")
	if h := s.host("h00"); h.stops[fencing.StopFenced] != 1 || h.resets != 1 {
		t.Fatalf("stops %v, resets %d: want one fenced stop and one watchdog reset", h.stops, h.resets)
	}
}

// TestSimFencedStopRestartNotReset: the same fenced stop, the agent
// starting again 5 s later (systemctl restart, an upgrade; cut off all
// along): it carries on fenced from its durable state, lists and re-fences
// the domains, and feeds the watchdog the stopped process left armed: no
// reset, nothing declared while a domain runs.
func TestSimFencedStopRestartNotReset(t *testing.T) {
	sc := scenario{hosts: 5, rack: 5, events: []simEvent{
		{at: 20 * time.Second, kind: "cut-host", hosts: []int{0}, dur: 170 * time.Second},
		{at: 21 * time.Second, kind: "stop", hosts: []int{0}, dur: 5 * time.Second},
	}}
	err, s := sc.run(t, "", false)
	if err != "" {
		t.Fatalf("%s (stops %v)", err, s.host("h00").stops)
	}
	if h := s.host("h00"); h.stops[fencing.StopFenced] != 1 || h.resets != 0 || !h.wdArmed {
		t.Fatalf("stops %v, resets %d, watchdog armed %v: want one fenced stop, no reset, the restart feeding", h.stops, h.resets, h.wdArmed)
	}
}
