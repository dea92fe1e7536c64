package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/fencing"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/openstack"
	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

// TestFenceRejoinReconcile is issue 4's rejoin through the whole agent
// with fencing and reconciliation on (the fence rig: embedded JetStream
// behind a blackholing proxy, the controller, fast fencing timings) and the
// replay Nova: the agent's NATS link is cut, its Nova instances are paused;
// meanwhile Nova evacuates most of them; the link heals before expiry: the
// rejoin reconciliation destroys the evacuated (paused) copies and fencing
// resumes only the others. Measured: heal → last duplicate destroyed, and
// heal → the others running. HVGUARD_REJOIN_DOMAINS sets the number of
// instances (default 10; 3 stay).
func TestFenceRejoinReconcile(t *testing.T) {
	n := 10
	if v, err := strconv.Atoi(os.Getenv("HVGUARD_REJOIN_DOMAINS")); err == nil && v > 3 {
		n = v
	}
	r := newFenceRig(t, true, 0)
	uuids := make([]string, n)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("7e1d7c3a-%04x-4000-8000-%012d", os.Getpid()&0xffff, i)
		defineNovaDomain(t, r.wl, fmt.Sprintf("instance-rejoin-%d", i), uuids[i])
	}
	r.domains = uuids
	evacuated, stay := uuids[:n-3], uuids[n-3:]

	nova := openstacktest.New(t)
	nova.Scenario(uuids, make([]bool, n), openstack.PageSize) // nothing evacuated yet
	r.cfg.Reconcile.Enabled = true
	r.cfg.Reconcile.NovaHosts = []string{"node1"}
	r.cfg.OpenStack.Cloud = "test"
	r.cfg.OpenStack.CloudsFile = nova.CloudsYAML(t)
	r.cfg.OpenStack.RequestTimeout = agent.Duration(2 * time.Second)
	if err := r.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	if st, err := agent.ReadReconcileStatus(r.cfg.StateDir); err != nil || !st.Report.OK() || st.Report.Destroyed != 0 || st.Report.Trigger != reconcile.TriggerStart {
		t.Fatalf("start reconciliation: %v %s", err, st.Report.Summary())
	}
	time.Sleep(time.Second) // the controller sees renewals; the guard is published and read

	r.prx.Blackhole(true)
	r.waitFor("all domains paused", 10*time.Second, func() bool { return r.allDomains(lifecycle.StatePaused) })
	// While the host is cut off, Nova evacuates most of its instances.
	flags := make([]bool, n)
	for i := range evacuated {
		flags[i] = true
	}
	nova.Scenario(uuids, flags, openstack.PageSize)
	r.prx.Blackhole(false)
	healed := time.Now()
	destroyed := r.waitFor("evacuated copies off", 20*time.Second, func() bool { return statesAre(r.wl, evacuated, lifecycle.StateShutoff) })
	resumed := r.waitFor("the others running", 20*time.Second, func() bool { return statesAre(r.wl, stay, lifecycle.StateRunning) })
	st, err := agent.ReadReconcileStatus(r.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Report.Trigger != reconcile.TriggerRejoin || !st.Report.OK() || st.Report.Destroyed != len(evacuated) {
		t.Fatalf("rejoin reconciliation: %s\n%s", st.Report.Summary(), r.history())
	}
	time.Sleep(500 * time.Millisecond) // a wrong resume of a destroyed copy would show now
	if !statesAre(r.wl, evacuated, lifecycle.StateShutoff) || !statesAre(r.wl, stay, lifecycle.StateRunning) {
		t.Fatalf("after the rejoin: wrong states\n%s", r.history())
	}
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("declared\n%s", r.history())
	}
	t.Logf("%d instances, %d evacuated: heal → last duplicate destroyed %s (reconciliation %s, %d API calls), heal → others resumed %s\n%s",
		n, len(evacuated), destroyed.Sub(healed).Round(time.Millisecond),
		st.Report.FinishedAt.Sub(st.Report.StartedAt).Round(time.Millisecond), st.Report.APICalls,
		resumed.Sub(healed).Round(time.Millisecond), r.history())
}

func statesAre(c *libvirtx.Conn, uuids []string, want lifecycle.State) bool {
	for _, u := range uuids {
		if st, err := c.State(context.Background(), u); err != nil || st != want {
			return false
		}
	}
	return true
}

// defineNovaDomain defines and starts a test-driver domain carrying Nova's
// metadata, removed when the test ends.
func defineNovaDomain(t *testing.T, c *libvirtx.Conn, name, uuid string) {
	t.Helper()
	meta := fmt.Sprintf(`  <metadata>
    <nova:instance xmlns:nova=%q>
      <nova:package version="26.2.2"/>
      <nova:name>%s</nova:name>
    </nova:instance>
  </metadata>
</domain>`, reconcile.NovaNamespace, name)
	ctx := context.Background()
	if _, err := c.DefineXML(ctx, strings.Replace(libvirtx.TestDomainXML(name, uuid), "</domain>", meta, 1)); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Destroy(context.Background(), uuid)
		_ = c.Undefine(context.Background(), uuid)
	})
}
