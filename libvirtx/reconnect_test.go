package libvirtx

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hvguard/lifecycle"
)

// Reconnect tests need a real libvirtd. They run only when
// HVGUARD_LIBVIRTD_URI names one, e.g.
//
//	HVGUARD_LIBVIRTD_URI=test+unix:///default go test -run Reconnect ./libvirtx/
//	HVGUARD_LIBVIRTD_URI='test+unix:///default?socket=/tmp/lvd/libvirt-sock' ...
//
// A test+unix URI with path /default is rewritten to a private node file
// (test+unix:///<tempdir>/node.xml), so these tests never touch the
// daemon's shared test driver state that other tests may be using.
//
// TestReconnectAfterClientClosed kicks this process's client off the daemon
// with virt-admin client-disconnect (see virtAdmin; the admin socket only
// accepts the daemon's own uid). It never kills anything and never touches
// other processes' clients.
//
// TestReconnectHungDaemon also needs HVGUARD_LIBVIRTD_PID, the pid of a
// daemon that you own: it SIGSTOPs it for a few seconds (SIGCONT in
// cleanup).
func daemonURI(t *testing.T) string {
	t.Helper()
	raw := os.Getenv("HVGUARD_LIBVIRTD_URI")
	if raw == "" {
		t.Skip("HVGUARD_LIBVIRTD_URI not set: reconnect tests need a real libvirtd (e.g. test+unix:///default); see reconnect_test.go")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("HVGUARD_LIBVIRTD_URI=%q: %v", raw, err)
	}
	if strings.HasPrefix(u.Scheme, "test+") && u.Path == "/default" {
		dir := t.TempDir()
		p := filepath.Join(dir, "node.xml")
		if err := os.WriteFile(p, []byte(emptyNode), 0o644); err != nil {
			t.Fatal(err)
		}
		// The daemon may run as another user (a session daemon).
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		u.Path = p
	}
	return u.String()
}

// virtAdmin returns the virt-admin command prefix: HVGUARD_VIRT_ADMIN split
// on spaces, or virt-admin -c <admin URI derived from the daemon URI>. (The
// admin API is used through the CLI: libvirt-admin loaded into this process
// next to libvirt crashes on libvirt 9.0.0, measured.)
func virtAdmin(daemon string) []string {
	if v := os.Getenv("HVGUARD_VIRT_ADMIN"); v != "" {
		return strings.Fields(v)
	}
	adm := "libvirtd:///system"
	if u, err := url.Parse(daemon); err == nil {
		if sock := u.Query().Get("socket"); sock != "" {
			adm += "?socket=" + filepath.Join(filepath.Dir(sock), "libvirt-admin-sock")
		}
	}
	return []string{"virt-admin", "-c", adm}
}

