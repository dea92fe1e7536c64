package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/daemonkit"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// Daemon constants.
const (
	// LoopStale is how long the leader lock's loop may go without progress
	// before the controller stops feeding systemd's watchdog: the loop goes
	// round at least every renew_interval/2 (1.25 s by default), or every
	// second while its watch is being re-established, so 10 s without
	// progress means it is wedged and a restart (which resigns nothing:
	// the lock lapses after its TTL) is the remedy.
	LoopStale = 10 * time.Second
	// BucketRetryMax bounds the pause between attempts to open the lease
	// bucket while NATS (or the bucket) is unavailable at start. Each
	// attempt (bounded by BucketAttemptTimeout) feeds systemd's watchdog:
	// with both bounds one ping comes at least every 10 s, well within
	// the unit's WatchdogSec (30 s), so a controller waiting for NATS is
	// not restarted while it retries, and one wedged in that loop is.
	BucketRetryMax = 5 * time.Second
	// BucketAttemptTimeout bounds one attempt to open the bucket.
	BucketAttemptTimeout = 5 * time.Second
	// ViewTimeout bounds a status or metrics request for the tracker's
	// view (answered by the tracker's loop between two ticks).
	ViewTimeout = 2 * time.Second
)

// Options are the parts of a daemon that are not configuration (tests).
type Options struct {
	// Now is the clock; daemonkit.BootNow (CLOCK_BOOTTIME) when nil.
	Now func() time.Time
	// Ready is closed once the daemon is ready: NATS connected and both
	// watches (leader lock, lease bucket) synced.
	Ready chan<- struct{}
	// OnDecision is called with every tracker decision after it was
	// performed (or not: controller.ErrNotActing).
	OnDecision func(controller.Decision, error)
	// OnLeaderChange is called on every election and deposition.
	OnLeaderChange func(controller.LeaderOp)
	// Listening, if set, receives the status endpoint's address once it
	// listens (tests listen on port 0).
	Listening func(addr string)
	// RecoveryCloud, if set, replaces the OpenStack adapter host recovery
	// calls (tests); otherwise modes evacuate and masakari build it from
	// the openstack section.
	RecoveryCloud controller.RecoveryCloud
	// OnRecoveryEvent is called with every host recovery event published.
	OnRecoveryEvent func(controller.RecoveryEvent)
}

// Daemon is a running controller.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	opts   Options
	now    func() time.Time
	notify *daemonkit.Notifier
	nc     *nats.Conn
	// cnc is the connection to the controllers' account (nats.control);
	// nc itself when nats.control is unset.
	cnc  *nats.Conn
	lr   *controller.LeaderRunner
	run  *controller.Runner
	rec  *controller.RecoveryRunner
	cons *controller.Consumer
	ir   *controller.InstanceRecoveryRunner // nil: instance_recovery.mode off
	// irReports: instance recovery events waiting to be published.
	irReports chan controller.InstanceRecoveryEvent
	start     time.Time

	decisions chan outEvent

	started                     atomic.Bool // lr and run are set
	leaderSynced, trackerSynced atomic.Bool
	lastTick                    atomic.Int64 // Runner heartbeat, UnixNano on now()
	lastPing                    time.Time    // Runner goroutine only
	stuckSaid                   bool         // Runner goroutine only
	readyOnce                   sync.Once    // READY=1 sent (synced, or degraded)
	syncedOnce                  sync.Once    // both watches synced
	m                           counters
	natsStats                   delivery.ConnStats
	warnings                    []string // cfg.SecurityWarnings()
	// insecureStream: the lease bucket's stream allows rollups or direct gets
	// (natslease.StreamWarning), checked once the bucket is open.
	insecureStream atomic.Bool
	// beaconSaid: when a refused beacon was last logged (UnixNano).
	beaconSaid atomic.Int64
}

// beaconLogEvery spaces the log lines of refused beacons (each is
// counted: hvguard_controller_beacons_total{result="refused"}).
const beaconLogEvery = 10 * time.Second

