package agent

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reconciliation metrics (only with reconcile.enabled).
var (
	descRecRuns = prometheus.NewDesc("hvguard_reconcile_runs_total",
		"Rejoin reconciliations with Nova, by trigger (start, rejoin, periodic, retry) and outcome (ok, failed: nothing destroyed or a destroy failed).",
		[]string{"trigger", "outcome"}, nil)
	descRecDestroyed = prometheus.NewDesc("hvguard_reconcile_domains_destroyed_total",
		"Stale copies of instances Nova evacuated elsewhere that were powered off.", nil, nil)
	descRecWould = prometheus.NewDesc("hvguard_reconcile_domains_would_destroy_total",
		"Stale copies found in reconcile.action report (not destroyed), counted per reconciliation.", nil, nil)
	descRecFailed = prometheus.NewDesc("hvguard_reconcile_destroy_failures_total",
		"Destroys of stale copies that failed (the reconciliation is retried).", nil, nil)
	descRecSkipped = prometheus.NewDesc("hvguard_reconcile_domains_skipped",
		"Domains the last reconciliation refused to judge (Nova's evidence incomplete or contradictory: nothing done to them; `hvguard-agent status` says why).", nil, nil)
	descRecLastOK = prometheus.NewDesc("hvguard_reconcile_last_success_timestamp_seconds",
		"Unix time of the last OK reconciliation (0: none since start).", nil, nil)
	descRecFailures = prometheus.NewDesc("hvguard_reconcile_consecutive_failures",
		"Reconciliations in a row that were not OK (0 after an OK one).", nil, nil)
	descRecPublished = prometheus.NewDesc("hvguard_reconcile_events_published_total",
		"Reconcile events acknowledged by JetStream.", nil, nil)
	descRecDropped = prometheus.NewDesc("hvguard_reconcile_events_dropped_total",
		"Reconcile events dropped unpublished (NATS unreachable too long; the status file and domain marks keep the record).", nil, nil)
)

func (c collector) collectReconcile(ch chan<- prometheus.Metric) {
	r := c.d.rec
	if r == nil {
		return
	}
	s := &r.stats
	cnt := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	g := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v)
	}
	s.runs.Range(func(k, v any) bool {
		trigger, outcome, _ := strings.Cut(k.(string), "/")
		cnt(descRecRuns, v.(*atomic.Uint64).Load(), trigger, outcome)
		return true
	})
	cnt(descRecDestroyed, s.Destroyed.Load())
	cnt(descRecWould, s.WouldDestroy.Load())
	cnt(descRecFailed, s.DestroyFailed.Load())
	last := 0.0
	if ns := s.LastSuccess.Load(); ns > 0 {
		last = float64(ns) / 1e9
	}
	g(descRecSkipped, float64(s.LastSkipped.Load()))
	g(descRecLastOK, last)
	g(descRecFailures, float64(s.ConsecutiveFailures.Load()))
	cnt(descRecPublished, s.EventsPublished.Load())
	cnt(descRecDropped, s.EventsDropped.Load())
}
