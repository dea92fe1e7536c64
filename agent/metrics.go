package agent

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"hvguard/agent/delivery"
	"hvguard/daemonkit"
	"hvguard/fencing/peer"
)

// unixSeconds is t as a *_timestamp_seconds value.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// collector exposes the daemon's live counters at scrape time. Counters live
// in the components (atomics), so the event path never touches Prometheus.
type collector struct{ d *Daemon }

var (
	descEventsIn   = prometheus.NewDesc("hvguard_libvirt_events_total", "libvirt domain events received by the event loop.", nil, nil)
	descReports    = prometheus.NewDesc("hvguard_lifecycle_reports_total", "Lifecycle transitions reported (appended to the outbox), by transition.", []string{"transition"}, nil)
	descSuppressed = prometheus.NewDesc("hvguard_lifecycle_stops_suppressed_total", "Stops not reported because the domain ran again (reported as rebooted), by reason.", []string{"reason"}, nil)
	descChecks     = prometheus.NewDesc("hvguard_domain_state_checks_total", "Real-state checks made at the end of a stop window.", nil, nil)
	descCheckErrs  = prometheus.NewDesc("hvguard_domain_state_check_errors_total", "Real-state checks that failed.", nil, nil)
	descResyncs    = prometheus.NewDesc("hvguard_domain_resyncs_total", "Full domain resyncs (after reconnect or hand-off overflow).", nil, nil)
	descTracked    = prometheus.NewDesc("hvguard_domains_tracked", "Domains the debouncer tracks.", nil, nil)
	descLvUp       = prometheus.NewDesc("hvguard_libvirt_connected", "1 when the libvirt connection is up.", nil, nil)
	descLvReconn   = prometheus.NewDesc("hvguard_libvirt_reconnects_total", "libvirt reconnects.", nil, nil)
	descLvOverflow = prometheus.NewDesc("hvguard_libvirt_event_overflows_total", "Events that found the hand-off buffer full (each forces a resync).", nil, nil)
	descLoopAge    = prometheus.NewDesc("hvguard_libvirt_event_loop_last_tick_timestamp_seconds", "Unix time of the libvirt event loop's last tick (it ticks every second; the agent withholds systemd's watchdog ping when it is 10 s old).", nil, nil)
	descNatsUp     = prometheus.NewDesc("hvguard_nats_connected", "1 when the NATS connection is up.", nil, nil)
	descOutDepth   = prometheus.NewDesc("hvguard_outbox_depth", "Events in the outbox not yet acknowledged by JetStream.", nil, nil)
	descOutBytes   = prometheus.NewDesc("hvguard_outbox_bytes", "Bytes used by the outbox on disk.", nil, nil)
	descOutMaxEv   = prometheus.NewDesc("hvguard_outbox_max_events", "The outbox's bound in events (outbox.max_events): at the bound the oldest events are dropped and a gap marker published.", nil, nil)
	descOutMaxB    = prometheus.NewDesc("hvguard_outbox_max_bytes", "The outbox's bound in bytes (outbox.max_bytes).", nil, nil)
	descPublished  = prometheus.NewDesc("hvguard_outbox_events_published_total", "Events acknowledged by JetStream.", nil, nil)
	descResent     = prometheus.NewDesc("hvguard_outbox_events_resent_total", "Events sent again after an error or timeout (deduplicated by message ID).", nil, nil)
	descDropped    = prometheus.NewDesc("hvguard_outbox_events_dropped_total", "Events dropped because the outbox was full (each gap is announced by a gap marker).", nil, nil)
	descGaps       = prometheus.NewDesc("hvguard_outbox_gap_markers_total", "Gap markers written.", nil, nil)
	descNatsDenied = prometheus.NewDesc("hvguard_nats_permission_denied_total", "Operations the NATS server refused for lack of permission (each logged at ERROR naming the permission).", nil, nil)
	descInsecure   = prometheus.NewDesc("hvguard_insecure_settings", "Insecure settings in the configuration (plaintext NATS allowed to a remote server, a password in a NATS URL, verify: false in clouds.yaml, a lease bucket allowing rollups); listed by hvguard-agent status and logged at start.", nil, nil)
	descDrift      = prometheus.NewDesc("hvguard_stream_settings_differing", "Settings of the existing HVGUARD_EVENTS stream that differ from hvguard's recommendation (left unchanged, logged at WARN), by risky (true: can cost events or duplicates).", []string{"risky"}, nil)

	// Classification (only with classification.enabled).
	descClassified  = prometheus.NewDesc("hvguard_stop_classifications_total", "Stops reported with a Nova classification, by classification (rebooted, stopped-by-nova, stopped-unexpectedly, unknown) and reason.", []string{"classification", "reason"}, nil)
	descClassifying = prometheus.NewDesc("hvguard_stops_classifying", "Stops held back while they are classified (waiting for Nova or held for a Nova operation).", nil, nil)
	descQueued      = prometheus.NewDesc("hvguard_reports_queued", "Reports of domains whose stop is being classified, queued to be published after it (in order).", nil, nil)
	descHolds       = prometheus.NewDesc("hvguard_stop_holds_total", "Stops held because a Nova operation explained them, by Nova task_state.", []string{"task"}, nil)
	descNovaQueries = prometheus.NewDesc("hvguard_nova_queries_total", "Nova queries for classification, by kind (servers, actions) and result (ok, error, timeout).", []string{"kind", "result"}, nil)

	// Fencing (only with fence.enabled).
	descFenceState    = prometheus.NewDesc("hvguard_fence_state", "1 for the current fencing state (starting, healthy, suspect, asking-peers, held, fencing, fenced, rejoining, awaiting-release).", []string{"state"}, nil)
	descLeaseAge      = prometheus.NewDesc("hvguard_fence_lease_last_renewal_timestamp_seconds", "Unix time (send time) of the last lease renewal known to have landed (0: none since start). Measured on CLOCK_BOOTTIME and converted at scrape time, so a wall-clock step moves it by that step.", nil, nil)
	descLeaseHeld     = prometheus.NewDesc("hvguard_fence_lease_held", "1 while the agent holds its lease.", nil, nil)
	descRenewals      = prometheus.NewDesc("hvguard_fence_lease_renewals_total", "Lease renewals sent.", nil, nil)
	descBeacons       = prometheus.NewDesc("hvguard_fence_beacons_published_total", "Beacons published after the agent's own lease renewals (fencing.Beacon: what lets a controller requiring signatures count a renewal it cannot verify).", nil, nil)
	descRenewFailures = prometheus.NewDesc("hvguard_fence_lease_renewal_failures_total", "Lease renewals not acknowledged (timed out, failed or CAS conflict).", nil, nil)
	descPeersAsked    = prometheus.NewDesc("hvguard_fence_peers_asked_total", "Peer questions sent.", nil, nil)
	descPeerAnswers   = prometheus.NewDesc("hvguard_fence_peer_answers_total", "Peer answers, by kind.", []string{"kind"}, nil)
	descPausedByHV    = prometheus.NewDesc("hvguard_fence_domains_paused", "Domains hvguard paused and would resume on a rejoin (the durable paused set).", nil, nil)
	descFenceOps      = prometheus.NewDesc("hvguard_fence_operations_total", "Completed fence operations, by op (pause, destroy, resume).", []string{"op"}, nil)
	descFenceOpErrs   = prometheus.NewDesc("hvguard_fence_operation_errors_total", "Failed pause/destroy/resume calls (pause/destroy are retried).", nil, nil)
	descFenceAlerts   = prometheus.NewDesc("hvguard_fence_alerts_total", "Fencing alerts (logged at ERROR).", nil, nil)
	descFenceInvalid  = prometheus.NewDesc("hvguard_fence_invalid_records_total", "Lease records (or guards) refused as untrusted: forged, replayed, unsigned with signing required, unknown signer, bad signature; read, shown by a peer, or asked to be relayed (logged at ERROR).", nil, nil)
	descFenceResets   = prometheus.NewDesc("hvguard_fence_host_resets_requested_total", "Host resets requested (only ever seen > 0 in tests or when the reset failed).", nil, nil)
	descFenceAction   = prometheus.NewDesc("hvguard_fence_action", "Always 1; action: the configured fence action (pause, destroy, reset-host, none = monitor only).", []string{"action"}, nil)
	descPeerRefused   = prometheus.NewDesc("hvguard_fence_peer_requests_refused_total", "Peer requests the endpoint refused, by reason (signature, stale, replay, addressee, relay-host, decode, body, method).", []string{"reason"}, nil)
	descPeerConns     = prometheus.NewDesc("hvguard_fence_peer_connections_refused_total", "Connections to the peer endpoint closed at once: over the per-address or total limit.", nil, nil)
	descWatchdog      = prometheus.NewDesc("hvguard_fence_watchdog_state", "1 for the hardware watchdog's state (none, disarmed, armed, triggered, malfunction).", []string{"state"}, nil)
)

