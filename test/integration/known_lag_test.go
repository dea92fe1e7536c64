package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/proto"
)

// TestStopReportedOnceAcrossKillBeforeKnownSave: a stop is reported (in
// the outbox) and the agent is SIGKILLed before domains.json is rewritten
// (it is saved at most every KnownSaveInterval). The kill lands before the
// save deterministically: the domains.json of before the stop is put back
// after the SIGKILL. At the next start the file says running, the listing
// says shutoff: the stop was reported a second time. domains.json records
// the outbox seq of its last report, and the start folds the reports the
// outbox still holds after it in.
func TestStopReportedOnceAcrossKillBeforeKnownSave(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	state := stateDir(t)
	known := filepath.Join(state, "domains.json")
	const uuid = "7a3b9c1d-0000-4000-8000-0000000000b1"

	first := startChild(t, childPlain, ns.ClientURL(), state, childDomainsEnv+"="+uuid+",knownlag,running")
	first.waitReports(t, 1) // defined (resync)
	var before []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(known); err == nil && strings.Contains(string(b), uuid) {
			before = b
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never written with the domain", known)
		}
	}
	first.destroy(t, uuid)
	nc := natsConn(t, ns.ClientURL())
	waitFor(t, nc, childPlainHost, func(evs []proto.LifecycleEvent) bool { return count(byDomain(evs, uuid), "stopped(") == 1 })
	first.kill(t)
	if err := os.WriteFile(known, before, 0o600); err != nil { // the save the kill prevented
		t.Fatal(err)
	}

	second := startChild(t, childPlain, ns.ClientURL(), state, childDomainsEnv+"="+uuid+",knownlag,shutoff")
	second.waitReports(t, 1)    // the full report after its first listing
	time.Sleep(10 * testWindow) // window, check and publish of a re-report
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("graceful stop of the second agent: %v", err)
	}
	c := deliverytest.Collect(t, nc, childPlainHost, 0, 5*time.Second)
	if n := count(byDomain(c.Events, uuid), "stopped("); n != 1 {
		t.Fatalf("one stop of the domain reported %d times: %v", n, byDomain(c.Events, uuid))
	}
}
