//go:build realvirt

package realvirt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/lifecycle"
)

// daemonConfig is the libvirtx configuration of the daemon tests: the
// production keepalive (5 s × 3), short timeouts and a fast backoff so the
// tests stay quick.
func daemonConfig(uri string) libvirtx.Config {
	cfg := libvirtx.DefaultConfig(uri)
	cfg.ConnectTimeout = 3 * time.Second
	cfg.CallTimeout = 3 * time.Second
	cfg.ReconnectMin = 200 * time.Millisecond
	cfg.ReconnectMax = 1 * time.Second
	return cfg
}

// listDomains calls ListDomains with a bounded context.
func listDomains(t *testing.T, c *libvirtx.Conn) []lifecycle.DomainSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	doms, err := c.ListDomains(ctx)
	if err != nil {
		t.Fatalf("ListDomains: %v", err)
	}
	return doms
}

func formatDomains(doms []lifecycle.DomainSnapshot) string {
	parts := make([]string, len(doms))
	for i, d := range doms {
		parts[i] = fmt.Sprintf("%s(%s)=%v", d.Name, d.UUID[:8], d.State)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// defaultTestDomain returns the test driver's default domain "test".
func defaultTestDomain(t *testing.T, doms []lifecycle.DomainSnapshot) lifecycle.DomainSnapshot {
	t.Helper()
	for _, d := range doms {
		if d.Name == "test" {
			return d
		}
	}
	t.Fatalf("the test driver's default domain \"test\" is missing: %s", formatDomains(doms))
	return lifecycle.DomainSnapshot{}
}

// expectEventsWork suspends and resumes domain "test" with virsh in a
// subprocess and waits for both events: proof that callbacks are registered
// on the current connection.
func expectEventsWork(t *testing.T, r *recorder, uri, uuid string) {
	t.Helper()
	m := r.mark()
	start := time.Now()
	mustVirsh(t, uri, "suspend", "test")
	mustVirsh(t, uri, "resume", "test")
	evs := r.waitEvents(t, m, uuid, 10*time.Second, "SUSPENDED/PAUSED then RESUMED/UNPAUSED", func(evs []lifecycle.Event) bool {
		return hasSubsequence(evs, "SUSPENDED/PAUSED", "RESUMED/UNPAUSED")
	})
	t.Logf("events flow: %s", format(evs, start))
}

// TestDaemonRestart kills the (private) libvirtd with SIGTERM and with
// SIGKILL and restarts it. libvirtx must notice at once (close callback),
// fail calls fast while the daemon is gone, reconnect by itself, signal
// ResyncNeeded, deliver events again on the new connection, and ListDomains
// must show the daemon's state after the outage. The test driver's state
// lives in the daemon, so a restart resets it to the default domain set
// (one running domain "test"): the state change that a resync must reveal
// is that "test", destroyed before the outage, is running again and the
// extra domain defined before the outage is gone.
func TestDaemonRestart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) { testDaemonRestart(t, sig) })
	}
}

