package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/daemonkit/atomicfile"
	"hvguard/fencing"
	"hvguard/libvirtx"
	"hvguard/openstack"
	"hvguard/proto"
	"hvguard/reconcile"
)

// ReconcileStatusFile is the last reconciliation's report in state_dir,
// read by `hvguard-agent --status`.
const ReconcileStatusFile = "reconcile-last.json"

// Reconcile wiring constants.
const (
	// reconcilePublishTimeout bounds one JetStream publish of a reconcile
	// event: a healthy cluster acks in milliseconds; the event is kept and
	// re-sent (same Nats-Msg-Id) rather than waited for.
	reconcilePublishTimeout = 5 * time.Second
	// reconcilePublishRetry is the pause before unpublished reconcile
	// events are tried again (NATS down, or a stream provisioned by hand
	// that does not capture the reconcile subject). The first attempt
	// waits for the lifecycle publisher's stream check (loop), so a fresh
	// start does not fail it.
	reconcilePublishRetry = 2 * time.Second
	// reconcileMaxPending bounds the reconcile events kept in memory while
	// NATS is unreachable. A reconciliation produces one per stale copy
	// (at most a host's domains); beyond this the oldest are dropped,
	// counted and logged: the domain marks and the status file keep the
	// record.
	reconcileMaxPending = 1000
)

// ReconcileStatus is what ReconcileStatusFile holds.
type ReconcileStatus struct {
	Host string `json:"host"`
	// LastSuccess is when the last OK reconciliation finished (zero: none
	// since the agent started).
	LastSuccess time.Time `json:"last_success,omitzero"`
	// Report is the last reconciliation, OK or not.
	Report reconcile.Report `json:"report"`
}

// ReconcileStats are the reconciliation's counters for the metrics.
type ReconcileStats struct {
	runs                sync.Map // "trigger/ok|failed" -> *atomic.Uint64
	Destroyed           atomic.Uint64
	WouldDestroy        atomic.Uint64
	DestroyFailed       atomic.Uint64
	LastSkipped         atomic.Int64 // domains the last run skipped (refused to judge)
	LastSuccess         atomic.Int64 // unix nanos
	ConsecutiveFailures atomic.Int64
	EventsPublished     atomic.Uint64
	EventsDropped       atomic.Uint64
}

