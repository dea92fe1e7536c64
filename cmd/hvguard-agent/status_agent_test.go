package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/lifecycle"
	"hvguard/test/netcut"
)

// `hvguard-agent status` against the real agent (agent.Run in-process:
// libvirt's test driver, an embedded JetStream behind a blackholing
// proxy), through the CLI: the socket, its permissions, the JSON shape,
// each exit code, and the fallback to the state files once the agent is
// down.

// noDomains restricts fencing to no domain: the test driver is shared by
// the process (production fences every domain).
type noDomains struct{ agent.FenceHypervisor }

func (noDomains) ListDomains(context.Context) ([]lifecycle.DomainSnapshot, error) { return nil, nil }

type statusRig struct {
	t      *testing.T
	ns     *server.Server
	prx    *netcut.Proxy
	conf   string
	socket string
	state  string
	cancel context.CancelFunc
	done   chan error
}

// newStatusRig writes a configuration (fencing at ×0.1 timing when fence)
// whose status socket is in a directory that does not exist yet.
func newStatusRig(t *testing.T, fence bool) *statusRig {
	dir := t.TempDir()
	r := &statusRig{t: t, ns: deliverytest.StartJetStream(t, t.TempDir(), -1), socket: filepath.Join(dir, "run", "agent.sock"),
		state: filepath.Join(dir, "state"), conf: filepath.Join(dir, "agent.yaml")}
	r.prx = netcut.New(t, r.ns.Addr().String())
	yaml := fmt.Sprintf(`host: status-h1.example.org
state_dir: %s
libvirt: {uri: "test:///default"}
lifecycle: {window: 400ms}
nats: {urls: ["nats://%s"], ready_timeout: 2s}
metrics: {listen: ""}
status: {socket: %s}
shutdown_timeout: 1s
`, r.state, r.prx.Addr(), r.socket)
	if fence {
		secret := filepath.Join(dir, "peer.secret")
		if err := os.WriteFile(secret, []byte("status-test-shared-secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		yaml += fmt.Sprintf(`fence:
  enabled: true
  action: pause
  peer_listen: "127.0.0.1:0"
  peer_secret_file: %s
  peer_url: "http://127.0.0.1:9/{host}"
  renew_interval: 200ms
  renew_timeout: 200ms
  peer_timeout: 300ms
  fence_deadline: 500ms
  lease_ttl: 1500ms
  held_recheck: 500ms
  members_refresh: 500ms
  runtime_dir: %s
`, secret, filepath.Join(dir, "runtime"))
	}
	if err := os.WriteFile(r.conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs the agent on the rig's configuration until ready.
func (r *statusRig) start() {
	cfg, err := agent.LoadConfig(r.conf)
	if err != nil {
		r.t.Fatal(err)
	}
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("HVGUARD_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	go func() {
		r.done <- agent.Run(ctx, cfg, log, agent.Options{Ready: ready,
			WrapFenceHypervisor: func(h agent.FenceHypervisor) agent.FenceHypervisor { return noDomains{h} }})
	}()
	select {
	case <-ready:
	case err := <-r.done:
		r.t.Fatalf("agent exited: %v", err)
	case <-time.After(20 * time.Second):
		r.t.Fatal("agent not ready after 20 s")
	}
	r.t.Cleanup(r.stop)
}

func (r *statusRig) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.t.Fatal("agent did not stop within 30 s")
	}
	r.cancel = nil
}

// status runs `hvguard-agent status --json` and decodes it strictly.
func (r *statusRig) status() (int, agent.Status) {
	r.t.Helper()
	code, out, errOut := runCLI("status", "--json", "--config", r.conf)
	var st agent.Status
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		r.t.Fatalf("status --json: %v\n%s\n%s", err, out, errOut)
	}
	return code, st
}

// waitStatus polls status until ok, or fails after 15 s.
func (r *statusRig) waitStatus(what string, ok func(int, agent.Status) bool) (int, agent.Status) {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, st := r.status()
		if ok(code, st) {
			return code, st
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("status never %s: exit %d, %+v", what, code, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The JSON's top-level and nested keys are the documented contract
// (README "Status"): a rename breaks scripts, so it must break this test.
func TestStatusJSONShapeAndHealthy(t *testing.T) {
	r := newStatusRig(t, true)
	// A stale socket left by a killed agent is replaced.
	if err := os.MkdirAll(filepath.Dir(r.socket), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", r.socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	r.start()

	fi, err := os.Stat(r.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != agent.StatusSocketMode {
		t.Errorf("socket %s: mode %v, want a socket with %v (root only)", r.socket, fi.Mode(), fs.FileMode(agent.StatusSocketMode))
	}

	code, st := r.waitStatus("healthy", func(c int, st agent.Status) bool { return c == agent.ExitHealthy })
	if st.Source != "agent" || st.Health != agent.HealthHealthy || len(st.Problems) != 0 || st.Fence.State != "healthy" || !st.Fence.LeaseHeld ||
		st.Fence.LeaseAgeSeconds == nil || *st.Fence.LeaseAgeSeconds > 5 || st.Fence.Watchdog != "none" || !st.NATS.Connected || !st.Libvirt.Connected ||
		st.Outbox.MaxEvents != agent.DefaultOutboxMaxEvents || st.Stops == nil || st.PID != os.Getpid() {
		t.Errorf("healthy agent: exit %d, %+v", code, st)
	}

	_, out, _ := runCLI("status", "--json", "--config", r.conf)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]json.RawMessage) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	want := map[string][]string{
		"":       {"fence", "health", "host", "libvirt", "nats", "now", "outbox", "pid", "problems", "reconcile_enabled", "source", "started_at", "stops", "version"},
		"fence":  {"action", "enabled", "last_renewal", "lease_age_seconds", "lease_held", "paused_domains", "reason", "state", "watchdog"},
		"nats":   {"connected", "endpoint"},
		"outbox": {"bytes", "depth", "dropped", "gap_markers", "max_bytes", "max_events"},
		"stops":  {"classifying", "domains_tracked", "held"},
	}
	for part, ks := range want {
		m := raw
		if part != "" {
			m = nil
			if err := json.Unmarshal(raw[part], &m); err != nil {
				t.Fatalf("%s: %v", part, err)
			}
		}
		if got := keys(m); !slices.Equal(got, ks) {
			t.Errorf("status --json %q keys = %v, want %v", part, got, ks)
		}
	}

	code, text, _ := runCLI("--status", "--config", r.conf) // the old spelling
	for _, w := range []string{"hvguard-agent on status-h1.example.org: HEALTHY", "source:       the running agent", "fence:        healthy",
		"action pause, watchdog none", "lease:        held, last renewal landed", "nats:         connected", "libvirt:      connected, test:///default",
		"outbox:       ", "held stops:   0 in their window", "reconcile:    none recorded"} {
		if !strings.Contains(text, w) {
			t.Errorf("status text lacks %q:\n%s", w, text)
		}
	}
	if code != agent.ExitHealthy || strings.Contains(text, "problems:") {
		t.Errorf("--status: exit %d:\n%s", code, text)
	}

	// unfence and its older spelling reach the lease bucket: a healthy
	// host has nothing to release.
	for _, cmd := range []string{"unfence", "--unfence"} {
		code, out, errOut := runCLI(cmd, "--config", r.conf)
		if code != 1 || !strings.Contains(errOut, "nothing to release") {
			t.Errorf("%s on a healthy host: exit %d, %q %q", cmd, code, out, errOut)
		}
	}
}

// Degraded (1): NATS gone, fencing off. Down (4): the agent stopped.
func TestStatusDegradedThenDown(t *testing.T) {
	r := newStatusRig(t, false)
	r.start()
	if code, st := r.status(); code != agent.ExitHealthy || st.Fence.Enabled {
		t.Fatalf("exit %d, %+v", code, st)
	}
	r.ns.Shutdown()
	_, st := r.waitStatus("degraded", func(c int, _ agent.Status) bool { return c == agent.ExitDegraded })
	if st.Health != agent.HealthDegraded || len(st.Problems) == 0 || !strings.Contains(st.Problems[0], "NATS disconnected") {
		t.Errorf("degraded: %+v", st)
	}
	code, text, _ := runCLI("status", "--config", r.conf)
	if code != agent.ExitDegraded || !strings.Contains(text, ": DEGRADED") || !strings.Contains(text, "problems:     - NATS disconnected") ||
		!strings.Contains(text, "nats:         DISCONNECTED") {
		t.Errorf("degraded text, exit %d:\n%s", code, text)
	}

	r.stop()
	if _, err := os.Stat(r.socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind after a clean stop: %v", err)
	}
	code, st = r.status()
	if code != agent.ExitDown || st.Health != agent.HealthDown || st.Source != "state-files" || st.NATS != nil || st.PID != 0 {
		t.Errorf("agent down: exit %d, %+v", code, st)
	}
	code, text, _ = runCLI("status", "--config", r.conf)
	if code != agent.ExitDown || !strings.Contains(text, ": DOWN") || !strings.Contains(text, "STATE FILES ONLY: status socket "+r.socket) {
		t.Errorf("down text, exit %d:\n%s", code, text)
	}
}

// Fenced (3): the link to NATS cut, the agent fences itself; still 3
// from fence.json once the agent is down.
func TestStatusFencedThenDownFenced(t *testing.T) {
	r := newStatusRig(t, true)
	r.start()
	r.waitStatus("healthy", func(c int, _ agent.Status) bool { return c == agent.ExitHealthy })
	r.prx.Blackhole(true)
	_, st := r.waitStatus("fenced", func(c int, st agent.Status) bool { return c == agent.ExitFenced && st.Fence.State == "fenced" })
	if st.Source != "agent" || st.Health != agent.HealthFenced || !strings.HasPrefix(st.Problems[0], "host is fenced (") {
		t.Errorf("fenced: %+v", st)
	}
	code, text, _ := runCLI("status", "--config", r.conf)
	if code != agent.ExitFenced || !strings.Contains(text, ": FENCED") || !strings.Contains(text, "fence:        fenced (") {
		t.Errorf("fenced text, exit %d:\n%s", code, text)
	}

	r.stop() // NATS unreachable: the stop path fences (it is fenced already)
	code, st = r.status()
	if code != agent.ExitFenced || st.Source != "state-files" || st.Fence.State != "fenced" || st.Health != agent.HealthFenced {
		t.Errorf("down and fenced: exit %d, %+v", code, st)
	}
	code, text, _ = runCLI("status", "--config", r.conf)
	if code != agent.ExitFenced || !strings.Contains(text, "STATE FILES ONLY") || !strings.Contains(text, "lease:        unknown (agent down)") {
		t.Errorf("down and fenced text, exit %d:\n%s", code, text)
	}
}

// A path that is not a socket is never removed: the agent runs without
// its status socket (logged), and status falls back to the files.
func TestStatusSocketPathNotASocket(t *testing.T) {
	r := newStatusRig(t, false)
	if err := os.MkdirAll(filepath.Dir(r.socket), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.socket, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.start()
	if b, err := os.ReadFile(r.socket); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file at status.socket was touched: %q %v", b, err)
	}
	code, st := r.status()
	if st.Source != "state-files" || code != agent.ExitDown || !strings.Contains(st.SourceError, "holds agent.lock: the agent runs but does not answer") {
		t.Errorf("exit %d, %+v", code, st)
	}
}

func TestStatusCommandLine(t *testing.T) {
	for _, args := range [][]string{{"--json"}, {"--socket", "/x"}, {"status", "--unfence"}, {"unfence", "--status"}, {"status", "extra"}} {
		if code, _, _ := runCLI(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	code, _, errOut := runCLI("--help")
	for _, w := range []string{"hvguard-agent status [--json]", "hvguard-agent unfence", "alias --status", "alias --unfence", "0 healthy, 1 degraded", "3\nfenced", "4 the agent is down"} {
		if !strings.Contains(strings.ReplaceAll(errOut, "\n", "\n"), w) && !strings.Contains(strings.Join(strings.Fields(errOut), " "), strings.Join(strings.Fields(w), " ")) {
			t.Errorf("--help (exit %d) lacks %q", code, w)
		}
	}
}
