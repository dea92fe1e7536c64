package lifecycle

import (
	"errors"
	"fmt"
	"time"
)

// Safety-relevant defaults and limits.
const (
	// DefaultWindow is how long a stop is held before the real state is
	// checked. 15 s is Nova's own LIFECYCLE_DELAY: a reboot whose start
	// events arrive in time is settled by events alone, exactly where Nova
	// would settle it, and hvguard never reports a stop earlier than Nova.
	DefaultWindow = 15 * time.Second

	// MaxWindow bounds Window: a stop held longer hides a real outage from
	// operators and from HA evacuation for too long.
	MaxWindow = 5 * time.Minute

	// DefaultRecheckInterval is the wait after a failed or inconclusive
	// check (e.g. StateShutdown: the guest is still going down). One second
	// lets an ACPI shutdown (measured ~1.8 s from SHUTDOWN to STOPPED)
	// finish without hammering libvirtd.
	DefaultRecheckInterval = time.Second

	// MinRecheckInterval stops a misconfiguration from turning rechecks
	// into a busy loop of virDomainGetState calls against libvirtd.
	MinRecheckInterval = 100 * time.Millisecond

	// DefaultCheckTimeout is how long an OpCheckState may stay unanswered
	// before it counts as failed and a new check is issued. A hung libvirtd
	// is detected by keepalive after ~20 s; 5 s per attempt keeps a stop
	// from being held forever by a caller that lost the answer.
	DefaultCheckTimeout = 5 * time.Second

	// DefaultMaxChecks is how many checks a stop gets before it is reported
	// with ReasonStateCheckFailed. With the defaults the worst-case delay of
	// a real stop report is Window + MaxChecks*CheckTimeout +
	// (MaxChecks-1)*RecheckInterval = 15+25+4 = 44 s.
	DefaultMaxChecks = 5

	// MaxMaxChecks bounds MaxChecks so a stop can never be held for hours.
	MaxMaxChecks = 100

	// RebootBurstGap ends a burst of REBOOT events: one guest reset makes
	// libvirt send 2–4 REBOOT events within tens of milliseconds (measured
	// 32 ms apart on QEMU 7.2, test/realvirt), so REBOOTs closer than 2 s
	// to the previous one are the same reset (or a reset loop) and are
	// reported as one rebooted. No guest resets, runs its firmware and
	// boots in 2 s; a reset loop that does is capped by Window instead.
	// It is also the delay of an ordinary reboot's report.
	RebootBurstGap = 2 * time.Second

	// RebootEventsPerReset is the most REBOOT events one reset produced:
	// shared/reference/libvirt-events.md measured 2–3; test/realvirt's
	// TestAgentQEMUReboots measured 2 in most runs and 4 for one
	// `reboot -f` in a CI run under load (its console showed one reset;
	// the guest kernel likely tried a second reset method before the vCPU
	// stopped). A rebooted report standing for more (Decision.RebootEvents)
	// stood for several resets within one Window: the guest is resetting
	// repeatedly. Only the log level and this reading depend on it.
	RebootEventsPerReset = 4
)

// ErrInvalidConfig is wrapped by every Config validation error.
var ErrInvalidConfig = errors.New("lifecycle: invalid config")

// Config configures a Debouncer. Start from DefaultConfig.
type Config struct {
	// Window is how long a stop is held, waiting for a start or reboot
	// event, before the domain's real state is checked. It also bounds
	// the coalescing of REBOOT events: a burst is reported at most Window
	// after its first event, and a domain gets at most one reboot-event
	// report per Window (a reset loop: one report per Window with the
	// count). 0 selects pass-through: stops are reported at once,
	// unchecked, every REBOOT event is reported on its own, and the other
	// fields are ignored.
	Window time.Duration
	// RecheckInterval is the wait before a new check after a failed or
	// inconclusive one (>= MinRecheckInterval).
	RecheckInterval time.Duration
	// CheckTimeout is how long an issued check may stay unanswered before
	// it counts as failed; 0 selects DefaultCheckTimeout.
	CheckTimeout time.Duration
	// MaxChecks is the number of checks per stop before the stop is
	// reported with ReasonStateCheckFailed (1..MaxMaxChecks).
	MaxChecks int
}

// DefaultConfig returns the production defaults.
func DefaultConfig() Config {
	return Config{
		Window:          DefaultWindow,
		RecheckInterval: DefaultRecheckInterval,
		CheckTimeout:    DefaultCheckTimeout,
		MaxChecks:       DefaultMaxChecks,
	}
}

// Validate reports every invalid field; each error wraps ErrInvalidConfig
// and names the field and its value.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Window < 0 {
		bad("Window %v is negative (0 selects pass-through)", c.Window)
	}
	if c.Window > MaxWindow {
		bad("Window %v exceeds MaxWindow %v", c.Window, MaxWindow)
	}
	if c.Window > 0 {
		if c.RecheckInterval < MinRecheckInterval {
			bad("RecheckInterval %v is below MinRecheckInterval %v", c.RecheckInterval, MinRecheckInterval)
		}
		if c.CheckTimeout < 0 {
			bad("CheckTimeout %v is negative (0 selects DefaultCheckTimeout)", c.CheckTimeout)
		}
		if c.MaxChecks < 1 || c.MaxChecks > MaxMaxChecks {
			bad("MaxChecks %d is outside 1..%d", c.MaxChecks, MaxMaxChecks)
		}
	}
	return errors.Join(errs...)
}
