package daemon

import (
	"errors"
	"strings"

	"hvguard/controller/instancerecovery"
	"hvguard/daemonkit"
)

// InstanceRecoveryConfig is the section instance_recovery (issue 14,
// instancerecovery.Config; docs/controller.md "Instance recovery").
type InstanceRecoveryConfig struct {
	// Mode: off (default), notify, restart or masakari.
	Mode instancerecovery.Mode `yaml:"mode"`
	// Protect: ha-enabled (server metadata HA_Enabled=True, Masakari's
	// convention), all or none; Projects overrides it per project id.
	Protect  instancerecovery.Protect            `yaml:"protect"`
	Projects map[string]instancerecovery.Protect `yaml:"projects"`
	// Details: the libvirt details of stopped-unexpectedly stops that are
	// recovered: crashed, failed, destroyed, shutdown-by-guest.
	Details []string `yaml:"details"`
	// Unknown: recover stops classified unknown once Nova shows the server
	// SHUTOFF with no task and its last stop was not a user's.
	Unknown       bool     `yaml:"unknown"`
	SettleTimeout Duration `yaml:"settle_timeout"`
	PollInterval  Duration `yaml:"poll_interval"`
	VerifyTimeout Duration `yaml:"verify_timeout"`
	Budget        int      `yaml:"budget"`
	BudgetWindow  Duration `yaml:"budget_window"`
	Backoff       Duration `yaml:"backoff"`
	MaxBackoff    Duration `yaml:"max_backoff"`
	MaxEventAge   Duration `yaml:"max_event_age"`
}

// defaultInstanceRecovery is the core's defaults with mode off.
func defaultInstanceRecovery() InstanceRecoveryConfig {
	c := instancerecovery.DefaultConfig()
	return InstanceRecoveryConfig{Mode: instancerecovery.ModeOff, Protect: c.Protect, Details: c.Details, Unknown: c.Unknown,
		SettleTimeout: Duration(c.SettleTimeout), PollInterval: Duration(c.PollInterval), VerifyTimeout: Duration(c.VerifyTimeout),
		Budget: c.Budget, BudgetWindow: Duration(c.BudgetWindow), Backoff: Duration(c.Backoff), MaxBackoff: Duration(c.MaxBackoff),
		MaxEventAge: Duration(c.MaxEventAge)}
}

// InstanceRecoveryCore is the core's configuration.
func (c *Config) InstanceRecoveryCore() instancerecovery.Config {
	s := c.InstanceRecovery
	return instancerecovery.Config{Mode: s.Mode, Protect: s.Protect, Projects: s.Projects, Details: s.Details, Unknown: s.Unknown,
		SettleTimeout: s.SettleTimeout.D(), PollInterval: s.PollInterval.D(), VerifyTimeout: s.VerifyTimeout.D(), Budget: s.Budget,
		BudgetWindow: s.BudgetWindow.D(), Backoff: s.Backoff.D(), MaxBackoff: s.MaxBackoff.D(), MaxEventAge: s.MaxEventAge.D(), ID: c.ID}
}

// validateInstanceRecovery reports the section's problems (fields named
// instance_recovery.*) and returns what needs OpenStack ("" if nothing).
func (c *Config) validateInstanceRecovery(bad daemonkit.Bad) string {
	err := c.InstanceRecoveryCore().Validate()
	for _, e := range unjoin(err) {
		field, rest, _ := strings.Cut(e.Error(), ": ")
		val, why, _ := strings.Cut(rest, ": ")
		bad("instance_recovery."+field, val, why)
	}
	if c.InstanceRecovery.Mode == "" || c.InstanceRecovery.Mode == instancerecovery.ModeOff {
		return ""
	}
	return "instance_recovery.mode " + string(c.InstanceRecovery.Mode)
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{errors.Unwrap(err)}
}
