package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/agent/delivery"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/libvirtx"
	"hvguard/openstack/openstacktest"
	"hvguard/proto"
	"hvguard/reconcile"
)

// Real UUIDs of openstack/testdata's recorded responses (as in
// reconcile/contract_test.go).
const (
	recEvac1   = "d3fe1837-1656-48ea-8337-667709b89817" // evacuated node1 → node2 (done), on node2
	recEvac2   = "57a7da7d-2a0e-4df8-9f76-cc82fae3ff85" // evacuated node1 → node2, answered on node1 again (migrated back)
	recOnNode1 = "7957de7b-13d7-491d-b919-f56b3617fe5b" // never moved
	recNotNova = "6f1c2a9e-0000-4000-8000-000000000099" // a domain without Nova metadata
)

func recTestLog() *slog.Logger {
	if os.Getenv("HVGUARD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// novaDomainXML is a test-driver domain carrying Nova's metadata element.
func novaDomainXML(name, uuid string) string {
	meta := fmt.Sprintf(`  <metadata>
    <nova:instance xmlns:nova=%q>
      <nova:package version="26.2.2"/>
      <nova:name>%s</nova:name>
    </nova:instance>
  </metadata>
</domain>`, reconcile.NovaNamespace, name)
	return strings.Replace(libvirtx.TestDomainXML(name, uuid), "</domain>", meta, 1)
}

// recDomains defines and starts the recorded scenario's domains on
// test:///default (shared by every connection of this process, so the
// agent under test sees them), removed when the test ends.
func recDomains(t *testing.T) *libvirtx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("test:///default"), recTestLog())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range c.Events() {
		}
	}()
	for _, u := range []string{recEvac1, recEvac2, recOnNode1, recNotNova} {
		x := novaDomainXML("instance-"+u[:8], u)
		if u == recNotNova {
			x = libvirtx.TestDomainXML("not-nova", u)
		}
		if _, err := c.DefineXML(ctx, x); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Destroy(context.Background(), u)
			_ = c.Undefine(context.Background(), u)
		})
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recNova is the replay Nova answering the recorded scenario.
func recNova(t *testing.T) *openstacktest.Server {
	s := openstacktest.New(t)
	s.RouteFile("/v2.1/os-migrations?source_compute=node1&migration_type=evacuation&limit=500", "migrations-node1-all")
	s.RouteFile("/v2.1/servers/"+recEvac1, "server-evacuated")
	s.Route("/v2.1/servers/"+recEvac2, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(),
		Body: openstacktest.ServerBody(recEvac2, "node1", "ACTIVE", "")})
	return s
}

func recConfig(t *testing.T, natsURL, clouds string) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Host = "node1"
	cfg.StateDir = t.TempDir()
	cfg.Libvirt.URI = "test:///default"
	cfg.NATS.URLs = []string{natsURL}
	cfg.NATS.ReadyTimeout = Duration(2 * time.Second)
	cfg.Metrics.Listen = fmt.Sprintf("127.0.0.1:%d", deliverytest.FreePort(t))
	cfg.Reconcile.Enabled = true
	cfg.OpenStack.Cloud = "test"
	cfg.OpenStack.CloudsFile = clouds
	cfg.OpenStack.RequestTimeout = Duration(2 * time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runAgent runs Run until the test ends and waits until it is ready.
func runAgent(t *testing.T, cfg Config) { runAgentLog(t, cfg, recTestLog()) }

// runAgentLog is runAgent logging to log.
func runAgentLog(t *testing.T, cfg Config, log *slog.Logger) {
	t.Helper()
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, log, Options{Ready: ready}) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("agent exited before ready: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("agent not ready after 20s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop within 30s")
		}
	})
}

func recState(t *testing.T, c *libvirtx.Conn, uuid string) string {
	t.Helper()
	st, err := c.State(context.Background(), uuid)
	if err != nil {
		t.Fatal(err)
	}
	return st.String()
}

