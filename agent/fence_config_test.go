package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// The fence: defaults are fencing.DefaultConfig's (the numbers in
// docs/fencing.md, README and packaging/agent.yaml), fencing is off, and
// the section validates.
func TestFenceConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	c.Host = "node1.example.org"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	f := c.Fence
	if f.Enabled || f.Action != "pause" || f.AllowReset || f.WatchdogDevice != "" {
		t.Fatalf("defaults: %+v", f)
	}
	got := f.Core("node1.example.org", "boot")
	want := fencing.DefaultConfig("node1.example.org", "boot")
	if got.Timing != want.Timing || got.HeldRecheck != want.HeldRecheck || got.PeerBatch != want.PeerBatch || got.Action != want.Action {
		t.Fatalf("core %+v, want fencing defaults %+v", got, want)
	}
	if got.Backstop() != fencing.BackstopNone {
		t.Fatalf("backstop %s", got.Backstop())
	}
	if u := f.peerURL("node2.example.org"); u != "http://node2.example.org:9476/v1/fencing/peer" {
		t.Fatalf("peer url %s", u)
	}
}

// Every problem names the field and the value; enabling fencing needs a
// readable secret of at least 16 bytes.
func TestFenceConfigValidation(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tooshort\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A secret other local users can read: refused with its mode named.
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("0123456789abcdef-long-enough\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		mod        func(*FenceConfig)
	}{
		{"action", `fence.action: "halt": must be pause`, func(f *FenceConfig) { f.Action = "halt" }},
		{"ttl", "fence.lease_ttl: 8s: too short", func(f *FenceConfig) { f.LeaseTTL = Duration(8 * time.Second) }},
		{"renew", "fence.renew_interval: 0s: must be positive", func(f *FenceConfig) { f.RenewInterval = 0 }},
		{"drift", "fence.max_clock_drift: 0.5", func(f *FenceConfig) { f.MaxClockDrift = 0.5 }},
		{"listen", `fence.peer_listen: "9476": must be host:port`, func(f *FenceConfig) { f.PeerListen = "9476" }},
		{"url", `fence.peer_url: "ftp://{host}"`, func(f *FenceConfig) { f.PeerURL = "ftp://{host}" }},
		{"wd", "fence.watchdog_timeout: 1.5s: must be whole seconds", func(f *FenceConfig) {
			f.WatchdogDevice, f.WatchdogTimeout = "/dev/watchdog", Duration(1500*time.Millisecond)
		}},
		{"nosecret", `fence.peer_secret_file: "": required when fencing is enabled`, func(f *FenceConfig) { f.Enabled = true }},
		{"runtimedir", `fence.runtime_dir: "run/hvguard": must be an absolute path`, func(f *FenceConfig) { f.RuntimeDir = "run/hvguard" }},
		{"noruntimedir", `fence.runtime_dir: "": must be an absolute path`, func(f *FenceConfig) { f.RuntimeDir = "" }},
		{"shortsecret", "secret must be at least 16 bytes", func(f *FenceConfig) { f.Enabled, f.PeerSecretFile = true, short }},
		{"missing", "cannot be read", func(f *FenceConfig) { f.Enabled, f.PeerSecretFile = true, filepath.Join(dir, "none") }},
		{"worldreadable", `fence.peer_secret_file: "` + open + `": is a secret but has mode 0644`, func(f *FenceConfig) { f.Enabled, f.PeerSecretFile = true, open }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Host = "node1.example.org"
			tc.mod(&c.Fence)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// ParseConfig reads a fence: section (unknown keys are rejected).
func TestFenceConfigParse(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(secret, []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig([]byte("host: n1.example.org\nfence:\n  enabled: true\n  action: destroy\n  allow_reset: true\n  peer_secret_file: " + secret +
		"\n  peer_urls: {n2.example.org: \"http://10.0.0.2:9476\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Fence.Enabled || c.Fence.Action != "destroy" || c.Fence.Core(c.Host, "b").Backstop() != fencing.BackstopReset {
		t.Fatalf("%+v", c.Fence)
	}
	if u := c.Fence.peerURL("n2.example.org"); u != "http://10.0.0.2:9476/v1/fencing/peer" {
		t.Fatalf("override: %s", u)
	}
	if b, acc, err := readSecret(secret); err != nil || string(b) != "0123456789abcdef" || len(acc) != 0 {
		t.Fatalf("secret %q %q %v", b, acc, err)
	}
	// A rotation: one secret per line, the first signs, all are accepted.
	if err := os.WriteFile(secret, []byte("new-secret-0123456789\n\n  old-secret-0123456789  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, acc, err := readSecret(secret); err != nil || string(b) != "new-secret-0123456789" || len(acc) != 1 || string(acc[0]) != "old-secret-0123456789" {
		t.Fatalf("secrets %q %q %v", b, acc, err)
	}
	if _, err := ParseConfig([]byte("fence:\n  enable: true\n")); err == nil {
		t.Fatal("unknown key accepted")
	}
}

// The fencing clock is CLOCK_BOOTTIME: it advances with real time and
// never runs backwards.
func TestBootClock(t *testing.T) {
	a := bootNow()
	time.Sleep(10 * time.Millisecond)
	b := bootNow()
	if d := b.Sub(a); d < 10*time.Millisecond || d > time.Second {
		t.Fatalf("boot clock advanced %s over 10ms", d)
	}
}
