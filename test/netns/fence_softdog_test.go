package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hvguard/fencing/watchdog"
)

// softdogDevice returns a /dev/watchdogN served by the kernel's softdog
// loaded with soft_noboot=1 (expiry logs instead of rebooting), loading it
// when possible, or skips with the reason. It never touches another
// watchdog: opening a hardware watchdog arms it, and a test must not be
// able to reset this machine.
func softdogDevice(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("softdog: needs root")
	}
	if _, err := os.Stat("/sys/module/softdog"); err != nil {
		out, err := exec.Command("modprobe", "softdog", "soft_noboot=1").CombinedOutput()
		if err != nil {
			t.Skipf("softdog: not loaded and `modprobe softdog soft_noboot=1` failed (%v: %s): a container or a kernel without modules cannot run this test", err, strings.TrimSpace(string(out)))
		}
	}
	nb, err := os.ReadFile("/sys/module/softdog/parameters/soft_noboot")
	if err != nil || strings.TrimSpace(string(nb)) != "1" && strings.TrimSpace(string(nb)) != "Y" {
		t.Skipf("softdog: loaded without soft_noboot=1 (%q, %v): an expiry would reboot this machine; not testing", nb, err)
	}
	ids, _ := filepath.Glob("/sys/class/watchdog/watchdog*/identity")
	for _, p := range ids {
		id, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(id)) == "Software Watchdog" {
			dev := "/dev/" + filepath.Base(filepath.Dir(p))
			if _, err := os.Stat(dev); err == nil {
				return dev
			}
		}
	}
	t.Skip("softdog: loaded but no /dev/watchdogN identifies as \"Software Watchdog\"")
	return ""
}

// TestSoftdogArmFeedDisarm drives the kernel's softdog through the agent's
// watchdog code (watchdog.OpenLinux + the state layer): armed with a 2 s
// timeout, fed for longer than the timeout (it does not fire: the kernel's
// timeleft stays above 0), then disarmed by magic close. Guarded by
// HVGUARD_SOFTDOG=1 (test/netns/run.sh sets it); skips with the reason
// where softdog cannot be loaded with soft_noboot=1.
func TestSoftdogArmFeedDisarm(t *testing.T) {
	if os.Getenv("HVGUARD_SOFTDOG") != "1" {
		t.Skip("set HVGUARD_SOFTDOG=1 (test/netns/run.sh does, as root)")
	}
	dev := softdogDevice(t)
	d, err := watchdog.OpenLinux(dev)
	if err != nil {
		t.Fatal(err)
	}
	w := watchdog.New(d)
	if err := w.Arm(time.Now(), 2*time.Second); err != nil {
		_ = d.MagicClose()
		t.Fatal(err)
	}
	defer func() {
		if err := w.Disarm(); err != nil {
			t.Errorf("disarm: %v", err)
		}
	}()
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		if st := w.Feed(time.Now(), true); st != watchdog.Armed {
			t.Fatalf("state %s while fed (err %v)", st, w.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("softdog %s armed (timeout %s), fed for 4 s, disarming by magic close", dev, w.Timeout())
}
