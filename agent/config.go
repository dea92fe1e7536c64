package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"hvguard/daemonkit"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// Duration is a time.Duration that reads and writes YAML as a Go duration
// string ("15s", "500ms") (shared with the controller).
type Duration = daemonkit.Duration

// Config is the agent's configuration file (/etc/hvguard/agent.yaml).
// Every field is documented in packaging/agent.yaml and in the README; the
// two must change together.
type Config struct {
	// Host is this compute node's name as Nova knows it (nova.conf [DEFAULT]
	// host). Empty means os.Hostname(). It must be an RFC 1123 host name:
	// it becomes a NATS subject token.
	Host string `yaml:"host"`
	// StateDir holds the outbox, the per-host sequence number and the last
	// known domain states. It must be on persistent storage.
	StateDir string        `yaml:"state_dir"`
	Log      LogConfig     `yaml:"log"`
	Libvirt  LibvirtConfig `yaml:"libvirt"`
	// Lifecycle configures the stop debouncer.
	Lifecycle LifecycleConfig `yaml:"lifecycle"`
	NATS      NATSConfig      `yaml:"nats"`
	Outbox    OutboxConfig    `yaml:"outbox"`
	Metrics   MetricsConfig   `yaml:"metrics"`
	// Status is the local socket `hvguard-agent status` asks.
	Status StatusConfig `yaml:"status"`
	// Fence is self-fencing (off unless fence.enabled); see config_fence.go.
	Fence FenceConfig `yaml:"fence"`
	// Reconcile is the rejoin reconciliation with Nova (off unless
	// reconcile.enabled); see config_reconcile.go.
	Reconcile ReconcileConfig `yaml:"reconcile"`
	// Classification is Nova-aware stop classification (off unless
	// classification.enabled); see config_classification.go.
	Classification ClassificationConfig `yaml:"classification"`
	// OpenStack is the cloud that reconcile and classification ask; see
	// config_openstack.go.
	OpenStack OpenStackConfig `yaml:"openstack"`
	// ShutdownTimeout bounds the graceful shutdown: how long SIGTERM waits
	// for the outbox to drain to NATS. What is not sent stays on disk.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
}

// LogConfig selects the log level and format.
type LogConfig = daemonkit.LogConfig

// LibvirtConfig is the libvirt connection.
type LibvirtConfig struct {
	URI               string   `yaml:"uri"`
	KeepAliveInterval Duration `yaml:"keepalive_interval"`
	KeepAliveCount    uint     `yaml:"keepalive_count"`
	ConnectTimeout    Duration `yaml:"connect_timeout"`
	ReconnectMin      Duration `yaml:"reconnect_min"`
	ReconnectMax      Duration `yaml:"reconnect_max"`
	EventBuffer       int      `yaml:"event_buffer"`
	CallTimeout       Duration `yaml:"call_timeout"`
}

// LifecycleConfig is the debouncer.
type LifecycleConfig struct {
	// Window is how long a stop is held before the real state is checked,
	// and the most a guest reset's rebooted is held (lifecycle
	// RebootBurstGap). 0 reports stops and REBOOT events immediately (no
	// debouncing).
	Window Duration `yaml:"window"`
	// RecheckInterval is the pause before a failed or inconclusive state
	// check is repeated.
	RecheckInterval Duration `yaml:"recheck_interval"`
	// CheckTimeout: a state check not answered within this time counts as
	// a failed check.
	CheckTimeout Duration `yaml:"check_timeout"`
	// MaxChecks bounds the state checks of one stop; after that the stop is
	// reported with reason state-check-failed.
	MaxChecks int `yaml:"max_checks"`
	// CheckConcurrency bounds the libvirt state queries in flight at once.
	CheckConcurrency int `yaml:"check_concurrency"`
}

// NATSConfig is the connection to the NATS cluster the controller reads
// (urls, credentials, TLS, ready_timeout: shared with the controller).
type NATSConfig struct {
	daemonkit.NATSConfig `yaml:",inline"`
	CreateStream         bool `yaml:"create_stream"`
}

// OutboxConfig bounds the on-disk outbox.
type OutboxConfig struct {
	MaxBytes  int64 `yaml:"max_bytes"`
	MaxEvents int   `yaml:"max_events"`
}

