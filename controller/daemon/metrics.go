package daemon

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/daemonkit"
	"hvguard/fencing"
)

// counters are updated by the loops (atomics) and read at scrape time.
type counters struct {
	leaderChanges atomic.Int64
	declared      atomic.Int64 // declarations written
	declareFailed atomic.Int64 // declarations not written (CAS conflict: the host renewed; or NATS)
	// declareReceipt: declarations not written because the host's
	// withdrawal receipt names a withdrawal (controller.ErrWithdrawalReceipt).
	declareReceipt atomic.Int64
	notActing      atomic.Int64 // writes MayAct did not allow
	released       atomic.Int64
	holds          atomic.Int64 // guard holds started
	heldBack       atomic.Int64
	refusals       atomic.Int64 // hosts refused (per change)
	refusedDue     atomic.Int64
	keysDeleted    atomic.Int64 // lease keys deleted or purged (lease-deleted)
	invalid        atomic.Int64 // untrusted values of lease keys (invalid-record)
	regressed      atomic.Int64 // keys whose revisions went down (revision-regressed)
	beacons        atomic.Int64 // agents' beacons passed to the tracker
	beaconsBad     atomic.Int64 // beacons refused (undecodable, wrong host, queue full)
	beaconsShed    atomic.Int64 // beacons shed unverified, beyond their host's budget (controller.ErrBeaconShed)
	beaconLosses   atomic.Int64 // windows in which beacons may have been lost (controller/beaconloss.go)
	// decisionsDropped: decision events not published (queue full, NATS
	// refused the publish).
	decisionsDropped atomic.Int64
	// recovery events by op.
	recMu     sync.Mutex
	recEvents map[string]int64
}

func (c *counters) recoveryEvent(op string) {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	if c.recEvents == nil {
		c.recEvents = map[string]int64{}
	}
	c.recEvents[op]++
}

func (c *counters) count(d controller.Decision, err error) {
	switch {
	case errors.Is(err, controller.ErrNotActing):
		c.notActing.Add(1)
	case d.Op == controller.OpDeclare && err == nil:
		c.declared.Add(1)
	case d.Op == controller.OpDeclare && errors.Is(err, controller.ErrWithdrawalReceipt):
		c.declareReceipt.Add(1)
	case d.Op == controller.OpDeclare:
		c.declareFailed.Add(1)
	case d.Op == controller.OpRelease && err == nil:
		c.released.Add(1)
	case d.Op == controller.OpHoldStarted:
		c.holds.Add(1)
	case d.Op == controller.OpHeldBack:
		c.heldBack.Add(1)
	case d.Op == controller.OpRefuse:
		c.refusals.Add(1)
	case d.Op == controller.OpRefusedDue:
		c.refusedDue.Add(1)
	case d.Op == controller.OpLeaseDeleted:
		c.keysDeleted.Add(1)
	case d.Op == controller.OpInvalid:
		c.invalid.Add(1)
	case d.Op == controller.OpRevisionRegressed:
		c.regressed.Add(1)
	}
}

