package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"

	"hvguard/agent/delivery"
	"hvguard/daemonkit"
	"hvguard/daemonkit/atomicfile"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/fencing/watchdog"
	"hvguard/libvirtx"
	"hvguard/proto"
	"hvguard/reconcile"
)

// Version is set at build time (-ldflags -X hvguard/agent.Version=...).
var Version = "dev"

// EventLoopStale is how old the libvirt event loop's heartbeat may be before
// the agent stops feeding systemd's watchdog: the loop ticks every second, so
// 10 s without a tick means it is wedged (a callback blocked) and no event
// can arrive — a restart is the right remedy.
const EventLoopStale = 10 * time.Second

// Options are the parts of a daemon that are not configuration: the demo and
// the tests use them to plug in their own pieces.
type Options struct {
	// WrapHypervisor, if set, wraps the libvirt connection (the demo uses
	// it to delay events like a loaded libvirt does).
	WrapHypervisor func(Hypervisor) Hypervisor
	// OnReport is called after each event is durably appended.
	OnReport func(ev proto.LifecycleEvent)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Ready is closed once the daemon is ready (libvirt connected, NATS
	// connected or degraded). The event loop's first domain listing may
	// still be in flight then (READY does not wait for it): tests that act
	// on domains right after Ready wait for OnResync too.
	Ready chan<- struct{}
	// OnResync is called on the event loop after each full domain listing
	// has been applied (the first one at start), with the number of
	// domains listed. hvguard_domain_resyncs_total counts the same.
	OnResync func(domains int)

	// Fencing (fence.enabled; see fence.go). ResetHost resets the host;
	// nil means SysrqReset (tests inject a recorder: never reset a test
	// machine). Reconciler is the rejoin reconciliation hook (issue 4);
	// nil means "reconciled, drop nothing". OpenWatchdog opens the
	// hardware watchdog device (nil: watchdog.OpenLinux). OnFenceTransition
	// is called with every fence-state transition (tests).
	ResetHost         func() error
	Reconciler        FenceReconciler
	OpenWatchdog      func(path string) (watchdog.Device, error)
	OnFenceTransition func(fencing.Transition)
	// WrapFenceHypervisor, if set, wraps what fencing lists, pauses,
	// destroys and resumes (tests on a shared libvirtd restrict fencing to
	// their own domains with it; production fences every domain).
	WrapFenceHypervisor func(FenceHypervisor) FenceHypervisor
}

// Daemon is a running agent.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	opts   Options
	notify *Notifier
	lv     *libvirtx.Conn
	nc     *nats.Conn
	outbox *delivery.Outbox
	pub    *delivery.Publisher
	// natsStats counts the NATS connection's permission violations.
	natsStats delivery.ConnStats
	warnings  []string // cfg.SecurityWarnings()
	loop      *Loop
	fence     *fencer     // nil unless fence.enabled
	rec       *reconciler // nil unless reconcile.enabled
	// fenceStopped: the stop path ran; ready: READY was sent.
	fenceStopped, ready bool
	// ctx is Run's context (its cause: see failure).
	ctx context.Context
	// started: when Run was called (status).
	started time.Time
}

// eventSigner returns the host key that signs the agent's lifecycle and
// reconcile events (docs/events.md, "Signatures"; a controller with
// signing required refuses unsigned ones): the fencer's key or, with
// fencing off, fence.signing's key when its mode is optional or required;
// the zero Signer (unsigned events) with signing off.
func (d *Daemon) eventSigner() (fencing.Signer, error) {
	signer := fencing.Signer{}
	if d.fence != nil {
		signer = d.fence.signer
	} else {
		_, s, serr := d.cfg.Fence.Signing.load(d.cfg.Host)
		if serr != nil {
			return signer, fmt.Errorf("%s %v: %s", serr.field, serr.val, serr.why)
		}
		signer = s
	}
	if signer.Key != nil {
		d.log.Info("events signed with the host key", "key", signer.ID)
	} else {
		d.log.Warn("events are NOT signed (fence.signing.mode: off): a controller with signing required refuses them (docs/security.md)")
	}
	return signer, nil
}

