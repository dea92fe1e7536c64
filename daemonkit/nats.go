package daemonkit

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// NATSConfig is a daemon's connection to the NATS cluster: its URLs, the
// credentials and TLS files, and how long start-up waits for it.
type NATSConfig struct {
	URLs      []string `yaml:"urls"`
	CredsFile string   `yaml:"creds_file"`
	CAFile    string   `yaml:"ca_file"`
	CertFile  string   `yaml:"cert_file"`
	KeyFile   string   `yaml:"key_file"`
	// ReadyTimeout is how long start-up waits for NATS before the daemon
	// declares itself ready in a degraded mode (it keeps retrying).
	ReadyTimeout Duration `yaml:"ready_timeout"`
}

// Validate reports bad fields (named nats.*) through bad. The files must
// be readable now: a daemon that cannot read its credentials cannot start.
func (n NATSConfig) Validate(bad Bad) {
	if len(n.URLs) == 0 {
		bad("nats.urls", "[]", "at least one URL is required")
	}
	for i, s := range n.URLs {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			bad(fmt.Sprintf("nats.urls[%d]", i), fmt.Sprintf("%q", s), "must be nats://host:port (or tls://, ws://, wss://)")
		}
	}
	for _, f := range []struct{ field, path string }{
		{"nats.creds_file", n.CredsFile}, {"nats.ca_file", n.CAFile}, {"nats.cert_file", n.CertFile}, {"nats.key_file", n.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			bad(f.field, fmt.Sprintf("%q", f.path), "cannot be read: "+errors.Unwrap(err).Error())
		}
	}
	if (n.CertFile == "") != (n.KeyFile == "") {
		bad("nats.cert_file", fmt.Sprintf("%q", n.CertFile), "cert_file and key_file go together")
	}
	if n.ReadyTimeout < 0 {
		bad("nats.ready_timeout", n.ReadyTimeout.D(), "must not be negative")
	}
}

// URL joins the URLs for nats.Connect (a cluster: comma-separated).
func (n NATSConfig) URL() string { return strings.Join(n.URLs, ",") }

// Options returns the credential and TLS options the section configures.
func (n NATSConfig) Options() []nats.Option {
	var opts []nats.Option
	if n.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	if n.CAFile != "" {
		opts = append(opts, nats.RootCAs(n.CAFile))
	}
	if n.CertFile != "" {
		opts = append(opts, nats.ClientCert(n.CertFile, n.KeyFile))
	}
	return opts
}
