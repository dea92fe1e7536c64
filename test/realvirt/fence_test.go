//go:build realvirt

package realvirt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/test/guest"
	"hvguard/test/netcut"
)

// ownDomains restricts fencing to the test's own domains: the system
// libvirtd may run other people's guests, which a test must never pause.
type ownDomains struct {
	agent.FenceHypervisor
	uuids []string
}

func (o ownDomains) ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error) {
	all, err := o.FenceHypervisor.ListDomains(ctx)
	var out []lifecycle.DomainSnapshot
	for _, d := range all {
		if slices.Contains(o.uuids, d.UUID) {
			out = append(out, d)
		}
	}
	return out, err
}

// TestFenceQEMUGuestsPauseAndResume: real QEMU/TCG guests on qemu:///system
// under a fencing agent (agent.Run) whose NATS link is blackholed by a TCP
// proxy (timing compressed ×0.1, the controller.Runner watching): the
// guests are paused by the fence (libvirt state paused, QEMU stopped) well
// before the controller could declare the host, and resumed by the heal;
// nothing is declared. HVGUARD_FENCE_GUESTS sets the number of guests
// (default 2). Reset is a recorder (and HVGUARD_FORBID_RESET=1).
func TestFenceQEMUGuestsPauseAndResume(t *testing.T) {
	requireDaemon(t, sysQEMUURI)
	if err := guest.Built(); err != nil {
		t.Skip(err)
	}
	t.Setenv(agent.ForbidResetEnv, "1")
	n := 2
	if v, err := strconv.Atoi(os.Getenv("HVGUARD_FENCE_GUESTS")); err == nil && v > 0 {
		n = v
	}
	lc := libvirtx.DefaultConfig(sysQEMUURI)
	lc.CallTimeout = 60 * time.Second
	wl := dial(t, lc)
	var guests []*qemuGuest
	var uuids []string
	for i := range n {
		uuid := newUUID(t)
		g := &qemuGuest{t: t, c: wl, uuid: uuid, name: fmt.Sprintf("hvg-fence-%d-%s", i, uuid[:8]),
			serial: filepath.Join(t.TempDir(), "serial.log")}
		t.Cleanup(func() {
			_, _ = virsh(sysQEMUURI, 60*time.Second, "destroy", uuid)
			if _, err := virsh(sysQEMUURI, 60*time.Second, "undefine", uuid); err != nil {
				t.Errorf("cleanup %s: %v", g.name, err)
			}
		})
		g.define(guest.ModeIdle, "destroy")
		g.op("Start", wl.Start)
		guests, uuids = append(guests, g), append(uuids, uuid)
	}
	for _, g := range guests {
		g.waitSerial("watching power button", 120*time.Second)
	}

	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	prx := netcut.New(t, srv.Addr().String())
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	st := &natslease.Store{KV: kv}

	host := "realvirt-fence.example.org"
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("realvirt-test-shared-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Host = host
	cfg.StateDir = t.TempDir()
	cfg.Fence.RuntimeDir = t.TempDir()
	cfg.Status.Socket = ""
	cfg.Libvirt.URI = sysQEMUURI
	cfg.Libvirt.CallTimeout = agent.Duration(60 * time.Second)
	cfg.NATS.URLs = []string{"nats://" + prx.Addr()}
	cfg.Metrics.Listen = ""
	f := &cfg.Fence
	f.Enabled, f.Action, f.AllowReset = true, "pause", true
	f.PeerSecretFile, f.PeerListen, f.PeerURL = secret, "127.0.0.1:0", "http://127.0.0.1:9/{host}"
	f.RenewInterval, f.RenewTimeout = agent.Duration(200*time.Millisecond), agent.Duration(200*time.Millisecond)
	f.PeerTimeout, f.FenceDeadline = agent.Duration(300*time.Millisecond), agent.Duration(500*time.Millisecond)
	f.LeaseTTL, f.HeldRecheck = agent.Duration(1500*time.Millisecond), agent.Duration(500*time.Millisecond)
	f.MembersRefresh = agent.Duration(500 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	timing := f.Core(host, "b").Timing

	go func() { // five healthy hosts: guard threshold 1
		revs := map[string]uint64{}
		for ctx.Err() == nil {
			for i := 1; i <= 5; i++ {
				h := fmt.Sprintf("h%d.example.org", i)
				rec := fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: h, BootID: "b", State: fencing.LeaseActive,
					FencingEnabled: true, Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: timing}
				if n, err := st.Write(ctx, h, revs[h], rec, time.Second); err == nil {
					revs[h] = n
				}
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	// The agent's backstop is reset (a recorder here, no watchdog): the
	// controller must accept that agent-dependent backstop explicitly.
	ccfg := controller.DefaultConfig()
	ccfg.AcceptAgentDependentBackstop = true
	tr, err := controller.NewTracker(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var declared time.Time
	var trans []fencing.Transition
	go func() {
		_ = (&controller.Runner{Store: st, Tracker: tr, Log: testLogger(t), OnDecision: func(d controller.Decision, err error) {
			if err == nil && d.Op == controller.OpDeclare && d.Host == host {
				mu.Lock()
				declared = time.Now()
				mu.Unlock()
			}
		}}).Run(ctx)
	}()
	var resets int
	ready := make(chan struct{})
	actx, acancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(actx, cfg, testLogger(t), agent.Options{Ready: ready,
			ResetHost:           func() error { mu.Lock(); resets++; mu.Unlock(); return nil },
			OnFenceTransition:   func(x fencing.Transition) { mu.Lock(); trans = append(trans, x); mu.Unlock() },
			WrapFenceHypervisor: func(h agent.FenceHypervisor) agent.FenceHypervisor { return ownDomains{h, uuids} },
		})
	}()
	t.Cleanup(func() {
		acancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent exited: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("agent not ready")
	}
	state := func() fencing.State {
		mu.Lock()
		defer mu.Unlock()
		if len(trans) == 0 {
			return ""
		}
		return trans[len(trans)-1].To
	}
	all := func(want lifecycle.State) bool {
		for _, g := range guests {
			if g.state() != want {
				return false
			}
		}
		return true
	}
	wait := func(what string, timeout time.Duration, ok func() bool) time.Time {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !ok() {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("timed out waiting for %s; transitions: %v", what, trans)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Now()
	}
	wait("healthy", 20*time.Second, func() bool { return state() == fencing.StateHealthy })
	time.Sleep(time.Second)

	cut := time.Now()
	prx.Blackhole(true)
	fenceAt := wait("fencing started", 10*time.Second, func() bool { return state() == fencing.StateFencing || state() == fencing.StateFenced })
	paused := wait("all guests paused", 20*time.Second, func() bool { return all(lifecycle.StatePaused) })
	mu.Lock()
	d := declared
	mu.Unlock()
	if !d.IsZero() {
		t.Fatalf("declared before the heal")
	}
	prx.Blackhole(false)
	heal := time.Now()
	resumed := wait("all guests running", 30*time.Second, func() bool { return all(lifecycle.StateRunning) })
	time.Sleep(3 * time.Second)
	mu.Lock()
	d, r := declared, resets
	mu.Unlock()
	if !d.IsZero() || r != 0 {
		t.Fatalf("declared %v, %d resets requested", d, r)
	}
	t.Logf("%d QEMU guests: cut→fence started %s, fence start→all paused (libvirt state) %s; heal→all running %s",
		n, fenceAt.Sub(cut).Round(time.Millisecond), paused.Sub(fenceAt).Round(time.Millisecond), resumed.Sub(heal).Round(time.Millisecond))
	mu.Lock()
	for _, x := range trans {
		t.Logf("transition %s", x)
	}
	mu.Unlock()
}
