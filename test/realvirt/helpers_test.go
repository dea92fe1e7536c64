//go:build realvirt

package realvirt

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/lifecycle"
)

// virsh runs `virsh -c uri args...` in a subprocess (a different libvirt
// client process than the test), bounded by timeout, and returns its
// combined output.
func virsh(uri string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", uri}, args...)...)
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh -c %s %s: %w: %s", uri, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// mustVirsh is virsh that fails the test on error; it logs the duration.
func mustVirsh(t *testing.T, uri string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := virsh(uri, 30*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("virsh %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return out
}

// requireDaemon skips the test unless `virsh -c uri list` answers.
func requireDaemon(t *testing.T, uri string) {
	t.Helper()
	if _, err := exec.LookPath("virsh"); err != nil {
		t.Skip("virsh not installed: run test/libvirtd/start.sh first")
	}
	if _, err := virsh(uri, 15*time.Second, "list", "--all"); err != nil {
		t.Skipf("libvirt daemon for %s not reachable (run test/libvirtd/start.sh): %v", uri, err)
	}
}

// testLogger returns a slog.Logger writing to t.Log, so that libvirtx's own
// log lines (connection lost, reconnect, ...) appear in the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log("libvirtx: " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// dial connects libvirtx to cfg.URI and closes the Conn in t.Cleanup.
func dial(t *testing.T, cfg libvirtx.Config) *libvirtx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := libvirtx.Dial(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Dial %s: %v", cfg.URI, err)
	}
	t.Logf("Dial %s: %v", cfg.URI, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
	})
	return c
}

// newUUID returns a random (version 4) UUID in canonical lower-case form.
func newUUID(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ---- event recording ----

// recorder collects everything a Conn hands out: events and resync
// signals. It is drained by its own goroutine, which ends when the Conn's
// Events channel is closed (by Close).
type recorder struct {
	start time.Time

	mu      sync.Mutex
	evs     []lifecycle.Event
	resyncs int
}

// record starts draining c. It must be called right after dial, so that
// its goroutine is stopped (by Close closing Events) before the test ends.
func record(c *libvirtx.Conn) *recorder {
	r := &recorder{start: time.Now()}
	go func() {
		for {
			select {
			case ev, ok := <-c.Events():
				if !ok {
					return
				}
				r.mu.Lock()
				r.evs = append(r.evs, ev)
				r.mu.Unlock()
			case <-c.ResyncNeeded():
				r.mu.Lock()
				r.resyncs++
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// mark returns the number of events recorded so far: pass it to since to
// look only at later events.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

// resyncCount returns how many resync signals were received.
func (r *recorder) resyncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resyncs
}

// since returns the events recorded after mark m for the domain uuid ("":
// all domains).
func (r *recorder) since(m int, uuid string) []lifecycle.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []lifecycle.Event
	for _, ev := range r.evs[m:] {
		if uuid == "" || ev.UUID == uuid {
			out = append(out, ev)
		}
	}
	return out
}

// waitEvents polls until cond holds for the events of uuid after mark m, or
// fails the test after timeout. It returns those events.
func (r *recorder) waitEvents(t *testing.T, m int, uuid string, timeout time.Duration, what string, cond func([]lifecycle.Event) bool) []lifecycle.Event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs := r.since(m, uuid)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timeout (%v) waiting for %s; got %s", timeout, what, format(evs, time.Time{}))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// key is "EVENT/DETAIL" ("REBOOT" for reboot events).
func key(ev lifecycle.Event) string {
	if ev.Detail == "" {
		return ev.Event
	}
	return ev.Event + "/" + ev.Detail
}

// format renders events as "RESUMED/UNPAUSED(+12ms) STARTED/BOOTED(+15ms)",
// times relative to t0 (or to the first event if t0 is zero).
func format(evs []lifecycle.Event, t0 time.Time) string {
	if len(evs) == 0 {
		return "(none)"
	}
	if t0.IsZero() {
		t0 = evs[0].At
	}
	parts := make([]string, len(evs))
	for i, ev := range evs {
		parts[i] = fmt.Sprintf("%s(+%v)", key(ev), ev.At.Sub(t0).Round(time.Millisecond))
	}
	return strings.Join(parts, " ")
}

// keys returns key(ev) for each event.
func keys(evs []lifecycle.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = key(ev)
	}
	return out
}

// hasSubsequence reports whether want occurs in keys(evs) in order (other
// events may be interleaved).
func hasSubsequence(evs []lifecycle.Event, want ...string) bool {
	i := 0
	for _, ev := range evs {
		if i < len(want) && key(ev) == want[i] {
			i++
		}
	}
	return i == len(want)
}

// indexOf returns the index of the first event with key k, or -1.
func indexOf(evs []lifecycle.Event, k string) int {
	for i, ev := range evs {
		if key(ev) == k {
			return i
		}
	}
	return -1
}

// waitStatus polls c.Status until cond holds or fails the test after
// timeout; it returns the status and how long it took.
func waitStatus(t *testing.T, c *libvirtx.Conn, timeout time.Duration, what string, cond func(libvirtx.Status) bool) (libvirtx.Status, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		st := c.Status()
		if cond(st) {
			return st, time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("timeout (%v) waiting for %s; status %+v", timeout, what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeFile writes data to a new file in t.TempDir and returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