// beacon counts an agent's beacon (controller.Runner.OnBeacon) and logs a
// refused one, at most once every beaconLogEvery.
func (d *Daemon) beacon(host string, b fencing.Beacon, err error) {
	if err == nil {
		d.m.beacons.Add(1)
		return
	}
	if errors.Is(err, controller.ErrBeaconShed) {
		d.m.beaconsShed.Add(1) // the runner says so itself, once a while
		return
	}
	d.m.beaconsBad.Add(1)
	now := d.now().UnixNano()
	if last := d.beaconSaid.Load(); now-last >= int64(beaconLogEvery) && d.beaconSaid.CompareAndSwap(last, now) {
		d.log.Warn("agent beacon refused", "host", host, "revision", b.Revision, "err", err)
	}
}

// securityWarnings are the insecure settings: the configuration's and,
// once the bucket is open, natslease.StreamWarning if it applies.
func (d *Daemon) securityWarnings() []string {
	if !d.insecureStream.Load() {
		return d.warnings
	}
	return append(append([]string(nil), d.warnings...), natslease.StreamWarning)
}

// Run starts the controller and blocks until ctx is cancelled (SIGTERM);
// then it stops the tracker (no write in flight), resigns the leader lock
// (a standby takes over after TakeoverAfter(act_margin), not a whole TTL)
// and closes NATS.
func Run(ctx context.Context, cfg Config, log *slog.Logger, opts Options) error {
	d := &Daemon{cfg: cfg, log: log, opts: opts, now: opts.Now, notify: daemonkit.NewNotifier(log)}
	if d.now == nil {
		d.now = daemonkit.BootNow
	}
	d.start = d.now()
	d.notify.Status("connecting to NATS")
	d.warnings = cfg.SecurityWarnings()
	daemonkit.LogWarnings(log, d.warnings)
	natsOpts, err := cfg.NATS.Options()
	if err != nil {
		return err
	}
	nc, err := delivery.Connect(cfg.NATS.URL(), "hvguard-controller "+cfg.ID, log, &d.natsStats, natsOpts...)
	if err != nil {
		return err
	}
	d.nc, d.cnc = nc, nc
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	cjs := js
	if cfg.NATS.Control.Set() {
		// The controllers' own account (docs/security.md, "The
		// controllers' account").
		copts, err := cfg.NATS.ControlSection().OptionsFor("nats.control")
		if err != nil {
			return err
		}
		cnc, err := delivery.Connect(cfg.NATS.URL(), "hvguard-controller "+cfg.ID+" (control)", log, &d.natsStats, copts...)
		if err != nil {
			return fmt.Errorf("nats.control: %w", err)
		}
		d.cnc = cnc
		defer cnc.Close()
		if cjs, err = jetstream.New(cnc); err != nil {
			return fmt.Errorf("jetstream (nats.control): %w", err)
		}
	}

	if cfg.Metrics.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			return fmt.Errorf("metrics.listen %q: %w", cfg.Metrics.Listen, err)
		}
		if opts.Listening != nil {
			opts.Listening(ln.Addr().String())
		}
		defer daemonkit.ServeHTTP(ln, d.handler(), 5*time.Second, log, "status and metrics endpoint")()
	}

	readyCtx, stopReady := context.WithCancel(ctx)
	defer stopReady()
	go d.degradedAfter(readyCtx, cfg.NATS.ReadyTimeout.D())

	kv, cb, err := d.openBucket(ctx, js, cjs)
	if err != nil {
		return nil // ctx ended while waiting: a clean stop
	}
	d.insecureStream.Store(natslease.WarnStream(ctx, js, log))
	recCore, err := recovery.New(cfg.Recovery.Core())
	if err != nil {
		return err
	}
	cloud := opts.RecoveryCloud
	if cloud == nil && cfg.Recovery.Calls() {
		os, err := cfg.NewOpenStack(log.With("component", "openstack"))
		if err != nil {
			return err
		}
		if os == nil {
			return fmt.Errorf("recovery.mode %s needs openstack.cloud", cfg.Recovery.Mode)
		}
		cloud = recoveryCloud{os}
	}
	core, err := controller.NewLeader(cfg.LeaderCore())
	if err != nil {
		return err
	}
	tracker, err := controller.NewTracker(cfg.TrackerCore())
	if err != nil {
		return err
	}
	d.lr = &controller.LeaderRunner{KV: cb.Control, Core: core, Log: log.With("component", "leader"), Now: d.now,
		Eligible: d.nc.IsConnected, // the lock is on cnc; the leases on nc
		OnChange: d.leaderChanged, OnSynced: func() { d.leaderSynced.Store(true); d.maybeReady() }}
	keys, signer, serr := cfg.Signing.Load()
	if serr != nil {
		return serr
	}
	if keys.Enabled() {
		log.Info("signed lease records", "mode", string(keys.Mode), "key", signer.ID, "host_keys", len(keys.Hosts), "controller_keys", len(keys.Controllers))
	} else {
		log.Warn("lease records are NOT signed (signing.mode: off): any holder of NATS credentials can forge a host's record (docs/security.md)")
	}
	st := &natslease.Store{KV: kv, Control: cb.Control, NC: d.nc, Signer: signer, Keys: keys}
	var enrolled []string // hosts with a key in host_keys_file
	if keys != nil {
		enrolled = slices.Sorted(maps.Keys(keys.Hosts))
	}
	// Each enrolled host's receipts stream, checked off the start's path
	// (one stream info each; created where this user may: make run's
	// single account): the hosts no stream can vouch for are named once.
	go checkReceiptStreams(ctx, js, log, enrolled)
	if err := natslease.AccountUnsound(ctx, js); err != nil {
		log.Error("withdrawal receipts: a host whose key may hide a write is not declared while this holds", "err", err)
	}
	d.run = &controller.Runner{Store: st, Tracker: tracker, Memory: cb.Memory, Log: log.With("component", "tracker"), Receipts: js,
		ReceiptsAccount: func(ctx context.Context) error { return natslease.AccountUnsound(ctx, js) },
		Now:             d.now, MayAct: d.lr.MayAct, OnDecision: d.decided, Heartbeat: d.heartbeat,
		OnSynced: func(int) { d.trackerSynced.Store(true); d.maybeReady() },
		Beacons:  d.nc, OnBeacon: d.beacon, OnBeaconsLost: func(string, []string) { d.m.beaconLosses.Add(1) },
		Signature: func() string { return fmt.Sprintf("declared by controller %s, term %d", cfg.ID, d.lr.Term()) }}

	d.rec = &controller.RecoveryRunner{KV: cb.Recovery, Leases: st, NC: d.nc, Core: recCore, Cloud: cloud, View: d.run.View,
		MayAct: d.lr.MayAct, Now: d.now, Log: log.With("component", "recovery"),
		By:      func() string { return fmt.Sprintf("controller %s, term %d", cfg.ID, d.lr.Term()) },
		OnEvent: d.recoveryEvent}
	log.Info("host recovery", "mode", cfg.Recovery.Mode, "release", cfg.Recovery.Release)

	d.decisions = make(chan outEvent, DecisionQueue)
	pubCtx, stopPub := context.WithCancel(context.Background())
	defer stopPub()
	go d.publishDecisions(pubCtx)

	// The fleet view: every controller (leader or standby) consumes the
	// event stream with its own durable consumer.
	d.cons = &controller.Consumer{JS: js, ID: cfg.ID, Keys: keys, Log: log.With("component", "events")}
	// Instance recovery (issue 14) hooks into the consumer.
	irDone := make(chan struct{})
	irCtx, stopIR := context.WithCancel(context.Background())
	if err := d.startInstanceRecovery(ctx, irCtx, cjs, irDone); err != nil {
		stopIR()
		return err
	}
	consCtx, stopCons := context.WithCancel(context.Background())
	consDone := make(chan struct{})
	go func() { defer close(consDone); _ = d.cons.Run(consCtx) }()

	d.started.Store(true)
	leaderCtx, stopLeader := context.WithCancel(context.Background())
	leaderDone := make(chan struct{})
	go func() { defer close(leaderDone); _ = d.lr.Run(leaderCtx) }()
	trackerCtx, stopTracker := context.WithCancel(context.Background())
	trackerDone := make(chan struct{})
	var trackerErr error
	go func() {
		defer close(trackerDone)
		for {
			trackerErr = d.run.Run(trackerCtx)
			if trackerCtx.Err() != nil || !errors.Is(trackerErr, controller.ErrLeaseStreamRolledBack) {
				return
			}
			// The lease stream rolled back under the watch (rollback.go):
			// the runner dropped every pin and stopped; a fresh tracker
			// lists the stream as it is now, as a restarted controller
			// would (the decision was counted: the alert fires).
			log.Error("lease stream rolled back: the lease tracker starts afresh", "err", trackerErr)
			tr, err := controller.NewTracker(cfg.TrackerCore())
			if err != nil {
				trackerErr = err
				return
			}
			d.run.Tracker = tr
		}
	}()
	recCtx, stopRec := context.WithCancel(context.Background())
	recDone := make(chan struct{})
	go func() { defer close(recDone); _ = d.rec.Run(recCtx) }()

	select {
	case <-ctx.Done():
	case <-trackerDone:
		// The tracker stopped on its own (it could not subscribe to the
		// beacons, or a fresh tracker could not be made): the daemon
		// stops and exits non-zero; systemd restarts it.
		log.Error("the lease tracker stopped: stopping the controller", "err", trackerErr)
	}
	d.notify.Stopping()
	log.Info("stopping: host recovery and the tracker first (no write in flight), then resigning the leader lock")
	stopRec()
	<-recDone
	stopTracker()
	<-trackerDone
	stopIR() // no record write or action in flight
	<-irDone
	stopLeader()
	<-leaderDone
	stopCons()
	<-consDone
	log.Info("stopped")
	if ctx.Err() == nil && trackerErr != nil {
		return fmt.Errorf("lease tracker: %w", trackerErr)
	}
	return nil
}

