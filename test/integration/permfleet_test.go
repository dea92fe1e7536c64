package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/controller/daemon"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/test/netcut"
)

// permFleet is two real agents (fencing on, pausing nothing) and a real
// controller on the nats-server at url (the shipped permissions), each
// authenticated with its own example NKey, at peerPair's ×0.2 timing (a
// relay crosses a proxy): compute-2 reaches NATS and compute-1's peer
// endpoint through proxies the test can cut.
type permFleet struct {
	prxNATS2, prxPeer1  *netcut.Proxy
	logs1, logs2, logsC logBuffer
	trMu                sync.Mutex
	trans2              []fencing.Transition
}

const permH1, permH2 = "compute-1.example.org", "compute-2.example.org"

// startPermFleet starts it; signing (may be nil) completes each agent's
// configuration and the controller's, onDecision sees the controller's
// decisions.
func startPermFleet(t *testing.T, url string, signing func(agentHost string, a *agent.Config, c *daemon.Config), onDecision func(controller.Decision, error)) *permFleet {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "peer.secret")
	if err := os.WriteFile(secret, []byte("integration-test-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	portA, portB := deliverytest.FreePort(t), deliverytest.FreePort(t)
	p := &permFleet{prxNATS2: netcut.New(t, strings.TrimPrefix(url, "nats://")),
		prxPeer1: netcut.New(t, fmt.Sprintf("127.0.0.1:%d", portA))} // h2's way to h1's peer endpoint
	agentCfg := func(host, natsURL string, listen int, peers map[string]string) agent.Config {
		cfg := agentConfig(t, host, natsURL, t.TempDir())
		cfg.NATS.NKeySeedFile = natspermtest.SeedFile(t, "agent:"+host)
		cfg.NATS.CreateStream = false
		cfg.Fence.Enabled, cfg.Fence.Action, cfg.Fence.AllowReset = true, "pause", true
		cfg.Fence.CreateBucket = false
		cfg.Fence.PeerSecretFile = secret
		cfg.Fence.PeerListen = fmt.Sprintf("127.0.0.1:%d", listen)
		cfg.Fence.PeerURL = "http://127.0.0.1:9/{host}"
		cfg.Fence.PeerURLs = peers
		cfg.ShutdownTimeout = agent.Duration(time.Second)
		f := &cfg.Fence
		f.RenewInterval, f.RenewTimeout = agent.Duration(400*time.Millisecond), agent.Duration(400*time.Millisecond)
		f.PeerTimeout, f.FenceDeadline = agent.Duration(600*time.Millisecond), agent.Duration(time.Second)
		f.LeaseTTL, f.HeldRecheck = agent.Duration(3*time.Second), agent.Duration(time.Second)
		f.MembersRefresh = agent.Duration(500 * time.Millisecond)
		if signing != nil {
			signing(host, &cfg, nil)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	// Fence nothing: the test driver's domains are shared with other tests.
	noDomains := func(h agent.FenceHypervisor) agent.FenceHypervisor { return ownDomains{h, nil} }
	startAgentLog(t, agentCfg(permH1, url, portA, map[string]string{permH2: fmt.Sprintf("http://127.0.0.1:%d", portB)}),
		agent.Options{WrapFenceHypervisor: noDomains, ResetHost: func() error { return nil }}, p.logs1.logger())
	startAgentLog(t, agentCfg(permH2, "nats://"+p.prxNATS2.Addr(), portB, map[string]string{permH1: "http://" + p.prxPeer1.Addr()}),
		agent.Options{WrapFenceHypervisor: noDomains, ResetHost: func() error { return nil },
			OnFenceTransition: func(tr fencing.Transition) { p.trMu.Lock(); p.trans2 = append(p.trans2, tr); p.trMu.Unlock() }},
		p.logs2.logger())

	ccfg := daemon.DefaultConfig()
	ccfg.ID = "ctl-1"
	ccfg.NATS.URLs = []string{url}
	ccfg.NATS.NKeySeedFile = natspermtest.SeedFile(t, "controller:ctl-1")
	ccfg.NATS.Control.NKeySeedFile = natspermtest.SeedFile(t, "controller:ctl-1:control")
	ccfg.NATS.CreateBucket = false
	ccfg.NATS.ReadyTimeout = daemon.Duration(5 * time.Second)
	ccfg.Leader = daemon.LeaderConfig{TTL: daemon.Duration(time.Second), RenewInterval: daemon.Duration(250 * time.Millisecond),
		WriteTimeout: daemon.Duration(200 * time.Millisecond), ActMargin: daemon.Duration(200 * time.Millisecond)}
	ccfg.Guard.Share, ccfg.Guard.Window = 0.5, daemon.Duration(time.Second) // 2 hosts: threshold 1
	ccfg.Tracker.AcceptAgentDependentBackstop = true                        // the agents' backstop is reset
	ccfg.Metrics.Listen = ""
	if signing != nil {
		signing("", nil, &ccfg)
	}
	if err := ccfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, ccfg, p.logsC.logger(), daemon.Options{OnDecision: onDecision}) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// transitions2 returns compute-2's fence transitions so far.
func (p *permFleet) transitions2() []fencing.Transition {
	p.trMu.Lock()
	defer p.trMu.Unlock()
	return append([]fencing.Transition(nil), p.trans2...)
}

func (p *permFleet) dump() string {
	return fmt.Sprintf("agent 1:\n%s\nagent 2:\n%s\ncontroller:\n%s", p.logs1.String(), p.logs2.String(), p.logsC.String())
}

// noPermissionErrors fails if a daemon logged a permission error.
func (p *permFleet) noPermissionErrors(t *testing.T) {
	t.Helper()
	for name, l := range map[string]*logBuffer{"agent " + permH1: &p.logs1, "agent " + permH2: &p.logs2, "controller": &p.logsC} {
		if strings.Contains(l.String(), "permission denied") || strings.Contains(strings.ToLower(l.String()), "permissions violation") {
			t.Errorf("%s hit a permission error under the shipped permissions:\n%s", name, l.String())
		}
	}
}
