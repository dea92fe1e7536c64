package agent

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"hvguard/daemonkit"
	"hvguard/fencing"
	"hvguard/fencing/peer"
	"hvguard/proto"
)

// FenceConfig is the `fence:` section: self-fencing (docs/fencing.md).
// Fencing is OFF unless enabled is true. The timing constants default to
// fencing.DefaultConfig's and are advertised in the lease record; the
// controller computes its grace from them.
type FenceConfig struct {
	// Enabled turns fencing on. Off, the agent neither renews a lease nor
	// fences nor arms a watchdog: hvguard then only reports lifecycle
	// events, and the controller never evacuates this host.
	Enabled bool `yaml:"enabled"`
	// Action is pause, destroy, reset-host or none (monitor only).
	Action string `yaml:"action"`
	// AllowReset lets a fence that missed its deadline escalate to a host
	// reset (sysrq 'b'). Without a watchdog it makes the backstop "reset",
	// which needs a live agent and which the controller refuses by default;
	// with one the backstop stays "watchdog" (the slowest path).
	AllowReset bool `yaml:"allow_reset"`
	// WatchdogDevice is the hardware watchdog ("" = none), e.g.
	// /dev/watchdog. Armed while fencing is on with a real action.
	WatchdogDevice  string   `yaml:"watchdog_device"`
	WatchdogTimeout Duration `yaml:"watchdog_timeout"`
	// PeerListen is host:port of this agent's peer endpoint.
	PeerListen string `yaml:"peer_listen"`
	// PeerSecretFile holds the fleet's shared HMAC secret (>= 16 bytes),
	// or several, one per line, during a rotation: the first signs, all
	// are accepted. Mode 0600: a file its group or others can access is
	// refused.
	PeerSecretFile string `yaml:"peer_secret_file"`
	// PeerURL is the URL template of a peer's endpoint; {host} is replaced
	// by the peer's host name as found in the lease bucket.
	PeerURL string `yaml:"peer_url"`
	// PeerURLs overrides PeerURL for individual hosts.
	PeerURLs map[string]string `yaml:"peer_urls"`
	// CreateBucket creates the lease bucket (1 replica) when it is missing.
	CreateBucket bool `yaml:"create_bucket"`
	// MembersRefresh is how often the bucket's membership and the
	// controller's guard are read while NATS is reachable.
	MembersRefresh Duration `yaml:"members_refresh"`
	// FenceConcurrency bounds the pause/destroy/resume calls in flight.
	FenceConcurrency int `yaml:"fence_concurrency"`
	// RuntimeDir holds a second copy of the durable fence state
	// (fence.json) on a per-boot tmpfs: a state_dir lost within the boot
	// keeps the lease age and the fence state (docs/fencing.md).
	RuntimeDir string `yaml:"runtime_dir"`
	// Signing: signed lease records (config_signing.go).
	Signing SigningConfig `yaml:"signing"`

	RenewInterval Duration `yaml:"renew_interval"`
	RenewTimeout  Duration `yaml:"renew_timeout"`
	PeerTimeout   Duration `yaml:"peer_timeout"`
	FenceDeadline Duration `yaml:"fence_deadline"`
	LeaseTTL      Duration `yaml:"lease_ttl"`
	HeldRecheck   Duration `yaml:"held_recheck"`
	MaxClockDrift float64  `yaml:"max_clock_drift"`
	PeerBatch     int      `yaml:"peer_batch"`
}

