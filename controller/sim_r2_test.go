package controller

import (
	"testing"
	"time"
)

// TestSimDomainStartedAfterFencedStop (reviewer R2, OPEN): h00 is cut off
// from NATS and its peers and stopped (systemctl stop): the withdrawal
// cannot land, so it fences before leaving (StopFenced) and magic-closes
// the watchdog. The agent stays stopped. Five seconds later an operator
// (or Nova, which does not go through NATS) starts a domain on the host:
// nothing fences it, nothing resets the host, and the controller declares
// the host when its lease lapses — while the domain runs.
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
}
