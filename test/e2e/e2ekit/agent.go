// Package e2ekit holds what the real-OpenStack e2e scenarios share: node1's
// whole agent (agent.Run) on the libvirt test driver with fencing at x0.1
// timing, its fence transitions, its reconciliation status, and the test
// driver's domains. Used by test/e2e/agent (issue 4) and test/e2e/recovery
// (issue 13).
package e2ekit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/fencing"
	"hvguard/libvirtx"
	"hvguard/reconcile"
	"hvguard/test/e2e/openstack/osharness"
)

func Log(t *testing.T) *slog.Logger {
	if os.Getenv("HVG_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// FenceConfig turns fencing on with ×0.1 timing (fenced ~1 s after the
// cut) and no peers (nobody listens at the peer URL: a cut-off host hears
// from no peer, as a really isolated one would).
func FenceConfig(t *testing.T, cfg *agent.Config) {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "peer.secret")
	if err := os.WriteFile(secret, []byte("e2e-test-shared-peer-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &cfg.Fence
	f.Enabled, f.Action, f.AllowReset = true, "pause", true
	f.PeerSecretFile, f.PeerListen, f.PeerURL = secret, "127.0.0.1:0", "http://127.0.0.1:9/{host}"
	f.RuntimeDir = t.TempDir() // never the machine's /run/hvguard
	f.RenewInterval = agent.Duration(200 * time.Millisecond)
	f.RenewTimeout = agent.Duration(200 * time.Millisecond)
	f.PeerTimeout = agent.Duration(300 * time.Millisecond)
	f.FenceDeadline = agent.Duration(500 * time.Millisecond)
	f.LeaseTTL = agent.Duration(1500 * time.Millisecond)
	f.HeldRecheck = agent.Duration(500 * time.Millisecond)
	f.MembersRefresh = agent.Duration(500 * time.Millisecond)
	cfg.ShutdownTimeout = agent.Duration(time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

// FenceLog records the agent's fence-state transitions.
type FenceLog struct {
	mu    sync.Mutex
	trans []fencing.Transition
	at    []time.Time
}

func NewFenceLog() *FenceLog { return &FenceLog{} }

func (l *FenceLog) Add(tr fencing.Transition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.trans, l.at = append(l.trans, tr), append(l.at, time.Now())
}

// Wait returns when the agent first entered state to at or after since
// (wall clock at the callback), failing after timeout. since matters: the
// agent went starting → healthy at its start, long before a rejoin.
func (l *FenceLog) Wait(t *testing.T, to fencing.State, since time.Time, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		for i, tr := range l.trans {
			if tr.To == to && !l.at[i].Before(since) {
				at := l.at[i]
				l.mu.Unlock()
				return at
			}
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("fencing never reached %s within %v: %s", to, timeout, l)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// String lists the transitions with their times.
func (l *FenceLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, tr := range l.trans {
		fmt.Fprintf(&b, "\n  %s %s → %s (%s)", l.at[i].Format("15:04:05.000"), tr.From, tr.To, tr.Reason)
	}
	return b.String()
}

func AgentConfig(t *testing.T, natsURL, state, clouds string) agent.Config {
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.Host = "node1"
	cfg.StateDir = state
	cfg.Libvirt.URI = "test:///default"
	cfg.NATS.URLs = []string{natsURL}
	cfg.NATS.ReadyTimeout = agent.Duration(2 * time.Second)
	cfg.Metrics.Listen = ""
	cfg.Status.Socket = ""
	cfg.Reconcile.Enabled = true
	cfg.Reconcile.Interval = agent.Duration(agent.MinReconcileInterval)
	cfg.OpenStack.Cloud = osharness.CloudName
	cfg.OpenStack.CloudsFile = clouds
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// RunAgent runs agent.Run and waits until it is ready (the start
// reconciliation is done by then). stop cancels it and waits.
func RunAgent(t *testing.T, cfg agent.Config) (stop func() error) {
	t.Helper()
	return RunAgentOpts(t, cfg, agent.Options{})
}

// RunAgentOpts is RunAgent with options (opts.Ready is set here).
func RunAgentOpts(t *testing.T, cfg agent.Config, opts agent.Options) (stop func() error) {
	t.Helper()
	ready := make(chan struct{})
	opts.Ready = ready
	stop, done := StartAgent(t, cfg, opts)
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent exited before ready: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("agent not ready after 2 min")
	}
	return stop
}

// RunAgentAsync starts agent.Run without waiting.
func RunAgentAsync(t *testing.T, cfg agent.Config) (stop func() error) {
	stop, _ = StartAgent(t, cfg, agent.Options{})
	return stop
}

func StartAgent(t *testing.T, cfg agent.Config, opts agent.Options) (stop func() error, done chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, Log(t), opts) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				err = fmt.Errorf("agent did not stop within a minute")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, done
}

func Status(t *testing.T, state string) agent.ReconcileStatus {
	t.Helper()
	st, err := agent.ReadReconcileStatus(state)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ReportSince polls the status file until it holds a reconciliation that
// started at or after since: the domains a run destroys are off before it
// writes its report (it marks them first), so the file read right after
// they went off may still show the previous run.
func ReportSince(t *testing.T, state string, since time.Time, timeout time.Duration) agent.ReconcileStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := agent.ReadReconcileStatus(state)
		if err == nil && !st.Report.StartedAt.Before(since) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconciliation report since %s within %v: last %s (err %v)",
				since.Format("15:04:05.000"), timeout, st.Report.Summary(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func LibvirtConn(t *testing.T) *libvirtx.Conn {
	t.Helper()
	c, err := libvirtx.Dial(context.Background(), libvirtx.DefaultConfig("test:///default"), Log(t))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range c.Events() {
		}
	}()
	t.Cleanup(func() { c.Close() })
	return c
}

func DefineNova(t *testing.T, c *libvirtx.Conn, name, uuid string) {
	meta := fmt.Sprintf(`  <metadata>
    <nova:instance xmlns:nova=%q>
      <nova:package version="26.2.2"/>
      <nova:name>%s</nova:name>
    </nova:instance>
  </metadata>
</domain>`, reconcile.NovaNamespace, name)
	DefineDomain(t, c, strings.Replace(libvirtx.TestDomainXML(name, uuid), "</domain>", meta, 1), uuid)
}

func DefineDomain(t *testing.T, c *libvirtx.Conn, xml, uuid string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.DefineXML(ctx, xml); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Destroy(context.Background(), uuid)
		_ = c.Undefine(context.Background(), uuid)
	})
}

func ExpectStates(t *testing.T, c *libvirtx.Conn, want string, uuids ...string) {
	t.Helper()
	for _, u := range uuids {
		st, err := c.State(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		if st.String() != want {
			t.Errorf("domain %s: %s, want %s", u, st, want)
		}
	}
}

// WaitStates polls until every uuid is in state want.
func WaitStates(t *testing.T, c *libvirtx.Conn, want string, timeout time.Duration, uuids ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, u := range uuids {
		for {
			st, err := c.State(context.Background(), u)
			if err == nil && st.String() == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("domain %s: %v %v after %v, want %s", u, st, err, timeout, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// WaitOff polls until every uuid is off and returns when the last one was
// first seen off.
func WaitOff(t *testing.T, c *libvirtx.Conn, uuids []string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	left := map[string]bool{}
	for _, u := range uuids {
		left[u] = true
	}
	for {
		now := time.Now()
		for u := range left {
			st, err := c.State(context.Background(), u)
			if err == nil && st.Off() {
				delete(left, u)
			}
		}
		if len(left) == 0 {
			return now
		}
		if now.After(deadline) {
			t.Fatalf("%d of %d evacuated duplicates still not off after %v", len(left), len(uuids), timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
