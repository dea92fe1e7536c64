package daemon

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"hvguard/controller"
	"hvguard/controller/recovery"
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
	rc, dc := cfg.Recovery.Core(), recovery.DefaultConfig()
	rc.NovaHosts = nil
	if !reflect.DeepEqual(rc, dc) {
		t.Fatalf("recovery defaults differ from the core's: %+v / %+v", rc, dc)
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
		{"missing control seed", "nats:\n  control:\n    nkey_seed_file: /nonexistent/c.nk\n", []string{"nats.control.nkey_seed_file", "/nonexistent/c.nk"}},
		{"control user without password", "nats:\n  control:\n    user: ctl\n", []string{"nats.control.user", `"ctl"`, "password_file"}},
		{"unknown control field", "nats:\n  control:\n    urls: [nats://x:1]\n", []string{"urls", "not found"}},
		{"negative ready timeout", "nats:\n  ready_timeout: -1s\n", []string{"nats.ready_timeout", "-1s"}},
		{"log level", "log:\n  level: loud\n", []string{"log.level", `"loud"`}},
		{"log format", "log:\n  format: xml\n", []string{"log.format", `"xml"`}},
		{"instance recovery mode", "instance_recovery:\n  mode: evacuate\n", []string{"instance_recovery.mode", `"evacuate"`}},
		{"instance recovery needs a cloud", "instance_recovery:\n  mode: restart\n", []string{"openstack.cloud", "instance_recovery.mode restart"}},
		{"instance recovery detail", "instance_recovery:\n  details: [crashed, saved]\n", []string{"instance_recovery.details", `"saved"`}},
		{"instance recovery budget", "instance_recovery:\n  budget: 0\n", []string{"instance_recovery.budget", "0"}},
		{"instance recovery project", "instance_recovery:\n  projects: {p1: some}\n", []string{"instance_recovery.projects.p1", `"some"`}},
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
		{"nats write deadline", "tracker:\n  nats_write_deadline: 5m\n", []string{"tracker.nats_write_deadline", "5m0s", "at most 2m0s"}},
		{"openstack interface", "openstack:\n  interface: private\n", []string{"openstack.interface", `"private"`}},
		{"openstack timeout", "openstack:\n  request_timeout: 0s\n", []string{"openstack.request_timeout", "0s"}},
		{"openstack cloud not loadable", "openstack:\n  cloud: nope\n  clouds_file: /nonexistent/clouds.yaml\n", []string{"openstack", `cloud "nope"`, "/nonexistent/clouds.yaml"}},
		{"metrics listen", "metrics:\n  listen: nowhere\n", []string{"metrics.listen", `"nowhere"`}},
		{"recovery mode", "recovery:\n  mode: evac\n", []string{"recovery.mode", `"evac"`}},
		{"recovery release", "recovery:\n  release: auto\n", []string{"recovery.release", `"auto"`}},
		{"recovery max evacuations", "recovery:\n  max_evacuations: 0\n", []string{"recovery.max_evacuations", "0"}},
		{"recovery max hosts", "recovery:\n  max_hosts: -1\n", []string{"recovery.max_hosts", "-1"}},
		{"recovery max attempts", "recovery:\n  max_attempts: 0\n", []string{"recovery.max_attempts", "0"}},
		{"recovery retry base", "recovery:\n  retry_base: 0s\n", []string{"recovery.retry_base", "0s"}},
		{"recovery retry max", "recovery:\n  retry_max: 1s\n", []string{"recovery.retry_max", "1s", "retry_base (10s)"}},
		{"recovery release retry", "recovery:\n  release_retry: 0s\n", []string{"recovery.release_retry", "0s"}},
		{"recovery nova hosts", "recovery:\n  nova_hosts: {node1.example.org: 'node 1'}\n", []string{"recovery.nova_hosts", `"node 1"`}},
		{"evacuate without a cloud", "recovery:\n  mode: evacuate\n", []string{"openstack.cloud", "required with recovery.mode evacuate"}},
		{"masakari without a cloud", "recovery:\n  mode: masakari\n", []string{"openstack.cloud", "required with recovery.mode masakari"}},
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

// nats.control: never the main user's own file; with credentials but no
// nats.control the shared account is an insecure setting, with it not.
func TestConfigControlUser(t *testing.T) {
	dir := t.TempDir()
	seed := dir + "/nats.nk"
	cseed := dir + "/nats-control.nk"
	for _, p := range []string{seed, cseed} {
		// An NKey user seed (the example controller's).
		if err := os.WriteFile(p, []byte("SUAENDZN6M46DR7BR54C2KX4YWHRQIR4DDVVBCPSNMDPZKWAOHER2V4C3A\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := ParseConfig([]byte("nats:\n  nkey_seed_file: " + seed + "\n  control:\n    nkey_seed_file: " + seed + "\n"))
	if err == nil || !strings.Contains(err.Error(), "nats.control.nkey_seed_file") || !strings.Contains(err.Error(), "another user") {
		t.Fatalf("the main user's seed as the control user's: %v", err)
	}
	shared, err := ParseConfig([]byte("nats:\n  nkey_seed_file: " + seed + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := shared.SecurityWarnings(); !slices.Contains(w, SharedAccountWarning) {
		t.Errorf("credentials without nats.control: warnings %q", w)
	}
	own, err := ParseConfig([]byte("nats:\n  nkey_seed_file: " + seed + "\n  control:\n    nkey_seed_file: " + cseed + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := own.SecurityWarnings(); slices.Contains(w, SharedAccountWarning) {
		t.Errorf("with nats.control: warnings %q", w)
	}
	if c := own.NATS.ControlSection(); c.NKeySeedFile != cseed || c.URL() != own.NATS.URL() {
		t.Errorf("control section %+v", c)
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

// openstack.service_cloud: needs cloud, must load from the same
// clouds.yaml, and reaches the adapter's configuration.
func TestConfigServiceCloud(t *testing.T) {
	path := t.TempDir() + "/clouds.yaml"
	y := `clouds:
  admin:
    auth: {auth_url: "http://127.0.0.1:1/v3", username: a, password: p, project_name: admin, user_domain_name: Default, project_domain_name: Default}
  svc:
    auth: {auth_url: "http://127.0.0.1:1/v3", username: s, password: p, project_name: service, user_domain_name: Default, project_domain_name: Default}
`
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"without cloud", "openstack:\n  service_cloud: svc\n  clouds_file: " + path + "\n", `openstack.service_cloud: "svc": needs openstack.cloud`},
		{"not in clouds.yaml", "openstack:\n  cloud: admin\n  service_cloud: nope\n  clouds_file: " + path + "\n", `openstack.service_cloud: "nope"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to mention %s", err, c.want)
			}
		})
	}
	cfg, err := ParseConfig([]byte("openstack:\n  cloud: admin\n  service_cloud: svc\n  clouds_file: " + path + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rc := cfg.OpenStack.Recovery(); rc.Cloud != "admin" || rc.ServiceCloud != "svc" || rc.CloudsFile != path {
		t.Fatalf("recovery config %+v", rc)
	}
	r, err := cfg.NewOpenStack(nil)
	if err != nil || r == nil {
		t.Fatalf("adapter %v %v", r, err)
	}
	_, err = ParseConfig([]byte("recovery:\n  mode: evacuate\nopenstack:\n  cloud: admin\n  clouds_file: " + path + "\n"))
	if err == nil || !strings.Contains(err.Error(), `openstack.service_cloud: "": required with recovery.mode evacuate`) {
		t.Fatalf("evacuate without service_cloud: %v", err)
	}
	if _, err := ParseConfig([]byte("recovery:\n  mode: evacuate\nopenstack:\n  cloud: admin\n  service_cloud: svc\n  clouds_file: " + path + "\n")); err != nil {
		t.Fatalf("evacuate with both clouds: %v", err)
	}
	none, _ := ParseConfig(nil)
	if r, err := none.NewOpenStack(nil); r != nil || err != nil {
		t.Fatalf("no cloud: %v %v", r, err)
	}
}

// Attack (reviewer X1): two lease hosts mapped to one nova-compute host
// (a typo, or names differing only in case: Nova's MariaDB compares host
// names case-insensitively) make the recovery of one of them force down
// and evacuate the other's — a live host's — servers. The configuration
// must be refused, naming both.
func TestAttackConfigNovaHostsNotInjective(t *testing.T) {
	for _, y := range []string{
		"recovery:\n  nova_hosts: {node1: compute-1, node2: compute-1}\n",
		"recovery:\n  nova_hosts: {node1: compute-1, node2: COMPUTE-1}\n",
	} {
		_, err := ParseConfig([]byte(y))
		if err == nil {
			t.Errorf("accepted %q", y)
			continue
		}
		for _, w := range []string{"recovery.nova_hosts", "node1", "node2"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
	}
}