var (
	descLeader           = prometheus.NewDesc("hvguard_controller_leader", "1 while this controller holds the leader lock and may act.", nil, nil)
	descTerm             = prometheus.NewDesc("hvguard_controller_leader_term", "Term of the leader lock as this controller's watch shows it (0: none).", nil, nil)
	descLeaderChanges    = prometheus.NewDesc("hvguard_controller_leader_changes_total", "Times this controller was elected or deposed.", nil, nil)
	descDeclarations     = prometheus.NewDesc("hvguard_controller_declarations_total", "Host declarations (lease expired), by result: written, failed (CAS conflict: the host renewed; or NATS; or its withdrawal receipt could not be read), withdrawal-receipt (not written: the host's stored withdrawal receipt names a withdrawal the tracker had missed), not-acting (decided while not allowed to act: not written).", []string{"result"}, nil)
	descReleases         = prometheus.NewDesc("hvguard_controller_host_releases_total", "Declared hosts released.", nil, nil)
	descHolds            = prometheus.NewDesc("hvguard_controller_guard_holds_total", "Mass-failure guard holds started (nothing declared while one lasts).", nil, nil)
	descHolding          = prometheus.NewDesc("hvguard_controller_guard_holding", "1 while the mass-failure guard holds.", nil, nil)
	descHeldBack         = prometheus.NewDesc("hvguard_controller_hosts_held_back_total", "Due hosts not declared because the guard held.", nil, nil)
	descRefusals         = prometheus.NewDesc("hvguard_controller_host_refusals_total", "Hosts refused (constants the controller cannot honour; never declared), counted per change.", nil, nil)
	descRefusedDue       = prometheus.NewDesc("hvguard_controller_refused_hosts_due_total", "Refused hosts that fell silent and were NOT declared.", nil, nil)
	descHosts            = prometheus.NewDesc("hvguard_controller_hosts", "Hosts in the lease bucket, by lease state (active, expired, released, withdrawn).", []string{"state"}, nil)
	descRefused          = prometheus.NewDesc("hvguard_controller_hosts_refused", "Hosts currently refused.", nil, nil)
	descRollbackGated    = prometheus.NewDesc("hvguard_controller_hosts_rollback_gated", "Hosts that fell due after the lease stream rolled back and are NOT declared until their beacon proves their record or an operator runs hvguard-controller confirm-rollback HOST (docs/security.md, \"The rollback gate\").", nil, nil)
	descSilent           = prometheus.NewDesc("hvguard_controller_hosts_silent", "Hosts the guard counts silent now.", nil, nil)
	descEvents           = prometheus.NewDesc("hvguard_controller_lifecycle_messages_total", "Lifecycle messages consumed from the event stream, by what the fleet view did with them: applied, duplicate, old-incarnation (dropped), missing (applied after a hole: the host's view went stale), new-incarnation (applied: the host's view went stale), poison (undecodable: terminated, never redelivered).", []string{"verdict"}, nil)
	descEventsRefused    = prometheus.NewDesc("hvguard_controller_events_refused_total", "Events refused by their signature (signing optional or required; docs/security.md, \"Signed events\"): terminated, never applied to the fleet view nor seen by instance recovery, logged at most every 10 s. By reason: unsigned (signing: required), foreign-key (another host's key), unknown-signer, bad-signature.", []string{"reason"}, nil)
	descStreamLag        = prometheus.NewDesc("hvguard_controller_stream_lag_messages", "Messages in the event stream not yet delivered to this controller's consumer (read every 5 s).", nil, nil)
	descAckPending       = prometheus.NewDesc("hvguard_controller_stream_ack_pending_messages", "Messages delivered to this controller's consumer and not yet acknowledged.", nil, nil)
	descStaleHosts       = prometheus.NewDesc("hvguard_controller_hosts_stale", "Hosts whose fleet view is stale (events missing, a new incarnation, a gap, or no full report yet) until their agent's next full report.", nil, nil)
	descRegressed        = prometheus.NewDesc("hvguard_controller_lease_revision_regressions_total", "Lease keys whose revisions went down (the lease stream re-created or rolled back): each such host is not declared until its revisions pass the last one seen; restart the controllers.", nil, nil)
	descInvalidRecords   = prometheus.NewDesc("hvguard_controller_invalid_lease_records_total", "Values of lease keys ignored as untrusted (signing: forged, replayed, unsigned, unknown signer, bad signature, undecodable).", nil, nil)
	descBeaconLosses     = prometheus.NewDesc("hvguard_controller_beacon_loss_windows_total", "Ticks at which the controller found agents' beacons may have been lost (its beacon subscription dropped messages, its connection was down or reconnected, the beacon queue was full, or no beacon came within 10 s for a renewal the watch delivered); a host whose write the lease watch may have hidden meanwhile is not declared (docs/security.md).", nil, nil)
	descBeacons          = prometheus.NewDesc("hvguard_controller_beacons_total", "Agents' beacons received (fencing.Beacon: with signatures required, a lease value the controller cannot verify counts only when its host's beacon names its revision), by result: accepted, refused (undecodable, another host's, queue full), shed (beyond the host's verification budget: 50/s, burst 200; counted against that host only).", []string{"result"}, nil)
	descKeysDeleted      = prometheus.NewDesc("hvguard_controller_lease_keys_deleted_total", "Lease keys deleted or purged (the host is unprotected until its agent re-creates the key).", nil, nil)
	descHostsDeleted     = prometheus.NewDesc("hvguard_controller_hosts_key_deleted", "Hosts whose lease key is deleted now (never declared; still counted by the guard).", nil, nil)
	descThreshold        = prometheus.NewDesc("hvguard_controller_guard_threshold", "The mass-failure guard's threshold now: the smallest over the membership and every guard version an agent may still act on.", nil, nil)
	descDecisionsDropped = prometheus.NewDesc("hvguard_controller_decision_events_dropped_total", "Decision events (hvguard.v1._controller.decision) not published: queue full or NATS refused the publish (best effort; the lease bucket is the authority).", nil, nil)
	descIRReports        = prometheus.NewDesc("hvguard_controller_instance_recovery_reports_total", "Instance recovery reports, by step (skipped, waiting, acting, verifying, recovered, failed, over-budget, notified) and reason (docs/controller.md).", []string{"step", "reason"}, nil)
	descIRActions        = prometheus.NewDesc("hvguard_controller_instance_recovery_actions_total", "Instance recovery actions performed (start, hard-reboot, masakari), each after its intent was recorded.", []string{"action"}, nil)
	descIRInProgress     = prometheus.NewDesc("hvguard_controller_instance_recovery_in_progress", "Stops being handled (waiting for Nova, acting, verifying) or queued behind one.", nil, nil)
	descIROverBudget     = prometheus.NewDesc("hvguard_controller_instance_recovery_over_budget", "Instances that used their restart budget within the budget window (left alone, reported).", nil, nil)
	descIRSeconds        = prometheus.NewDesc("hvguard_controller_instance_recovery_seconds", "Stop reported by the agent → the server ACTIVE in Nova and the domain running again, per recovery.", nil, nil)
	descRecEvents        = prometheus.NewDesc("hvguard_controller_recovery_events_total", "Host recovery events published by this controller as the leader, by op (started, refused, paused, stopped, forced-down, attachment-removed, evacuate-requested, evacuated, evacuation-failed, unrecoverable, recovered, release-refused, released, ...).", []string{"op"}, nil)
	descRecoveries       = prometheus.NewDesc("hvguard_controller_recoveries", "Host recoveries this controller holds (as the leader), by phase.", []string{"phase"}, nil)
	descEvacInFlight     = prometheus.NewDesc("hvguard_controller_evacuations_in_flight", "Evacuations requested and not yet verified (bounded by recovery.max_evacuations).", nil, nil)
	descUnrecoverable    = prometheus.NewDesc("hvguard_controller_instances_unrecoverable", "Instances of the recoveries held that could not be recovered (reported; need a human).", nil, nil)
	descNatsUp           = prometheus.NewDesc("hvguard_controller_nats_connected", "1 when the NATS connection is up.", nil, nil)
	descNatsDenied       = prometheus.NewDesc("hvguard_controller_nats_permission_denied_total", "Operations the NATS server refused for lack of permission (each logged at ERROR naming the permission).", nil, nil)
	descInsecure         = prometheus.NewDesc("hvguard_controller_insecure_settings", "Insecure settings in the configuration (plaintext NATS allowed to a remote server, a password in a NATS URL, verify: false in clouds.yaml, a lease bucket allowing rollups); listed in the status.", nil, nil)
)

