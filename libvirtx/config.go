package libvirtx

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config tells Dial where to connect and how to supervise the connection.
// The zero value of every field except URI is invalid; start from
// DefaultConfig.
type Config struct {
	URI               string        // "qemu:///system", "test:///default", "test+unix:///default", ...
	KeepAliveInterval time.Duration // default 5s; used on remote/daemon URIs only (test:/// has none)
	KeepAliveCount    uint          // default 3
	ConnectTimeout    time.Duration // default 10s: a hung libvirtd makes NewConnect block
	ReconnectMin      time.Duration // default 500ms (exponential backoff with jitter)
	ReconnectMax      time.Duration // default 30s
	EventBuffer       int           // default 4096: hand-off channel capacity
	CallTimeout       time.Duration // default 10s, bound on each domain query/operation
}

// DefaultConfig returns the default configuration for uri.
func DefaultConfig(uri string) Config {
	return Config{
		URI:               uri,
		KeepAliveInterval: 5 * time.Second,
		KeepAliveCount:    3,
		ConnectTimeout:    10 * time.Second,
		ReconnectMin:      500 * time.Millisecond,
		ReconnectMax:      30 * time.Second,
		EventBuffer:       4096,
		CallTimeout:       10 * time.Second,
	}
}

// Validate reports every invalid field; each error names the field and its
// value.
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("libvirtx: config %s=%v: %s", field, value, why))
	}
	if strings.TrimSpace(c.URI) == "" {
		bad("URI", fmt.Sprintf("%q", c.URI), "must not be empty")
	} else if !strings.Contains(c.URI, ":") {
		bad("URI", fmt.Sprintf("%q", c.URI), "must be a libvirt URI such as qemu:///system")
	}
	if c.KeepAliveInterval < time.Second {
		// libvirt's keepalive interval is in whole seconds.
		bad("KeepAliveInterval", c.KeepAliveInterval, "must be at least 1s")
	} else if c.KeepAliveInterval%time.Second != 0 {
		bad("KeepAliveInterval", c.KeepAliveInterval, "must be a whole number of seconds")
	}
	if c.KeepAliveCount == 0 {
		bad("KeepAliveCount", c.KeepAliveCount, "must be at least 1")
	}
	if c.ConnectTimeout <= 0 {
		bad("ConnectTimeout", c.ConnectTimeout, "must be positive")
	}
	if c.ReconnectMin <= 0 {
		bad("ReconnectMin", c.ReconnectMin, "must be positive")
	}
	if c.ReconnectMax < c.ReconnectMin {
		bad("ReconnectMax", c.ReconnectMax, fmt.Sprintf("must be at least ReconnectMin (%v)", c.ReconnectMin))
	}
	if c.EventBuffer < 1 {
		bad("EventBuffer", c.EventBuffer, "must be at least 1")
	}
	if c.CallTimeout <= 0 {
		bad("CallTimeout", c.CallTimeout, "must be positive")
	}
	return errors.Join(errs...)
}

// inProcess reports whether uri is served inside this process (the test
// driver without a transport), where keepalive does not exist.
func inProcess(uri string) bool {
	scheme, _, ok := strings.Cut(uri, ":")
	return ok && scheme == "test"
}
