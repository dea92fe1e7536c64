package agent

import (
	"fmt"
	"log/slog"
	"strings"

	"hvguard/daemonkit"
	"hvguard/openstack"
)

// OpenStackConfig is the connection to the OpenStack cloud, shared by the
// features that ask Nova: reconcile (issue 4) and classification (issue 6)
// (and with the controller: daemonkit.OpenStackConfig).
type OpenStackConfig = daemonkit.OpenStackConfig

func defaultOpenStack() OpenStackConfig { return daemonkit.DefaultOpenStack() }

// newNova builds the one OpenStack client the agent's features share
// (reconcile and classification: one keystone token, one connection pool;
// the client is safe for concurrent use), or nil when no enabled feature
// asks Nova. It parses clouds.yaml and does not contact keystone or Nova.
func newNova(cfg Config, log *slog.Logger) (*openstack.Client, error) {
	if cfg.needsOpenStack() == "" {
		return nil, nil
	}
	nova, err := openstack.New(cfg.OpenStack.Client(), log.With("component", "openstack"))
	if err != nil {
		return nil, fmt.Errorf("openstack: %w", err)
	}
	return nova, nil
}

// SecurityWarnings are the insecure settings of the configuration
// (logged at ERROR at start, shown by `hvguard-agent status` and counted in
// hvguard_insecure_settings): plaintext NATS allowed to a remote server, a
// password in a NATS URL, TLS verification disabled in clouds.yaml.
func (c *Config) SecurityWarnings() []string {
	return append(c.NATS.Warnings(), c.OpenStack.Warnings(c.needsOpenStack())...)
}

// needsOpenStack names the enabled features that ask Nova ("" = none).
func (c *Config) needsOpenStack() string {
	var on []string
	if c.Reconcile.Enabled {
		on = append(on, "reconcile.enabled")
	}
	if c.Classification.Enabled {
		on = append(on, "classification.enabled")
	}
	return strings.Join(on, " and ")
}
