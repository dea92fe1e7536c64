//go:build realvirt

package realvirt

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/test/guest"
)

// sysQEMUURI is the system libvirtd's QEMU driver.
const sysQEMUURI = "qemu:///system"

// qemuGuest is one test guest defined on qemu:///system.
type qemuGuest struct {
	t      *testing.T
	c      *libvirtx.Conn
	r      *recorder
	uuid   string
	name   string
	serial string
}

// ctx returns a context bounded generously for one libvirt call on a busy
// 2-core host.
func bounded() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// define (re)defines the guest with the given hvg= mode and on_crash
// action; the same UUID and name are kept, so a redefinition updates it.
func (g *qemuGuest) define(mode, onCrash string) {
	g.t.Helper()
	xml, err := guest.DomainXML(guest.Params{Name: g.name, UUID: g.uuid, Mode: mode, OnCrash: onCrash, SerialLog: g.serial})
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := bounded()
	defer cancel()
	start := time.Now()
	uuid, err := g.c.DefineXML(ctx, xml)
	if err != nil {
		g.t.Fatalf("DefineXML (hvg=%s): %v", mode, err)
	}
	if uuid != g.uuid {
		g.t.Fatalf("DefineXML returned uuid %s, want %s", uuid, g.uuid)
	}
	g.t.Logf("DefineXML hvg=%s on_crash=%s: %v", mode, onCrash, time.Since(start).Round(time.Millisecond))
}

// op runs one libvirtx domain operation and logs how long it took.
func (g *qemuGuest) op(name string, fn func(context.Context, string) error) {
	g.t.Helper()
	ctx, cancel := bounded()
	defer cancel()
	start := time.Now()
	if err := fn(ctx, g.uuid); err != nil {
		g.t.Fatalf("%s: %v", name, err)
	}
	g.t.Logf("%s: %v", name, time.Since(start).Round(time.Millisecond))
}

// state returns the guest's state via libvirtx.
func (g *qemuGuest) state() lifecycle.State {
	g.t.Helper()
	ctx, cancel := bounded()
	defer cancel()
	s, err := g.c.State(ctx, g.uuid)
	if err != nil {
		g.t.Fatalf("State: %v", err)
	}
	return s
}

