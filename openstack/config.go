package openstack

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// Config says which cloud to use and how. The credentials, auth URL,
// region, interface and CA bundle come from clouds.yaml (and secure.yaml)
// through gophercloud's own loader, exactly as the openstack CLI reads
// them; the fields here only select and override.
type Config struct {
	// Cloud is the entry of clouds.yaml to use (like OS_CLOUD). Required.
	Cloud string
	// CloudsFile is the clouds.yaml path. Empty: the standard search
	// (OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/clouds.yaml,
	// /etc/openstack/clouds.yaml). A secure.yaml beside it is merged.
	CloudsFile string
	// Region overrides the cloud's region_name.
	Region string
	// Interface overrides the cloud's interface: public, internal or admin.
	Interface string
	// CACert overrides the cloud's cacert (a PEM bundle path).
	CACert string
	// RequestTimeout bounds each HTTP request (keystone and Nova); 0 =
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// PageSize is the /os-migrations limit per page; 0 = PageSize. At most
	// 1000 (Nova's default max_limit; a smaller max_limit is fine: paging
	// follows Nova's next links, not the count).
	PageSize int
}

// DefaultRequestTimeout bounds one HTTP request. A page of 500 evacuation
// records or one server is answered in well under a second by a healthy
// Nova (0.1–1 s measured for a servers listing under load); 10 s means
// "Nova is not answering", and a reconciliation gives up rather than wait.
const DefaultRequestTimeout = 10 * time.Second

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Cloud) == "" {
		errs = append(errs, errors.New("openstack: config cloud: must name an entry of clouds.yaml"))
	}
	switch c.Interface {
	case "", "public", "internal", "admin", "publicURL", "internalURL", "adminURL":
	default:
		errs = append(errs, fmt.Errorf("openstack: config interface=%q: must be public, internal or admin", c.Interface))
	}
	if c.PageSize < 0 || c.PageSize > 1000 {
		errs = append(errs, fmt.Errorf("openstack: config page_size=%d: must be between 1 and 1000 (0 = %d)", c.PageSize, PageSize))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("openstack: config request_timeout=%v: must not be negative", c.RequestTimeout))
	}
	return errors.Join(errs...)
}

// loaded is a parsed cloud.
type loaded struct {
	auth     gophercloud.AuthOptions
	endpoint gophercloud.EndpointOpts
	tls      *tls.Config
}

// load parses clouds.yaml with gophercloud's loader.
func (c Config) load() (loaded, error) {
	opts := []clouds.ParseOption{clouds.WithCloudName(c.Cloud)}
	if c.CloudsFile != "" {
		opts = append(opts, clouds.WithLocations(c.CloudsFile))
	}
	if c.Region != "" {
		opts = append(opts, clouds.WithRegion(c.Region))
	}
	if c.Interface != "" {
		opts = append(opts, clouds.WithEndpointType(c.Interface))
	}
	if c.CACert != "" {
		opts = append(opts, clouds.WithCACertPath(c.CACert))
	}
	ao, eo, tlsCfg, err := clouds.Parse(opts...)
	if err != nil {
		return loaded{}, &Error{Kind: KindConfig, Op: "load clouds.yaml", Err: err}
	}
	if ao.IdentityEndpoint == "" {
		return loaded{}, &Error{Kind: KindConfig, Op: "load clouds.yaml", Err: fmt.Errorf("cloud %q has no auth.auth_url", c.Cloud)}
	}
	// Keep the credentials in memory so gophercloud can re-authenticate when
	// the token expires (a long-running agent outlives any token).
	ao.AllowReauth = true
	return loaded{auth: ao, endpoint: eo, tls: tlsCfg}, nil
}

// InsecureTLS reports whether the cloud's clouds.yaml entry disables TLS
// certificate verification (verify: false, or insecure: true).
func (c Config) InsecureTLS() (bool, error) {
	l, err := c.load()
	if err != nil {
		return false, err
	}
	return l.tls != nil && l.tls.InsecureSkipVerify, nil
}
