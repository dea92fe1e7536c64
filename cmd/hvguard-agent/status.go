package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"hvguard/agent"
	"hvguard/reconcile"
)

// runStatus is `hvguard-agent status`: the running agent's Status over
// its socket, or (it does not answer) the state files'; printed as one
// screen or as JSON. The exit status is the Status's health.
func runStatus(cfg agent.Config, socket string, asJSON bool, stdout, stderr io.Writer) int {
	if socket == "" {
		socket = cfg.Status.Socket
	}
	var st agent.Status
	var err error
	if socket == "" {
		err = errors.New("status.socket is empty in this configuration")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), agent.StatusTimeout)
		st, err = agent.QueryStatus(ctx, socket)
		cancel()
	}
	if err != nil {
		st = agent.StatusFromFiles(cfg, err, time.Now())
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			fmt.Fprintf(stderr, "hvguard-agent: %v\n", err)
		}
	} else {
		printStatus(cfg, st, stdout)
	}
	return st.Health.ExitCode()
}

// printStatus prints st on one screen: the verdict and its reasons first,
// then each part, then the last reconciliation in detail.
func printStatus(cfg agent.Config, st agent.Status, stdout io.Writer) {
	w := func(k, f string, a ...any) { fmt.Fprintf(stdout, "%-13s %s\n", k+":", fmt.Sprintf(f, a...)) }
	ago := func(t time.Time) string { return st.Now.Sub(t).Round(100 * time.Millisecond).String() }
	fmt.Fprintf(stdout, "hvguard-agent on %s: %s\n", st.Host, strings.ToUpper(string(st.Health)))
	if st.Source == "agent" {
		w("source", "the running agent (pid %d, %s, up %s)", st.PID, st.Version, st.Now.Sub(st.StartedAt).Round(time.Second))
	} else {
		w("source", "STATE FILES ONLY: %s", st.SourceError)
	}
	for _, ins := range st.Insecure {
		w("INSECURE", "%s", ins)
	}
	for i, p := range st.Problems {
		k := ""
		if i == 0 {
			k = "problems"
		}
		fmt.Fprintf(stdout, "%-13s - %s\n", k+map[bool]string{true: ":", false: " "}[i == 0], p)
	}
	f := st.Fence
	switch {
	case !f.Enabled:
		w("fence", "off (fence.enabled is false)")
	default:
		line := fmt.Sprintf("%s", orDash(f.State))
		if f.Reason != "" {
			line += " (" + f.Reason + ")"
		}
		line += ", action " + f.Action
		if st.Source == "agent" {
			line += ", watchdog " + f.Watchdog
		}
		w("fence", "%s, %d domains paused by hvguard", line, f.PausedDomains)
		lease := "not held"
		if f.LeaseHeld {
			lease = "held"
		}
		if st.Source != "agent" {
			lease = "unknown (agent down)"
		}
		if f.LeaseAgeSeconds != nil {
			lease += fmt.Sprintf(", last renewal landed %s ago (%s)", ago(f.LastRenewal), f.LastRenewal.UTC().Format(time.RFC3339))
		} else {
			lease += ", no renewal landed in this boot"
		}
		w("lease", "%s", lease)
	}
	conn := func(k string, c *agent.ConnStatus) {
		if c == nil {
			w(k, "unknown (agent down)")
			return
		}
		state := "connected"
		if !c.Connected {
			state = "DISCONNECTED"
			if c.LastError != "" {
				state += " (" + c.LastError + ")"
			}
		}
		w(k, "%s, %s", state, c.Endpoint)
	}
	conn("nats", st.NATS)
	conn("libvirt", st.Libvirt)
	if o := st.Outbox; o != nil {
		w("outbox", "%d events, %d bytes not yet acknowledged (bound %d events / %d bytes); %d dropped, %d gap markers since start",
			o.Depth, o.Bytes, o.MaxEvents, o.MaxBytes, o.Dropped, o.GapMarkers)
	} else {
		w("outbox", "unknown (agent down): what it holds is sent at its next start")
	}
	if s := st.Stops; s != nil {
		w("held stops", "%d in their window, %d being classified with Nova; %d domains tracked", s.Held, s.Classifying, s.Domains)
	} else {
		w("held stops", "unknown (agent down)")
	}
	printReconcile(cfg, st, stdout)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printReconcile prints the last reconciliation recorded in
// state_dir/reconcile-last.json: what was checked, found, destroyed and
// why not.
func printReconcile(cfg agent.Config, sst agent.Status, stdout io.Writer) {
	path := filepath.Join(cfg.StateDir, agent.ReconcileStatusFile)
	st := sst.Reconcile
	now := sst.Now
	if st == nil {
		why := "the agent has not reconciled since this state_dir was created"
		if !cfg.Reconcile.Enabled {
			why = "reconcile.enabled is false in this configuration"
		}
		fmt.Fprintf(stdout, "%-13s none recorded (%s): %s\n", "reconcile:", path, why)
		return
	}
	r := st.Report
	w := func(k, f string, a ...any) { fmt.Fprintf(stdout, "%-13s %s\n", k+":", fmt.Sprintf(f, a...)) }
	fmt.Fprintf(stdout, "rejoin reconciliation with Nova (%s)\n", path)
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
}
