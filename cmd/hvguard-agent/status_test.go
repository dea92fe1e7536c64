package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/reconcile"
)

func TestStatus(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.MkdirAll(state, 0o700)
	conf := filepath.Join(dir, "agent.yaml")
	os.WriteFile(conf, []byte("host: node1\nstate_dir: "+state+"\nstatus: {socket: "+filepath.Join(dir, "agent.sock")+"}\n"), 0o600)

	// No agent runs on this configuration (its socket does not exist):
	// status says so, reads the state files, and exits 4 (down).
	code, out, _ := runCLI("status", "--config", conf)
	if code != agent.ExitDown || !strings.Contains(out, "STATE FILES ONLY") || !strings.Contains(out, "none recorded") || !strings.Contains(out, "reconcile.enabled is false") {
		t.Fatalf("no file: exit %d, %q", code, out)
	}

	at := time.Date(2026, 11, 29, 19, 15, 10, 0, time.UTC)
	rep := reconcile.Report{Hosts: []string{"node1"}, Trigger: reconcile.TriggerRejoin, StartedAt: at, FinishedAt: at.Add(830 * time.Millisecond),
		Domains: 3, NovaInstances: 2, Evacuations: 2, Candidates: 2, Destroyed: 1, Kept: 1, Skipped: 0, APICalls: 4, RetryIn: time.Minute,
		Results: []reconcile.DomainReport{
			{DomainDecision: reconcile.DomainDecision{UUID: "d3fe1837-1656-48ea-8337-667709b89817", Name: "instance-d3fe", Decision: reconcile.DecisionDestroy,
				Reason: reconcile.ReasonEvacuatedElsewhere, Evidence: &reconcile.Evidence{MigrationID: 1, MigrationStatus: "done", SourceCompute: "node1",
					DestCompute: "node2", ServerFound: true, ServerHost: "node2"}}, Outcome: reconcile.OutcomeDestroyed, Marked: true},
			{DomainDecision: reconcile.DomainDecision{UUID: "57a7da7d-2a0e-4df8-9f76-cc82fae3ff85", Name: "instance-57a7", Decision: reconcile.DecisionKeep,
				Reason: reconcile.ReasonServerOnThisHost, Evidence: &reconcile.Evidence{MigrationID: 2, MigrationStatus: "completed", SourceCompute: "node1",
					DestCompute: "node2", ServerFound: true, ServerHost: "node1"}}},
			{DomainDecision: reconcile.DomainDecision{UUID: "6f1c2a9e-0000-4000-8000-000000000099", Name: "not-nova", Decision: reconcile.DecisionKeep,
				Reason: reconcile.ReasonNotANovaInstance}},
		}}
	write := func(st agent.ReconcileStatus) {
		b, _ := json.Marshal(st)
		if err := os.WriteFile(filepath.Join(state, agent.ReconcileStatusFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(agent.ReconcileStatus{Host: "node1", LastSuccess: rep.FinishedAt, Report: rep})
	code, out, errOut := runCLI("--config", conf, "--status") // the old spelling
	if code != agent.ExitDown {
		t.Fatalf("OK report, agent down: exit %d: %s %s", code, out, errOut)
	}
	for _, want := range []string{"result:       OK", "destroyed 1", "d3fe1837-1656-48ea-8337-667709b89817 instance-d3fe", "destroyed      evacuated-elsewhere; migration 1 (done) node1→node2; server on node2",
		"server-on-this-host; migration 2 (completed) node1→node2; server on node1", "kept, nothing to report: not-a-nova-instance 1", "4 API calls"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	rep.Global, rep.GlobalDetail, rep.Destroyed, rep.Results = reconcile.ReasonNovaUnavailable, "GET /os-migrations: connection refused", 0, nil
	write(agent.ReconcileStatus{Host: "node1", Report: rep})
	code, out, _ = runCLI("status", "--config", conf)
	if code != agent.ExitDown || !strings.Contains(out, "NOT OK, NOTHING DESTROYED: nova-unavailable: GET /os-migrations: connection refused") ||
		!strings.Contains(out, "none since the agent started") {
		t.Fatalf("failed report: exit %d:\n%s", code, out)
	}
}