type collector struct{ d *Daemon }

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	g := func(desc *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, l...)
	}
	ctr := func(desc *prometheus.Desc, v int64, l ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), l...)
	}
	g(descNatsUp, b2f(d.nc.IsConnected()))
	ctr(descNatsDenied, int64(d.natsStats.PermissionDenied.Load()))
	g(descInsecure, float64(len(d.securityWarnings())))
	ctr(descLeaderChanges, d.m.leaderChanges.Load())
	ctr(descDeclarations, d.m.declared.Load(), "written")
	ctr(descDeclarations, d.m.declareFailed.Load(), "failed")
	ctr(descDeclarations, d.m.declareReceipt.Load(), "withdrawal-receipt")
	ctr(descDeclarations, d.m.notActing.Load(), "not-acting")
	ctr(descReleases, d.m.released.Load())
	ctr(descHolds, d.m.holds.Load())
	ctr(descHeldBack, d.m.heldBack.Load())
	ctr(descRefusals, d.m.refusals.Load())
	ctr(descRefusedDue, d.m.refusedDue.Load())
	ctr(descDecisionsDropped, d.m.decisionsDropped.Load())
	ctr(descKeysDeleted, d.m.keysDeleted.Load())
	d.m.recMu.Lock()
	for op, n := range d.m.recEvents {
		ctr(descRecEvents, n, op)
	}
	d.m.recMu.Unlock()
	ctr(descInvalidRecords, d.m.invalid.Load())
	ctr(descRegressed, d.m.regressed.Load())
	ctr(descBeacons, d.m.beacons.Load(), "accepted")
	ctr(descBeacons, d.m.beaconsBad.Load(), "refused")
	ctr(descBeacons, d.m.beaconsShed.Load(), "shed")
	ctr(descBeaconLosses, d.m.beaconLosses.Load())
	if !d.started.Load() {
		return
	}
	recs, _ := d.rec.Records()
	phases := map[recovery.Phase]int{}
	unrec := 0
	for _, r := range recs {
		phases[r.Phase]++
		unrec += len(r.Unrecoverable())
	}
	for p, n := range phases {
		g(descRecoveries, float64(n), string(p))
	}
	g(descEvacInFlight, float64(d.rec.InFlight()))
	g(descUnrecoverable, float64(unrec))
	cs := &d.cons.Stats
	ctr(descEvents, int64(cs.Applied.Load()-cs.Missing.Load()-cs.NewIncarnation.Load()), "applied")
	ctr(descEvents, int64(cs.Duplicates.Load()), "duplicate")
	ctr(descEvents, int64(cs.OldIncarnation.Load()), "old-incarnation")
	ctr(descEvents, int64(cs.Missing.Load()), "missing")
	ctr(descEvents, int64(cs.NewIncarnation.Load()), "new-incarnation")
	ctr(descEvents, int64(cs.Poison.Load()), "poison")
	for i, r := range controller.RefusedReasons {
		ctr(descEventsRefused, int64(cs.Refused[i].Load()), r)
	}
	g(descStreamLag, float64(cs.Lag.Load()))
	g(descAckPending, float64(cs.AckPending.Load()))
	stale := 0
	d.cons.View(func(f *controller.Fleet) { stale = f.StaleHosts() })
	g(descStaleHosts, float64(stale))
	if d.ir != nil {
		collectInstanceRecovery(ch, d.ir.View())
	}
	g(descLeader, b2f(d.lr.MayAct(d.now())))
	_, term := d.lr.Holder()
	g(descTerm, float64(term))
	ctx, cancel := context.WithTimeout(context.Background(), ViewTimeout)
	defer cancel()
	v, err := d.run.View(ctx)
	if err != nil {
		return // the tracker loop is busy or stuck: /healthz says which
	}
	g(descHolding, b2f(v.Holding))
	g(descSilent, float64(v.Silent))
	g(descThreshold, float64(v.Threshold))
	by := map[fencing.LeaseState]int{fencing.LeaseActive: 0, fencing.LeaseExpired: 0, fencing.LeaseReleased: 0, fencing.LeaseWithdrawn: 0}
	refused, deleted, gated := 0, 0, 0
	for _, h := range v.Hosts {
		if h.KeyDeleted {
			deleted++
			continue
		}
		by[h.State]++
		if h.Refused != "" {
			refused++
		}
		if h.RollbackGated {
			gated++
		}
	}
	g(descRollbackGated, float64(gated))
	g(descHostsDeleted, float64(deleted))
	for s, n := range by {
		g(descHosts, float64(n), string(s))
	}
	g(descRefused, float64(refused))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// handler serves /metrics, /healthz and /status.
func (d *Daemon) handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{d}, daemonkit.BuildInfoGauge("controller", Version), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc(StatusPath, d.serveStatus)
	return mux
}
