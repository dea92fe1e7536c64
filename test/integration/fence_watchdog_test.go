package integration

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/fencing"
	"hvguard/fencing/watchdog"
	"hvguard/lifecycle"
)

// recDevice is a watchdog.Device that records what the agent did to it
// (safe for the test goroutine to read while the fencing loop feeds it).
type recDevice struct {
	mu          sync.Mutex
	timeout     time.Duration
	feeds       []time.Time
	magicClosed bool
	closed      bool
}

func (d *recDevice) SetTimeout(t time.Duration) (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.timeout = t
	return t, nil
}

func (d *recDevice) Keepalive() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.feeds = append(d.feeds, time.Now())
	return nil
}

func (d *recDevice) MagicClose() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.magicClosed, d.closed = true, true
	return nil
}

func (d *recDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// lastFeed returns the time of the last keepalive.
func (d *recDevice) lastFeed() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.feeds) == 0 {
		return time.Time{}
	}
	return d.feeds[len(d.feeds)-1]
}

// hungPause makes Suspend hang (a wedged libvirtd) for the test's domains.
type hungPause struct {
	agent.FenceHypervisor
	release chan struct{}
}

func (h hungPause) Suspend(ctx context.Context, uuid string) error {
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return h.FenceHypervisor.Suspend(ctx, uuid)
}

// TestFenceWatchdogWiring: with fence.watchdog_device set (a recording
// device through Options.OpenWatchdog) the agent arms it at start and feeds
// it from the fencing loop while the lease is held. A partition with a
// hung libvirt (Suspend blocks) and no reset allowed: the fence misses its
// deadline, the agent raises FenceDeadlineMissedNoResetAllowed and stops
// feeding (the real device would reset the host within watchdog_timeout),
// and on the orderly stop the triggered watchdog is NOT disarmed (no magic
// close). A second agent whose fence completes keeps feeding and is
// disarmed by magic close on stop.
func TestFenceWatchdogWiring(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, 2)
	r.cfg.Fence.AllowReset = false
	r.cfg.Fence.WatchdogDevice = "/dev/watchdog-test"
	r.cfg.Fence.WatchdogTimeout = agent.Duration(time.Second)
	if err := r.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dev := &recDevice{}
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	r.opts.OpenWatchdog = func(path string) (watchdog.Device, error) { return dev, nil }
	r.opts.WrapFenceHypervisor = func(h agent.FenceHypervisor) agent.FenceHypervisor { return hungPause{h, release} }
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(time.Second)
	if dev.timeout != time.Second || dev.lastFeed().IsZero() || time.Since(dev.lastFeed()) > 500*time.Millisecond {
		t.Fatalf("watchdog not armed/fed while healthy: timeout %s, last feed %v ago", dev.timeout, time.Since(dev.lastFeed()))
	}
	r.prx.Blackhole(true)
	r.waitFor("fence deadline missed", 10*time.Second, func() bool {
		return slices.Contains(r.reasons(), fencing.ReasonFenceDeadlineMissedNoReset)
	})
	missed := time.Now()
	time.Sleep(1500 * time.Millisecond)
	if lf := dev.lastFeed(); lf.After(missed) {
		t.Fatalf("watchdog fed %s after the missed deadline\n%s", lf.Sub(missed), r.history())
	}
	if r.allDomains(lifecycle.StatePaused) {
		t.Fatal("domains paused although Suspend hangs")
	}
	// Stop while libvirt still hangs (the hung calls end with the
	// agent's context): the watchdog is still triggered.
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	dev.mu.Lock()
	mc, cl := dev.magicClosed, dev.closed
	dev.mu.Unlock()
	if mc || !cl {
		t.Fatalf("triggered watchdog: magic-closed %v, closed %v (want closed without magic close)", mc, cl)
	}
	t.Logf("hung fence: deadline missed, watchdog no longer fed, not disarmed on stop\n%s", r.history())
}

// TestFenceWatchdogDisarmOnStop: a healthy agent with a watchdog disarms
// it by magic close on an orderly stop.
func TestFenceWatchdogDisarmOnStop(t *testing.T) {
	t.Parallel()
	r := newFenceRig(t, true, 1)
	r.cfg.Fence.WatchdogDevice = "/dev/watchdog-test"
	r.cfg.Fence.WatchdogTimeout = agent.Duration(time.Second)
	dev := &recDevice{}
	r.opts.OpenWatchdog = func(string) (watchdog.Device, error) { return dev, nil }
	r.startAgent()
	r.waitState(fencing.StateHealthy, 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	if err := r.stopAgnt(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	dev.mu.Lock()
	defer dev.mu.Unlock()
	if !dev.magicClosed || len(dev.feeds) < 2 {
		t.Fatalf("magic-closed %v after %d feeds", dev.magicClosed, len(dev.feeds))
	}
}
