package agent

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Host = "node1.example.org"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestParseConfigOverridesDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
host: compute-7
lifecycle:
  window: 20s
nats:
  urls: [nats://10.0.0.1:4222, tls://10.0.0.2:4222]
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "compute-7" || cfg.Lifecycle.Window.D() != 20*time.Second || len(cfg.NATS.URLs) != 2 {
		t.Fatalf("parsed %+v", cfg)
	}
	if cfg.Lifecycle.MaxChecks != DefaultConfig().Lifecycle.MaxChecks {
		t.Fatalf("absent field lost its default: max_checks=%d", cfg.Lifecycle.MaxChecks)
	}
}

// Every bad value is reported with its field name and the value.
func TestConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "host: n1\nlifecycle:\n  windw: 5s\n", []string{"windw", "not found"}},
		{"bad duration", "host: n1\nlifecycle:\n  window: fifteen\n", []string{"fifteen", "duration"}},
		{"negative window", "host: n1\nlifecycle:\n  window: -1s\n", []string{"lifecycle.window", "-1s"}},
		{"huge window", "host: n1\nlifecycle:\n  window: 1h\n", []string{"lifecycle.window", "1h0m0s"}},
		{"host with space", "host: 'node 1'\n", []string{"host", `"node 1"`}},
		{"host with star", "host: 'node*'\n", []string{"host", `"node*"`}},
		{"relative state dir", "host: n1\nstate_dir: var/lib\n", []string{"state_dir", `"var/lib"`}},
		{"nats url scheme", "host: n1\nnats:\n  urls: [http://x:4222]\n", []string{"nats.urls[0]", `"http://x:4222"`}},
		{"no nats urls", "host: n1\nnats:\n  urls: []\n", []string{"nats.urls"}},
		{"log level", "host: n1\nlog:\n  level: loud\n", []string{"log.level", `"loud"`}},
		{"max checks", "host: n1\nlifecycle:\n  max_checks: 0\n", []string{"lifecycle.max_checks", "0"}},
		{"recheck too fast", "host: n1\nlifecycle:\n  recheck_interval: 1ms\n", []string{"lifecycle.recheck_interval", "1ms"}},
		{"outbox too small", "host: n1\noutbox:\n  max_bytes: 10\n", []string{"outbox.max_bytes", "10"}},
		{"metrics listen", "host: n1\nmetrics:\n  listen: nowhere\n", []string{"metrics.listen", `"nowhere"`}},
		{"missing creds", "host: n1\nnats:\n  creds_file: /nonexistent/x.creds\n", []string{"nats.creds_file", "/nonexistent/x.creds"}},
		{"reconnect order", "host: n1\nlibvirt:\n  reconnect_min: 10s\n  reconnect_max: 1s\n", []string{"libvirt.reconnect_max"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// All problems are reported at once, not one per run.
func TestConfigReportsAllErrors(t *testing.T) {
	_, err := ParseConfig([]byte("host: n1\nlog:\n  level: loud\n  format: xml\nlifecycle:\n  max_checks: 0\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"log.level", "log.format", "lifecycle.max_checks"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %s", err, w)
		}
	}
}

func TestEmptyFileMeansDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil)
	if err != nil {
		t.Fatalf("empty config: %v", err)
	}
	if cfg.Host == "" {
		t.Fatal("host not filled from the hostname")
	}
}