// MetricsConfig is the Prometheus endpoint.
// StatusConfig is the operator's status socket (agent/status.go).
type StatusConfig struct {
	// Socket is the unix socket the agent answers `hvguard-agent status`
	// on (mode 0600: root only); empty disables it (status then reads
	// the state files only).
	Socket string `yaml:"socket"`
}

type MetricsConfig struct {
	// Listen is host:port for /metrics and /healthz; empty disables it.
	Listen string `yaml:"listen"`
}

// Defaults. Values that matter for safety carry the reason.
const (
	// DefaultCheckConcurrency bounds libvirt calls in flight for state
	// checks, so a reboot storm cannot open hundreds of RPCs at once.
	DefaultCheckConcurrency = 8
	// DefaultNATSReadyTimeout: after 10 s without NATS the agent reports
	// READY in degraded mode; events go to the outbox meanwhile.
	DefaultNATSReadyTimeout = 10 * time.Second
	// DefaultShutdownTimeout bounds the outbox drain on SIGTERM; it is below
	// systemd's default TimeoutStopSec (90 s) with margin.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultOutboxMaxBytes / MaxEvents bound the disk the outbox may use
	// during a NATS outage: 64 MiB holds ~200 000 events, hours of a busy
	// host's traffic.
	DefaultOutboxMaxBytes  = 64 << 20
	DefaultOutboxMaxEvents = 100000
	// DefaultMetricsListen is loopback only: the endpoint has no auth.
	DefaultMetricsListen = "127.0.0.1:9475"
	// DefaultStateDir is where packages create the state directory (0700).
	DefaultStateDir = "/var/lib/hvguard"
)

// DefaultConfig returns the configuration used when a field is absent.
func DefaultConfig() Config {
	return Config{
		StateDir: DefaultStateDir,
		Log:      daemonkit.DefaultLog(),
		Libvirt: LibvirtConfig{
			URI:               "qemu:///system",
			KeepAliveInterval: Duration(5 * time.Second),
			KeepAliveCount:    3,
			ConnectTimeout:    Duration(10 * time.Second),
			ReconnectMin:      Duration(500 * time.Millisecond),
			ReconnectMax:      Duration(30 * time.Second),
			EventBuffer:       4096,
			CallTimeout:       Duration(10 * time.Second),
		},
		Lifecycle: LifecycleConfig{
			Window:           Duration(lifecycle.DefaultWindow),
			RecheckInterval:  Duration(lifecycle.DefaultRecheckInterval),
			CheckTimeout:     Duration(lifecycle.DefaultCheckTimeout),
			MaxChecks:        lifecycle.DefaultMaxChecks,
			CheckConcurrency: DefaultCheckConcurrency,
		},
		NATS: NATSConfig{
			NATSConfig: daemonkit.NATSConfig{
				URLs:         []string{"nats://127.0.0.1:4222"},
				ReadyTimeout: Duration(DefaultNATSReadyTimeout),
			},
			CreateStream: true,
		},
		Outbox:          OutboxConfig{MaxBytes: DefaultOutboxMaxBytes, MaxEvents: DefaultOutboxMaxEvents},
		Metrics:         MetricsConfig{Listen: DefaultMetricsListen},
		Status:          StatusConfig{Socket: DefaultStatusSocket},
		Fence:           defaultFence(),
		Reconcile:       defaultReconcile(),
		Classification:  defaultClassification(),
		OpenStack:       defaultOpenStack(),
		ShutdownTimeout: Duration(DefaultShutdownTimeout),
	}
}

// LoadConfig reads a YAML file over the defaults. Unknown fields are
// rejected; the result is validated.
func LoadConfig(path string) (Config, error) { return daemonkit.LoadFile(path, ParseConfig) }

// ParseConfig parses YAML over the defaults and validates the result.
func ParseConfig(data []byte) (Config, error) { return daemonkit.ParseYAML(data, DefaultConfig()) }

// Logging is the log section (the command line's --log-level and
// --log-format override it).
func (c *Config) Logging() *daemonkit.LogConfig { return &c.Log }

// Complete fills fields derived from the environment (the host name).
func (c *Config) Complete() error {
	if c.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("host: empty and os.Hostname failed: %w", err)
		}
		c.Host = h
	}
	return nil
}

