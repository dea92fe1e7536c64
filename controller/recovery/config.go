package recovery

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Mode says what the controller does for a declared host.
type Mode string

// Modes.
const (
	// ModeNotify publishes the decisions (events, status) and calls
	// nothing. The default: recovery changes a cloud, so it is opted in
	// (evacuate or masakari, with an openstack section); an installation
	// with the defaults — `make run`, a first deployment — shows what it
	// would do and needs no OpenStack.
	ModeNotify Mode = "notify"
	// ModeEvacuate: force down, remove the dead host's attachments,
	// evacuate, verify, retry.
	ModeEvacuate Mode = "evacuate"
	// ModeMasakari: force down, remove the dead host's attachments, then
	// hand the host to Masakari with a COMPUTE_HOST notification (its
	// engine evacuates).
	ModeMasakari Mode = "masakari"
)

// ReleasePolicy says who clears forced_down once the host is back.
type ReleasePolicy string

// Release policies.
const (
	// ReleaseOnRejoin: the controller clears forced_down once the host's
	// lease is active again with its agent healthy — released by an
	// operator (`hvguard-agent --unfence`, which refuses while the
	// reconciliation reports unreconciled evacuations) and reconciled
	// (the stale copies destroyed).
	ReleaseOnRejoin ReleasePolicy = "on-rejoin"
	// ReleaseManual: the controller never clears forced_down; it says
	// when the host is back and leaves it to the operator.
	ReleaseManual ReleasePolicy = "manual"
)

// Defaults and bounds. The numbers are in docs/controller.md ("Host
// recovery"); change both together.
const (
	// DefaultMaxEvacuations bounds the evacuations in flight (requested,
	// not yet verified) over all hosts: each one is a rebuild on a
	// destination compute and a scheduling request; unbounded, a host of
	// 100 instances stampedes the scheduler and the destinations.
	// Masakari's engine uses 3 threads; 8 keeps a host of a dozen
	// instances within the 60 s target (a rebuild took 2-5 s here).
	DefaultMaxEvacuations = 8
	// DefaultMaxHosts bounds the hosts being recovered at once (force-down
	// to the last evacuation verified); the others wait in declaration
	// order. A brake beside the mass-failure guard: whatever declares
	// hosts by mistake, the cloud is not emptied in one go.
	DefaultMaxHosts = 3
	// DefaultMaxAttempts is how often one call (an evacuation, an
	// attachment removal) is tried before the instance is reported
	// unrecoverable: NoValidHost may clear when capacity frees up, Nova
	// and Cinder errors are often transient, a persistent failure needs a
	// human.
	DefaultMaxAttempts = 3
	// DefaultRetryBase and DefaultRetryMax: the backoff after a failed
	// attempt, doubled per attempt (10 s, 20 s, 40 s, ... at most 2 min).
	DefaultRetryBase = 10 * time.Second
	DefaultRetryMax  = 2 * time.Minute
	// PollInterval is how often evacuations in flight (Nova's migrations)
	// and a Masakari notification are polled: a rebuild took 2-5 s here.
	PollInterval = 2 * time.Second
	// EvacuationSlowAfter: an evacuation whose migration has not finished
	// after this is reported slow (status, event); it is never evacuated
	// again while its migration runs (Nova would refuse, and a second
	// rebuild is never what anyone wants).
	EvacuationSlowAfter = 5 * time.Minute
	// IntentSettle: an evacuation intent recorded by another process (a
	// restart, a new leader) with no migration yet is issued again only
	// once the intent is this old (wall clock): the other process's call
	// may still be in flight (an OpenStack call is bounded by
	// CallTimeout). Nova refuses a second evacuation of a rebuilding
	// instance anyway (409).
	IntentSettle = 45 * time.Second
	// CallTimeout bounds one OpenStack call made by the runner.
	CallTimeout = 30 * time.Second
	// MigrationClockSkew: a migration counts for an evacuation only if
	// Nova created it no earlier than this before the intent (Nova's
	// clock against the controller's wall clock); an older evacuation of
	// the same instance (an earlier incident) never counts.
	MigrationClockSkew = 2 * time.Minute
	// DefaultReleaseRetry is the pause between attempts to clear
	// forced_down that Nova refused (done evacuations exist until the
	// host's nova-compute restarted) or that failed.
	DefaultReleaseRetry = 30 * time.Second
)

// Config configures the core.
type Config struct {
	Mode           Mode
	Release        ReleasePolicy
	MaxEvacuations int
	MaxHosts       int
	MaxAttempts    int
	RetryBase      time.Duration
	RetryMax       time.Duration
	ReleaseRetry   time.Duration
	// NovaHosts maps a lease host name to its nova-compute host name
	// (Nova's and Cinder's name for it); absent: the same name.
	NovaHosts map[string]string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Mode: ModeNotify, Release: ReleaseOnRejoin, MaxEvacuations: DefaultMaxEvacuations,
		MaxHosts: DefaultMaxHosts, MaxAttempts: DefaultMaxAttempts, RetryBase: DefaultRetryBase,
		RetryMax: DefaultRetryMax, ReleaseRetry: DefaultReleaseRetry}
}

// ErrInvalidConfig is wrapped by every validation error.
var ErrInvalidConfig = errors.New("recovery: invalid config")

// Validate checks c (the daemon validates field by field first, naming
// the configuration keys).
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, v any, why string) {
		errs = append(errs, fmt.Errorf("%w: %s %v: %s", ErrInvalidConfig, f, v, why))
	}
	switch c.Mode {
	case ModeNotify, ModeEvacuate, ModeMasakari:
	default:
		bad("mode", fmt.Sprintf("%q", c.Mode), "must be notify, evacuate or masakari")
	}
	switch c.Release {
	case ReleaseOnRejoin, ReleaseManual:
	default:
		bad("release", fmt.Sprintf("%q", c.Release), "must be on-rejoin or manual")
	}
	if c.MaxEvacuations < 1 {
		bad("max_evacuations", c.MaxEvacuations, "must be at least 1")
	}
	if c.MaxHosts < 1 {
		bad("max_hosts", c.MaxHosts, "must be at least 1")
	}
	if c.MaxAttempts < 1 {
		bad("max_attempts", c.MaxAttempts, "must be at least 1")
	}
	if c.RetryBase <= 0 || c.RetryMax < c.RetryBase {
		bad("retry_base/retry_max", fmt.Sprintf("%s/%s", c.RetryBase, c.RetryMax), "must be positive, retry_max at least retry_base")
	}
	if c.ReleaseRetry <= 0 {
		bad("release_retry", c.ReleaseRetry, "must be positive")
	}
	return errors.Join(errs...)
}

// NovaHost returns host's name in Nova.
func (c Config) NovaHost(host string) string {
	if n := c.NovaHosts[host]; n != "" {
		return n
	}
	return host
}

// SharedNovaHost returns the hosts among others (lease host names) whose
// nova-compute host is host's too, compared without case as Nova's
// database compares host names.
func (c Config) SharedNovaHost(host string, others []string) []string {
	var out []string
	for _, o := range others {
		if o != host && strings.EqualFold(c.NovaHost(o), c.NovaHost(host)) {
			out = append(out, o)
		}
	}
	return out
}

// backoff returns the pause after the n-th failed attempt (n ≥ 1).
func (c Config) backoff(n int) time.Duration {
	d := c.RetryBase
	for i := 1; i < n && d < c.RetryMax; i++ {
		d *= 2
	}
	return min(d, c.RetryMax)
}