func (s *ReconcileStats) run(trigger reconcile.Trigger, ok bool) {
	outcome := "failed"
	if ok {
		outcome = "ok"
	}
	v, _ := s.runs.LoadOrStore(string(trigger)+"/"+outcome, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// reconciler wires reconcile.Runner into the agent: the start run, the
// periodic timer (with the runner's backoff after failures), the rejoin
// hook of fencing (FenceReconciler), the status file, the metrics and the
// publication of ReconcileEvents. Runner.Run is never called on the event
// loop's or the fencing loop's goroutine.
type reconciler struct {
	host       string
	statusPath string
	log        *slog.Logger
	runner     *reconcile.Runner
	stats      ReconcileStats

	rearm    chan time.Duration // next periodic run after a run (latest wins)
	publishC chan struct{}

	// runMu serialises run: the runner serialises reconciliations, and
	// this keeps their recording (status file, timer) in the same order,
	// so an older report never overwrites a newer one.
	runMu sync.Mutex

	// signer: the host's key; the events are published signed
	// (delivery.EventMsg). Set before loop starts.
	signer fencing.Signer

	pubFailing bool // publish's failure streak (loop goroutine only): log once

	mu          sync.Mutex
	pending     []proto.ReconcileEvent
	lastSuccess time.Time
	rejoinRetry time.Time // a failed rejoin run: the next not before this
	rejoinFail  bool
}

// newReconciler builds the runner on nova, the agent's one OpenStack
// client (newNova).
func newReconciler(cfg Config, log *slog.Logger, nova *openstack.Client, doms reconcile.Domains, mode reconcile.Mode) (*reconciler, error) {
	if nova == nil {
		return nil, errors.New("reconcile: no OpenStack client")
	}
	rc := cfg.Reconcile
	log = log.With("component", "reconcile")
	// The machine's own host name: an evacuation to it under a Nova name
	// missing from nova_hosts is recognised (issue 10 item 9).
	var nodes []string
	if h, err := os.Hostname(); err == nil {
		nodes = append(nodes, h)
	}
	runner, err := reconcile.NewRunner(reconcile.RunnerConfig{
		Hosts: rc.Hosts(cfg.Host), Nodes: nodes, Mode: mode, Interval: rc.Interval.D(), Timeout: rc.Timeout.D(),
		ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState,
	}, nova, doms, log)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return &reconciler{
		host: cfg.Host, statusPath: filepath.Join(cfg.StateDir, ReconcileStatusFile), log: log, runner: runner,
		rearm: make(chan time.Duration, 1), publishC: make(chan struct{}, 1),
	}, nil
}

// run performs one reconciliation and records it: metrics, status file,
// events queued for publication, the periodic timer re-armed at RetryIn.
// It blocks for the reconciliation (bounded by reconcile.timeout): callers
// are the start-up sequence, the reconciler's own goroutine and fencing's
// hook goroutine.
func (r *reconciler) run(ctx context.Context, trigger reconcile.Trigger) reconcile.Report {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	rep := r.runner.Run(ctx, trigger)
	ok := rep.OK()
	r.stats.run(trigger, ok)
	r.stats.Destroyed.Add(uint64(rep.Destroyed))
	r.stats.WouldDestroy.Add(uint64(rep.WouldDestroy))
	r.stats.DestroyFailed.Add(uint64(rep.Failed))
	r.stats.LastSkipped.Store(int64(rep.Skipped))
	r.stats.ConsecutiveFailures.Store(int64(rep.ConsecutiveFailures))

	r.mu.Lock()
	if ok {
		r.lastSuccess = rep.FinishedAt
		r.stats.LastSuccess.Store(rep.FinishedAt.UnixNano())
	}
	st := ReconcileStatus{Host: r.host, LastSuccess: r.lastSuccess, Report: rep}
	for _, e := range rep.Events() {
		r.pending = append(r.pending, toProtoEvent(r.host, e))
	}
	if n := len(r.pending) - reconcileMaxPending; n > 0 {
		r.stats.EventsDropped.Add(uint64(n))
		r.log.Warn("reconcile events not published (NATS unreachable too long); dropped the oldest, the status file and domain marks keep the record",
			"host", r.host, "dropped", n)
		r.pending = slices.Delete(r.pending, 0, n)
	}
	r.mu.Unlock()

	if err := writeStatusAtomic(r.statusPath, st); err != nil {
		r.log.Error("writing the reconcile status file failed", "host", r.host, "path", r.statusPath, "err", err)
	}
	select {
	case <-r.rearm:
	default:
	}
	r.rearm <- rep.RetryIn
	select {
	case r.publishC <- struct{}{}:
	default:
	}
	return rep
}

// toProtoEvent is the published form of a reconcile.Event.
func toProtoEvent(host string, e reconcile.Event) proto.ReconcileEvent {
	return proto.ReconcileEvent{
		Schema: proto.SchemaVersion, Host: host, DomainUUID: e.DomainUUID, DomainName: e.DomainName,
		Outcome: proto.ReconcileOutcome(e.Outcome.String()), Reason: e.Reason.String(), Trigger: string(e.Trigger),
		MigrationID: e.Evidence.MigrationID, MigrationUUID: e.Evidence.MigrationUUID,
		MigrationStatus: e.Evidence.MigrationStatus, SourceCompute: e.Evidence.SourceCompute,
		DestCompute: e.Evidence.DestCompute, DestHost: e.Evidence.DestHost, ServerHost: e.Evidence.ServerHost,
		Error: e.Error, ObservedAt: e.ObservedAt.UTC(),
	}
}

// loop runs the periodic reconciliation and publishes events until ctx
// ends. Every run (start, rejoin, its own) re-arms its timer at the run's
// RetryIn: the period after an OK run, the backoff after a failed one.
// Events are published only once streamReady is closed (the lifecycle
// publisher has found or created the stream; nil: at once): at a fresh
// start the stream does not exist until then, and a publish before it
// would only fail and warn.
func (r *reconciler) loop(ctx context.Context, nc *nats.Conn, streamReady <-chan struct{}) {
	var js jetstream.JetStream
	if nc != nil {
		var err error
		if js, err = jetstream.New(nc); err != nil {
			r.log.Error("reconcile events cannot be published", "host", r.host, "err", err)
		}
	}
	subject, _ := proto.ReconcileSubject(r.host)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var retryPub <-chan time.Time
	streamOK := streamReady == nil
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-r.rearm:
			resetTimer(timer, d)
			continue
		case <-streamReady:
			streamReady, streamOK = nil, true
		case <-r.publishC:
		case <-retryPub:
			retryPub = nil
		case <-timer.C:
			trigger := reconcile.TriggerPeriodic
			if last, ok := r.runner.Last(); ok && !last.OK() {
				trigger = reconcile.TriggerRetry
			}
			r.run(ctx, trigger) // re-arms the timer through r.rearm
		}
		if js != nil && streamOK && !r.publish(ctx, js, subject) && retryPub == nil {
			retryPub = time.After(reconcilePublishRetry)
		}
	}
}

