package instancerecovery

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Mode says what the controller does about a recoverable stop.
type Mode string

// Modes.
const (
	// ModeOff: instance recovery is not running.
	ModeOff Mode = "off"
	// ModeNotify: decide and report (events, log, status), act on nothing.
	ModeNotify Mode = "notify"
	// ModeRestart: start the server through Nova (os-start, or a hard
	// reboot where Nova's state requires it).
	ModeRestart Mode = "restart"
	// ModeMasakari: create a Masakari VM notification; Masakari's engine
	// recovers the instance.
	ModeMasakari Mode = "masakari"
)

// Protect says which instances are protected.
type Protect string

// Protection policies.
const (
	// ProtectHAEnabled: only servers whose metadata HA_Enabled is true
	// (Masakari's convention; "True", "true", "1", "yes", "on", "y", "t").
	ProtectHAEnabled Protect = "ha-enabled"
	// ProtectAll: every server.
	ProtectAll Protect = "all"
	// ProtectNone: no server (per-project overrides may protect some).
	ProtectNone Protect = "none"
)

// Valid reports whether p is a known policy.
func (p Protect) Valid() bool {
	return p == ProtectHAEnabled || p == ProtectAll || p == ProtectNone
}

// Libvirt details of a stopped-unexpectedly stop (classify.Detail values)
// that may be recovered.
const (
	DetailCrashed   = "crashed"           // CRASHED, STOPPED/CRASHED: guest panic
	DetailFailed    = "failed"            // STOPPED/FAILED: QEMU died (killed, OOM)
	DetailDestroyed = "destroyed"         // STOPPED/DESTROYED outside Nova
	DetailShutdown  = "shutdown-by-guest" // STOPPED/SHUTDOWN: the guest powered itself off
)

// RecoverableDetails lists the details Config.Details may name.
var RecoverableDetails = []string{DetailCrashed, DetailFailed, DetailDestroyed, DetailShutdown}

// Defaults and bounds. The figures come from the issue 6 measurements on
// the e2e harness (docs/classification.md): Nova's own power-state sync
// turns an unexpected stop into vm_state stopped 16–17 s after it (idle),
// 30–47 s during a 30-guest reboot storm; a start took ~3–5 s.
const (
	// DefaultSettleTimeout: how long to wait for Nova to settle (vm_state
	// stopped, no task) after the stop was reported: well above the 47 s
	// measured under a storm. After it, a server Nova still shows active
	// but not running (its power-state sync is off or stuck) is hard
	// rebooted; one with a task still in flight is left alone (reported).
	DefaultSettleTimeout = 3 * time.Minute
	// DefaultPollInterval: how often Nova is asked while settling or
	// verifying (one GET /servers/{id} per instance).
	DefaultPollInterval = 2 * time.Second
	// DefaultVerifyTimeout: how long after the action the server must be
	// ACTIVE (no task, power running) and the agent must have reported the
	// domain running; a start took 3–5 s, a TCG boot under the storm's
	// load up to ~70 s.
	DefaultVerifyTimeout = 3 * time.Minute
	// DefaultBudget / DefaultBudgetWindow: at most 3 actions per instance
	// per hour; a guest that crashes again and again is reported and left
	// alone.
	DefaultBudget       = 3
	DefaultBudgetWindow = time.Hour
	// DefaultBackoff: the second action within the window waits 30 s after
	// the first, the third 60 s after the second, … (capped at MaxBackoff).
	DefaultBackoff    = 30 * time.Second
	DefaultMaxBackoff = 10 * time.Minute
	// DefaultMaxEventAge: a stop reported longer ago than this when the
	// core first sees it (a controller replaying the stream after a long
	// outage) is not acted on: the owner may have dealt with it since. It
	// must not exceed BudgetWindow, which is how long the record keeps
	// every action (so a replayed stop still finds its action).
	DefaultMaxEventAge = 10 * time.Minute
	// MaxRecordEntries bounds the stops kept in one instance's record.
	MaxRecordEntries = 64
)

// Config is the instance recovery's configuration.
type Config struct {
	Mode Mode
	// Protect is the default policy; Projects overrides it per project id.
	Protect  Protect
	Projects map[string]Protect
	// Details: the libvirt details of stopped-unexpectedly stops that are
	// recovered (RecoverableDetails).
	Details []string
	// Unknown: recover `unknown` stops once Nova confirms the server
	// SHUTOFF with no task in flight.
	Unknown bool
	// SettleTimeout, PollInterval, VerifyTimeout: see the defaults.
	SettleTimeout, PollInterval, VerifyTimeout time.Duration
	Budget                                     int
	BudgetWindow, Backoff, MaxBackoff          time.Duration
	MaxEventAge                                time.Duration
	// ID names this controller in the records it writes.
	ID string
}

