package daemon

import (
	"fmt"
	"sort"
	"strings"

	"hvguard/controller/recovery"
	"hvguard/daemonkit"
	"hvguard/reconcile"
)

// RecoveryConfig is host recovery (controller/recovery; docs/controller.md
// "Host recovery").
type RecoveryConfig struct {
	// Mode: notify (the default: publish the decisions, call nothing),
	// evacuate, or masakari. evacuate and masakari need the openstack
	// section (cloud and service_cloud).
	Mode string `yaml:"mode"`
	// Release: on-rejoin (clear forced_down once the host's agent is back
	// and reconciled) or manual.
	Release        string   `yaml:"release"`
	MaxEvacuations int      `yaml:"max_evacuations"`
	MaxHosts       int      `yaml:"max_hosts"`
	MaxAttempts    int      `yaml:"max_attempts"`
	RetryBase      Duration `yaml:"retry_base"`
	RetryMax       Duration `yaml:"retry_max"`
	ReleaseRetry   Duration `yaml:"release_retry"`
	// NovaHosts maps a lease host name (the agent's host) to its
	// nova-compute host name (nova.conf [DEFAULT] host), where they
	// differ; Cinder's attachments name the same host.
	NovaHosts map[string]string `yaml:"nova_hosts"`
}

// DefaultRecovery returns the section's defaults (recovery.DefaultConfig).
func DefaultRecovery() RecoveryConfig {
	d := recovery.DefaultConfig()
	return RecoveryConfig{Mode: string(d.Mode), Release: string(d.Release), MaxEvacuations: d.MaxEvacuations,
		MaxHosts: d.MaxHosts, MaxAttempts: d.MaxAttempts, RetryBase: Duration(d.RetryBase), RetryMax: Duration(d.RetryMax),
		ReleaseRetry: Duration(d.ReleaseRetry), NovaHosts: map[string]string{}}
}

// Core is the core's configuration.
func (r RecoveryConfig) Core() recovery.Config {
	return recovery.Config{Mode: recovery.Mode(r.Mode), Release: recovery.ReleasePolicy(r.Release), MaxEvacuations: r.MaxEvacuations,
		MaxHosts: r.MaxHosts, MaxAttempts: r.MaxAttempts, RetryBase: r.RetryBase.D(), RetryMax: r.RetryMax.D(),
		ReleaseRetry: r.ReleaseRetry.D(), NovaHosts: r.NovaHosts}
}

// Calls reports whether the mode calls OpenStack.
func (r RecoveryConfig) Calls() bool { return r.Mode != string(recovery.ModeNotify) }

// validate reports every problem, naming the recovery.* field and value.
func (r RecoveryConfig) validate(os OpenStackConfig, bad daemonkit.Bad) {
	switch recovery.Mode(r.Mode) {
	case recovery.ModeNotify, recovery.ModeEvacuate, recovery.ModeMasakari:
	default:
		bad("recovery.mode", fmt.Sprintf("%q", r.Mode), "must be notify (publish the decisions only), evacuate or masakari")
	}
	switch recovery.ReleasePolicy(r.Release) {
	case recovery.ReleaseOnRejoin, recovery.ReleaseManual:
	default:
		bad("recovery.release", fmt.Sprintf("%q", r.Release), "must be on-rejoin or manual")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"recovery.max_evacuations", r.MaxEvacuations}, {"recovery.max_hosts", r.MaxHosts}, {"recovery.max_attempts", r.MaxAttempts}} {
		if f.v < 1 {
			bad(f.name, f.v, "must be at least 1")
		}
	}
	daemonkit.Positive(bad, "recovery.retry_base", r.RetryBase)
	daemonkit.Positive(bad, "recovery.release_retry", r.ReleaseRetry)
	if r.RetryMax < r.RetryBase {
		bad("recovery.retry_max", r.RetryMax.D(), fmt.Sprintf("must be at least recovery.retry_base (%s)", r.RetryBase.D()))
	}
	keys := make([]string, 0, len(r.NovaHosts))
	for k := range r.NovaHosts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	claimed := map[string]string{}
	for _, k := range keys {
		if !reconcile.ValidHostName(k) || !reconcile.ValidHostName(r.NovaHosts[k]) {
			bad("recovery.nova_hosts", fmt.Sprintf("%q: %q", k, r.NovaHosts[k]), "must map a host name to a host name as Nova knows it")
		}
		// Nova's database compares host names without case.
		n := strings.ToLower(r.NovaHosts[k])
		if o, ok := claimed[n]; ok {
			bad("recovery.nova_hosts", fmt.Sprintf("%q: %q and %q: %q", o, r.NovaHosts[o], k, r.NovaHosts[k]),
				"two lease hosts map to one nova-compute host (Nova compares host names without case): one's recovery would evacuate the other's servers")
		}
		claimed[n] = k
	}
	if r.Calls() && strings.TrimSpace(os.ServiceCloud) == "" && strings.TrimSpace(os.Cloud) != "" {
		bad("openstack.service_cloud", `""`, "required with recovery.mode "+r.Mode+": Cinder removes the dead host's attachments only with the X-Service-Token of a user with the service role")
	}
}
