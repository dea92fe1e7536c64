package agent

import (
	"path/filepath"
	"strings"
	"testing"

	"hvguard/classify"
	"hvguard/openstack/openstacktest"
)

// Classification is off by default with classify's defaults; its bounds
// and its need of openstack.cloud are errors naming field and value.
func TestClassificationConfig(t *testing.T) {
	d := DefaultConfig()
	if d.Classification.Enabled || d.Classification.MaxHold.D() != classify.DefaultMaxHold ||
		d.Classification.QueryTimeout.D() != classify.DefaultQueryTimeout {
		t.Fatalf("defaults: %+v", d.Classification)
	}

	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"max_hold too short", "classification:\n  max_hold: 30s\n", []string{"classification.max_hold: 30s", "between 1m0s and 1h0m0s"}},
		{"max_hold too long", "classification:\n  max_hold: 2h\n", []string{"classification.max_hold: 2h0m0s"}},
		{"query_timeout too short", "classification:\n  query_timeout: 100ms\n", []string{"classification.query_timeout: 100ms", "between 500ms and 30s"}},
		{"query_timeout too long", "classification:\n  query_timeout: 1m\n", []string{"classification.query_timeout: 1m0s"}},
		{"nova_host", "classification:\n  nova_host: 'a b'\n", []string{`classification.nova_host: "a b"`}},
		{"enabled without cloud", "classification:\n  enabled: true\n", []string{`openstack.cloud: "": required with classification.enabled`}},
		{"both without cloud", "classification:\n  enabled: true\nreconcile:\n  enabled: true\n", []string{"required with reconcile.enabled and classification.enabled"}},
		{"old reconcile.openstack", "reconcile:\n  openstack:\n    cloud: x\n", []string{"openstack", "not found"}},
		{"missing clouds.yaml", "classification:\n  enabled: true\nopenstack:\n  cloud: c\n  clouds_file: " + filepath.Join(t.TempDir(), "none.yaml") + "\n",
			[]string{`openstack: cloud "c"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte("host: n1\n" + c.yaml))
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

	nova := openstacktest.New(t)
	cfg, err := ParseConfig([]byte("host: n1\nclassification:\n  enabled: true\n  nova_host: node3\n  max_hold: 10m\n  query_timeout: 2s\nopenstack:\n  cloud: test\n  clouds_file: " + nova.CloudsYAML(t) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	core := cfg.Classification.Core()
	if core.MaxHold.String() != "10m0s" || core.QueryTimeout.String() != "2s" || cfg.Classification.Host(cfg.Host) != "node3" {
		t.Fatalf("parsed %+v", cfg.Classification)
	}
	if h := DefaultConfig().Classification.Host("n1"); h != "n1" {
		t.Fatalf("nova_host default: %q", h)
	}
}
