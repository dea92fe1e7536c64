// Package daemon is hvguard-controller: it wires the leader lock
// (controller.LeaderRunner) and the lease tracker (controller.Runner) to
// NATS, systemd, Prometheus and the status endpoint. See docs/controller.md.
package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"hvguard/controller"
	"hvguard/daemonkit"
	"hvguard/fencing"
	"hvguard/openstack"
)

// Version is set at build time (-ldflags -X hvguard/controller/daemon.Version=...).
var Version = "dev"

// Duration is a YAML duration ("15s").
type Duration = daemonkit.Duration

// Config is the controller's configuration file (/etc/hvguard/controller.yaml).
// Every field is documented in packaging/controller.yaml and in
// docs/controller.md; the three must change together.
type Config struct {
	// ID names this controller process in the leader lock. Empty: the host
	// name and a random suffix, new for every process (a restarted
	// controller is a new candidate, never mistaken for its predecessor).
	ID        string              `yaml:"id"`
	Log       daemonkit.LogConfig `yaml:"log"`
	NATS      NATSConfig          `yaml:"nats"`
	Leader    LeaderConfig        `yaml:"leader"`
	Guard     GuardConfig         `yaml:"guard"`
	Tracker   TrackerConfig       `yaml:"tracker"`
	Recovery  RecoveryConfig      `yaml:"recovery"`
	OpenStack OpenStackConfig     `yaml:"openstack"`
	Metrics   MetricsConfig       `yaml:"metrics"`
	// InstanceRecovery: restart instances that stopped unexpectedly
	// (config_instance.go).
	InstanceRecovery InstanceRecoveryConfig `yaml:"instance_recovery"`
	// Signing: signed lease records (signing.go).
	Signing SigningConfig `yaml:"signing"`
}

// NATSConfig is the NATS connection and the lease bucket.
type NATSConfig struct {
	daemonkit.NATSConfig `yaml:",inline"`
	// CreateBucket creates the lease bucket when it is missing (one
	// replica; provision a replicated one for production). An existing
	// bucket is never changed.
	CreateBucket bool `yaml:"create_bucket"`
	// Control is the controller's user in the controllers' own NATS
	// account (natsperm.ControlAccount, HVGUARD_CONTROL): the same servers
	// and TLS, its own credentials. The leader lock, the guard's
	// authoritative copy, the memory and the recovery buckets live there,
	// out of the agents' reach (docs/security.md, "The controllers'
	// account"). Unset: they share the agents' account on the one
	// connection (a security warning when nats has credentials).
	Control ControlNATSConfig `yaml:"control"`
}

// ControlNATSConfig is nats.control: one way to authenticate, like the
// nats section's fields of the same names.
type ControlNATSConfig struct {
	CredsFile    string `yaml:"creds_file"`
	NKeySeedFile string `yaml:"nkey_seed_file"`
	TokenFile    string `yaml:"token_file"`
	User         string `yaml:"user"`
	PasswordFile string `yaml:"password_file"`
}

// Set reports whether nats.control names credentials (a second
// connection, to the controllers' account).
func (c ControlNATSConfig) Set() bool {
	return c.CredsFile != "" || c.NKeySeedFile != "" || c.TokenFile != "" || c.User != "" || c.PasswordFile != ""
}

// ControlSection is the connection to the controllers' account: the nats
// section's servers and TLS with nats.control's credentials.
func (n NATSConfig) ControlSection() daemonkit.NATSConfig {
	c := n.NATSConfig
	c.CredsFile, c.NKeySeedFile, c.TokenFile, c.User, c.PasswordFile =
		n.Control.CredsFile, n.Control.NKeySeedFile, n.Control.TokenFile, n.Control.User, n.Control.PasswordFile
	return c
}

// credentialed reports whether the nats section authenticates.
func credentialed(n daemonkit.NATSConfig) bool {
	return n.CredsFile != "" || n.NKeySeedFile != "" || n.TokenFile != "" || n.PasswordFile != ""
}

// validateControl reports bad nats.control fields: its credentials as the
// nats section's, and never the same file as the main user's (the control
// user is another user, in another account).
func (n NATSConfig) validateControl(bad daemonkit.Bad) {
	if !n.Control.Set() {
		return
	}
	c := n.ControlSection()
	c.ValidateCredentials("nats.control", bad)
	for _, f := range []struct{ name, main, control string }{
		{"creds_file", n.CredsFile, c.CredsFile}, {"nkey_seed_file", n.NKeySeedFile, c.NKeySeedFile},
		{"token_file", n.TokenFile, c.TokenFile}, {"password_file", n.PasswordFile, c.PasswordFile},
	} {
		if f.control != "" && f.control == f.main {
			bad("nats.control."+f.name, fmt.Sprintf("%q", f.control), "is nats."+f.name+" too: the control user is another user, in the controllers' account (hvguard-controller nats-accounts writes its seed as controller-ID.control.nk)")
		}
	}
}

