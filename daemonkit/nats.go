package daemonkit

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// NATSConfig is a daemon's connection to the NATS cluster: its URLs, the
// credentials and TLS files, and how long start-up waits for it
// (docs/security.md, "Transport").
type NATSConfig struct {
	URLs []string `yaml:"urls"`
	// One way to authenticate at most: a creds file (JWT + NKey seed), an
	// NKey seed file, a token file, or user with a password file. Every
	// one of these files (and key_file) is a secret: mode 0600, or the
	// daemon refuses to start.
	CredsFile    string `yaml:"creds_file"`
	NKeySeedFile string `yaml:"nkey_seed_file"`
	TokenFile    string `yaml:"token_file"`
	User         string `yaml:"user"`
	PasswordFile string `yaml:"password_file"`
	// TLS: ca_file verifies the servers (and, like cert_file, makes TLS
	// mandatory even with nats:// URLs); cert_file/key_file are the
	// client certificate for servers that verify clients.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// AllowInsecure permits plaintext (nats://, ws:// without ca_file or
	// cert_file) to a server that is not on this host: credentials and
	// lease records then cross the network readable and changeable by
	// anyone on the path. Logged at ERROR at start and shown in the
	// status while set.
	AllowInsecure bool `yaml:"allow_insecure"`
	// ReadyTimeout is how long start-up waits for NATS before the daemon
	// declares itself ready in a degraded mode (it keeps retrying).
	ReadyTimeout Duration `yaml:"ready_timeout"`
}

// Validate reports bad fields (named nats.*) through bad. The files must
// be readable now, and the secret ones accessible to their owner only: a
// daemon that cannot read its credentials cannot start.
func (n NATSConfig) Validate(bad Bad) {
	if len(n.URLs) == 0 {
		bad("nats.urls", "[]", "at least one URL is required")
	}
	tls := n.TLS()
	for i, s := range n.URLs {
		field := fmt.Sprintf("nats.urls[%d]", i)
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			bad(field, fmt.Sprintf("%q", s), "must be nats://host:port (or tls://, ws://, wss://)")
			continue
		}
		if !tls && !n.AllowInsecure && !Loopback(u.Hostname()) {
			bad(field, fmt.Sprintf("%q", Redact(s)), "plaintext to a server that is not on this host: use tls:// (or wss://) or set nats.ca_file, "+
				"or set nats.allow_insecure: true to accept that credentials and lease records cross the network unprotected")
		}
	}
	for _, f := range []struct{ field, path string }{{"nats.ca_file", n.CAFile}, {"nats.cert_file", n.CertFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			bad(f.field, fmt.Sprintf("%q", f.path), "cannot be read: "+RootCause(err).Error())
		}
	}
	n.ValidateCredentials("nats", bad)
	if n.KeyFile != "" {
		CheckSecretFile(bad, "nats.key_file", n.KeyFile)
	}
	if (n.CertFile == "") != (n.KeyFile == "") {
		bad("nats.cert_file", fmt.Sprintf("%q", n.CertFile), "cert_file and key_file go together")
	}
	if n.ReadyTimeout < 0 {
		bad("nats.ready_timeout", n.ReadyTimeout.D(), "must not be negative")
	}
}

// ValidateCredentials reports bad credential fields (named p.*: "nats",
// or "nats.control" for the controller's second user): one method at
// most, each secret file accessible to its owner only and readable now.
func (n NATSConfig) ValidateCredentials(p string, bad Bad) {
	var methods []string
	for _, f := range []struct{ field, path string }{
		{p + ".creds_file", n.CredsFile}, {p + ".nkey_seed_file", n.NKeySeedFile},
		{p + ".token_file", n.TokenFile}, {p + ".password_file", n.PasswordFile}} {
		if f.path == "" {
			continue
		}
		CheckSecretFile(bad, f.field, f.path)
		methods = append(methods, f.field)
	}
	if len(methods) > 1 {
		bad(methods[1], fmt.Sprintf("%q", "set"), "only one of "+p+".creds_file, nkey_seed_file, token_file, password_file may be set (also set: "+methods[0]+")")
	}
	if (n.User == "") != (n.PasswordFile == "") {
		bad(p+".user", fmt.Sprintf("%q", n.User), "user and password_file go together")
	}
	for _, f := range []struct{ field, path string }{{p + ".token_file", n.TokenFile}, {p + ".password_file", n.PasswordFile}} {
		if f.path != "" && SecretFileError(f.path) == nil {
			if _, err := secretReader(f.field, f.path); err != nil {
				bad(f.field, fmt.Sprintf("%q", f.path), "is empty")
			}
		}
	}
	if n.NKeySeedFile != "" && SecretFileError(n.NKeySeedFile) == nil {
		if _, err := nats.NkeyOptionFromSeed(n.NKeySeedFile); err != nil {
			bad(p+".nkey_seed_file", fmt.Sprintf("%q", n.NKeySeedFile), "not a user NKey seed: "+err.Error())
		}
	}
}