// openBucket opens (or, with nats.create_bucket, creates) the lease
// bucket on js and the controllers' buckets (controller.ControlBuckets:
// the leader lock and guard, the memory, host recovery) on cjs (the
// controllers' account), retrying until ctx ends. An existing bucket's
// configuration is never changed.
func (d *Daemon) openBucket(ctx context.Context, js, cjs jetstream.JetStream) (jetstream.KeyValue, controller.ControlBuckets, error) {
	backoff := 500 * time.Millisecond
	for {
		d.notify.WatchdogPing()
		actx, cancel := context.WithTimeout(ctx, BucketAttemptTimeout)
		kv, err := natslease.EnsureBucket(actx, js, d.cfg.NATS.CreateBucket)
		var cb controller.ControlBuckets
		if err == nil {
			cb, err = controller.EnsureControlBuckets(actx, cjs, d.cfg.NATS.CreateBucket)
		}
		cancel()
		if err == nil {
			return kv, cb, nil
		}
		if ctx.Err() != nil {
			return nil, cb, ctx.Err()
		}
		d.log.Warn("lease bucket not available yet; retrying", "err", err, "retry_in", backoff)
		d.notify.Status(fmt.Sprintf("waiting for NATS and the lease bucket: %v", err))
		select {
		case <-ctx.Done():
			return nil, cb, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, BucketRetryMax)
	}
}