// DefaultConfig returns the defaults (mode restart).
func DefaultConfig() Config {
	return Config{Mode: ModeRestart, Protect: ProtectHAEnabled, Details: []string{DetailCrashed, DetailFailed, DetailDestroyed},
		Unknown: true, SettleTimeout: DefaultSettleTimeout, PollInterval: DefaultPollInterval, VerifyTimeout: DefaultVerifyTimeout,
		Budget: DefaultBudget, BudgetWindow: DefaultBudgetWindow, Backoff: DefaultBackoff, MaxBackoff: DefaultMaxBackoff,
		MaxEventAge: DefaultMaxEventAge}
}

// Validate returns every problem at once, each naming the field and value
// (field names as in the controller's YAML section instance_recovery).
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, v any, why string) { errs = append(errs, fmt.Errorf("%s: %v: %s", field, v, why)) }
	switch c.Mode {
	case ModeOff, ModeNotify, ModeRestart, ModeMasakari:
	default:
		bad("mode", fmt.Sprintf("%q", c.Mode), "must be off, notify, restart or masakari")
	}
	if !c.Protect.Valid() {
		bad("protect", fmt.Sprintf("%q", c.Protect), "must be ha-enabled, all or none")
	}
	projects := make([]string, 0, len(c.Projects))
	for p := range c.Projects {
		projects = append(projects, p)
	}
	sort.Strings(projects)
	for _, p := range projects {
		if p == "" {
			bad("projects", `""`, "a project id must not be empty")
		}
		if v := c.Projects[p]; !v.Valid() {
			bad("projects."+p, fmt.Sprintf("%q", v), "must be ha-enabled, all or none")
		}
	}
	seen := map[string]bool{}
	for _, d := range c.Details {
		if !contains(RecoverableDetails, d) {
			bad("details", fmt.Sprintf("%q", d), "must be one of "+strings.Join(RecoverableDetails, ", "))
		}
		if seen[d] {
			bad("details", fmt.Sprintf("%q", d), "listed twice")
		}
		seen[d] = true
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"settle_timeout", c.SettleTimeout}, {"poll_interval", c.PollInterval}, {"verify_timeout", c.VerifyTimeout},
		{"budget_window", c.BudgetWindow}, {"backoff", c.Backoff}, {"max_backoff", c.MaxBackoff}, {"max_event_age", c.MaxEventAge}} {
		if f.d <= 0 {
			bad(f.name, f.d, "must be positive")
		}
	}
	if c.PollInterval > 0 && c.PollInterval < 100*time.Millisecond {
		bad("poll_interval", c.PollInterval, "must be at least 100ms (one Nova request per instance per interval)")
	}
	if c.Budget < 1 {
		bad("budget", c.Budget, "must be at least 1 (mode off disables recovery)")
	}
	if c.Backoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.Backoff {
		bad("max_backoff", c.MaxBackoff, fmt.Sprintf("must not be below backoff (%s)", c.Backoff))
	}
	if c.MaxEventAge > 0 && c.BudgetWindow > 0 && c.MaxEventAge > c.BudgetWindow {
		bad("max_event_age", c.MaxEventAge, fmt.Sprintf("must not exceed budget_window (%s): a replayed stop must still find its action in the record", c.BudgetWindow))
	}
	return errors.Join(errs...)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// protected applies the policy to a server.
func (c Config) protected(project string, metadata map[string]string) (bool, Protect) {
	p := c.Protect
	if o, ok := c.Projects[project]; ok {
		p = o
	}
	switch p {
	case ProtectAll:
		return true, p
	case ProtectHAEnabled:
		return HAEnabled(metadata), p
	}
	return false, p
}

// HAEnabled reports whether server metadata HA_Enabled is true, read as
// Masakari reads it (oslo's bool_from_string: 1, t, true, on, y, yes, any
// case).
func HAEnabled(metadata map[string]string) bool {
	switch strings.ToLower(strings.TrimSpace(metadata["HA_Enabled"])) {
	case "1", "t", "true", "on", "y", "yes":
		return true
	}
	return false
}