// LeaderConfig is the leader lock (controller.LeaderConfig).
type LeaderConfig struct {
	TTL           Duration `yaml:"ttl"`
	RenewInterval Duration `yaml:"renew_interval"`
	WriteTimeout  Duration `yaml:"write_timeout"`
	ActMargin     Duration `yaml:"act_margin"`
}

// GuardConfig is the mass-failure guard: declare nothing while more than
// min(count, floor(share × hosts)) hosts were silent within window.
type GuardConfig struct {
	Count  int      `yaml:"count"`
	Share  float64  `yaml:"share"`
	Window Duration `yaml:"window"`
}

// TrackerConfig is the lease tracker (controller.Config).
type TrackerConfig struct {
	// Drift bounds this controller's clock-rate error; it is used by the
	// tracker's grace and by the leader lock.
	Drift            float64  `yaml:"drift"`
	MaxHostDrift     float64  `yaml:"max_host_drift"`
	MaxGrace         Duration `yaml:"max_grace"`
	AcceptNoBackstop bool     `yaml:"accept_no_backstop"`
	// AcceptAgentDependentBackstop declares hosts whose only backstop is
	// a reset by their agent (allow_reset without a watchdog): a crashed
	// or hung agent there fences nothing (controller.Config).
	AcceptAgentDependentBackstop bool `yaml:"accept_agent_dependent_backstop"`
	// NATSWriteDeadline: the longest write_deadline of the NATS routes
	// and leaf nodes between agents and controllers (nats-server's
	// default 10s); raise it with them (controller.Config).
	NATSWriteDeadline Duration `yaml:"nats_write_deadline"`
}

// OpenStackConfig is the cloud host and instance recovery call (the
// agent's section, daemonkit.OpenStackConfig, plus the service user).
type OpenStackConfig struct {
	daemonkit.OpenStackConfig `yaml:",inline"`
	// ServiceCloud is the clouds.yaml entry (same file) of a user with the
	// `service` role. Its token goes only into the X-Service-Token header
	// of Cinder attachment deletes: Cinder removes an attachment Nova still
	// uses only for a service's request (OSSA-2023-003). Empty: host
	// recovery cannot clear attachments.
	ServiceCloud string `yaml:"service_cloud"`
}

// Recovery is the recovery adapter's configuration.
func (o OpenStackConfig) Recovery() openstack.RecoveryConfig {
	return openstack.RecoveryConfig{Config: o.Client(), ServiceCloud: o.ServiceCloud}
}

// Validate reports every problem (fields named openstack.*) through bad;
// users names what needs the cloud ("" = nothing). With service_cloud set
// it must be loadable from the same clouds.yaml (no network).
func (o OpenStackConfig) Validate(users string, bad daemonkit.Bad) {
	o.OpenStackConfig.Validate(users, bad)
	if strings.TrimSpace(o.ServiceCloud) == "" {
		return
	}
	if strings.TrimSpace(o.Cloud) == "" {
		bad("openstack.service_cloud", fmt.Sprintf("%q", o.ServiceCloud), "needs openstack.cloud (the admin entry) too")
		return
	}
	if _, err := openstack.NewRecovery(o.Recovery(), nil); err != nil {
		bad("openstack.service_cloud", fmt.Sprintf("%q (clouds_file %q)", o.ServiceCloud, o.CloudsFile), err.Error())
	}
}

// NewOpenStack builds the OpenStack adapter host and instance recovery call
// (openstack.Recovery) from the openstack section, or nil when no cloud
// is configured. It parses clouds.yaml and contacts nothing.
func (c *Config) NewOpenStack(log *slog.Logger) (*openstack.Recovery, error) {
	if strings.TrimSpace(c.OpenStack.Cloud) == "" {
		return nil, nil
	}
	r, err := openstack.NewRecovery(c.OpenStack.Recovery(), log)
	if err != nil {
		return nil, fmt.Errorf("openstack: %w", err)
	}
	return r, nil
}

// MetricsConfig is the HTTP endpoint: /metrics (Prometheus), /healthz and
// /status (what `hvguard-controller status` reads).
type MetricsConfig struct {
	// Listen is host:port; empty disables the endpoint (and status).
	Listen string `yaml:"listen"`
}

