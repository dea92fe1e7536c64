package agent

import (
	"fmt"
	"log/slog"
	"strings"

	"hvguard/openstack"
)

// OpenStackConfig is the connection to the OpenStack cloud, shared by the
// features that ask Nova: reconcile (issue 4) and classification (issue 6).
// It selects and overrides a clouds.yaml entry; the credentials stay in
// clouds.yaml/secure.yaml (read by gophercloud's own loader, as the
// openstack CLI reads them). Unused while both features are off.
type OpenStackConfig struct {
	// Cloud is the clouds.yaml entry (like OS_CLOUD). Required when
	// reconcile or classification is enabled.
	Cloud string `yaml:"cloud"`
	// CloudsFile is the clouds.yaml path; empty: the standard search
	// (OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/,
	// /etc/openstack/).
	CloudsFile string `yaml:"clouds_file"`
	// Region, Interface and CACert override the cloud's region_name,
	// interface (public, internal, admin) and cacert.
	Region    string `yaml:"region"`
	Interface string `yaml:"interface"`
	CACert    string `yaml:"cacert"`
	// RequestTimeout bounds each HTTP request to keystone and Nova.
	RequestTimeout Duration `yaml:"request_timeout"`
}

func defaultOpenStack() OpenStackConfig {
	return OpenStackConfig{RequestTimeout: Duration(openstack.DefaultRequestTimeout)}
}

// Client is the openstack client's configuration.
func (o OpenStackConfig) Client() openstack.Config {
	return openstack.Config{Cloud: o.Cloud, CloudsFile: o.CloudsFile, Region: o.Region,
		Interface: o.Interface, CACert: o.CACert, RequestTimeout: o.RequestTimeout.D()}
}

// newNova builds the one OpenStack client the agent's features share
// (reconcile and classification: one keystone token, one connection pool;
// the client is safe for concurrent use), or nil when no enabled feature
// asks Nova. It parses clouds.yaml and does not contact keystone or Nova.
func newNova(cfg Config, log *slog.Logger) (*openstack.Client, error) {
	if cfg.needsOpenStack() == "" {
		return nil, nil
	}
	nova, err := openstack.New(cfg.OpenStack.Client(), log.With("component", "openstack"))
	if err != nil {
		return nil, fmt.Errorf("openstack: %w", err)
	}
	return nova, nil
}

// needsOpenStack names the enabled features that ask Nova ("" = none).
func (c *Config) needsOpenStack() string {
	var on []string
	if c.Reconcile.Enabled {
		on = append(on, "reconcile.enabled")
	}
	if c.Classification.Enabled {
		on = append(on, "classification.enabled")
	}
	return strings.Join(on, " and ")
}

// validate reports every problem through bad. With a feature that needs it
// enabled it also parses clouds.yaml (openstack.New, no network): a cloud
// that cannot be loaded is a configuration error (exit 78), not a run-time
// failure.
func (o OpenStackConfig) validate(users string, bad func(field string, val any, why string)) {
	if o.RequestTimeout <= 0 {
		bad("openstack.request_timeout", o.RequestTimeout.D(), "must be positive")
	}
	switch o.Interface {
	case "", "public", "internal", "admin":
	default:
		bad("openstack.interface", fmt.Sprintf("%q", o.Interface), "must be public, internal, admin or empty (the cloud's)")
	}
	if users == "" {
		return
	}
	if strings.TrimSpace(o.Cloud) == "" {
		bad("openstack.cloud", `""`, "required with "+users+": the clouds.yaml entry to use")
		return
	}
	if _, err := openstack.New(o.Client(), nil); err != nil {
		bad("openstack", fmt.Sprintf("cloud %q (clouds_file %q)", o.Cloud, o.CloudsFile), err.Error())
	}
}