// Run starts the agent and blocks until ctx is cancelled (SIGTERM), then
// shuts down gracefully: with fencing on, the lease is withdrawn first (or
// the host fenced: docs/fencing.md, orderly stop), then the loop stops, the
// outbox is flushed to NATS within shutdown_timeout, and connections are
// closed. What could not be sent stays in the outbox and is sent at the
// next start.
//
// Start order: the lease and fence part comes before anything that can
// block or fail for long — NATS is dialled (never waited for), fencing
// starts (durable state, lease record, watchdog, the fencing loop), and
// only then the outbox is opened (a corrupt state.json fails here), libvirt
// connected (retried until it answers), the start reconciliation run (up to
// reconcile.timeout) and NATS waited for. A start step that fails after
// fencing started takes the same stop path (withdrawal "start-failed: …",
// or a fence).
func Run(ctx context.Context, cfg Config, log *slog.Logger, opts Options) (err error) {
	// fail ends the agent from inside (fencing: a watchdog that cannot be
	// armed late); context.Cause(ctx) says why.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	d := &Daemon{cfg: cfg, log: log, opts: opts, notify: NewNotifier(log), ctx: ctx, started: time.Now()}
	defer func() {
		// Runs last: a failure from inside is the error, not the start
		// step it interrupted.
		if f := d.failure(); f != nil && !errors.Is(err, f) {
			if err == nil {
				err = f
			} else {
				err = fmt.Errorf("%w (it interrupted: %v)", f, err)
			}
		}
	}()
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	// One agent per state_dir, checked before anything shared is touched:
	// a second agent that started fencing and then failed would withdraw
	// (or fence) the lease of the host whose agent runs.
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	// Sole writer of state_dir now: temporary files of a write that a
	// crash cut short are never read; remove them (logged).
	if removed, err := atomicfile.RemoveTemps(cfg.StateDir); len(removed) > 0 || err != nil {
		d.log.Info("removed temporary files of an interrupted write", "state_dir", cfg.StateDir, "files", removed, "err", err)
	}
	d.warnings = cfg.SecurityWarnings()
	daemonkit.LogWarnings(log, d.warnings)
	d.notify.Status("connecting to NATS")
	if err := d.dialNATS(); err != nil {
		return err
	}
	defer d.nc.Close()

	// Fencing first. Libvirt and the reconciliation hook are plugged in
	// once they exist: until then a fence cannot complete (it escalates)
	// and a rejoin waits (the host stays fenced).
	fenceHVLate := &lateHV{}
	var recLate *lateReconciler
	fenceDone := make(chan struct{})
	close(fenceDone)
	if cfg.Fence.Enabled {
		d.notify.Status("starting fencing")
		fopts := opts
		if cfg.Reconcile.Enabled && opts.Reconciler == nil {
			recLate = &lateReconciler{}
			fopts.Reconciler = recLate
		}
		if d.fence, err = newFencer(ctx, cfg, log, fenceHVLate, d.nc, fopts); err != nil {
			return fmt.Errorf("fencing: %w", err)
		}
		d.fence.fail = fail
		// The fencing loop stops last, after the stop path, the event loop
		// and the flush: fencing must outlive everything else in the
		// process.
		fenceCtx, stopFence := context.WithCancel(context.Background())
		fenceDone = make(chan struct{})
		go func() { defer close(fenceDone); d.fence.run(fenceCtx) }()
		defer func() { d.stopFencing(err); stopFence(); <-fenceDone; d.fence.shutdown() }()
		stopPeers, err := d.fence.servePeers()
		if err != nil {
			return err
		}
		defer stopPeers()
	}

	d.notify.Status("opening outbox")
	ob, err := delivery.OpenOutbox(filepath.Join(cfg.StateDir, "outbox"), delivery.OutboxConfig{
		Host:      cfg.Host,
		MaxBytes:  cfg.Outbox.MaxBytes,
		MaxEvents: cfg.Outbox.MaxEvents,
	}, log)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	d.outbox = ob
	defer func() {
		if cerr := ob.Close(); cerr != nil {
			err = multierror.Append(err, fmt.Errorf("close outbox: %w", cerr)).ErrorOrNil()
		}
	}()

	d.notify.Status("connecting to libvirt " + cfg.Libvirt.URI)
	if err := d.dialLibvirt(ctx); err != nil {
		return err
	}
	defer d.lv.Close()
	// Runs before libvirt is closed (defers run last-in first-out): a
	// fence at stop still reaches libvirt. A no-op once the stop ran.
	defer func() { d.stopFencing(err) }()
	fenceHVLate.set(d.lv)

	// One OpenStack client for every feature that asks Nova (nil when
	// none does): built here, no network; it authenticates on first use.
	nova, err := newNova(cfg, log)
	if err != nil {
		return err
	}
	if cfg.Classification.Enabled && !cfg.Reconcile.Enabled {
		// Log in now, off the start path (the start reconciliation does it
		// when reconcile is on): the first classified stop then waits for
		// Nova's answer only, not for keystone too.
		go func() {
			if err := nova.Authenticate(ctx); err != nil {
				log.Warn("OpenStack login at start failed; classification retries on its first query", "error", err.Error())
			}
		}()
	}
	if cfg.Reconcile.Enabled {
		// Rejoin reconciliation with Nova (issue 4) right after libvirt,
		// before the event loop acts on domains. Its outcome never stops
		// the start: a failed run is retried with backoff by d.rec.loop,
		// and fencing keeps a fenced host fenced (its rejoin hook answers
		// "not ready" until it is plugged in below).
		d.notify.Status("reconciling with Nova")
		if d.rec, err = newReconciler(cfg, log, nova, d.lv, cfg.Reconcile.Mode()); err != nil {
			return err
		}
		d.rec.run(ctx, reconcile.TriggerStart)
		if opts.Reconciler == nil {
			opts.Reconciler, d.opts.Reconciler = d.rec, d.rec
		}
		if recLate != nil {
			recLate.set(d.rec)
		}
	}

	signer, err := d.eventSigner()
	if err != nil {
		return err
	}
	if d.pub, err = delivery.NewPublisher(d.nc, d.outbox, delivery.PublisherConfig{
		CreateStream: d.cfg.NATS.CreateStream, Signer: signer,
	}, d.log); err != nil {
		return err
	}

	if d.rec != nil {
		d.rec.signer = signer
		// Periodic runs and event publication; stopped before NATS and
		// libvirt are closed.
		recCtx, stopRec := context.WithCancel(context.Background())
		recDone := make(chan struct{})
		go func() { defer close(recDone); d.rec.loop(recCtx, d.nc, d.pub.StreamReady()) }()
		defer func() { stopRec(); <-recDone }()
	}

	var hv Hypervisor = d.lv
	if opts.WrapHypervisor != nil {
		hv = opts.WrapHypervisor(hv)
	}
	if d.fence != nil {
		hv = fenceHV{Hypervisor: hv, f: d.fence}
	}
	var cls *ClassifyConfig
	if cfg.Classification.Enabled {
		// Nova-aware stop classification (issue 6) on the shared client:
		// Nova is asked only when a stop's window ends.
		cls = &ClassifyConfig{Core: cfg.Classification.Core(), Nova: nova, NovaHost: cfg.Classification.Host(cfg.Host)}
	}
	d.loop, err = NewLoop(LoopConfig{
		Host:             cfg.Host,
		Lifecycle:        cfg.Lifecycle.core(),
		CheckConcurrency: cfg.Lifecycle.CheckConcurrency,
		KnownPath:        filepath.Join(cfg.StateDir, "domains.json"),
		Classify:         cls,
	}, hv, ob, log, opts.Now)
	if err != nil {
		return fmt.Errorf("lifecycle: %w", err)
	}
	d.loop.HeartbeatEvery = d.notify.WatchdogPeriod()
	d.loop.Heartbeat = d.heartbeat
	if opts.OnReport != nil {
		d.loop.OnReport = opts.OnReport
	}
	d.loop.OnResync = opts.OnResync
	if d.fence != nil {
		// A domain that starts (or resumes) is fenced at once while fenced.
		onReport := d.loop.OnReport
		d.loop.OnReport = func(ev proto.LifecycleEvent) {
			switch ev.Transition {
			case proto.TransitionStarted, proto.TransitionResumed, proto.TransitionRebooted:
				d.fence.relist()
			}
			if onReport != nil {
				onReport(ev)
			}
		}
	}

	defer d.serveStatus()()
	if cfg.Metrics.Listen != "" {
		stop, err := d.serveMetrics()
		if err != nil {
			return err
		}
		defer stop()
	}

	pubCtx, stopPub := context.WithCancel(context.Background())
	pubDone := make(chan error, 1)
	go func() { pubDone <- d.pub.Run(pubCtx) }()

	loopCtx, stopLoop := context.WithCancel(ctx)
	defer stopLoop()
	loopDone := make(chan error, 1)
	go func() { loopDone <- d.loop.Run(loopCtx) }()

	d.waitReady(ctx)

	var result *multierror.Error
	select {
	case <-ctx.Done():
		if cause := d.failure(); cause != nil {
			result = multierror.Append(result, cause)
		}
	case lerr := <-loopDone:
		result = multierror.Append(result, fmt.Errorf("event loop: %w", lerr))
		loopDone = nil
	}
	d.notify.Stopping()
	// The lease first (withdraw, or fence), while the fencing loop, libvirt
	// and NATS all run: the drain and the flush below may take
	// shutdown_timeout, and nothing may lapse into a declaration meanwhile.
	d.stopFencing(result.ErrorOrNil())
	log.Info("shutting down: flushing outbox", "timeout", cfg.ShutdownTimeout.D())
	stopLoop()
	if loopDone != nil {
		if lerr := <-loopDone; lerr != nil {
			result = multierror.Append(result, lerr)
		}
	}
	if serr := ob.Sync(); serr != nil {
		result = multierror.Append(result, fmt.Errorf("outbox sync: %w", serr))
	}
	fctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.D())
	if ferr := d.pub.Flush(fctx); ferr != nil {
		log.Warn("outbox not fully flushed; the rest is sent at next start", "err", ferr)
	}
	cancel()
	stopPub()
	<-pubDone
	log.Info("stopped")
	return result.ErrorOrNil()
}

