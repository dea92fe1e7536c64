package agent

import (
	"fmt"
	"time"

	"hvguard/classify"
	"hvguard/reconcile"
)

// ClassificationConfig is Nova-aware stop classification (issue 6,
// docs/classification.md): before a debounced stop is reported, Nova's view
// of the instance says whether Nova caused it or is in the middle of it (a
// reboot in flight is held and reported as rebooted). Off by default:
// without it the agent reports stops exactly as the core debouncer decides
// them.
type ClassificationConfig struct {
	// Enabled turns classification on (needs openstack.cloud).
	Enabled bool `yaml:"enabled"`
	// NovaHost is this node's name in Nova (nova.conf [DEFAULT] host of its
	// nova-compute), the host filter of the servers listing. Empty: host.
	NovaHost string `yaml:"nova_host"`
	// MaxHold bounds how long a stop is held while a Nova operation that
	// explains it is in flight; then it is reported stopped-by-nova with
	// reason held-too-long.
	MaxHold Duration `yaml:"max_hold"`
	// QueryTimeout bounds one Nova query; an unanswered one makes the stops
	// waiting for it unknown (nova-slow).
	QueryTimeout Duration `yaml:"query_timeout"`
}

// Bounds of the classification section.
const (
	// MinMaxHold: Nova's own reboots kept domains off up to 51 s under
	// load (30 guests, 2 cores; docs/classification.md). A shorter hold
	// ends ordinary reboots as held-too-long.
	MinMaxHold = time.Minute
	// MaxMaxHold: a held stop reaches the controller at most this late;
	// beyond an hour a stop is no longer news (resize and shelve copies
	// take minutes, not hours).
	MaxMaxHold = time.Hour
	// MinQueryTimeout: servers/detail took 66–125 ms idle and up to 1 s
	// under load here; below 500 ms a busy Nova's answers become nova-slow.
	MinQueryTimeout = 500 * time.Millisecond
	// MaxQueryTimeout: an unexpected stop is reported at most this long
	// after its window (Nova not answering), and a held stop without a
	// Nova view for classify.DefaultNovaLostAfter (30 s) is unknown
	// anyway.
	MaxQueryTimeout = classify.DefaultNovaLostAfter
)

func defaultClassification() ClassificationConfig {
	return ClassificationConfig{
		Enabled:      false,
		MaxHold:      Duration(classify.DefaultMaxHold),
		QueryTimeout: Duration(classify.DefaultQueryTimeout),
	}
}

// Host returns the Nova host name (NovaHost, or host).
func (c ClassificationConfig) Host(host string) string {
	if c.NovaHost != "" {
		return c.NovaHost
	}
	return host
}

// Core is the classifier's configuration (the other tunables take
// classify's defaults).
func (c ClassificationConfig) Core() classify.Config {
	return classify.Config{MaxHold: c.MaxHold.D(), QueryTimeout: c.QueryTimeout.D()}
}

func (c ClassificationConfig) validate(bad func(field string, val any, why string)) {
	if c.NovaHost != "" && !reconcile.ValidHostName(c.NovaHost) {
		bad("classification.nova_host", fmt.Sprintf("%q", c.NovaHost), "must be a host name as Nova knows it")
	}
	if c.MaxHold.D() < MinMaxHold || c.MaxHold.D() > MaxMaxHold {
		bad("classification.max_hold", c.MaxHold.D(), fmt.Sprintf("must be between %s and %s", MinMaxHold, MaxMaxHold))
	}
	if c.QueryTimeout.D() < MinQueryTimeout || c.QueryTimeout.D() > MaxQueryTimeout {
		bad("classification.query_timeout", c.QueryTimeout.D(), fmt.Sprintf("must be between %s and %s", MinQueryTimeout, MaxQueryTimeout))
	}
}