// Fence defaults that are not protocol constants (those come from package
// fencing, with their reasons there and in docs/fencing.md).
const (
	// DefaultPeerPort is the peer endpoint's port: next to the metrics
	// port (9475). It listens on every address: peers are other hosts.
	DefaultPeerPort = 9476
	// DefaultPeerURL reaches a peer by its host name (as Nova and the lease
	// bucket know it) on DefaultPeerPort.
	DefaultPeerURL = "http://{host}:9476"
	// DefaultMembersRefresh: membership changes when hosts are added; 10 s
	// keeps the cached guard fresh without loading NATS (one Keys + one Get
	// per host per 10 s).
	DefaultMembersRefresh = 10 * time.Second
	// DefaultFenceConcurrency is the number of libvirt pause/destroy calls
	// in flight: the figure docs/fencing.md's timeline assumes (8 at a
	// time); libvirtd serialises per domain, not per connection.
	DefaultFenceConcurrency = 8
	// DefaultRuntimeDir is the per-boot directory of the runtime copy of
	// fence.json: systemd's RuntimeDirectory=hvguard (tmpfs, emptied at
	// boot, kept across agent restarts with RuntimeDirectoryPreserve=yes).
	DefaultRuntimeDir = "/run/hvguard"
)

// defaultFence returns the `fence:` defaults (fencing off).
func defaultFence() FenceConfig {
	d := fencing.DefaultConfig("", "")
	t := d.Timing
	return FenceConfig{
		Action:           string(fencing.ActionPause),
		WatchdogTimeout:  Duration(t.WatchdogTimeout),
		PeerListen:       fmt.Sprintf(":%d", DefaultPeerPort),
		PeerURL:          DefaultPeerURL,
		PeerURLs:         map[string]string{},
		CreateBucket:     true,
		MembersRefresh:   Duration(DefaultMembersRefresh),
		FenceConcurrency: DefaultFenceConcurrency,
		RuntimeDir:       DefaultRuntimeDir,
		Signing:          defaultSigning(),
		RenewInterval:    Duration(t.RenewInterval),
		RenewTimeout:     Duration(t.RenewTimeout),
		PeerTimeout:      Duration(t.PeerTimeout),
		FenceDeadline:    Duration(t.FenceDeadline),
		LeaseTTL:         Duration(t.LeaseTTL),
		HeldRecheck:      Duration(d.HeldRecheck),
		MaxClockDrift:    t.MaxClockDrift,
		PeerBatch:        d.PeerBatch,
	}
}

// Core returns the fencing.Config this section describes for host.
func (f FenceConfig) Core(host, bootID string) fencing.Config {
	c := fencing.DefaultConfig(host, bootID)
	c.Enabled = f.Enabled
	c.Action = fencing.Action(f.Action)
	c.AllowReset = f.AllowReset
	c.HardwareWatchdog = f.Enabled && f.WatchdogDevice != "" && c.Action != fencing.ActionNone
	c.Timing.RenewInterval = f.RenewInterval.D()
	c.Timing.RenewTimeout = f.RenewTimeout.D()
	c.Timing.PeerTimeout = f.PeerTimeout.D()
	c.Timing.FenceDeadline = f.FenceDeadline.D()
	c.Timing.LeaseTTL = f.LeaseTTL.D()
	c.Timing.WatchdogTimeout = f.WatchdogTimeout.D()
	c.Timing.MaxClockDrift = f.MaxClockDrift
	c.HeldRecheck = f.HeldRecheck.D()
	c.PeerBatch = f.PeerBatch
	c.LyingPeers = f.Signing.lyingPeers()
	c.AgentVersion = Version
	return c
}

// peerURL returns the endpoint URL of host.
func (f FenceConfig) peerURL(host string) string {
	if u, ok := f.PeerURLs[host]; ok {
		return strings.TrimRight(u, "/") + peer.Path
	}
	return strings.TrimRight(strings.ReplaceAll(f.PeerURL, "{host}", host), "/") + peer.Path
}

