package daemon

import (
	"os"
	"strings"
	"testing"

	"hvguard/controller"
)

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	// The defaults are the cores' defaults.
	lc := controller.DefaultLeaderConfig(cfg.ID)
	if cfg.LeaderCore() != lc || cfg.TrackerCore() != controller.DefaultConfig() {
		t.Fatalf("defaults differ from the cores': %+v / %+v", cfg.LeaderCore(), cfg.TrackerCore())
	}
}

// The id defaults to the host name and a suffix that differs per process
// (per Complete).
func TestIDDefaultsToHostnameAndSuffix(t *testing.T) {
	h, _ := os.Hostname()
	a, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ParseConfig(nil)
	if !strings.HasPrefix(a.ID, h+"-") || len(a.ID) != len(h)+7 || a.ID == b.ID {
		t.Fatalf("ids %q %q: want %s-<6 hex>, different each time", a.ID, b.ID, h)
	}
	c, _ := ParseConfig([]byte("id: ctl-1\n"))
	if c.ID != "ctl-1" {
		t.Fatalf("explicit id lost: %q", c.ID)
	}
}

// Every bad value is reported with its field name and the value.
func TestConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "leader:\n  tll: 5s\n", []string{"tll", "not found"}},
		{"unknown section", "fence:\n  enabled: true\n", []string{"fence", "not found"}},
		{"bad duration", "leader:\n  ttl: ten\n", []string{"ten", "duration"}},
		{"bad id", "id: 'ctl 1'\n", []string{"id", `"ctl 1"`}},
		{"nats url scheme", "nats:\n  urls: [http://x:4222]\n", []string{"nats.urls[0]", `"http://x:4222"`}},
		{"no nats urls", "nats:\n  urls: []\n", []string{"nats.urls"}},
		{"missing creds", "nats:\n  creds_file: /nonexistent/x.creds\n", []string{"nats.creds_file", "/nonexistent/x.creds"}},
		{"cert without key", "nats:\n  cert_file: /etc/hostname\n", []string{"nats.cert_file", "key_file"}},
		{"negative ready timeout", "nats:\n  ready_timeout: -1s\n", []string{"nats.ready_timeout", "-1s"}},
		{"log level", "log:\n  level: loud\n", []string{"log.level", `"loud"`}},
		{"log format", "log:\n  format: xml\n", []string{"log.format", `"xml"`}},
		{"zero ttl", "leader:\n  ttl: 0s\n", []string{"leader.ttl", "0s"}},
		{"zero renew", "leader:\n  renew_interval: 0s\n", []string{"leader.renew_interval", "0s"}},
		{"zero write timeout", "leader:\n  write_timeout: 0s\n", []string{"leader.write_timeout", "0s"}},
		{"negative act margin", "leader:\n  act_margin: -1s\n", []string{"leader.act_margin", "-1s"}},
		{"renew too slow for ttl", "leader:\n  ttl: 5s\n  renew_interval: 4s\n", []string{"leader", "ttl 5s", "renew_interval 4s", "must be < ttl"}},
		{"guard count", "guard:\n  count: -1\n", []string{"guard.count", "-1"}},
		{"guard share", "guard:\n  share: 1.5\n", []string{"guard.share", "1.5"}},
		{"guard window", "guard:\n  window: 0s\n", []string{"guard.window", "0s"}},
		{"drift", "tracker:\n  drift: 0.2\n", []string{"tracker.drift", "0.2"}},
		{"host drift", "tracker:\n  max_host_drift: -0.1\n", []string{"tracker.max_host_drift", "-0.1"}},
		{"max grace", "tracker:\n  max_grace: 0s\n", []string{"tracker.max_grace", "0s"}},
		{"openstack interface", "openstack:\n  interface: private\n", []string{"openstack.interface", `"private"`}},
		{"openstack timeout", "openstack:\n  request_timeout: 0s\n", []string{"openstack.request_timeout", "0s"}},
		{"openstack cloud not loadable", "openstack:\n  cloud: nope\n  clouds_file: /nonexistent/clouds.yaml\n", []string{"openstack", `cloud "nope"`, "/nonexistent/clouds.yaml"}},
		{"metrics listen", "metrics:\n  listen: nowhere\n", []string{"metrics.listen", `"nowhere"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted %q", c.yaml)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// All problems are reported at once.
func TestConfigReportsAllErrors(t *testing.T) {
	_, err := ParseConfig([]byte("log:\n  level: loud\nguard:\n  share: 2\nmetrics:\n  listen: x\nleader:\n  ttl: 0s\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"log.level", "guard.share", "metrics.listen", "leader.ttl"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %s", err, w)
		}
	}
}
