package daemonkit

import (
	"fmt"
	"strings"

	"hvguard/openstack"
)

// OpenStackConfig is a daemon's connection to the OpenStack cloud. It
// selects and overrides a clouds.yaml entry; the credentials stay in
// clouds.yaml/secure.yaml (read by gophercloud's own loader, as the
// openstack CLI reads them). Unused while no feature needs it.
type OpenStackConfig struct {
	// Cloud is the clouds.yaml entry (like OS_CLOUD). Required when a
	// feature that asks OpenStack is enabled.
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

// DefaultOpenStack returns the section's defaults.
func DefaultOpenStack() OpenStackConfig {
	return OpenStackConfig{RequestTimeout: Duration(openstack.DefaultRequestTimeout)}
}

// Client is the openstack client's configuration.
func (o OpenStackConfig) Client() openstack.Config {
	return openstack.Config{Cloud: o.Cloud, CloudsFile: o.CloudsFile, Region: o.Region,
		Interface: o.Interface, CACert: o.CACert, RequestTimeout: o.RequestTimeout.D()}
}

// Validate reports every problem (fields named openstack.*) through bad.
// users names what needs the cloud ("" = nothing: nothing more is
// checked); when something needs it, it also parses clouds.yaml (openstack.New, no network): a cloud that cannot be
// loaded is a configuration error (exit 78), not a run-time failure.
func (o OpenStackConfig) Validate(users string, bad Bad) {
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

// Warnings returns what is insecure in the cloud's configuration when
// users (what needs the cloud, "" = nothing) use it: a clouds.yaml entry
// with verify: false — keystone's and Nova's certificates are then not
// checked, although Nova's answers decide what hvguard destroys.
func (o OpenStackConfig) Warnings(users string) []string {
	if users == "" || o.Cloud == "" {
		return nil
	}
	insecure, err := o.Client().InsecureTLS()
	if err != nil || !insecure {
		return nil
	}
	return []string{fmt.Sprintf("openstack: clouds.yaml cloud %q disables TLS verification (verify: false): "+
		"keystone's and Nova's certificates are not checked, although Nova's answers (used by %s) decide what hvguard destroys; set cacert instead", o.Cloud, users)}
}