// kickOwnClients closes, through the daemon's admin interface, every client
// of the "libvirtd" server that belongs to this process. It returns how
// many it closed.
func kickOwnClients(t *testing.T, prefix []string) int {
	t.Helper()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(prefix[0], append(append([]string{}, prefix[1:]...), args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		return string(out)
	}
	kicked := 0
	for _, line := range strings.Split(run("srv-clients-list", "libvirtd"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		for _, il := range strings.Split(run("client-info", "libvirtd", f[0]), "\n") {
			k, v, ok := strings.Cut(il, ":")
			if ok && strings.TrimSpace(k) == "unix_process_id" && strings.TrimSpace(v) == strconv.Itoa(os.Getpid()) {
				run("client-disconnect", "libvirtd", f[0])
				kicked++
			}
		}
	}
	return kicked
}

func daemonConfig(uri string) Config {
	cfg := DefaultConfig(uri)
	cfg.KeepAliveInterval = time.Second
	cfg.KeepAliveCount = 2
	cfg.ConnectTimeout = 2 * time.Second
	cfg.ReconnectMin = 100 * time.Millisecond
	cfg.ReconnectMax = time.Second
	cfg.CallTimeout = time.Second
	return cfg
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// eventsWork defines a domain and waits for its DEFINED event.
func eventsWork(t *testing.T, c *Conn) {
	t.Helper()
	ctx := context.Background()
	uuid := newUUID()
	if _, err := c.DefineXML(ctx, TestDomainXML("rc-"+uuid[len(uuid)-6:], uuid)); err != nil {
		t.Fatalf("DefineXML: %v", err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-c.Events():
			if ev.UUID == uuid && ev.Kind == lifecycle.KindDefined {
				return
			}
		case <-deadline:
			t.Fatalf("no DEFINED event for %s", uuid)
		}
	}
}

func drainResync(c *Conn) {
	select {
	case <-c.ResyncNeeded():
	default:
	}
}

func TestReconnectAfterClientClosed(t *testing.T) {
	uri := daemonURI(t)
	c, err := Dial(context.Background(), daemonConfig(uri), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventsWork(t, c)
	drainResync(c)

	if n := kickOwnClients(t, virtAdmin(uri)); n != 1 {
		t.Fatalf("kicked %d clients of this process, want 1", n)
	}
	took := waitFor(t, "reconnect", 10*time.Second, func() bool { return c.Status().Reconnects >= 1 })
	st := c.Status()
	t.Logf("reconnected %v after the daemon closed our client; status %+v", took, st)
	if !st.Connected || st.LastLossReason == "" {
		t.Errorf("after reconnect: %+v", st)
	}
	select {
	case <-c.ResyncNeeded():
	default:
		t.Error("ResyncNeeded not signalled after reconnect")
	}
	eventsWork(t, c) // callbacks registered again on the new connection
	if _, err := c.ListDomains(context.Background()); err != nil {
		t.Errorf("ListDomains after reconnect: %v", err)
	}
}

func TestReconnectHungDaemon(t *testing.T) {
	uri := daemonURI(t)
	pidStr := os.Getenv("HVGUARD_LIBVIRTD_PID")
	if pidStr == "" {
		t.Skip("HVGUARD_LIBVIRTD_PID not set: this test SIGSTOPs a libvirtd that you own")
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil {
		t.Fatalf("HVGUARD_LIBVIRTD_PID=%q: %v", pidStr, err)
	}
	c, err := Dial(context.Background(), daemonConfig(uri), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventsWork(t, c)
	drainResync(c)
	c2, err := Dial(context.Background(), daemonConfig(uri), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			stopped = false
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)

	// A call on the hung daemon returns after CallTimeout, not never.
	t0 := time.Now()
	_, err = c.State(context.Background(), newUUID())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 2*time.Second {
		t.Fatalf("State on hung daemon = %v after %v, want DeadlineExceeded after ~1s", err, time.Since(t0))
	}
	// Close on a hung daemon returns after about CallTimeout.
	t0 = time.Now()
	c2.Close()
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Close on hung daemon took %v", d)
	}
	// Dial on a hung daemon gives up after ConnectTimeout.
	t0 = time.Now()
	cfg := daemonConfig(uri)
	cfg.ConnectTimeout = 500 * time.Millisecond
	if c3, err := Dial(context.Background(), cfg, testLogger(t)); err == nil {
		c3.Close()
		t.Errorf("Dial on hung daemon succeeded")
	} else if d := time.Since(t0); d > time.Second {
		t.Errorf("Dial on hung daemon failed after %v (%v), want ~500ms", d, err)
	}
	// Keepalive (1s x 2) declares the connection dead.
	took := waitFor(t, "keepalive loss", 15*time.Second, func() bool { return !c.Status().Connected })
	t.Logf("connection declared lost %v after the call timed out; status %+v", took, c.Status())
	// Calls fail fast while disconnected.
	t0 = time.Now()
	if _, err := c.ListDomains(context.Background()); !errors.Is(err, ErrNotConnected) || time.Since(t0) > 100*time.Millisecond {
		t.Errorf("ListDomains while disconnected = %v after %v, want ErrNotConnected at once", err, time.Since(t0))
	}
	// NewConnect blocks on the hung daemon: the supervisor reports the
	// timeout and keeps waiting on that one attempt.
	waitFor(t, "connect timeout reported", 15*time.Second, func() bool {
		return strings.Contains(c.Status().LastConnectError, "no answer")
	})
	cont()
	took = waitFor(t, "reconnect after SIGCONT", 15*time.Second, func() bool { return c.Status().Reconnects >= 1 && c.Status().Connected })
	t.Logf("reconnected %v after SIGCONT; status %+v", took, c.Status())
	select {
	case <-c.ResyncNeeded():
	default:
		t.Error("ResyncNeeded not signalled after reconnect")
	}
	eventsWork(t, c)
}