// dialLibvirt connects, retrying with backoff until ctx ends: at boot
// libvirtd may start after the agent.
func (d *Daemon) dialLibvirt(ctx context.Context) error {
	lc := libvirtx.DefaultConfig(d.cfg.Libvirt.URI)
	lc.KeepAliveInterval = d.cfg.Libvirt.KeepAliveInterval.D()
	lc.KeepAliveCount = d.cfg.Libvirt.KeepAliveCount
	lc.ConnectTimeout = d.cfg.Libvirt.ConnectTimeout.D()
	lc.ReconnectMin = d.cfg.Libvirt.ReconnectMin.D()
	lc.ReconnectMax = d.cfg.Libvirt.ReconnectMax.D()
	lc.EventBuffer = d.cfg.Libvirt.EventBuffer
	lc.CallTimeout = d.cfg.Libvirt.CallTimeout.D()
	backoff := lc.ReconnectMin
	for {
		conn, err := libvirtx.Dial(ctx, lc, d.log)
		if err == nil {
			d.lv = conn
			return nil
		}
		d.log.Warn("libvirt not reachable yet; retrying", "uri", lc.URI, "err", err, "retry_in", backoff)
		d.notify.Status(fmt.Sprintf("waiting for libvirt %s: %v", lc.URI, err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("libvirt %s: %w (gave up: %v)", lc.URI, err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, lc.ReconnectMax)
	}
}

// stopFencing takes the stop path of docs/fencing.md once (later calls
// are no-ops): withdraw the lease with a reason, or fence. cause nil means
// an orderly stop; otherwise the reason names the error ("start-failed"
// before READY).
func (d *Daemon) stopFencing(cause error) {
	if d.fence == nil || d.fenceStopped {
		return
	}
	d.fenceStopped = true
	if f := d.failure(); f != nil {
		cause = f // the real reason, not the start step it interrupted
	}
	reason := stopReasonOrderly
	if cause != nil {
		what := "start-failed: "
		if d.ready {
			what = "failed: "
		}
		reason = what + cause.Error()
		if len(reason) > maxStopReason {
			reason = reason[:maxStopReason]
		}
	}
	d.notify.Status("stopping: withdrawing the lease")
	o := d.fence.stop(reason)
	d.log.Info("fencing stopped", "outcome", o.String(), "reason", reason)
}

// failure is the error that ended the agent from inside (nil: none, or a
// signal).
func (d *Daemon) failure() error {
	if d.ctx == nil || d.ctx.Err() == nil {
		return nil
	}
	if c := context.Cause(d.ctx); c != nil && !errors.Is(c, context.Canceled) && !errors.Is(c, context.DeadlineExceeded) {
		return c
	}
	return nil
}

func (d *Daemon) dialNATS() error {
	auth, err := d.cfg.NATS.Options()
	if err != nil {
		return err
	}
	opts := append(delivery.ConnOptions(d.log, &d.natsStats), auth...)
	opts = append(opts, nats.Name("hvguard-agent "+d.cfg.Host), nats.CustomInboxPrefix(proto.AgentInboxPrefix(d.cfg.Host)))
	nc, err := nats.Connect(d.cfg.NATS.URL(), opts...)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	d.nc = nc
	return nil
}

// waitReady sends READY=1 once NATS is connected, or after
// nats.ready_timeout in degraded mode (events are kept in the outbox).
func (d *Daemon) waitReady(ctx context.Context) {
	deadline := time.NewTimer(d.cfg.NATS.ReadyTimeout.D())
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !d.nc.IsConnected() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			msg := "degraded: libvirt connected, NATS unreachable; events kept in the outbox"
			d.log.Warn("ready in degraded mode", "reason", msg)
			d.notify.Ready(msg)
			d.markReady()
			return
		case <-tick.C:
		}
	}
	d.log.Info("ready", "host", d.cfg.Host, "libvirt", d.cfg.Libvirt.URI, "nats", d.nc.ConnectedUrlRedacted())
	d.notify.Ready("ready: " + d.summary())
	d.markReady()
}

