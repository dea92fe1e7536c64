//go:build e2e

package recoverye2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/proto"
	"hvguard/test/e2e/openstack/osharness"
)

// The real hvguard-controller binary, built once per test process from
// cmd/hvguard-controller.
var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

func controllerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..", "..")
		dir, err := os.MkdirTemp("", "hvg-e2e-recovery-")
		if err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(dir, "hvguard-controller")
		gobin := os.Getenv("GO")
		if gobin == "" {
			gobin = "go"
		}
		cmd := exec.Command(gobin, "build", "-o", buildBin, "./cmd/hvguard-controller")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/hvguard-controller: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// freeAddr returns a free 127.0.0.1 port for the metrics endpoint.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ctlOpts is what a scenario sets in the controller's configuration; the
// rest stays at the defaults (recovery's included: max_attempts 3,
// retry_base 10 s, ...).
type ctlOpts struct {
	mode         recovery.Mode
	releaseRetry time.Duration // 0: the default (30 s)
}

// ctlProc is one hvguard-controller process.
type ctlProc struct {
	id, addr, logPath string
	cmd               *exec.Cmd
	done              chan error
}

// startController writes a configuration and starts the binary. Differences
// from the defaults, each needed by this rig rather than by recovery:
// guard.share 1 (one host in the bucket: the default share 0.2 of 1 host
// makes the threshold 0, so its silence alone would hold the guard), and
// tracker.accept_agent_dependent_backstop (node1's agent runs on the
// libvirt test driver with no watchdog device: its backstop is its own
// reset, which the test records as an error if it ever happens).
func startController(t *testing.T, id, natsURL, clouds string, o ctlOpts) *ctlProc {
	t.Helper()
	dir := t.TempDir()
	c := &ctlProc{id: id, addr: freeAddr(t), logPath: filepath.Join(dir, id+".log")}
	rel := ""
	if o.releaseRetry > 0 {
		rel = fmt.Sprintf("  release_retry: %s\n", o.releaseRetry)
	}
	cfg := fmt.Sprintf(`id: %s
log: {level: debug, format: text}
nats: {urls: [%q], ready_timeout: 5s}
guard: {share: 1}
tracker: {accept_agent_dependent_backstop: true}
recovery:
  mode: %s
%sopenstack:
  cloud: %s
  service_cloud: %s
  clouds_file: %s
metrics: {listen: %q}
`, id, natsURL, o.mode, rel, osharness.CloudName, osharness.ServiceCloudName, clouds, c.addr)
	path := filepath.Join(dir, "controller.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(controllerBinary(t), "--config", path)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.done = make(chan error, 1)
	go func() { c.done <- c.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() || os.Getenv("HVG_TEST_LOG") != "" {
			b, _ := os.ReadFile(c.logPath)
			t.Logf("controller %s log (last 6000 bytes):\n%s", id, tail(b, 6000))
		}
	})
	return c
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// stop sends SIGTERM (an orderly stop: it resigns the lock) and waits.
func (c *ctlProc) stop() {
	if c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.done <- nil // later stop()s return at once
}

// kill is a crash: SIGKILL, no resignation (a standby takes over only once
// the lock's TTL has passed).
func (c *ctlProc) kill() {
	_ = c.cmd.Process.Kill()
	err := <-c.done
	c.done <- err
}

// metric returns the value of an unlabelled metric of the controller's
// /metrics, or an error.
func (c *ctlProc) metric(name string) (string, error) {
	cl := http.Client{Timeout: 2 * time.Second}
	r, err := cl.Get("http://" + c.addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return "", err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no metric %s", name)
}

// leader reports whether the controller holds the lock and may act.
func (c *ctlProc) leader() bool {
	v, err := c.metric("hvguard_controller_leader")
	return err == nil && v == "1"
}

// waitLeader returns the first of cs that leads, failing after timeout.
func waitLeader(t *testing.T, timeout time.Duration, cs ...*ctlProc) *ctlProc {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, c := range cs {
			if c.leader() {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no controller leads after %v", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// events collects the controllers' recovery events from NATS.
type events struct {
	mu  sync.Mutex
	evs []controller.RecoveryEvent
}

func subscribeEvents(t *testing.T, nc *nats.Conn) *events {
	t.Helper()
	e := &events{}
	sub, err := nc.Subscribe(proto.ControllerRecoverySubject, func(m *nats.Msg) {
		var ev controller.RecoveryEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		e.mu.Lock()
		e.evs = append(e.evs, ev)
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return e
}

// ops returns the events of host with op, in arrival order.
func (e *events) ops(host, op string) []controller.RecoveryEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []controller.RecoveryEvent
	for _, ev := range e.evs {
		if ev.Host == host && ev.Op == op {
			out = append(out, ev)
		}
	}
	return out
}

// wait polls until host has n events with op.
func (e *events) wait(t *testing.T, host, op string, n int, timeout time.Duration) []controller.RecoveryEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if evs := e.ops(host, op); len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %q events of %s after %v (want %d): %s", len(e.ops(host, op)), op, host, timeout, n, e)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.evs {
		fmt.Fprintf(&b, "\n  %s %s %s %s phase=%s inst=%s why=%s %s %s", ev.At.Format("15:04:05.000"), ev.Controller, ev.Host, ev.Op,
			ev.Phase, ev.Instance, ev.Why, ev.Reason, ev.Error)
	}
	return b.String()
}

// record reads host's recovery record from the hvguard-host-recovery bucket.
func record(ctx context.Context, js jetstream.JetStream, host string) (recovery.Record, error) {
	kv, err := js.KeyValue(ctx, recovery.Bucket)
	if err != nil {
		return recovery.Record{}, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return recovery.Record{}, err
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		rec, err := recovery.DecodeRecord(e.Value())
		if err == nil && rec.Host == host {
			return rec, nil
		}
	}
	return recovery.Record{}, errors.New("no recovery record of " + host)
}

// waitPhase polls the record until its phase is one of want.
func waitPhase(t *testing.T, ctx context.Context, js jetstream.JetStream, host string, timeout time.Duration, want ...recovery.Phase) recovery.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var rec recovery.Record
	var err error
	for {
		rec, err = record(ctx, js, host)
		for _, p := range want {
			if err == nil && rec.Phase == p {
				return rec
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("recovery of %s not in %v after %v: phase %q reason %q (err %v)", host, want, timeout, rec.Phase, rec.Reason, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
