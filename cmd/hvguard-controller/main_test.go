package main

import (
	"github.com/nats-io/nats-server/v2/server"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/controller/daemon"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEveryFlag(t *testing.T) {
	code, _, errOut := runCLI("--help")
	if code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, f := range []string{"--config", "--check-config", "--print-defaults", "--log-level", "--log-format", "--version",
		"status", "--json", "--addr", "nats-accounts", "--keys", "READY=1", "WATCHDOG=1", "STATUS=", "/metrics", "/healthz", "/status", "78", "SIGTERM"} {
		if !strings.Contains(errOut, f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("id: ctl-1\nnats:\n  urls: [tls://10.0.0.1:4222]\n"), 0o600)
	os.WriteFile(bad, []byte("leader:\n  ttl: -3s\nguard:\n  share: 7\n"), 0o600)

	if code, out, errOut := runCLI("--config", good, "--check-config"); code != 0 || !strings.Contains(out, "valid") || !strings.Contains(out, "ctl-1") {
		t.Errorf("valid config: exit %d, out %q, err %q", code, out, errOut)
	}
	if code, out, _ := runCLI("--check-config", good); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("--check-config PATH: exit %d, out %q", code, out)
	}
	if code, _, _ := runCLI("--config", good, "--check-config", bad); code != 2 {
		t.Errorf("--config X --check-config Y: exit %d, want 2 (ambiguous)", code)
	}
	code, _, errOut := runCLI("--config", bad, "--check-config")
	if code != ExitConfig || !strings.Contains(errOut, "leader.ttl") || !strings.Contains(errOut, "-3s") ||
		!strings.Contains(errOut, "guard.share") || !strings.Contains(errOut, "7") {
		t.Errorf("invalid config: exit %d, err %q; want exit 78 naming leader.ttl -3s and guard.share 7", code, errOut)
	}
	if code, _, errOut := runCLI("--config", filepath.Join(dir, "missing.yaml"), "--check-config"); code != ExitConfig || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("missing config: exit %d, err %q", code, errOut)
	}
	if code, _, errOut := runCLI("--config", good, "--check-config", "--log-level", "loud"); code != ExitConfig || !strings.Contains(errOut, "log.level") {
		t.Errorf("--log-level loud: exit %d, err %q", code, errOut)
	}
	if code, _, _ := runCLI("stray"); code != 2 {
		t.Errorf("stray argument: exit %d, want 2", code)
	}
}

// The printed defaults are themselves a valid configuration, and read back
// as the defaults.
func TestPrintDefaultsRoundTrips(t *testing.T) {
	code, out, _ := runCLI("--print-defaults")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	p := filepath.Join(t.TempDir(), "defaults.yaml")
	os.WriteFile(p, []byte(out), 0o600)
	if code, _, errOut := runCLI("--config", p, "--check-config"); code != 0 {
		t.Fatalf("printed defaults do not validate: %s\n%s", errOut, out)
	}
	cfg, err := daemon.LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID = ""
	again, _ := yaml.Marshal(cfg)
	if string(again) != out {
		t.Fatalf("defaults do not round-trip:\n%s\n---\n%s", out, again)
	}
}

