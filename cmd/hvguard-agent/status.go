package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"hvguard/agent"
	"hvguard/reconcile"
)

// statusNoReport is the exit status of --status when the last
// reconciliation was not OK or none is recorded: scripts and monitoring
// can test it.
const statusNoReport = 1

// printStatus prints the last reconciliation recorded in
// state_dir/reconcile-last.json: what was checked, found, destroyed and
// why not. It returns 0 when that reconciliation was OK.
func printStatus(cfg agent.Config, stdout, stderr io.Writer, now time.Time) int {
	path := filepath.Join(cfg.StateDir, agent.ReconcileStatusFile)
	st, err := agent.ReadReconcileStatus(cfg.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		why := "the agent has not reconciled since this state_dir was created"
		if !cfg.Reconcile.Enabled {
			why = "reconcile.enabled is false in this configuration"
		}
		fmt.Fprintf(stdout, "no reconciliation recorded (%s): %s\n", path, why)
		return statusNoReport
	}
	if err != nil {
		fmt.Fprintf(stderr, "hvguard-agent: %v\n", err)
		return statusNoReport
	}
	r := st.Report
	w := func(k, f string, a ...any) { fmt.Fprintf(stdout, "%-13s %s\n", k+":", fmt.Sprintf(f, a...)) }
	fmt.Fprintf(stdout, "rejoin reconciliation with Nova, host %s (%s)\n", st.Host, path)
	w("last run", "%s, %s (%s ago), took %s, action %s, nova hosts %s", r.Trigger, r.FinishedAt.UTC().Format(time.RFC3339),
		now.Sub(r.FinishedAt).Round(time.Second), r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond), r.Mode, strings.Join(r.Hosts, ","))
	if r.OK() {
		w("result", "OK")
	} else if r.Global != reconcile.ReasonNone {
		w("result", "NOT OK, NOTHING DESTROYED: %s: %s", r.Global, r.GlobalDetail)
	} else {
		w("result", "NOT OK: %d destroys failed", r.Failed)
	}
	if st.LastSuccess.IsZero() {
		w("last OK", "none since the agent started")
	} else {
		w("last OK", "%s (%s ago)", st.LastSuccess.UTC().Format(time.RFC3339), now.Sub(st.LastSuccess).Round(time.Second))
	}
	w("checked", "%d local domains, %d Nova instances; Nova: %d evacuation records from this host, %d servers looked up, %d API calls",
		r.Domains, r.NovaInstances, r.Evacuations, r.Candidates, r.APICalls)
	w("found", "destroyed %d, already off %d, would destroy %d, destroy failed %d, kept %d, skipped %d",
		r.Destroyed, r.AlreadyOff, r.WouldDestroy, r.Failed, r.Kept, r.Skipped)
	next := "periodic"
	if !r.OK() {
		next = fmt.Sprintf("retry (%d failures in a row)", r.ConsecutiveFailures)
	}
	w("next", "%s, %s after the last run", next, r.RetryIn)

	// Every domain with something to say: stale copies, skips (why not),
	// and kept instances that have an evacuation record. The rest (no
	// evacuation, not a Nova instance) are counted by reason.
	quiet := map[string]int{}
	var lines []string
	for _, d := range r.Results {
		if d.Decision == reconcile.DecisionKeep && d.Evidence == nil {
			quiet[d.Reason.String()]++
			continue
		}
		what := d.Decision.String()
		if d.Outcome != reconcile.OutcomeNone {
			what = d.Outcome.String()
		}
		l := fmt.Sprintf("  %s %-20s %-14s %s", d.UUID, d.Name, what, d.Reason)
		if e := d.Evidence; e != nil {
			if e.MigrationID != 0 {
				l += fmt.Sprintf("; migration %d (%s) %s→%s", e.MigrationID, e.MigrationStatus, e.SourceCompute, e.DestCompute)
			}
			if e.ServerFound {
				l += "; server on " + e.ServerHost
				if e.ServerTaskState != "" {
					l += " (task " + e.ServerTaskState + ")"
				}
			}
		}
		if d.Detail != "" {
			l += "; " + d.Detail
		}
		if d.Error != "" {
			l += "; error: " + d.Error
		}
		lines = append(lines, l)
	}
	if len(lines) > 0 {
		fmt.Fprintln(stdout, "domains:")
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
	}
	if len(quiet) > 0 {
		var ks []string
		for k, n := range quiet {
			ks = append(ks, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(ks)
		fmt.Fprintf(stdout, "kept, nothing to report: %s\n", strings.Join(ks, ", "))
	}
	if !r.OK() {
		return statusNoReport
	}
	return 0
}