// maybeReady sends READY=1 once both watches have synced.
func (d *Daemon) maybeReady() {
	if !d.leaderSynced.Load() || !d.trackerSynced.Load() {
		return
	}
	d.syncedOnce.Do(func() {
		d.log.Info("ready", "id", d.cfg.ID, "nats", d.nc.ConnectedUrlRedacted())
		sent := false
		d.readyOnce.Do(func() { sent = true; d.notify.Ready("ready: watching the lease bucket") })
		if !sent { // READY=1 went out degraded; say it is over
			d.notify.Status("ready: watching the lease bucket (no longer degraded)")
		}
		if d.opts.Ready != nil {
			close(d.opts.Ready)
		}
	})
}

// degradedAfter reports READY in a degraded mode when the watches have not
// synced within timeout (NATS or the bucket unavailable): the unit is up,
// says why in STATUS=, and keeps retrying; the controller acts on nothing
// until it leads.
func (d *Daemon) degradedAfter(ctx context.Context, timeout time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(timeout):
	}
	d.readyOnce.Do(func() {
		msg := "degraded: NATS or the lease bucket unavailable; retrying, acting on nothing"
		d.log.Warn("ready in degraded mode", "reason", msg)
		d.notify.Ready(msg)
	})
}

// heartbeat runs on the tracker's goroutine every tick (250 ms). It feeds
// systemd's watchdog only while the leader lock's loop progresses too:
// both must run for the controller to lead, or to take over.
func (d *Daemon) heartbeat() {
	now := d.now()
	d.lastTick.Store(now.UnixNano())
	if age := now.Sub(d.lr.Alive()); age > LoopStale {
		if !d.stuckSaid {
			d.stuckSaid = true
			d.log.Error("leader lock loop is stuck; withholding the watchdog ping", "age", age)
		}
		d.notify.Status(fmt.Sprintf("leader lock loop stuck for %s", age.Round(time.Second)))
		return
	}
	d.stuckSaid = false
	if now.Sub(d.lastPing) < d.notify.WatchdogPeriod() {
		return
	}
	d.lastPing = now
	d.notify.WatchdogPing()
	d.notify.Status(d.summary(now))
}