// publish sends the pending events in order, each with its Nats-Msg-Id
// (a re-send after a timeout is dropped by the stream's duplicate window).
// It reports whether nothing is left pending.
func (r *reconciler) publish(ctx context.Context, js jetstream.JetStream, subject string) bool {
	r.mu.Lock()
	evs := slices.Clone(r.pending)
	r.mu.Unlock()
	sent := 0
	var perr error
	for i := range evs {
		b, err := evs[i].Encode()
		if err != nil { // cannot happen for what toProtoEvent builds; never retried
			r.log.Error("reconcile event not encodable; dropped", "host", r.host, "domain_uuid", evs[i].DomainUUID, "err", err)
			sent++
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, reconcilePublishTimeout)
		_, err = js.PublishMsg(pctx, delivery.EventMsg(subject, b, r.signer), jetstream.WithMsgID(evs[i].MsgID()), jetstream.WithExpectStream(proto.StreamName))
		cancel()
		if err != nil {
			perr = err
			break
		}
		r.stats.EventsPublished.Add(1)
		sent++
	}
	r.mu.Lock()
	// run() may have appended (or dropped the oldest) meanwhile: remove
	// what was sent by identity, not by position.
	done := map[string]bool{}
	for _, e := range evs[:sent] {
		done[e.MsgID()] = true
	}
	r.pending = slices.DeleteFunc(r.pending, func(e proto.ReconcileEvent) bool { return done[e.MsgID()] })
	left := len(r.pending)
	r.mu.Unlock()
	switch {
	case perr != nil && !r.pubFailing:
		// Once per failure streak (retried every reconcilePublishRetry).
		r.pubFailing = true
		r.log.Warn("reconcile events not published yet; retrying (if the stream was provisioned by hand, it must capture "+
			proto.ReconcileWildcard+": nats stream edit "+proto.StreamName+" --subjects '"+strings.Join(proto.StreamSubjects(), ",")+"')",
			"host", r.host, "pending", left, "err", perr, "retry_in", reconcilePublishRetry)
	case perr == nil && r.pubFailing:
		r.pubFailing = false
		r.log.Info("reconcile events published again", "host", r.host)
	}
	return left == 0
}