func (d *Daemon) markReady() {
	d.ready = true
	if d.opts.Ready != nil {
		close(d.opts.Ready)
		d.opts.Ready = nil
	}
}

// heartbeat runs on the event loop goroutine. It feeds systemd's watchdog
// only when the libvirt event loop is ticking too: both must make progress
// for the agent to see and report events.
func (d *Daemon) heartbeat() {
	st := d.lv.Status()
	if age := time.Since(st.EventLoopTick); age > EventLoopStale {
		d.log.Error("libvirt event loop is stuck; withholding the watchdog ping", "age", age)
		d.notify.Status(fmt.Sprintf("libvirt event loop stuck for %s", age.Round(time.Second)))
		return
	}
	if d.fence != nil {
		// With fencing on, WATCHDOG=1 proves that BOTH loops progress.
		if ok, age := d.fence.healthy(); !ok {
			d.log.Error("fencing loop is stuck; withholding the watchdog ping", "age", age)
			d.notify.Status(fmt.Sprintf("fencing loop stuck for %s", age.Round(time.Second)))
			return
		}
	}
	d.notify.WatchdogPing()
	d.notify.Status(d.summary())
}

func (d *Daemon) summary() string {
	lvs := "libvirt up"
	if !d.lv.Status().Connected {
		lvs = "libvirt DOWN"
	}
	ns := "nats up"
	if !d.nc.IsConnected() {
		ns = "nats DOWN"
	}
	fs := ""
	if d.fence != nil {
		if st := d.fence.stats.State.Load(); st != nil {
			fs = ", fence=" + *st
		}
	}
	return fmt.Sprintf("%s, %s, outbox=%d, %s%s", lvs, ns, d.outbox.Stats().Depth, d.loop.stats, fs)
}