// summary is the one-line STATUS= (tracker goroutine only).
func (d *Daemon) summary(now time.Time) string {
	role := "standby"
	if d.lr.MayAct(now) {
		role = fmt.Sprintf("LEADER term %d", d.lr.Term())
	} else if h, t := d.lr.Holder(); h != "" {
		role = fmt.Sprintf("standby (leader %s term %d)", h, t)
	}
	tr := d.run.Tracker
	hold := ""
	if tr.Holding() {
		hold = ", GUARD HOLDING"
	}
	nats := ""
	if !d.nc.IsConnected() {
		nats = ", nats DOWN"
	} else if !d.cnc.IsConnected() {
		nats = ", nats.control DOWN"
	}
	return fmt.Sprintf("%s, %d hosts%s%s", role, tr.Members(), hold, nats)
}

func (d *Daemon) leaderChanged(op controller.LeaderOp) {
	d.m.leaderChanges.Add(1)
	if d.opts.OnLeaderChange != nil {
		d.opts.OnLeaderChange(op)
	}
}

func (d *Daemon) decided(dc controller.Decision, err error) {
	d.m.count(dc, err)
	d.publishDecision(dc, err)
	if d.opts.OnDecision != nil {
		d.opts.OnDecision(dc, err)
	}
}

// DecisionQueue bounds the decision events waiting to be published: a
// core publish on a blackholed connection blocked 1.3 s (measured for the
// agents' fence events), so they are published from their own goroutine
// and dropped (counted) when it falls this far behind.
const DecisionQueue = 64

// publishDecision queues dc's event when this controller carried it out,
// or, for decisions that only say something (guard holds, refusals, …),
// when it leads: a standby decides too but acts on nothing, and its
// decisions would be duplicates.
func (d *Daemon) publishDecision(dc controller.Decision, err error) {
	if errors.Is(err, controller.ErrNotActing) {
		return
	}
	acted := dc.Op == controller.OpDeclare || dc.Op == controller.OpRelease
	if !acted && !d.lr.MayAct(d.now()) {
		return
	}
	ev := controller.NewDecisionEvent(d.cfg.ID, d.lr.Term(), dc, err, time.Now())
	d.queue(outEvent{subject: proto.ControllerDecisionSubject, op: ev.Op, host: ev.Host, encode: ev.Encode})
}