// Reconcile is fencing's rejoin hook (FenceReconciler): a reconciliation
// before any fenced domain is resumed. Not OK → an error: the host stays
// fenced and fencing calls again; the next attempt waits for the runner's
// backoff (reconcile.NextDelay) and runs as TriggerRetry. OK → drop every
// paused domain the report does not allow to resume (destroyed, skipped as
// ambiguous, or not listed).
func (r *reconciler) Reconcile(ctx context.Context, paused []string) ([]string, error) {
	r.mu.Lock()
	trigger, wait := reconcile.TriggerRejoin, time.Duration(0)
	if r.rejoinFail {
		trigger, wait = reconcile.TriggerRetry, time.Until(r.rejoinRetry)
	}
	r.mu.Unlock()
	if wait > 0 {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rejoin reconciliation: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
	rep := r.run(ctx, trigger)
	r.mu.Lock()
	r.rejoinFail = !rep.OK()
	r.rejoinRetry = time.Now().Add(rep.RetryIn)
	r.mu.Unlock()
	if !rep.OK() {
		return nil, fmt.Errorf("rejoin reconciliation not OK (%s): %s: %s", rep.Summary(), rep.Global, rep.GlobalDetail)
	}
	var drop []string
	for _, u := range paused {
		if !rep.MayResume(u) {
			drop = append(drop, u)
		}
	}
	return drop, nil
}

// Unreconciled lists the local stale copies (Destroy decisions of the last
// reconciliation) that still run, or an error when the last reconciliation
// was not OK or there is none.
func (r *reconciler) Unreconciled(context.Context) ([]string, error) {
	rep, ok := r.runner.Last()
	if !ok {
		return nil, errors.New("no reconciliation has run yet")
	}
	return unreconciled(rep)
}

func unreconciled(rep reconcile.Report) ([]string, error) {
	if !rep.OK() {
		return nil, fmt.Errorf("the last reconciliation was not OK: %s: %s", rep.Global, rep.GlobalDetail)
	}
	var out []string
	for _, d := range rep.Results {
		if d.Decision == reconcile.DecisionDestroy && d.Outcome != reconcile.OutcomeDestroyed && d.Outcome != reconcile.OutcomeAlreadyOff {
			out = append(out, d.UUID)
		}
	}
	return out, nil
}

// unfenceReconciler answers `hvguard-agent --unfence` from a fresh
// report-mode reconciliation in the CLI's own process.
type unfenceReconciler struct{ r *reconciler }

func (u unfenceReconciler) Reconcile(ctx context.Context, paused []string) ([]string, error) {
	return u.r.Reconcile(ctx, paused)
}

func (u unfenceReconciler) Unreconciled(ctx context.Context) ([]string, error) {
	rep := u.r.runner.Run(ctx, reconcile.TriggerStart)
	return unreconciled(rep)
}

// NewUnfenceReconciler is the reconciliation check for `hvguard-agent
// --unfence`: with reconcile.enabled it connects to libvirt and, on
// Unreconciled, runs a report-mode reconciliation (nothing is destroyed or
// marked; the running agent does that) and lists the stale copies still
// running. Without reconcile.enabled it returns nil (no check). close
// releases the libvirt connection.
func NewUnfenceReconciler(ctx context.Context, cfg Config, log *slog.Logger) (rec FenceReconciler, closeFn func(), err error) {
	if !cfg.Reconcile.Enabled {
		return nil, func() {}, nil
	}
	lc := libvirtx.DefaultConfig(cfg.Libvirt.URI)
	lc.ConnectTimeout = cfg.Libvirt.ConnectTimeout.D()
	lc.CallTimeout = cfg.Libvirt.CallTimeout.D()
	lv, err := libvirtx.Dial(ctx, lc, log)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile check: libvirt %s: %w", cfg.Libvirt.URI, err)
	}
	go func() { // nobody else reads this connection's events
		for range lv.Events() {
		}
	}()
	nova, err := newNova(cfg, log)
	if err != nil {
		lv.Close()
		return nil, nil, err
	}
	r, err := newReconciler(cfg, log, nova, lv, reconcile.ModeReport)
	if err != nil {
		lv.Close()
		return nil, nil, err
	}
	return unfenceReconciler{r}, func() { lv.Close() }, nil
}

// writeStatusAtomic writes v as indented JSON with atomicfile.Write:
// `--status` reads the old or the new file, never a torn one.
func writeStatusAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return atomicfile.Write(path, append(b, '\n'), 0o600)
}

// ReadReconcileStatus reads state_dir/reconcile-last.json.
func ReadReconcileStatus(stateDir string) (ReconcileStatus, error) {
	var st ReconcileStatus
	b, err := os.ReadFile(filepath.Join(stateDir, ReconcileStatusFile))
	if err != nil {
		return st, fmt.Errorf("reconcile status: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("reconcile status %s: %w", filepath.Join(stateDir, ReconcileStatusFile), err)
	}
	return st, nil
}
