package integration

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
)

// notifySocket listens like systemd does and returns every datagram.
func notifySocket(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "1000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	out := make(chan string, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(out)
				return
			}
			out <- string(buf[:n])
		}
	}()
	return out
}

func expectNotify(t *testing.T, ch <-chan string, within time.Duration, match func(string) bool, what string) string {
	t.Helper()
	deadline := time.After(within)
	var seen []string
	for {
		select {
		case m := <-ch:
			if match(m) {
				return m
			}
			seen = append(seen, m)
		case <-deadline:
			t.Fatalf("no %s within %s; got %q", what, within, seen)
		}
	}
}

// READY=1 comes once libvirt and NATS are connected; WATCHDOG=1 then keeps
// coming from the event loop, and STATUS= carries the summary.
func TestSystemdReadyAndWatchdog(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	ch := notifySocket(t)
	cfg := agentConfig(t, "it-systemd", ns.ClientURL(), t.TempDir())
	startAgent(t, cfg, agent.Options{})
	ready := expectNotify(t, ch, 10*time.Second, func(m string) bool { return strings.Contains(m, "READY=1") }, "READY=1")
	if !strings.Contains(ready, "STATUS=ready: libvirt up, nats up") {
		t.Errorf("READY without the expected status: %q", ready)
	}
	for i := 0; i < 3; i++ {
		expectNotify(t, ch, 3*time.Second, func(m string) bool { return m == "WATCHDOG=1" }, "WATCHDOG=1")
	}
}

// With NATS unreachable the agent becomes ready in an explicitly degraded
// mode after nats.ready_timeout, and says so in STATUS=.
func TestSystemdReadyDegradedWithoutNATS(t *testing.T) {
	ch := notifySocket(t)
	port := deliverytest.FreePort(t) // nothing listens there
	cfg := agentConfig(t, "it-degraded", "nats://127.0.0.1:"+strconv.Itoa(port), t.TempDir())
	cfg.NATS.ReadyTimeout = agent.Duration(500 * time.Millisecond)
	cfg.ShutdownTimeout = agent.Duration(500 * time.Millisecond) // nothing to flush to
	start := time.Now()
	startAgent(t, cfg, agent.Options{})
	ready := expectNotify(t, ch, 10*time.Second, func(m string) bool { return strings.Contains(m, "READY=1") }, "READY=1")
	if !strings.Contains(ready, "STATUS=degraded") {
		t.Errorf("READY without NATS should be degraded, got %q", ready)
	}
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Errorf("degraded READY after %s, before nats.ready_timeout", el)
	}
}
