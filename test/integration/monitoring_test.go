package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/classify"
	"hvguard/controller/daemon"
	"hvguard/fencing"
	"hvguard/openstack"
	"hvguard/openstack/openstacktest"
	"hvguard/proto"
)

// The shipped alerting rules and dashboard (packaging/monitoring) and the
// rename table of docs/monitoring.md against what the daemons export.
const monitoringDir = "../../packaging/monitoring"

// families parses a Prometheus text exposition into family name -> label
// name -> the label values seen.
func families(body string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	series := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	pair := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "# TYPE ") {
			if f := strings.Fields(l); len(f) >= 3 && out[f[2]] == nil {
				out[f[2]] = map[string][]string{}
			}
			continue
		}
		m := series.FindStringSubmatch(l)
		if m == nil || strings.HasPrefix(l, "#") {
			continue
		}
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_bucket"), "_sum"), "_count")
		if out[name] == nil {
			name = m[1]
			out[name] = map[string][]string{}
		}
		for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(out[name][p[1]], p[2]) {
				out[name][p[1]] = append(out[name][p[1]], p[2])
			}
		}
	}
	return out
}

// dynamicLabels are label values a series has only once something
// happened (a family per value seen) or only for the configured value:
// those are checked against the code's list of possible values instead of
// the scrape.
var dynamicLabels = map[string][]string{
	"hvguard_stop_classifications_total/classification": {string(classify.Rebooted), string(classify.StoppedByNova), string(classify.StoppedUnexpectedly), string(classify.Unknown)},
	"hvguard_fence_action/action":                       {string(fencing.ActionPause), string(fencing.ActionDestroy), string(fencing.ActionResetHost), string(fencing.ActionNone)},
}