// resetSerial empties the console log. Call it only while QEMU is not
// running (QEMU keeps its file offset: truncating under it leaves a hole).
func (g *qemuGuest) resetSerial() {
	g.t.Helper()
	if err := os.WriteFile(g.serial, nil, 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// waitSerial waits until the console log contains s.
func (g *qemuGuest) waitSerial(s string, timeout time.Duration) time.Duration {
	g.t.Helper()
	start := time.Now()
	for {
		b, _ := os.ReadFile(g.serial)
		if bytes.Contains(b, []byte(s)) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			g.t.Fatalf("guest console has no %q after %v; console:\n%s", s, timeout, g.console())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// console returns the "hvg:" lines and the last lines of the console log.
func (g *qemuGuest) console() string {
	b, _ := os.ReadFile(g.serial)
	b = bytes.ReplaceAll(b, []byte{0}, nil)
	lines := strings.Split(string(b), "\n")
	var out []string
	for i, l := range lines {
		if strings.HasPrefix(l, "hvg:") || i >= len(lines)-15 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestQEMUGuestLifecycle runs the tiny QEMU/TCG guest (test/guest) on
// qemu:///system through libvirtx and checks the event sequences that
// hvguard's decisions rest on:
//
//   - start: RESUMED/UNPAUSED, then STARTED/BOOTED;
//   - Nova hard reboot (Destroy + Start): STOPPED/DESTROYED, RESUMED, STARTED;
//   - ACPI shutdown (Shutdown, the first half of Nova's soft reboot):
//     SHUTDOWN/GUEST, then STOPPED/SHUTDOWN;
//   - guest-initiated reboot with on_reboot=restart: REBOOT events only, no
//     STOPPED, the domain stays running;
//   - guest panic with on_crash=destroy: CRASHED/PANICKED, STOPPED/CRASHED.
//
// The observed sequences and timings are logged. The domain is destroyed
// and undefined at the end, also on failure.
func TestQEMUGuestLifecycle(t *testing.T) {
	requireDaemon(t, sysQEMUURI)
	if err := guest.Built(); err != nil {
		t.Skip(err)
	}
	cfg := libvirtx.DefaultConfig(sysQEMUURI)
	cfg.CallTimeout = 60 * time.Second // QEMU start/define on a busy 2-core host
	c := dial(t, cfg)
	r := record(c)

	uuid := newUUID(t)
	g := &qemuGuest{t: t, c: c, r: r, uuid: uuid, name: "hvg-realvirt-" + uuid[:8],
		serial: filepath.Join(t.TempDir(), "console.log")}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest console (hvg lines and tail):\n%s", g.console())
		}
		// virsh in a subprocess: works even if the libvirtx Conn is broken.
		_, _ = virsh(sysQEMUURI, 60*time.Second, "destroy", uuid)
		if _, err := virsh(sysQEMUURI, 60*time.Second, "undefine", uuid); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	all := r.mark()
	g.define(guest.ModeIdle, "destroy")

	ok := t.Run("start", func(t *testing.T) {
		g.t = t
		g.resetSerial()
		m := r.mark()
		t0 := time.Now()
		g.op("Start", c.Start)
		evs := r.waitEvents(t, m, uuid, 60*time.Second, "RESUMED/UNPAUSED and STARTED/BOOTED", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "RESUMED/UNPAUSED") >= 0 && indexOf(evs, "STARTED/BOOTED") >= 0
		})
		t.Logf("start: %s", format(evs, t0))
		if !hasSubsequence(evs, "RESUMED/UNPAUSED", "STARTED/BOOTED") || indexOf(evs, "STARTED/BOOTED") < indexOf(evs, "RESUMED/UNPAUSED") {
			t.Errorf("start: want RESUMED/UNPAUSED before STARTED/BOOTED, got %v", keys(evs))
		}
		up := g.waitSerial("watching power button", 120*time.Second)
		t.Logf("guest up (power button watched) %v after Start returned", up.Round(time.Millisecond))
		if s := g.state(); s != lifecycle.StateRunning {
			t.Errorf("State after start = %v", s)
		}
	})
	if !ok {
		return
	}

	ok = t.Run("hard-reboot", func(t *testing.T) {
		g.t = t
		m := r.mark()
		t0 := time.Now()
		g.op("Destroy", c.Destroy)
		g.resetSerial()
		g.op("Start", c.Start)
		evs := r.waitEvents(t, m, uuid, 60*time.Second, "STOPPED/DESTROYED, RESUMED/UNPAUSED, STARTED/BOOTED", func(evs []lifecycle.Event) bool {
			return hasSubsequence(evs, "STOPPED/DESTROYED", "RESUMED/UNPAUSED", "STARTED/BOOTED")
		})
		t.Logf("Destroy+Start (Nova hard reboot): %s", format(evs, t0))
		for _, ev := range evs {
			switch key(ev) {
			case "SHUTDOWN/HOST", "STOPPED/DESTROYED", "RESUMED/UNPAUSED", "STARTED/BOOTED":
			default:
				t.Errorf("unexpected event %s in a hard reboot", key(ev))
			}
		}
		up := g.waitSerial("watching power button", 120*time.Second)
		t.Logf("guest up again %v after Start returned", up.Round(time.Millisecond))
	})
	if !ok {
		return
	}

	ok = t.Run("acpi-shutdown", func(t *testing.T) {
		g.t = t
		m := r.mark()
		t0 := time.Now()
		g.op("Shutdown", c.Shutdown)
		evs := r.waitEvents(t, m, uuid, 60*time.Second, "SHUTDOWN/GUEST then STOPPED/SHUTDOWN", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "STOPPED/SHUTDOWN") >= 0
		})
		t.Logf("Shutdown (ACPI): %s", format(evs, t0))
		if !hasSubsequence(evs, "SHUTDOWN/GUEST", "STOPPED/SHUTDOWN") {
			t.Errorf("want SHUTDOWN/GUEST then STOPPED/SHUTDOWN, got %v", keys(evs))
		}
		if i, j := indexOf(evs, "SHUTDOWN/GUEST"), indexOf(evs, "STOPPED/SHUTDOWN"); i >= 0 && j > i {
			t.Logf("SHUTDOWN/GUEST → STOPPED/SHUTDOWN gap: %v", evs[j].At.Sub(evs[i].At).Round(time.Millisecond))
		}
		if s := g.state(); s != lifecycle.StateShutoff {
			t.Errorf("State after ACPI shutdown = %v, want shutoff", s)
		}
	})
	if !ok {
		return
	}

	ok = t.Run("guest-reboot", func(t *testing.T) {
		g.t = t
		const after = 2 // seconds after boot
		g.define(guest.ModeRebootAfter(after), "destroy")
		g.resetSerial()
		m := r.mark()
		t0 := time.Now()
		g.op("Start", c.Start)
		startEvs := r.waitEvents(t, m, uuid, 60*time.Second, "STARTED/BOOTED", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "STARTED/BOOTED") >= 0
		})
		booted := r.mark()
		evs := r.waitEvents(t, booted, uuid, 120*time.Second, "a REBOOT event", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "REBOOT") >= 0
		})
		// Keep watching a while: a late STOPPED would show up here.
		firstReboot := evs[0].At
		time.Sleep(5 * time.Second)
		evs = r.since(booted, uuid)
		t.Logf("guest reboot (hvg=reboot-after=%d, on_reboot=restart): start %s | after boot: %s",
			after, format(startEvs, t0), format(evs, t0))
		t.Logf("first REBOOT %v after Start; %d REBOOT events in the following 5 s window", firstReboot.Sub(t0).Round(time.Millisecond), len(evs))
		for _, ev := range evs {
			if ev.Kind != lifecycle.KindReboot {
				t.Errorf("guest reboot produced %s (kind %v): want REBOOT events only", key(ev), ev.Kind)
			}
		}
		if s := g.state(); s != lifecycle.StateRunning {
			t.Errorf("State during guest reboots = %v, want running", s)
		}
		m = r.mark()
		g.op("Destroy", c.Destroy)
		r.waitEvents(t, m, uuid, 60*time.Second, "STOPPED/DESTROYED", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "STOPPED/DESTROYED") >= 0
		})
	})
	if !ok {
		return
	}

	t.Run("guest-panic", func(t *testing.T) {
		g.t = t
		g.define(guest.ModePanicAfter(2), "destroy")
		g.resetSerial()
		m := r.mark()
		t0 := time.Now()
		g.op("Start", c.Start)
		evs := r.waitEvents(t, m, uuid, 120*time.Second, "STOPPED/CRASHED", func(evs []lifecycle.Event) bool {
			return indexOf(evs, "STOPPED/CRASHED") >= 0
		})
		t.Logf("guest panic (pvpanic ISA, on_crash=destroy): %s", format(evs, t0))
		if !hasSubsequence(evs, "CRASHED/PANICKED", "STOPPED/CRASHED") {
			t.Errorf("want CRASHED/PANICKED then STOPPED/CRASHED, got %v", keys(evs))
		}
		if s := g.state(); s != lifecycle.StateShutoff {
			t.Errorf("State after the crash = %v, want shutoff", s)
		}
	})
	g.t = t
	t.Logf("all events of the guest: %s", format(r.since(all, uuid), time.Time{}))
	if st := c.Status(); st.Overflows != 0 || st.Reconnects != 0 || !st.Connected {
		t.Errorf("status: %+v", st)
	}
}