// TLS reports whether every connection is TLS: a tls:// or wss:// URL
// (nats.go then uses TLS for the whole pool), or ca_file or cert_file
// (nats.RootCAs and nats.ClientCert make TLS mandatory).
func (n NATSConfig) TLS() bool {
	if n.CAFile != "" || n.CertFile != "" {
		return true
	}
	for _, s := range n.URLs {
		if u, err := url.Parse(s); err == nil && (u.Scheme == "tls" || u.Scheme == "wss") {
			return true
		}
	}
	return false
}

// Loopback reports whether host (a URL's host name) is this host:
// "localhost" or a loopback address.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Redact removes the password of a URL's user info (for logs and errors).
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// Warnings returns what is insecure in the section, for the log at start
// and the daemons' status: plaintext allowed to remote servers, a password
// inside a URL (in the configuration file, which packages install
// world-readable).
func (n NATSConfig) Warnings() []string {
	var w []string
	tls := n.TLS()
	for _, s := range n.URLs {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if !tls && !Loopback(u.Hostname()) {
			w = append(w, fmt.Sprintf("nats: plaintext connection to %s allowed by nats.allow_insecure: credentials and lease records cross the network unprotected", Redact(s)))
		}
		if _, ok := u.User.Password(); ok {
			w = append(w, fmt.Sprintf("nats: %s carries a password in the configuration file: use nats.user and nats.password_file (mode 0600)", Redact(s)))
		}
	}
	return w
}

// URL joins the URLs for nats.Connect (a cluster: comma-separated).
func (n NATSConfig) URL() string { return strings.Join(n.URLs, ",") }

// Options returns the credential and TLS options the section configures.
// A token or password file is read again at every (re)connect, so it can
// be replaced without a restart; if it cannot be read then, the last
// value read is used.
func (n NATSConfig) Options() ([]nats.Option, error) { return n.OptionsFor("nats") }

// OptionsFor is Options naming the section p in its errors ("nats", or
// "nats.control" for the controller's second user).
func (n NATSConfig) OptionsFor(p string) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case n.CredsFile != "":
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	case n.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%s.nkey_seed_file %q: %w", p, n.NKeySeedFile, err)
		}
		opts = append(opts, o)
	case n.TokenFile != "":
		read, err := secretReader(p+".token_file", n.TokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.TokenHandler(read))
	case n.PasswordFile != "":
		read, err := secretReader(p+".password_file", n.PasswordFile)
		if err != nil {
			return nil, err
		}
		user := n.User
		opts = append(opts, nats.UserInfoHandler(func() (string, string) { return user, read() }))
	}
	if n.CAFile != "" {
		opts = append(opts, nats.RootCAs(n.CAFile))
	}
	if n.CertFile != "" {
		opts = append(opts, nats.ClientCert(n.CertFile, n.KeyFile))
	}
	return opts, nil
}

// secretReader reads a one-line secret file now (an error if it cannot)
// and returns a function that reads it again, keeping the last good value.
func secretReader(field, path string) (func() string, error) {
	read := func() (string, error) {
		b, err := ReadSecretFile(field, path)
		if err != nil {
			return "", err
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("%s: %q is empty", field, path)
		}
		return s, nil
	}
	last, err := read()
	if err != nil {
		return nil, err
	}
	return func() string {
		if s, err := read(); err == nil {
			last = s
		}
		return last
	}, nil
}

// LogWarnings logs each warning at ERROR (insecure settings are loud).
func LogWarnings(log *slog.Logger, warnings []string) {
	for _, w := range warnings {
		log.Error("insecure configuration", "warning", w)
	}
}