func testDaemonRestart(t *testing.T, sig syscall.Signal) {
	d := startPrivateDaemon(t)
	uri := d.URI()
	c := dial(t, daemonConfig(uri))
	r := record(c)

	before := listDomains(t, c)
	test := defaultTestDomain(t, before)
	if test.State != lifecycle.StateRunning {
		t.Fatalf("default domain not running at start: %s", formatDomains(before))
	}
	expectEventsWork(t, r, uri, test.UUID)

	// State before the outage: "test" destroyed, one extra domain defined.
	m := r.mark()
	mustVirsh(t, uri, "destroy", "test")
	extraUUID := newUUID(t)
	mustVirsh(t, uri, "define", writeFile(t, "extra.xml", libvirtx.TestDomainXML("hvg-extra", extraUUID)))
	r.waitEvents(t, m, "", 10*time.Second, "STOPPED/DESTROYED and DEFINED/ADDED", func(evs []lifecycle.Event) bool {
		return indexOf(evs, "STOPPED/DESTROYED") >= 0 && indexOf(evs, "DEFINED/ADDED") >= 0
	})
	t.Logf("before the outage: %s", formatDomains(listDomains(t, c)))

	st0 := c.Status()
	resync0 := r.resyncCount()

	// Outage.
	killedAt := time.Now()
	exit := d.kill(sig)
	t.Logf("%v: libvirtd exited after %v", sig, exit.Round(time.Millisecond))
	st, _ := waitStatus(t, c, 10*time.Second, "Connected=false", func(s libvirtx.Status) bool { return !s.Connected })
	t.Logf("connection declared lost %v after the signal (reason %q)", time.Since(killedAt).Round(time.Millisecond), st.LastLossReason)

	// Calls fail fast while the daemon is down.
	callStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := c.State(ctx, test.UUID)
	cancel()
	if !errors.Is(err, libvirtx.ErrNotConnected) {
		t.Errorf("State during the outage: err = %v, want ErrNotConnected", err)
	}
	if took := time.Since(callStart); took > time.Second {
		t.Errorf("State during the outage took %v, want fail-fast", took)
	}
	// Let at least one reconnect attempt fail against the dead socket.
	time.Sleep(700 * time.Millisecond)

	d.start()
	st, took := waitStatus(t, c, 20*time.Second, "reconnect", func(s libvirtx.Status) bool {
		return s.Connected && s.Reconnects > st0.Reconnects
	})
	t.Logf("reconnected %v after the daemon answered (outage %v); Reconnects %d→%d; last connect error %q",
		took.Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond), st0.Reconnects, st.Reconnects, st.LastConnectError)
	if st.Reconnects != st0.Reconnects+1 {
		t.Errorf("Reconnects = %d, want %d", st.Reconnects, st0.Reconnects+1)
	}
	if st.LastConnectError == "" {
		t.Errorf("LastConnectError empty: no reconnect attempt failed during the outage?")
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.resyncCount() <= resync0 {
		if time.Now().After(deadline) {
			t.Fatalf("ResyncNeeded not signalled after the reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Resync: the daemon's state after the outage (test driver defaults).
	after := listDomains(t, c)
	t.Logf("after the outage (resync): %s", formatDomains(after))
	if got := defaultTestDomain(t, after); got.UUID != test.UUID || got.State != lifecycle.StateRunning {
		t.Errorf("after restart: %+v, want the default domain %s running again", got, test.UUID)
	}
	for _, dom := range after {
		if dom.UUID == extraUUID {
			t.Errorf("domain defined before the outage survived a restart of the test driver: %+v", dom)
		}
	}
	if len(after) != 1 {
		t.Errorf("want exactly the default domain set (1 domain), got %s", formatDomains(after))
	}

	// Events flow on the new connection, and queries work.
	expectEventsWork(t, r, uri, test.UUID)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, err := c.State(ctx, test.UUID); err != nil || s != lifecycle.StateRunning {
		t.Errorf("State after reconnect = %v, %v; want running", s, err)
	}
}

// TestDaemonHang stops the (private) libvirtd with SIGSTOP. With keepalive
// 5 s × 3 the connection must be declared lost after about 20 s, calls made
// meanwhile must return within CallTimeout, reconnect attempts must give up
// after ConnectTimeout instead of blocking, and after SIGCONT libvirtx must
// be connected again with events flowing. Takes ~30 s: skipped with -short.
func TestDaemonHang(t *testing.T) {
	if testing.Short() {
		t.Skip("hung-daemon test takes ~30 s (keepalive 5 s × 3): skipped with -short")
	}
	d := startPrivateDaemon(t)
	uri := d.URI()
	cfg := daemonConfig(uri)
	c := dial(t, cfg)
	r := record(c)
	test := defaultTestDomain(t, listDomains(t, c))
	expectEventsWork(t, r, uri, test.UUID)
	st0 := c.Status()
	resync0 := r.resyncCount()

	stoppedAt := time.Now()
	d.signal(syscall.SIGSTOP)
	t.Cleanup(func() { d.signal(syscall.SIGCONT) }) // before Close (cleanups run LIFO)
	t.Logf("SIGSTOP libvirtd (pid %d)", d.pid())

	// A call on the hung daemon is bounded by CallTimeout.
	callStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := c.State(ctx, test.UUID)
	cancel()
	took := time.Since(callStart)
	t.Logf("State on the hung daemon: %v after %v", err, took.Round(time.Millisecond))
	if err == nil {
		t.Errorf("State on a hung daemon succeeded")
	}
	if took > cfg.CallTimeout+2*time.Second {
		t.Errorf("State on a hung daemon took %v, want ≤ CallTimeout (%v) + 2s", took, cfg.CallTimeout)
	}

	// Keepalive declares the connection dead: 5 s × (3+1) ≈ 20 s.
	st, _ := waitStatus(t, c, 45*time.Second, "Connected=false (keepalive)", func(s libvirtx.Status) bool { return !s.Connected })
	lost := time.Since(stoppedAt)
	t.Logf("connection declared lost %v after SIGSTOP (reason %q)", lost.Round(time.Millisecond), st.LastLossReason)
	if lost < 10*time.Second {
		t.Errorf("lost after only %v: expected keepalive (~20 s)", lost)
	}

	// Reconnect attempts against the hung daemon give up after
	// ConnectTimeout (NewConnect itself stays blocked in the background).
	lostAt := time.Now()
	st, _ = waitStatus(t, c, cfg.ConnectTimeout+10*time.Second, "a failed reconnect attempt", func(s libvirtx.Status) bool {
		return strings.Contains(s.LastConnectError, "no answer within")
	})
	t.Logf("reconnect attempt gave up %v after the loss: %q", time.Since(lostAt).Round(time.Millisecond), st.LastConnectError)
	if st.Connected || st.Reconnects != st0.Reconnects {
		t.Errorf("status while hung: %+v", st)
	}
	if tick := time.Since(st.EventLoopTick); tick > 5*time.Second {
		t.Errorf("libvirt event loop stuck: last tick %v ago", tick)
	}

	contAt := time.Now()
	d.signal(syscall.SIGCONT)
	st, took = waitStatus(t, c, 20*time.Second, "reconnect after SIGCONT", func(s libvirtx.Status) bool {
		return s.Connected && s.Reconnects > st0.Reconnects
	})
	t.Logf("reconnected %v after SIGCONT (hang %v total); Reconnects %d→%d, Abandoned %d",
		took.Round(time.Millisecond), contAt.Sub(stoppedAt).Round(time.Millisecond), st0.Reconnects, st.Reconnects, st.Abandoned)
	deadline := time.Now().Add(5 * time.Second)
	for r.resyncCount() <= resync0 {
		if time.Now().After(deadline) {
			t.Fatalf("ResyncNeeded not signalled after the reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("after the hang (resync): %s", formatDomains(listDomains(t, c)))
	expectEventsWork(t, r, uri, test.UUID)
}
