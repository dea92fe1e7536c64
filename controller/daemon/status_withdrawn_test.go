package daemon

import (
	"strings"
	"testing"

	"hvguard/controller"
	"hvguard/fencing"
)

// TestPrintStatusWithdrawn: a host whose agent withdrew is shown as
// unprotected, with the agent's reason.
func TestPrintStatusWithdrawn(t *testing.T) {
	var b strings.Builder
	PrintStatus(&b, Status{ID: "c1", Role: "leader", Tracker: &controller.TrackerView{Hosts: []controller.LeaseView{
		{Host: "h1", State: fencing.LeaseWithdrawn, Reason: "orderly-stop", Backstop: fencing.BackstopWatchdog},
		{Host: "h2", State: fencing.LeaseActive, Backstop: fencing.BackstopWatchdog},
	}}})
	out := b.String()
	if !strings.Contains(out, "UNPROTECTED (agent withdrew; not declared, not recovered): orderly-stop") {
		t.Fatalf("status lacks the withdrawn host's note:\n%s", out)
	}
}