// Defaults.
const (
	// DefaultListen is loopback only: the endpoint has no authentication
	// (the agent's is 9475, its peer endpoint 9476).
	DefaultListen = "127.0.0.1:9477"
	// DefaultNATSReadyTimeout: after 10 s without NATS (or without the
	// bucket) the controller reports READY in a degraded mode and keeps
	// retrying; it acts on nothing meanwhile.
	DefaultNATSReadyTimeout = 10 * time.Second
	// DefaultConfigPath is where the packages install the configuration.
	DefaultConfigPath = "/etc/hvguard/controller.yaml"
)

// DefaultConfig returns the configuration used when a field is absent.
func DefaultConfig() Config {
	tc := controller.DefaultConfig()
	lc := controller.DefaultLeaderConfig("")
	return Config{
		Log: daemonkit.DefaultLog(),
		NATS: NATSConfig{NATSConfig: daemonkit.NATSConfig{
			URLs:         []string{"nats://127.0.0.1:4222"},
			ReadyTimeout: Duration(DefaultNATSReadyTimeout),
		}, CreateBucket: true},
		Leader: LeaderConfig{TTL: Duration(lc.TTL), RenewInterval: Duration(lc.RenewInterval),
			WriteTimeout: Duration(lc.WriteTimeout), ActMargin: Duration(lc.ActMargin)},
		Guard: GuardConfig{Count: tc.GuardCount, Share: tc.GuardShare, Window: Duration(tc.GuardWindow)},
		Tracker: TrackerConfig{Drift: tc.Drift, MaxHostDrift: tc.MaxHostDrift, MaxGrace: Duration(tc.MaxGrace),
			AcceptNoBackstop: tc.AcceptNoBackstop, AcceptAgentDependentBackstop: tc.AcceptAgentDependentBackstop,
			NATSWriteDeadline: Duration(tc.NATSWriteDeadline)},
		Recovery:         DefaultRecovery(),
		OpenStack:        OpenStackConfig{OpenStackConfig: daemonkit.DefaultOpenStack()},
		Metrics:          MetricsConfig{Listen: DefaultListen},
		InstanceRecovery: defaultInstanceRecovery(),
		Signing:          defaultSigning(),
	}
}

// LoadConfig reads a YAML file over the defaults. Unknown fields are
// rejected; the result is completed (id) and validated.
func LoadConfig(path string) (Config, error) { return daemonkit.LoadFile(path, ParseConfig) }

// ParseConfig parses YAML over the defaults, completes and validates it.
func ParseConfig(data []byte) (Config, error) { return daemonkit.ParseYAML(data, DefaultConfig()) }

// Logging is the log section (the command line's --log-level and
// --log-format override it).
func (c *Config) Logging() *daemonkit.LogConfig { return &c.Log }