// status against a running controller (in-process, embedded JetStream):
// text and JSON; exit 1 when nothing answers.
func TestStatusCommand(t *testing.T) {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	cfg := daemon.DefaultConfig()
	cfg.ID = "ctl-status"
	cfg.NATS.URLs = []string{srv.ClientURL()}
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.Leader = daemon.LeaderConfig{TTL: daemon.Duration(time.Second), RenewInterval: daemon.Duration(250 * time.Millisecond),
		WriteTimeout: daemon.Duration(200 * time.Millisecond), ActMargin: daemon.Duration(200 * time.Millisecond)}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), daemon.Options{Listening: func(a string) { addr <- a }})
	}()
	defer func() { cancel(); <-done }()
	a := <-addr

	// Until it leads (1.02 s), it is a standby with no leader.
	var st daemon.Status
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		code, out, errOut := runCLI("status", "--json", "--addr", a)
		if code != 0 {
			t.Fatalf("status --json: exit %d: %s", code, errOut)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
		if st.Role == "leader" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Role != "leader" || st.Leader != "ctl-status" || st.LeaderTerm != 1 || st.Tracker == nil || st.Health != "ok" {
		t.Fatalf("status %+v: want the leader ctl-status, term 1, a lease view, health ok", st)
	}
	code, out, errOut := runCLI("status", "--addr", a)
	if code != 0 || !strings.Contains(out, "controller ctl-status") || !strings.Contains(out, "leader") || !strings.Contains(out, "ctl-status (term 1)") {
		t.Fatalf("status: exit %d, out %q, err %q", code, out, errOut)
	}
	// status HOST (flags after the host): a host nothing was heard from.
	if code, out, errOut := runCLI("status", "node9", "--addr", a); code != 0 || !strings.Contains(out, "host node9: no event seen from it") {
		t.Fatalf("status node9: exit %d, out %q, err %q", code, out, errOut)
	}
	if !strings.Contains(out, "events:     consumer hvguard-controller-ctl-status") {
		t.Fatalf("status shows no event-stream section: %q", out)
	}
	// --config: the address is its metrics.listen.
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte(fmt.Sprintf("metrics:\n  listen: %q\n", a)), 0o600)
	if code, out, _ := runCLI("status", "--config", p); code != 0 || !strings.Contains(out, "ctl-status") {
		t.Fatalf("status --config: exit %d, out %q", code, out)
	}
	cancel()
	<-done
	done <- nil
	if code, _, errOut := runCLI("status", "--addr", a); code != 1 || !strings.Contains(errOut, "no controller answers") {
		t.Fatalf("status with nothing listening: exit %d, err %q; want 1", code, errOut)
	}
	if code, _, _ := runCLI("status", "node1", "extra"); code != 2 {
		t.Fatalf("status node1 extra: exit %d, want 2", code)
	}
}

