//go:build e2e

package classifye2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/proto"
	"hvguard/test/e2e/openstack/osharness"
)

// envInt reads a positive integer from the environment (def if unset).
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number >= 0", name, s)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a duration such as 45s", name, s)
	}
	return d
}

// agentLog writes an agent's log (info, text) to dir/agent-<name>.log: the
// files are kept after the run (run.sh names the directory) to tell why a
// stop was classified as it was.
func agentLog(t *testing.T, dir, name string) *slog.Logger {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "agent-"+name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", name)
}

// logDir is HVG_STORM_LOGDIR, else a new directory under the temp dir; it
// is not removed.
func logDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("HVG_STORM_LOGDIR")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "hvguard-storm-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runningAgent is one real agent.Run in this process, host node3 on
// qemu:///system, publishing to its own embedded nats-server.
type runningAgent struct {
	name string
	ns   *server.Server
	stop func() error
}

// startAgent starts an agent and waits until it is ready. With clouds != ""
// Nova classification is on (openstack.cloud from that clouds.yaml).
func startAgent(t *testing.T, name, clouds, logs string) *runningAgent {
	t.Helper()
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	cfg := agent.DefaultConfig()
	cfg.Host = osharness.LibvirtHost
	cfg.StateDir = t.TempDir()
	cfg.Libvirt.URI = "qemu:///system"
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.NATS.ReadyTimeout = agent.Duration(2 * time.Second)
	cfg.Metrics.Listen = ""
	cfg.Status.Socket = ""
	if clouds != "" {
		cfg.OpenStack.Cloud = osharness.CloudName
		cfg.OpenStack.CloudsFile = clouds
		cfg.Classification.Enabled = true
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("agent %s config: %v", name, err)
	}
	log := agentLog(t, logs, name)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, log, agent.Options{Ready: ready}) }()
	var once sync.Once
	var stopErr error
	a := &runningAgent{name: name, ns: ns, stop: func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(time.Minute):
				stopErr = fmt.Errorf("agent %s did not stop within a minute", name)
			}
		})
		return stopErr
	}}
	t.Cleanup(func() { _ = a.stop() })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent %s exited before ready: %v", name, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("agent %s not ready after 2 min", name)
	}
	return a
}

// published is one lifecycle message as stored by JetStream.
type published struct {
	ev     proto.LifecycleEvent
	stored time.Time // JetStream's store time: when a consumer can see it
}

// stream returns the agent's JetStream stream.
func (a *runningAgent) stream(ctx context.Context) (jetstream.Stream, func(), error) {
	nc, err := nats.Connect(a.ns.ClientURL())
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	s, err := js.Stream(ctx, proto.StreamName)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return s, nc.Close, nil
}

// count is the number of messages in the agent's stream.
func (a *runningAgent) count(ctx context.Context) (uint64, error) {
	s, closeFn, err := a.stream(ctx)
	if err != nil {
		return 0, err
	}
	defer closeFn()
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// messages reads every lifecycle message of the agent's stream in order.
func (a *runningAgent) messages(t *testing.T, ctx context.Context) []published {
	t.Helper()
	s, closeFn, err := a.stream(ctx)
	if err != nil {
		t.Fatalf("agent %s stream: %v", a.name, err)
	}
	defer closeFn()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	subj, err := proto.LifecycleSubject(osharness.LibvirtHost)
	if err != nil {
		t.Fatal(err)
	}
	var out []published
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("agent %s stream seq %d: %v", a.name, seq, err)
		}
		if m.Subject != subj {
			continue
		}
		ev, err := proto.DecodeLifecycle(m.Data)
		if err != nil {
			t.Errorf("agent %s: undecodable message %d: %v: %s", a.name, seq, err, m.Data)
			continue
		}
		out = append(out, published{ev: ev, stored: m.Time})
	}
	return out
}

// waitQuiet waits until neither agent published anything for quiet (at
// most max), so every held or pending stop has been reported.
func waitQuiet(t *testing.T, ctx context.Context, quiet, max time.Duration, as ...*runningAgent) {
	t.Helper()
	deadline := time.Now().Add(max)
	last, since := "", time.Now()
	for {
		var cs []string
		for _, a := range as {
			n, err := a.count(ctx)
			if err != nil {
				t.Fatalf("agent %s: %v", a.name, err)
			}
			cs = append(cs, fmt.Sprint(n))
		}
		if c := strings.Join(cs, "/"); c != last {
			last, since = c, time.Now()
		}
		if time.Since(since) >= quiet {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("agents still publishing after %v (messages %s)", max, last)
			return
		}
		time.Sleep(time.Second)
	}
}

// startStress runs `stress-ng --cpu n` on the host until the test ends (0 =
// no load). It is this test's own process group: it is ended by its pid.
func startStress(t *testing.T, n int) {
	t.Helper()
	if n == 0 {
		return
	}
	bin, err := exec.LookPath("stress-ng")
	if err != nil {
		t.Fatalf("stress-ng not installed (apt-get install stress-ng; test/e2e/classify/run.sh does it): %v", err)
	}
	cmd := exec.Command(bin, "--cpu", strconv.Itoa(n), "--quiet")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
}

// loadavg is the 1-minute load average.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// novaLogTime returns when node3's nova-compute logged a line containing
// both "[instance: id]" and what, at or after since (the log is in local
// time, as nova writes it), or the zero time.
func novaLogTime(workDir, id, what string, since time.Time) (time.Time, error) {
	f, err := os.Open(filepath.Join(workDir, "log", "nova-compute-"+osharness.LibvirtHost+".log"))
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	return scanNovaLog(f, "[instance: "+id+"]", what, since)
}

func scanNovaLog(r io.Reader, inst, what string, since time.Time) (time.Time, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if len(l) < 23 || !strings.Contains(l, inst) || !strings.Contains(l, what) {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.000", l[:23], time.Local)
		if err == nil && !at.Before(since.Truncate(time.Millisecond)) {
			return at, nil
		}
	}
	return time.Time{}, sc.Err()
}

// waitStops waits until the agent published a stopped message for every
// uuid (at most timeout).
func (a *runningAgent) waitStops(t *testing.T, ctx context.Context, timeout time.Duration, uuids ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, m := range a.messages(t, ctx) {
			if m.ev.Transition == proto.TransitionStopped {
				seen[m.ev.DomainUUID] = true
			}
		}
		var missing []string
		for _, u := range uuids {
			if !seen[u] {
				missing = append(missing, u)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s: no stopped message for %v after %v", a.name, missing, timeout)
		}
		time.Sleep(time.Second)
	}
}