// validate appends the section's problems through bad (field, value, why).
func (f FenceConfig) validate(bad func(field string, val any, why string)) {
	switch fencing.Action(f.Action) {
	case fencing.ActionPause, fencing.ActionDestroy, fencing.ActionResetHost, fencing.ActionNone:
	default:
		bad("fence.action", fmt.Sprintf("%q", f.Action), "must be pause, destroy, reset-host or none")
	}
	positive := func(field string, d Duration) bool {
		if d <= 0 {
			bad(field, d.D(), "must be positive")
			return false
		}
		return true
	}
	ok := true
	for _, p := range []struct {
		field string
		d     Duration
	}{
		{"fence.renew_interval", f.RenewInterval}, {"fence.renew_timeout", f.RenewTimeout},
		{"fence.peer_timeout", f.PeerTimeout}, {"fence.fence_deadline", f.FenceDeadline},
		{"fence.lease_ttl", f.LeaseTTL}, {"fence.held_recheck", f.HeldRecheck},
		{"fence.members_refresh", f.MembersRefresh},
	} {
		ok = positive(p.field, p.d) && ok
	}
	if f.WatchdogDevice != "" {
		ok = positive("fence.watchdog_timeout", f.WatchdogTimeout) && ok
		if f.WatchdogTimeout.D()%time.Second != 0 {
			bad("fence.watchdog_timeout", f.WatchdogTimeout.D(), "must be whole seconds (the device's unit)")
		}
	}
	if f.MaxClockDrift < 0 || f.MaxClockDrift > fencing.MaxSupportedDrift {
		bad("fence.max_clock_drift", f.MaxClockDrift, fmt.Sprintf("must be between 0 and %g", fencing.MaxSupportedDrift))
		ok = false
	}
	if f.PeerBatch < 0 {
		bad("fence.peer_batch", f.PeerBatch, "must not be negative")
	}
	if f.FenceConcurrency < 1 {
		bad("fence.fence_concurrency", f.FenceConcurrency, "must be at least 1")
	}
	if f.RuntimeDir == "" || !filepath.IsAbs(f.RuntimeDir) {
		bad("fence.runtime_dir", fmt.Sprintf("%q", f.RuntimeDir), "must be an absolute path")
	}
	if ok {
		t := f.Core("validate", "").Timing
		if t.SuspectAfter()+t.PeerTimeout > t.FenceBy() {
			bad("fence.lease_ttl", t.LeaseTTL, fmt.Sprintf("too short: renew_interval+renew_timeout+peer_timeout (%s) must fit before lease_ttl-fence_deadline (%s)",
				t.SuspectAfter()+t.PeerTimeout, t.FenceBy()))
		}
	}
	if _, _, err := net.SplitHostPort(f.PeerListen); err != nil {
		bad("fence.peer_listen", fmt.Sprintf("%q", f.PeerListen), "must be host:port")
	}
	checkURL := func(field, s string) {
		u, err := url.Parse(strings.ReplaceAll(s, "{host}", "h"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(field, fmt.Sprintf("%q", s), "must be an http:// or https:// URL")
		}
	}
	checkURL("fence.peer_url", f.PeerURL)
	for h, u := range f.PeerURLs {
		if _, err := proto.HostToken(h); err != nil {
			bad("fence.peer_urls", fmt.Sprintf("%q", h), "key must be a host name: "+err.Error())
		}
		checkURL("fence.peer_urls."+h, u)
	}
	if !f.Enabled {
		return
	}
	if f.PeerSecretFile == "" {
		bad("fence.peer_secret_file", `""`, "required when fencing is enabled (peers must authenticate; without peers every NATS outage fences every host)")
	} else if _, _, err := readSecret(f.PeerSecretFile); err != nil {
		bad("fence.peer_secret_file", fmt.Sprintf("%q", f.PeerSecretFile), err.Error())
	}
	if f.WatchdogDevice != "" && !strings.HasPrefix(f.WatchdogDevice, "/dev/") {
		bad("fence.watchdog_device", fmt.Sprintf("%q", f.WatchdogDevice), "must be a /dev/ path or empty")
	}
}

// unwrapAll is daemonkit.RootCause.
var unwrapAll = daemonkit.RootCause

// readSecret reads the peer secret file (peer.ParseSecrets: one secret
// per line, the first signs, all are accepted), refusing a file its group
// or others can access.
func readSecret(path string) (sign []byte, accepted [][]byte, err error) {
	if err := daemonkit.SecretFileError(path); err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot be read: %w", unwrapAll(err))
	}
	return peer.ParseSecrets(b)
}