// nats-accounts creates a seed per user once (0600), prints an accounts
// block nats-server parses, and refuses a bad user.
func TestNATSAccounts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	code, out, errOut := runCLI("nats-accounts", "--keys", dir, "agent:compute-1.example.org", "controller:ctl-1", "reader:dash")
	if code != 0 || !strings.Contains(out, "hvguard.v1.compute-1_example_org.lifecycle") || strings.Count(errOut, "created ") != 5 {
		t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
	}
	st, err := os.Stat(filepath.Join(dir, "agent-compute-1.example.org.nk"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed: %v %v", st, err)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	os.WriteFile(conf, []byte(out), 0o600)
	// Three users in HVGUARD, the controller's and the reader's second
	// users in HVGUARD_CONTROL.
	if o, err := server.ProcessConfigFile(conf); err != nil || len(o.Nkeys) != 5 {
		t.Fatalf("nats-server: %v", err)
	}
	// Again: the same keys, nothing created.
	code, out2, errOut := runCLI("nats-accounts", "--keys", dir, "agent:compute-1.example.org", "controller:ctl-1", "reader:dash")
	if code != 0 || out2 != out || errOut != "" {
		t.Fatalf("second run: exit %d, same %v, err %q", code, out2 == out, errOut)
	}
	if code, _, errOut := runCLI("nats-accounts", "--keys", dir, "agent:bad_host"); code != 2 || !strings.Contains(errOut, "agent:bad_host") {
		t.Fatalf("bad host: exit %d, err %q", code, errOut)
	}
}

// TestNATSAccountsReceiptsStreams: --receipts-streams writes one stream
// configuration per agent (not the controllers' or readers'), each
// capturing that agent's subject only; nats-server creates each stream
// from its file as it is (the API request nats stream add --config
// makes), and it vouches for its agent's receipts and no other's; bad
// --replicas, no agent, or the old --receipts-stream is a bad command
// line.
func TestNATSAccountsReceiptsStreams(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	out := filepath.Join(t.TempDir(), "streams")
	agents := []string{"compute-1.example.org", "compute-2.example.org"}
	code, _, errOut := runCLI("nats-accounts", "--keys", dir, "--receipts-streams", out, "agent:"+agents[0], "agent:"+agents[1], "controller:ctl-1", "reader:dash")
	if code != 0 || !strings.Contains(errOut, "nats stream add --config "+out) {
		t.Fatalf("exit %d, err %q", code, errOut)
	}
	files, err := filepath.Glob(filepath.Join(out, "*.json"))
	if err != nil || len(files) != len(agents) {
		t.Fatalf("files %q (%v): want one per agent", files, err)
	}
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, js, ctx := deliverytest.JetStream(t, srv)
	for i, h := range agents {
		name, _ := proto.WithdrawalStreamOf(h)
		b, err := os.ReadFile(filepath.Join(out, name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.CREATE."+name, b)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(resp.Data), `"error"`) {
			t.Fatalf("nats-server refused %s's file: %s", h, resp.Data)
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if err := natslease.ReceiptsUnsound(c, h); err != nil {
			t.Fatalf("the stream from %s's file: %v", h, err)
		}
		if err := natslease.ReceiptsUnsound(c, agents[1-i]); err == nil {
			t.Fatalf("%s's stream vouches for %s", h, agents[1-i])
		}
	}
	if code, _, errOut := runCLI("nats-accounts", "--keys", dir, "--receipts-streams", out, "--replicas", "9", "agent:"+agents[0]); code != 2 || !strings.Contains(errOut, "--replicas 9") {
		t.Fatalf("--replicas 9: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCLI("nats-accounts", "--keys", dir, "--receipts-streams", out, "controller:ctl-1"); code != 2 || !strings.Contains(errOut, "agent:HOST") {
		t.Fatalf("no agent: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCLI("nats-accounts", "--keys", dir, "--receipts-stream", "x.json", "agent:"+agents[0]); code != 2 || !strings.Contains(errOut, "--receipts-streams DIR") {
		t.Fatalf("old --receipts-stream: exit %d, %q", code, errOut)
	}
}

// TestConfirmRollbackCommand: confirm-rollback (and mark-rollback) refuses a bad command line
// (2), a bad host name (2) and a bad configuration (78); on a real NATS it
// writes each host's confirmation to the control bucket (0), where the
// controllers' rollback gate reads it (controller/rollbackconfirm.go).
func TestConfirmRollbackCommand(t *testing.T) {
	if code, _, errOut := runCLI("confirm-rollback"); code != 2 || !strings.Contains(errOut, "at least one HOST") {
		t.Fatalf("no host: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCLI("confirm-rollback", "bad*host"); code != 2 || !strings.Contains(errOut, `host "bad*host"`) {
		t.Fatalf("bad host: exit %d, %q", code, errOut)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("guard:\n  share: 7\n"), 0o600)
	if code, _, errOut := runCLI("confirm-rollback", "--config", bad, "h1"); code != 78 || !strings.Contains(errOut, "guard.share") {
		t.Fatalf("bad config: exit %d, %q", code, errOut)
	}
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, js, ctx := deliverytest.JetStream(t, srv)
	defer nc.Close()
	kv, err := controller.EnsureControlBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("id: ctl-1\nnats:\n  urls: ["+srv.ClientURL()+"]\n"), 0o600)
	if code, _, errOut := runCLI("confirm-rollback", "--config", good, "h1.example.org"); code != 1 || !strings.Contains(errOut, "no rollback marker") {
		t.Fatalf("confirm with no marker: exit %d, %q", code, errOut)
	}
	if code, out, errOut := runCLI("mark-rollback", "--config", good, "--reason", "restored"); code != 0 || !strings.Contains(out, "rollback marker written") {
		t.Fatalf("mark-rollback: exit %d, %q, %q", code, out, errOut)
	}
	if e, err := kv.Get(ctx, controller.RollbackMarkerKey); err != nil || !strings.Contains(string(e.Value()), `"reason":"restored"`) {
		t.Fatalf("the marker: %v", err)
	}
	code, out, errOut := runCLI("confirm-rollback", "--config", good, "h1.example.org", "h2.example.org", "--reason", "powered off")
	if code != 0 || !strings.Contains(out, "h1.example.org: confirmed") || !strings.Contains(out, "h2.example.org: confirmed") {
		t.Fatalf("confirm-rollback: exit %d, %q, %q", code, out, errOut)
	}
	if code, _, errOut := runCLI("mark-rollback", "--config", good, "extra"); code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Fatalf("mark-rollback extra: exit %d, %q", code, errOut)
	}
	code, out, errOut = runCLI("mark-rollback", "--config", good, "--clear")
	if code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("mark-rollback --clear: exit %d, %q, %q", code, out, errOut)
	}
	if _, err := kv.Get(ctx, controller.RollbackMarkerKey); err == nil {
		t.Fatal("the marker is still there after --clear")
	}
	k, _ := controller.ConfirmKey("h2.example.org")
	e, err := kv.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	var c controller.RollbackConfirmation
	if err := json.Unmarshal(e.Value(), &c); err != nil || c.Host != "h2.example.org" || c.Reason != "powered off" || c.By == "" || c.Marker == "" {
		t.Fatalf("stored confirmation %s (%v)", e.Value(), err)
	}
}
