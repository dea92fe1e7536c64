package daemon

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"hvguard/controller"
	ir "hvguard/controller/instancerecovery"
)

// status prints instance recovery: mode, in progress, the instances over
// budget and the recent stops with why.
func TestPrintInstanceRecovery(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	v := &controller.InstanceRecoveryView{Mode: ir.ModeRestart, InProgress: 2,
		OverBudget: []ir.Report{{UUID: "u-loop", Name: "instance-0000000a", Host: "node3", At: at, Step: ir.StepOverBudget, Error: "3 actions within 1h0m0s"}},
		Recent: []ir.Report{
			{UUID: "u-1", Name: "instance-00000001", Host: "node3", At: at, Classification: "stopped-unexpectedly", Detail: "failed",
				Step: ir.StepRecovered, Reason: ir.ReasonVerified, Action: ir.ActionStart, TookSeconds: 41.2},
			{UUID: "u-2", Name: "instance-00000002", Host: "node3", At: at, Classification: "stopped-by-nova", Detail: "shutdown-by-guest",
				Step: ir.StepSkipped, Reason: ir.ReasonStoppedByNova},
		}}
	var b bytes.Buffer
	printInstanceRecovery(&b, v)
	out := b.String()
	for _, want := range []string{"mode restart, 2 stops in progress, 1 instances over budget", "u-loop", "3 actions within 1h0m0s",
		"stopped-unexpectedly/failed", "recovered", "active-and-running", "start", "41.2s", "stopped-by-nova", "skipped"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	printInstanceRecovery(&b, nil)
	if b.Len() != 0 {
		t.Errorf("mode off printed %q", b.String())
	}
}