// fullAgent runs an agent with every optional feature on (fencing with a
// real action, reconciliation and classification against a fake Nova),
// and a controller watching the same NATS; it returns both scrapes once a
// stop was classified (the classification families exist from then on).
func fullAgentAndController(t *testing.T) (agentMetrics, ctlMetrics string) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-monitoring.example.org"
	dom, _ := newDomain(t, wl, "monitoring")
	reboot, _ := newDomain(t, wl, "monitoring-reboot")
	nova := newFakeNova(t, host)
	nova.set(dom, novaActive)
	nova.set(reboot, novaActive)
	nova.Route(fmt.Sprintf("/v2.1/os-migrations?source_compute=%s&migration_type=evacuation&limit=%d", host, openstack.PageSize),
		openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: openstacktest.MigrationsPage(nil, false, nova.URL, openstack.PageSize)})
	secret := filepath.Join(t.TempDir(), "peer.secret")
	if err := os.WriteFile(secret, []byte("integration-test-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", deliverytest.FreePort(t))
	cfg := classifyingConfig(t, nova, ns.ClientURL(), host, func(c *agent.Config) {
		c.Reconcile.Enabled = true
		c.Reconcile.Action = agent.ReconcileActionReport
		c.Fence.Enabled = true
		c.Fence.Action = "pause"
		c.Fence.PeerSecretFile = secret
		c.Fence.PeerListen = "127.0.0.1:0"
		c.Fence.PeerURL = "http://127.0.0.1:9/{host}"
		c.ShutdownTimeout = agent.Duration(time.Second)
		c.Metrics.Listen = addr
	})
	startAgent(t, cfg, agent.Options{WrapFenceHypervisor: func(h agent.FenceHypervisor) agent.FenceHypervisor {
		return ownDomains{FenceHypervisor: h, uuids: []string{dom, reboot}} // never fence other tests' domains
	}})

	ctlCfg := daemon.DefaultConfig()
	ctlCfg.ID = "it-monitoring-ctl"
	ctlCfg.NATS.URLs = []string{ns.ClientURL()}
	ctlCfg.Metrics.Listen = "127.0.0.1:0"
	if err := ctlCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, listening, done := make(chan struct{}), make(chan string, 1), make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, ctlCfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
			daemon.Options{Ready: ready, Listening: func(a string) { listening <- a }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	ctlAddr := <-listening
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("controller exited: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("controller not ready after 10 s")
	}

	nc := natsConn(t, ns.ClientURL())
	must(t, wl.Destroy(context.Background(), dom))
	must(t, wl.Destroy(context.Background(), reboot)) // a hard reboot: a suppressed stop
	must(t, wl.Start(context.Background(), reboot))
	waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(stopsAndReboots(classified(evs, dom))) == 1 && len(stopsAndReboots(classified(evs, reboot))) == 1
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		agentMetrics = scrape(t, "http://"+addr+"/metrics")
		if metric(agentMetrics, `hvguard_fence_state{state="healthy"}`) == 1 &&
			strings.Contains(agentMetrics, "hvguard_stop_classifications_total{") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return agentMetrics, scrape(t, "http://"+ctlAddr+"/metrics")
}

// TestMonitoringNamesExported: every metric (and every label value it
// matches on) named in the alerting rules and the dashboard is exported by
// a running agent or controller, and the rename table of
// docs/monitoring.md is true: each new name exported, no old one. A
// rename that forgets the rules fails here, not silently in production.
func TestMonitoringNamesExported(t *testing.T) {
	am, cm := fullAgentAndController(t)
	fams := families(am)
	for k, labels := range families(cm) {
		if fams[k] == nil {
			fams[k] = map[string][]string{}
		}
		for l, vs := range labels {
			fams[k][l] = append(fams[k][l], vs...)
		}
	}

	files, _ := filepath.Glob(filepath.Join(monitoringDir, "*"))
	named := regexp.MustCompile(`\bhvguard_[a-z0-9_]+`)
	selector := regexp.MustCompile(`\b(hvguard_[a-z0-9_]+)\s*\{([^}]*)\}`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|=)\s*\\?"([^"\\]*)\\?"`)
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".test.yml") {
			continue // the promtool unit tests' input series are made up
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, name := range named.FindAllString(text, -1) {
			checked++
			if fams[name] == nil {
				t.Errorf("%s names %s: neither the agent nor the controller exports it", filepath.Base(f), name)
			}
		}
		for _, sel := range selector.FindAllStringSubmatch(text, -1) {
			name := sel[1]
			for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
				label, value := m[1], m[3]
				if label == "instance" || label == "job" || strings.Contains(value, "$") || fams[name] == nil {
					continue
				}
				values := fams[name][label]
				if dyn, ok := dynamicLabels[name+"/"+label]; ok {
					values = dyn
				}
				for _, v := range strings.Split(value, "|") {
					if !slices.Contains(values, v) {
						t.Errorf("%s matches %s{%s=%q}: exported values of %s are %v", filepath.Base(f), name, label, v, label, values)
					}
				}
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d metric names found in %s: the parser is broken", checked, monitoringDir)
	}

	// The rename table: | `old` | `new` | ... |
	doc, err := os.ReadFile("../../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(hvguard_[a-z0-9_]+)(?:\\{[a-z,]*\\})?` \\| `(hvguard_[a-z0-9_]+)(?:\\{[a-z,]*\\})?` \\|")
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 10 {
		t.Fatalf("rename table of docs/monitoring.md: %d rows parsed", len(rows))
	}
	alert := regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`)
	for _, f := range files {
		if !strings.HasSuffix(f, ".rules.yml") {
			continue
		}
		b, _ := os.ReadFile(f)
		for _, a := range alert.FindAllStringSubmatch(string(b), -1) {
			if !strings.Contains(string(doc), "\n#### "+a[1]+"\n") {
				t.Errorf("alert %s (%s) has no section \"#### %s\" in docs/monitoring.md (its runbook annotation points there)", a[1], filepath.Base(f), a[1])
			}
		}
	}
	for _, r := range rows {
		if fams[r[1]] != nil {
			t.Errorf("old name %s is still exported (docs/monitoring.md says it is gone)", r[1])
		}
		if fams[r[2]] == nil {
			t.Errorf("new name %s (was %s) is not exported", r[2], r[1])
		}
	}
	for _, d := range []string{`daemon="agent"`, `daemon="controller"`} {
		if !strings.Contains(am+cm, d) || fams["hvguard_build_info"] == nil {
			t.Errorf("no hvguard_build_info{%s}", d)
		}
	}
	if v := metric(am, "hvguard_fence_lease_last_renewal_timestamp_seconds"); v < float64(time.Now().Add(-time.Minute).Unix()) || v > float64(time.Now().Add(time.Minute).Unix()) {
		t.Errorf("hvguard_fence_lease_last_renewal_timestamp_seconds = %v, want a Unix time near now", v)
	}
}

// TestMonitoringDashboardQueriesParse: every query of the dashboard is
// valid PromQL (promtool parses them as recording rules; the rules files
// themselves are checked by `make test-rules`).
func TestMonitoringDashboardQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not installed (make test-rules installs Debian's prometheus)")
		}
		t.Skip("promtool not installed: `make test-rules` installs it")
	}
	b, err := os.ReadFile(filepath.Join(monitoringDir, "hvguard-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(exprs) < 20 {
		t.Fatalf("%d queries found in the dashboard", len(exprs))
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(e)
		fmt.Fprintf(&rules, "      - record: dashboard:q%d\n        expr: %s\n", i, q)
	}
	p := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(p, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", p).CombinedOutput(); err != nil {
		t.Fatalf("dashboard queries do not parse: %v\n%s", err, out)
	}
}