// Complete fills the id when it is empty: host name and 6 random hex
// digits.
func (c *Config) Complete() error {
	if c.ID != "" {
		return nil
	}
	h, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("id: empty and os.Hostname failed: %w", err)
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("id: %w", err)
	}
	c.ID = h + "-" + hex.EncodeToString(b[:])
	return nil
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Validate checks every field and returns all problems at once, each
// naming the field and the bad value.
func (c *Config) Validate() error {
	var p daemonkit.Problems
	bad := p.Bad
	if !idRE.MatchString(c.ID) {
		bad("id", fmt.Sprintf("%q", c.ID), "must be 1-128 of [A-Za-z0-9._-], starting with a letter or digit (empty: host name and a random suffix)")
	}
	c.Log.Validate(bad)
	c.NATS.NATSConfig.Validate(bad)
	c.NATS.validateControl(bad)

	l := c.Leader
	for _, f := range []struct {
		name string
		d    Duration
	}{{"leader.ttl", l.TTL}, {"leader.renew_interval", l.RenewInterval}, {"leader.write_timeout", l.WriteTimeout}} {
		daemonkit.Positive(bad, f.name, f.d)
	}
	if l.ActMargin < 0 {
		bad("leader.act_margin", l.ActMargin.D(), "must not be negative")
	}
	if l.TTL > 0 && l.RenewInterval > 0 && l.WriteTimeout > 0 && l.ActMargin >= 0 {
		if err := c.LeaderCore().Validate(); err != nil {
			bad("leader", fmt.Sprintf("ttl %s, renew_interval %s, write_timeout %s, act_margin %s, tracker.drift %g",
				l.TTL.D(), l.RenewInterval.D(), l.WriteTimeout.D(), l.ActMargin.D(), c.Tracker.Drift), err.Error())
		}
	}

	if c.Guard.Count < 0 {
		bad("guard.count", c.Guard.Count, "must not be negative")
	}
	if c.Guard.Share < 0 || c.Guard.Share > 1 {
		bad("guard.share", c.Guard.Share, "must be between 0 and 1")
	}
	daemonkit.Positive(bad, "guard.window", c.Guard.Window)
	if c.Tracker.Drift < 0 || c.Tracker.Drift > fencing.MaxSupportedDrift {
		bad("tracker.drift", c.Tracker.Drift, fmt.Sprintf("must be between 0 and %g", fencing.MaxSupportedDrift))
	}
	if c.Tracker.MaxHostDrift < 0 || c.Tracker.MaxHostDrift > fencing.MaxSupportedDrift {
		bad("tracker.max_host_drift", c.Tracker.MaxHostDrift, fmt.Sprintf("must be between 0 and %g", fencing.MaxSupportedDrift))
	}
	daemonkit.Positive(bad, "tracker.max_grace", c.Tracker.MaxGrace)
	if d := c.Tracker.NATSWriteDeadline.D(); d <= 0 || d > controller.MaxNATSWriteDeadline {
		bad("tracker.nats_write_deadline", d, fmt.Sprintf("must be > 0 and at most %s (nats-server's write_deadline on routes and leaf nodes; default 10s)", controller.MaxNATSWriteDeadline))
	}
	if err := c.TrackerCore().Validate(); err != nil && p.Err() == nil {
		// Every field above passed: a rule only the core knows.
		bad("tracker", fmt.Sprintf("%+v", c.Tracker), err.Error())
	}
	users := c.validateInstanceRecovery(bad)
	if users == "" {
		users = c.openStackUsers()
	}
	if c.Recovery.Calls() {
		users = "recovery.mode " + c.Recovery.Mode
	}
	c.Recovery.validate(c.OpenStack, bad)
	c.OpenStack.Validate(users, bad)
	daemonkit.ValidateListen(bad, "metrics.listen", c.Metrics.Listen)
	c.Signing.validate(bad)
	return p.Err()
}

// openStackUsers names what needs the cloud ("" = nothing).
func (c *Config) openStackUsers() string {
	if c.OpenStack.Cloud != "" {
		return "openstack.cloud set"
	}
	return ""
}

// SecurityWarnings are the insecure settings of the configuration
// (logged at ERROR at start, shown in the status): plaintext NATS allowed
// to a remote server, a password in a NATS URL, credentials without
// nats.control (SharedAccountWarning), TLS verification disabled in
// clouds.yaml.
func (c *Config) SecurityWarnings() []string {
	w := c.NATS.Warnings()
	if credentialed(c.NATS.NATSConfig) && !c.NATS.Control.Set() {
		w = append(w, SharedAccountWarning)
	}
	return append(w, c.OpenStack.Warnings(c.openStackUsers())...)
}

// SharedAccountWarning is said when the controller authenticates to NATS
// but nats.control is unset: its own state then shares the agents'
// account, where an agent can have the server overwrite it.
const SharedAccountWarning = "nats.control is not set: the leader lock, the guard and the recovery buckets share the agents' NATS account, " +
	"where any agent can overwrite them through JetStream API replies (no controller may act; a restarted one declares nothing): " +
	"give the controllers their own account (docs/security.md, \"The controllers' account\")"

// LeaderCore is the leader lock's configuration.
func (c *Config) LeaderCore() controller.LeaderConfig {
	return controller.LeaderConfig{ID: c.ID, TTL: c.Leader.TTL.D(), RenewInterval: c.Leader.RenewInterval.D(),
		WriteTimeout: c.Leader.WriteTimeout.D(), ActMargin: c.Leader.ActMargin.D(), Drift: c.Tracker.Drift}
}

// TrackerCore is the lease tracker's configuration.
func (c *Config) TrackerCore() controller.Config {
	return controller.Config{GuardCount: c.Guard.Count, GuardShare: c.Guard.Share, GuardWindow: c.Guard.Window.D(),
		Drift: c.Tracker.Drift, MaxHostDrift: c.Tracker.MaxHostDrift, MaxGrace: c.Tracker.MaxGrace.D(),
		AcceptNoBackstop: c.Tracker.AcceptNoBackstop, AcceptAgentDependentBackstop: c.Tracker.AcceptAgentDependentBackstop,
		NATSWriteDeadline: c.Tracker.NATSWriteDeadline.D()}
}

// NewLogger builds the controller's structured logger.
var NewLogger = daemonkit.NewLogger
