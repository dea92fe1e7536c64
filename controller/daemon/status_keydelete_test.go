package daemon

import (
	"strings"
	"testing"

	"hvguard/controller"
	"hvguard/fencing"
)

// TestPrintStatusKeyDeletedAndGuardVersions: a host whose lease key was
// deleted is shown as unprotected; the guard line lists the versions in
// force.
func TestPrintStatusKeyDeletedAndGuardVersions(t *testing.T) {
	var b strings.Builder
	PrintStatus(&b, Status{ID: "c1", Role: "leader", Tracker: &controller.TrackerView{Threshold: 4,
		GuardVersions: []fencing.GuardVersion{{Version: 1, Threshold: 4}, {Version: 2, Threshold: 10}},
		Hosts: []controller.LeaseView{
			{Host: "h1", State: fencing.LeaseActive, KeyDeleted: true, Backstop: fencing.BackstopWatchdog},
			{Host: "h2", State: fencing.LeaseActive, Backstop: fencing.BackstopWatchdog},
		}}})
	out := b.String()
	for _, want := range []string{"UNPROTECTED (lease key deleted", "versions in force (version:threshold) v1:4 v2:10"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
}