func (d *Daemon) serveMetrics() (func(), error) {
	ln, err := net.Listen("tcp", d.cfg.Metrics.Listen)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen %q: %w", d.cfg.Metrics.Listen, err)
	}
	return serveHTTP(ln, d.metricsHandler(), 5*time.Second, d.log, "metrics"), nil
}

// serveHTTP serves an endpoint (shared with the controller).
var serveHTTP = daemonkit.ServeHTTP

// StateDirLockFile is the file in state_dir an agent holds an exclusive
// flock(2) on while it runs (the kernel drops it when the process dies).
const StateDirLockFile = "agent.lock"

// lockStateDir takes the state_dir lock, or says which process holds it.
func lockStateDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, StateDirLockFile)
	f, err := delivery.LockFile(path)
	if errors.Is(err, delivery.ErrLocked) {
		holder, _ := os.ReadFile(path)
		return nil, fmt.Errorf("state_dir %s is in use by another hvguard-agent (pid %s): one agent per host and state_dir; nothing was touched",
			dir, strings.TrimSpace(string(holder)))
	}
	if err != nil {
		return nil, fmt.Errorf("state_dir lock: %w", err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

// securityWarnings are the insecure settings: the configuration's and,
// once the lease bucket is open, natslease.StreamWarning if it applies.
func (d *Daemon) securityWarnings() []string {
	if d.fence == nil || !d.fence.store.insecureStream.Load() {
		return d.warnings
	}
	return append(append([]string(nil), d.warnings...), natslease.StreamWarning)
}