// peerAnswerNames are the label values of fencing.PeerAnswerKind.
var peerAnswerNames = [...]string{"unreachable", "cannot-renew", "relay-failed", "relayed", "declared", "lease-lapsed"}

var fenceStates = []string{"starting", "healthy", "suspect", "asking-peers", "held", "fencing", "fenced", "rejoining", "awaiting-release"}

func (c collector) collectFence(ch chan<- prometheus.Metric) {
	f := c.d.fence
	if f == nil {
		return
	}
	s := &f.stats
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	cnt := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	cur := ""
	if p := s.State.Load(); p != nil {
		cur = *p
	}
	for _, st := range fenceStates {
		v := 0.0
		if st == cur {
			v = 1
		}
		g(descFenceState, v, st)
	}
	lastAck := 0.0
	if ns := s.LastAck.Load(); ns > 0 {
		lastAck = unixSeconds(time.Now().Add(-bootNow().Sub(time.Unix(0, ns))))
	}
	g(descLeaseAge, lastAck)
	held := 0.0
	if s.LeaseHeld.Load() {
		held = 1
	}
	g(descLeaseHeld, held)
	cnt(descRenewals, s.Renewals.Load())
	cnt(descRenewFailures, s.RenewFailures.Load())
	cnt(descBeacons, s.Beacons.Load())
	cnt(descPeersAsked, s.PeersAsked.Load())
	for i, n := range peerAnswerNames {
		cnt(descPeerAnswers, s.PeerAnswers[i].Load(), n)
	}
	g(descPausedByHV, float64(s.PausedByHV.Load()))
	cnt(descFenceOps, s.Paused.Load(), "pause")
	cnt(descFenceOps, s.Destroyed.Load(), "destroy")
	cnt(descFenceOps, s.Resumed.Load(), "resume")
	cnt(descFenceOpErrs, s.FenceOpErrors.Load())
	cnt(descFenceAlerts, s.Alerts.Load())
	cnt(descFenceInvalid, s.InvalidRecords.Load())
	cnt(descFenceResets, s.ResetRequested.Load())
	g(descFenceAction, 1, string(f.core.Action))
	for _, reason := range peer.RefuseReasons {
		cnt(descPeerRefused, s.PeerRefused.get(reason), reason)
	}
	if l := s.peerConns.Load(); l != nil {
		cnt(descPeerConns, l.Refused.Load())
	}
	wd := s.Watchdog.Load()
	for i, n := range []string{"none", "disarmed", "armed", "triggered", "malfunction"} {
		v := 0.0
		if int32(i-1) == wd {
			v = 1
		}
		g(descWatchdog, v, n)
	}
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	s := d.loop.stats
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	counter(descEventsIn, s.EventsIn.Load())
	counter(descNatsDenied, d.natsStats.PermissionDenied.Load())
	gauge(descInsecure, float64(len(d.securityWarnings())))
	for i, t := range transitions {
		counter(descReports, s.Reports[i].Load(), string(t))
	}
	s.Suppressed.Range(func(k, v any) bool {
		counter(descSuppressed, v.(*atomic.Uint64).Load(), k.(string))
		return true
	})
	counter(descChecks, s.Checks.Load())
	counter(descCheckErrs, s.CheckErrors.Load())
	counter(descResyncs, s.Resyncs.Load())
	gauge(descTracked, float64(s.Tracked.Load()))

	ls := d.lv.Status()
	gauge(descLvUp, b2f(ls.Connected))
	counter(descLvReconn, ls.Reconnects)
	counter(descLvOverflow, ls.Overflows)
	tick := 0.0
	if !ls.EventLoopTick.IsZero() {
		tick = unixSeconds(ls.EventLoopTick)
	}
	gauge(descLoopAge, tick)

	gauge(descNatsUp, b2f(d.nc.IsConnected()))
	os := d.outbox.Stats()
	gauge(descOutDepth, float64(os.Depth))
	gauge(descOutBytes, float64(os.Bytes))
	gauge(descOutMaxEv, float64(d.cfg.Outbox.MaxEvents))
	gauge(descOutMaxB, float64(d.cfg.Outbox.MaxBytes))
	counter(descDropped, os.Dropped)
	counter(descGaps, os.GapMarkers)
	counter(descPublished, os.Acked)
	counter(descResent, os.Resent)
	var ps delivery.Stats
	if d.pub != nil {
		ps = d.pub.Stats()
	}
	gauge(descDrift, float64(ps.StreamDriftRisky), "true")
	gauge(descDrift, float64(ps.StreamDrift-ps.StreamDriftRisky), "false")
	c.collectFence(ch)
	c.collectReconcile(ch)
	c.collectClassify(ch)
}

func (c collector) collectClassify(ch chan<- prometheus.Metric) {
	if !c.d.loop.Classifying() {
		return
	}
	s := c.d.loop.ClassifyStats()
	cnt := func(desc *prometheus.Desc, m *sync.Map) {
		m.Range(func(k, v any) bool {
			labels := strings.SplitN(k.(string), "/", 2)
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v.(*atomic.Uint64).Load()), labels...)
			return true
		})
	}
	cnt(descClassified, &s.Classifications)
	cnt(descHolds, &s.Holds)
	cnt(descNovaQueries, &s.NovaQueries)
	ch <- prometheus.MustNewConstMetric(descClassifying, prometheus.GaugeValue, float64(s.Classifying.Load()))
	ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(s.Queued.Load()))
}

// metricsHandler serves /metrics (Prometheus) and /healthz (200 when the
// event loop iterated within the last 5 s).
func (d *Daemon) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{d}, daemonkit.BuildInfoGauge("agent", Version), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		last := time.Unix(0, d.loop.stats.LastLoop.Load())
		if time.Since(last) > 5*time.Second {
			http.Error(w, "event loop stalled since "+last.Format(time.RFC3339), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok " + d.summary() + "\n"))
	})
	return mux
}
