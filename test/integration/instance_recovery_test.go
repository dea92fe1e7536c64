package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller/daemon"
	ir "hvguard/controller/instancerecovery"
)

// TestControllerInstanceRecovery (issue 14): the real agent (libvirt test
// driver, classification against a Nova serving Nova 26.2.2's recorded
// bodies) and the real controller daemon (instance_recovery.mode restart,
// protect all) on one embedded JetStream. A domain destroyed outside Nova
// (stopped-unexpectedly) is started through Nova exactly once, after Nova
// showed it SHUTOFF, and verified when the agent reports it running; a
// stop API stop and a Nova hard reboot get no action.
func TestControllerInstanceRecovery(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-ir1.example.org"
	crash, _ := newDomain(t, wl, "ir-crash")
	stopped, _ := newDomain(t, wl, "ir-stopapi")
	reboot, _ := newDomain(t, wl, "ir-reboot")
	nova := newFakeNova(t, host)
	for _, u := range []string{crash, stopped, reboot} {
		nova.set(u, novaActive)
	}
	startClassifying(t, nova, ns.ClientURL(), host, nil)

	cfg := daemon.DefaultConfig()
	cfg.ID = "ctl-ir"
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.NATS.ReadyTimeout = daemon.Duration(5 * time.Second)
	cfg.Metrics.Listen = "127.0.0.1:0"
	// ×0.1 leader timing: leading ~1 s after start
	cfg.Leader.TTL, cfg.Leader.RenewInterval = daemon.Duration(time.Second), daemon.Duration(250*time.Millisecond)
	cfg.Leader.WriteTimeout, cfg.Leader.ActMargin = daemon.Duration(200*time.Millisecond), daemon.Duration(200*time.Millisecond)
	cfg.OpenStack.Cloud = "test"
	cfg.OpenStack.CloudsFile = nova.CloudsYAML(t)
	cfg.InstanceRecovery.Mode = ir.ModeRestart
	cfg.InstanceRecovery.Protect = ir.ProtectAll
	cfg.InstanceRecovery.PollInterval = daemon.Duration(100 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	addr := runController(t, cfg)
	ctx := t.Context()
	status := func(what string, ok func(daemon.Status) bool) daemon.Status {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var st daemon.Status
		for {
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, _ = daemon.FetchStatus(c, addr, "")
			cancel()
			if st.InstanceRecovery != nil && ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never; last status %+v", what, st.InstanceRecovery)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	status("leading", func(st daemon.Status) bool { return st.Role == "leader" })
	report := func(st daemon.Status, uuid string, step ir.Step) *ir.Report {
		for _, r := range st.InstanceRecovery.Recent {
			if r.UUID == uuid && r.Step == step {
				return &r
			}
		}
		return nil
	}
	starts := func(uuid string) int {
		n := 0
		for _, r := range nova.Captured() {
			if r.Method == "POST" && strings.HasSuffix(r.Target, "/servers/"+uuid+"/action") {
				if !strings.Contains(string(r.Body), "os-start") {
					t.Errorf("action on %s: %s", uuid, r.Body)
				}
				n++
			}
		}
		return n
	}

	// The three stops: a destroy Nova knows nothing of (Nova still
	// active: its sync comes later), the stop API, a hard reboot.
	must(t, wl.Destroy(ctx, crash))
	nova.set(stopped, novaState{"ACTIVE", "active", "powering-off", 1})
	nova.userStop(stopped, time.Now().Add(-time.Second))
	must(t, wl.Shutdown(ctx, stopped))
	nova.set(stopped, novaStopped)
	nova.set(reboot, novaHardReboot)
	must(t, wl.Destroy(ctx, reboot))

	st := status("the crash waits for Nova's sync", func(st daemon.Status) bool {
		return report(st, stopped, ir.StepSkipped) != nil && st.InstanceRecovery.InProgress >= 1
	})
	if r := report(st, stopped, ir.StepSkipped); r.Reason != ir.ReasonStoppedByNova {
		t.Fatalf("stop API: %+v", r)
	}
	time.Sleep(time.Second)
	if n := starts(crash); n != 0 {
		t.Fatalf("started before Nova showed SHUTOFF: %d", n)
	}
	// Nova's power sync: SHUTOFF, no task → os-start.
	nova.set(crash, novaStopped)
	deadline := time.Now().Add(10 * time.Second)
	for starts(crash) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := starts(crash); n != 1 {
		t.Fatalf("%d os-start calls for the crash, want 1", n)
	}
	// Nova starts it: the domain runs, Nova shows ACTIVE.
	must(t, wl.Start(ctx, crash))
	nova.set(crash, novaActive)
	st = status("the crash recovered", func(st daemon.Status) bool { return report(st, crash, ir.StepRecovered) != nil })
	r := report(st, crash, ir.StepRecovered)
	if r.Action != ir.ActionStart || r.Classification != "stopped-unexpectedly" || r.Detail != ir.DetailDestroyed {
		t.Fatalf("recovered report %+v", r)
	}
	// The hard reboot completes; nothing else is ever done.
	must(t, wl.Start(ctx, reboot))
	nova.set(reboot, novaActive)
	time.Sleep(2 * time.Second)
	for _, u := range []string{stopped, reboot} {
		if n := starts(u); n != 0 {
			t.Errorf("%d actions for %s (stop API / reboot), want 0", n, u)
		}
	}
	if n := starts(crash); n != 1 {
		t.Errorf("%d os-start calls for the crash in the end, want 1", n)
	}
	st = status("final", func(daemon.Status) bool { return true })
	if st.InstanceRecovery.InProgress != 0 || st.InstanceRecovery.Actions[ir.ActionStart] != 1 {
		t.Errorf("final instance recovery status: in progress %d, actions %v", st.InstanceRecovery.InProgress, st.InstanceRecovery.Actions)
	}
}