// outEvent is an event waiting to be published.
type outEvent struct {
	subject, op, host string
	encode            func() ([]byte, error)
}

// queue queues ev for publishing, or counts it dropped.
func (d *Daemon) queue(ev outEvent) {
	select {
	case d.decisions <- ev:
	default:
		d.m.decisionsDropped.Add(1)
	}
}

// recoveryEvent counts, queues for publishing and reports a host recovery
// event (the runner says them only while leading).
func (d *Daemon) recoveryEvent(e recovery.Event) {
	d.m.recoveryEvent(e.Op)
	ev := controller.NewRecoveryEvent(d.cfg.ID, d.lr.Term(), e, time.Now())
	d.queue(outEvent{subject: proto.ControllerRecoverySubject, op: e.Op, host: e.Host, encode: ev.Encode})
	if d.opts.OnRecoveryEvent != nil {
		d.opts.OnRecoveryEvent(ev)
	}
}

// publishDecisions publishes queued decision and recovery events until ctx
// ends.
func (d *Daemon) publishDecisions(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-d.decisions:
			b, err := ev.encode()
			if err == nil {
				err = d.nc.Publish(ev.subject, b)
			}
			if err != nil {
				d.m.decisionsDropped.Add(1)
				d.log.Debug("event not published", "subject", ev.subject, "op", ev.op, "host", ev.host, "err", err)
			}
		}
	}
}

// healthy reports whether both loops progress and NATS is connected.
func (d *Daemon) healthy() error {
	now := d.now()
	switch {
	case !d.started.Load():
		return errors.New("waiting for NATS and the lease bucket")
	case !d.nc.IsConnected():
		return errors.New("NATS disconnected")
	case !d.cnc.IsConnected():
		return errors.New("NATS disconnected (nats.control: the controllers' account)")
	case now.Sub(d.lr.Alive()) > LoopStale:
		return fmt.Errorf("leader lock loop stuck for %s", now.Sub(d.lr.Alive()).Round(time.Second))
	case now.Sub(time.Unix(0, d.lastTick.Load())) > LoopStale:
		return errors.New("tracker loop stuck")
	case !d.leaderSynced.Load() || !d.trackerSynced.Load():
		return errors.New("watches not synced yet")
	}
	return nil
}

// receiptStreamCheckTimeout bounds the start's check of one host's
// receipts stream (checkReceiptStreams).
const receiptStreamCheckTimeout = 5 * time.Second

// checkReceiptStreams logs, at ERROR, the enrolled hosts whose withdrawal
// receipts no stream can vouch for (natslease.StreamOfReceiptsUnsound:
// a host among them whose key may hide a write is not declared until
// its own stream is provisioned), after creating each missing one while
// this user may (the first creation that got no answer ends the
// attempts: the server refuses a publish the shipped permissions do not
// allow without answering it; an answered refusal — the older shared
// stream captures the host's subject — is that host's only).
func checkReceiptStreams(ctx context.Context, js jetstream.JetStream, log *slog.Logger, hosts []string) {
	create := true
	var unsound []string
	var why error // the first host's
	for _, h := range hosts {
		if ctx.Err() != nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, receiptStreamCheckTimeout)
		if create {
			var api *jetstream.APIError
			if _, err := natslease.EnsureWithdrawalStream(cctx, js, h); err != nil && !errors.As(err, &api) {
				create = false // no answer: a creation this user may not make
			}
		}
		if err := natslease.StreamOfReceiptsUnsound(cctx, js, h); err != nil {
			unsound = append(unsound, h)
			why = cmp.Or(why, err)
		}
		cancel()
	}
	if len(unsound) > 0 {
		log.Error("no withdrawal receipts stream can vouch for the receipts of these enrolled hosts: a host among them whose key may hide a write is not declared until its own stream is provisioned (docs/operations.md, \"NATS provisioning\")", "hosts", unsound, "why", why)
		return
	}
	log.Info("withdrawal receipts: every enrolled host has its own stream", "hosts", len(hosts))
}
