package agent

import (
	"fmt"
	"time"

	"hvguard/reconcile"
)

// ReconcileConfig is the rejoin reconciliation with Nova (issue 4,
// docs/reconcile.md): destroy the local copies of instances Nova evacuated
// to another host while this node was cut off. Off by default: without an
// OpenStack cloud configured the agent behaves exactly as before.
type ReconcileConfig struct {
	// Enabled turns reconciliation on (needs openstack.cloud).
	Enabled bool `yaml:"enabled"`
	// Action is destroy (power off stale copies, mark them) or report (only
	// log and publish what would be destroyed).
	Action string `yaml:"action"`
	// Interval is the period of the periodic reconciliation.
	Interval Duration `yaml:"interval"`
	// Timeout bounds one reconciliation.
	Timeout Duration `yaml:"timeout"`
	// NovaHosts are this node's names in Nova (nova.conf [DEFAULT] host of
	// its nova-compute). Empty: [host].
	NovaHosts []string `yaml:"nova_hosts"`
}

// Reconcile actions (reconcile.action).
const (
	ReconcileActionDestroy = "destroy"
	ReconcileActionReport  = "report"
)

// Bounds of the reconcile section.
const (
	// MinReconcileInterval: a period below 10 s would make the periodic
	// run (one listing per Nova host) a steady load on nova-api for no
	// gain; rejoins do not wait for the period anyway.
	MinReconcileInterval = 10 * time.Second
	// MaxReconcileTimeout: a reconciliation holds a rejoining host fenced;
	// longer than 10 min is a misconfiguration.
	MaxReconcileTimeout = 10 * time.Minute
)

func defaultReconcile() ReconcileConfig {
	return ReconcileConfig{
		Enabled:   false,
		Action:    ReconcileActionDestroy,
		Interval:  Duration(reconcile.DefaultInterval),
		Timeout:   Duration(reconcile.DefaultTimeout),
		NovaHosts: []string{},
	}
}

// Mode maps Action onto reconcile's mode.
func (r ReconcileConfig) Mode() reconcile.Mode {
	if r.Action == ReconcileActionReport {
		return reconcile.ModeReport
	}
	return reconcile.ModeDestroy
}

// Hosts returns the Nova host names (NovaHosts, or [host]).
func (r ReconcileConfig) Hosts(host string) []string {
	if len(r.NovaHosts) > 0 {
		return r.NovaHosts
	}
	return []string{host}
}

// validate reports every problem through bad. The OpenStack connection
// (required when enabled) is checked by OpenStackConfig.validate.
func (r ReconcileConfig) validate(bad func(field string, val any, why string)) {
	if r.Action != ReconcileActionDestroy && r.Action != ReconcileActionReport {
		bad("reconcile.action", fmt.Sprintf("%q", r.Action), "must be destroy or report")
	}
	if r.Interval.D() < MinReconcileInterval {
		bad("reconcile.interval", r.Interval.D(), fmt.Sprintf("must be at least %s", MinReconcileInterval))
	}
	if r.Timeout <= 0 || r.Timeout.D() > MaxReconcileTimeout {
		bad("reconcile.timeout", r.Timeout.D(), fmt.Sprintf("must be positive and at most %s", MaxReconcileTimeout))
	}
	for i, h := range r.NovaHosts {
		if !reconcile.ValidHostName(h) {
			bad(fmt.Sprintf("reconcile.nova_hosts[%d]", i), fmt.Sprintf("%q", h), "must be a host name as Nova knows it")
		}
	}
}