// TestAgentStartReconciliation: the whole agent (Run) on the libvirt test
// driver, an embedded JetStream and the replay Nova of recorded answers:
// the start reconciliation destroys only the evacuated copy, publishes its
// ReconcileEvent, writes the status file and the metrics.
func TestAgentStartReconciliation(t *testing.T) {
	c := recDomains(t)
	nova := recNova(t)
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	cfg := recConfig(t, ns.ClientURL(), nova.CloudsYAML(t))
	runAgent(t, cfg)

	for u, want := range map[string]string{recEvac1: "shutoff", recEvac2: "running", recOnNode1: "running", recNotNova: "running"} {
		if st := recState(t, c, u); st != want {
			t.Errorf("%s: %s, want %s", u, st, want)
		}
	}
	mark, err := c.Metadata(context.Background(), recEvac1, reconcile.MarkNamespace)
	if err != nil || !strings.Contains(mark, `reason="evacuated-elsewhere"`) || !strings.Contains(mark, `action="destroyed"`) {
		t.Errorf("mark of %s: %q, %v", recEvac1, mark, err)
	}

	st, err := ReadReconcileStatus(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	rep := st.Report
	if rep.Trigger != reconcile.TriggerStart || !rep.OK() || rep.Destroyed != 1 || st.LastSuccess.IsZero() || st.Host != "node1" {
		t.Fatalf("status file: %+v: %s", st, rep.Summary())
	}
	if rep.APICalls != 4 { // token + 1 page + 2 lookups
		t.Errorf("API calls %d, want 4: %v", rep.APICalls, nova.Requests())
	}

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	evs := deliverytest.ReconcileEvents(t, nc, "node1", 1, 15*time.Second)
	if len(evs) != 1 {
		t.Fatalf("reconcile events: %+v", evs)
	}
	e := evs[0]
	if e.DomainUUID != recEvac1 || e.Outcome != proto.ReconcileDestroyed || e.Reason != "evacuated-elsewhere" ||
		e.Trigger != "start" || e.MigrationID != 1 || e.DestCompute != "node2" || e.ServerHost != "node2" || e.SourceCompute != "node1" {
		t.Errorf("event %+v", e)
	}

	// The publish ack may land just after the stream delivered the event.
	metrics := scrape(t, cfg)
	for i := 0; i < 50 && !strings.Contains(metrics, "hvguard_reconcile_events_published_total 1"); i++ {
		time.Sleep(100 * time.Millisecond)
		metrics = scrape(t, cfg)
	}
	for _, want := range []string{
		`hvguard_reconcile_runs_total{outcome="ok",trigger="start"} 1`,
		`hvguard_reconcile_domains_destroyed_total 1`,
		`hvguard_reconcile_consecutive_failures 0`,
		`hvguard_reconcile_events_published_total 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(metrics, "hvguard_reconcile_last_success_timestamp_seconds 0\n") {
		t.Error("last success time not set")
	}
}

// lockedBuffer is an io.Writer safe for the agent's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAgentReconcileEventsWaitForTheStream: the start reconciliation runs
// before NATS is connected, so its events are pending when the agent
// starts; they are published once the lifecycle publisher has found or
// created the stream, without the reconciler's "not published yet"
// warning (issue 15: its first attempt raced the stream's creation and
// warned on every fresh start, the events arriving only after a retry).
//   - fresh: an empty JetStream, the agent creates the stream;
//   - provisioned-late: the agent may not create it (nats.create_stream
//     false) and the operator provisions it after the reconciler had a full
//     retry period to try: the race made deterministic. The publisher's one
//     ERROR about the missing stream is the report.
func TestAgentReconcileEventsWaitForTheStream(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := map[bool]string{false: "fresh", true: "provisioned-late"}[late]
		t.Run(name, func(t *testing.T) {
			recDomains(t)
			nova := recNova(t)
			ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
			cfg := recConfig(t, ns.ClientURL(), nova.CloudsYAML(t))
			cfg.NATS.CreateStream = !late
			var logs lockedBuffer
			runAgentLog(t, cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			if late {
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(logs.String(), "JetStream stream not usable") {
					if time.Now().After(deadline) {
						t.Fatalf("the publisher did not report the missing stream:\n%s", logs.String())
					}
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(reconcilePublishRetry)
				_, js, ctx := deliverytest.JetStream(t, ns)
				if _, err := js.CreateStream(ctx, delivery.StreamConfig(1)); err != nil {
					t.Fatal(err)
				}
			}
			nc, err := nats.Connect(ns.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if evs := deliverytest.ReconcileEvents(t, nc, "node1", 1, 15*time.Second); len(evs) != 1 || evs[0].DomainUUID != recEvac1 {
				t.Fatalf("reconcile events: %+v", evs)
			}
			if !late {
				// A failed first attempt would warn now at the latest.
				time.Sleep(reconcilePublishRetry)
			}
			if w := grepLines(logs.String(), "not published"); w != "" {
				t.Errorf("the reconciler published before the stream was there:\n%s", w)
			}
		})
	}
}

// scrape reads the agent's /metrics.
func scrape(t *testing.T, cfg Config) string {
	t.Helper()
	resp, err := http.Get("http://" + cfg.Metrics.Listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAgentStartReconciliationNovaFaulting: Nova answering 500 → nothing
// destroyed, the status file says why, the failure is counted.
func TestAgentStartReconciliationNovaFaulting(t *testing.T) {
	c := recDomains(t)
	nova := recNova(t)
	nova.FailAll(openstacktest.Fault500)
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	cfg := recConfig(t, ns.ClientURL(), nova.CloudsYAML(t))
	runAgent(t, cfg)
	for _, u := range []string{recEvac1, recEvac2, recOnNode1, recNotNova} {
		if st := recState(t, c, u); st != "running" {
			t.Errorf("%s: %s while Nova was failing", u, st)
		}
	}
	st, err := ReadReconcileStatus(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Report.OK() || st.Report.Global != reconcile.ReasonNovaUnavailable || st.Report.Destroyed != 0 || !st.LastSuccess.IsZero() {
		t.Fatalf("status: %s", st.Report.Summary())
	}
	if st.Report.RetryIn != reconcile.RetryMin {
		t.Errorf("retry in %v, want %v", st.Report.RetryIn, reconcile.RetryMin)
	}
	m := scrape(t, cfg)
	if !strings.Contains(m, `hvguard_reconcile_runs_total{outcome="failed",trigger="start"} 1`) || !strings.Contains(m, "hvguard_reconcile_consecutive_failures 1") {
		t.Errorf("metrics:\n%s", grepLines(m, "hvguard_reconcile"))
	}
	// Nova back: the retry (after reconcile.RetryMin) destroys the copy.
	nova.FailAll(openstacktest.FaultNone)
	deadline := time.Now().Add(10 * time.Second)
	for recState(t, c, recEvac1) != "shutoff" {
		if time.Now().After(deadline) {
			t.Fatal("the retry did not destroy the evacuated copy within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The status file is written when the run has finished (after the
	// destroy and the mark): wait for the retry's report, then judge it.
	st, err = ReadReconcileStatus(cfg.StateDir)
	for err == nil && st.Report.Trigger != reconcile.TriggerRetry && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		st, err = ReadReconcileStatus(cfg.StateDir)
	}
	if err != nil || st.Report.Trigger != reconcile.TriggerRetry || !st.Report.OK() {
		t.Errorf("after the retry: %v %s", err, st.Report.Summary())
	}
	for _, u := range []string{recEvac2, recOnNode1, recNotNova} {
		if st := recState(t, c, u); st != "running" {
			t.Errorf("%s: %s", u, st)
		}
	}
}

// TestReconcileHook: fencing's rejoin hook. Not OK → an error (the host
// stays fenced) and the next attempt waits for the backoff and runs as a
// retry; OK → the evacuated copy is destroyed and dropped (with any
// unknown domain), the others may be resumed.
func TestReconcileHook(t *testing.T) {
	c := recDomains(t)
	nova := recNova(t)
	cfg := recConfig(t, "nats://127.0.0.1:1", nova.CloudsYAML(t))
	client, err := newNova(cfg, recTestLog())
	if err != nil {
		t.Fatal(err)
	}
	r, err := newReconciler(cfg, recTestLog(), client, c, reconcile.ModeDestroy)
	if err != nil {
		t.Fatal(err)
	}
	paused := []string{recEvac1, recEvac2, recOnNode1, recNotNova, "6f1c2a9e-0000-4000-8000-00000000dead"}
	nova.FailAll(openstacktest.FaultDrop)
	if _, err := r.Reconcile(context.Background(), paused); err == nil {
		t.Fatal("Nova down: the hook reported reconciled")
	}
	if last, _ := r.runner.Last(); last.Trigger != reconcile.TriggerRejoin || recState(t, c, recEvac1) != "running" {
		t.Fatalf("after the failed rejoin: %s", last.Summary())
	}
	nova.FailAll(openstacktest.FaultNone)
	start := time.Now()
	drop, err := r.Reconcile(context.Background(), paused)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < reconcile.RetryMin-100*time.Millisecond {
		t.Errorf("the retry did not wait for the backoff (%v)", waited)
	}
	if last, _ := r.runner.Last(); last.Trigger != reconcile.TriggerRetry {
		t.Errorf("trigger %s, want retry", last.Trigger)
	}
	slices.Sort(drop)
	if want := []string{"6f1c2a9e-0000-4000-8000-00000000dead", recEvac1}; !slices.Equal(drop, want) {
		t.Errorf("drop %v, want %v", drop, want)
	}
	if recState(t, c, recEvac1) != "shutoff" || recState(t, c, recEvac2) != "running" {
		t.Error("wrong domains destroyed")
	}
	if pending, err := r.Unreconciled(context.Background()); err != nil || len(pending) != 0 {
		t.Errorf("Unreconciled after OK destroy run: %v, %v", pending, err)
	}
	// Next rejoin: a plain rejoin again (the failure was cleared).
	if _, err := r.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if last, _ := r.runner.Last(); last.Trigger != reconcile.TriggerRejoin {
		t.Errorf("trigger %s, want rejoin", last.Trigger)
	}
}

// TestUnfenceReconciler: the --unfence check lists running stale copies
// from a report-mode run and destroys nothing.
func TestUnfenceReconciler(t *testing.T) {
	c := recDomains(t)
	nova := recNova(t)
	cfg := recConfig(t, "nats://127.0.0.1:1", nova.CloudsYAML(t))
	rec, closeFn, err := NewUnfenceReconciler(context.Background(), cfg, recTestLog())
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	pending, err := rec.Unreconciled(context.Background())
	if err != nil || !slices.Equal(pending, []string{recEvac1}) {
		t.Fatalf("Unreconciled = %v, %v", pending, err)
	}
	if recState(t, c, recEvac1) != "running" {
		t.Fatal("the unfence check destroyed a domain")
	}
	nova.FailAll(openstacktest.Fault500)
	if _, err := rec.Unreconciled(context.Background()); err == nil {
		t.Fatal("Nova failing: no error")
	}
	cfg.Reconcile.Enabled = false
	if rec, _, err := NewUnfenceReconciler(context.Background(), cfg, recTestLog()); rec != nil || err != nil {
		t.Fatalf("disabled: %v %v", rec, err)
	}
}

func TestReconcileConfigValidation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Host = "node1"
	cfg.Reconcile.Enabled = true
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), `openstack.cloud: "": required with reconcile.enabled`) {
		t.Fatalf("enabled without a cloud: %v", err)
	}
	cfg.OpenStack.Cloud = "nope"
	cfg.OpenStack.CloudsFile = filepath.Join(t.TempDir(), "missing.yaml")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `openstack: cloud "nope"`) {
		t.Fatalf("missing clouds.yaml: %v", err)
	}
	cfg = DefaultConfig()
	cfg.Host = "node1"
	cfg.Reconcile.Action = "nuke"
	cfg.Reconcile.Interval = Duration(time.Second)
	cfg.Reconcile.Timeout = 0
	cfg.Reconcile.NovaHosts = []string{"bad host"}
	cfg.OpenStack.Interface = "private"
	err = cfg.Validate()
	for _, want := range []string{`reconcile.action: "nuke"`, "reconcile.interval: 1s", "reconcile.timeout: 0s", `reconcile.nova_hosts[0]: "bad host"`, `openstack.interface: "private"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	// Disabled (the default): no cloud needed, nothing read.
	cfg = DefaultConfig()
	cfg.Host = "node1"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Reconcile.Hosts("node1"); !slices.Equal(got, []string{"node1"}) {
		t.Errorf("default nova hosts %v", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