// Validate checks every field and returns all problems at once, each naming
// the field and the bad value.
func (c *Config) Validate() error {
	var p daemonkit.Problems
	bad := p.Bad
	if _, err := proto.HostToken(c.Host); err != nil {
		bad("host", fmt.Sprintf("%q", c.Host), err.Error())
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		bad("state_dir", fmt.Sprintf("%q", c.StateDir), "must be an absolute path")
	}
	c.Log.Validate(bad)
	if u, err := url.Parse(c.Libvirt.URI); err != nil || u.Scheme == "" {
		bad("libvirt.uri", fmt.Sprintf("%q", c.Libvirt.URI), "must be a libvirt URI such as qemu:///system")
	}
	positive := func(field string, d Duration) { daemonkit.Positive(bad, field, d) }
	positive("libvirt.connect_timeout", c.Libvirt.ConnectTimeout)
	positive("libvirt.reconnect_min", c.Libvirt.ReconnectMin)
	positive("libvirt.reconnect_max", c.Libvirt.ReconnectMax)
	positive("libvirt.call_timeout", c.Libvirt.CallTimeout)
	if c.Libvirt.KeepAliveInterval < 0 {
		bad("libvirt.keepalive_interval", c.Libvirt.KeepAliveInterval.D(), "must not be negative (0 disables)")
	}
	if c.Libvirt.ReconnectMax < c.Libvirt.ReconnectMin {
		bad("libvirt.reconnect_max", c.Libvirt.ReconnectMax.D(), "must not be below libvirt.reconnect_min")
	}
	if c.Libvirt.EventBuffer < 16 {
		bad("libvirt.event_buffer", c.Libvirt.EventBuffer, "must be at least 16")
	}
	if c.Lifecycle.Window < 0 || c.Lifecycle.Window.D() > lifecycle.MaxWindow {
		bad("lifecycle.window", c.Lifecycle.Window.D(), fmt.Sprintf("must be between 0 (no debouncing) and %s", lifecycle.MaxWindow))
	}
	if c.Lifecycle.RecheckInterval.D() < lifecycle.MinRecheckInterval {
		bad("lifecycle.recheck_interval", c.Lifecycle.RecheckInterval.D(), fmt.Sprintf("must be at least %s", lifecycle.MinRecheckInterval))
	}
	positive("lifecycle.check_timeout", c.Lifecycle.CheckTimeout)
	if c.Lifecycle.MaxChecks < 1 || c.Lifecycle.MaxChecks > lifecycle.MaxMaxChecks {
		bad("lifecycle.max_checks", c.Lifecycle.MaxChecks, fmt.Sprintf("must be between 1 and %d", lifecycle.MaxMaxChecks))
	}
	if c.Lifecycle.CheckConcurrency < 1 {
		bad("lifecycle.check_concurrency", c.Lifecycle.CheckConcurrency, "must be at least 1")
	}
	c.NATS.NATSConfig.Validate(bad)
	if c.Outbox.MaxBytes < 1<<20 {
		bad("outbox.max_bytes", c.Outbox.MaxBytes, "must be at least 1048576 (1 MiB)")
	}
	if c.Outbox.MaxEvents < 100 {
		bad("outbox.max_events", c.Outbox.MaxEvents, "must be at least 100")
	}
	daemonkit.ValidateListen(bad, "metrics.listen", c.Metrics.Listen)
	if s := c.Status.Socket; s != "" && (!filepath.IsAbs(s) || len(s) > maxSocketPath) {
		bad("status.socket", fmt.Sprintf("%q", s), fmt.Sprintf("must be an absolute path of at most %d bytes, or empty", maxSocketPath))
	}
	positive("shutdown_timeout", c.ShutdownTimeout)
	c.Fence.validate(bad)
	c.Fence.Signing.validate(c.Host, c.Fence.Enabled, bad)
	c.Reconcile.validate(bad)
	c.Classification.validate(bad)
	c.OpenStack.Validate(c.needsOpenStack(), bad)
	return p.Err()
}

// core is the debouncer configuration this section describes.
func (l LifecycleConfig) core() lifecycle.Config {
	return lifecycle.Config{
		Window:          l.Window.D(),
		RecheckInterval: l.RecheckInterval.D(),
		CheckTimeout:    l.CheckTimeout.D(),
		MaxChecks:       l.MaxChecks,
	}
}

// ParseLevel maps a level name to slog's level.
func ParseLevel(s string) (slog.Level, error) { return daemonkit.ParseLevel(s) }

// NewLogger builds the agent's structured logger.
func NewLogger(w io.Writer, lc LogConfig) (*slog.Logger, error) { return daemonkit.NewLogger(w, lc) }
