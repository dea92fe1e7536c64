package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/daemonkit"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
	"hvguard/fencing/watchdog"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// Fencing loop constants.
const (
	// FenceMaxTick is the longest the fencing loop sleeps: it stamps its
	// progress (systemd's WATCHDOG=1) and feeds the hardware watchdog on
	// every iteration, so it must iterate well inside watchdog_timeout/4
	// (2.5 s at the default) even when the Agent has no deadline sooner.
	FenceMaxTick = 250 * time.Millisecond
	// FenceLoopStale is how old the fencing loop's progress stamp may be
	// before the agent withholds systemd's WATCHDOG=1: the loop iterates
	// every FenceMaxTick, so 10 s (as EventLoopStale) means it is wedged.
	FenceLoopStale = 10 * time.Second
	// fenceRelistBusy is how often the fencing loop lists the domains
	// itself while isolated or fenced: a domain started meanwhile (by an
	// operator, or Nova) is fenced within this time even if its start
	// event was missed.
	fenceRelistBusy = time.Second
	// fenceRelistIdle is the same while healthy: the event loop's resyncs
	// and start events keep the inventory current; this is a backstop.
	fenceRelistIdle = 30 * time.Second
	// reconcileRetry is the pause before a failed reconciliation hook is
	// run again (the agent stays fenced meanwhile).
	reconcileRetry = 2 * time.Second
	// fenceStartTimeout bounds the start-up reads of the lease (NATS may
	// be down: the agent then starts from its durable state).
	fenceStartTimeout = natsReadTimeout
	// natsReadTimeout is natslease.ReadTimeout: one read of the bucket.
	natsReadTimeout = 2 * time.Second
	// stopSlack is added to the longest stop the core can take (two
	// withdrawals of renew_timeout, then a fence of fence_deadline) before
	// the agent gives up waiting for it and leaves the watchdog armed: a
	// few loop iterations.
	stopSlack = time.Second
)

// FenceReconciler is the rejoin reconciliation hook. THIS IS WHERE THE NOVA
// RECONCILIATION PLUGS IN (issue 4: reconcile.Runner): before domains that
// hvguard paused are resumed, and before an operator's unfence, Nova is
// asked which of them were evacuated (rebuilt elsewhere) while this host
// was cut off; those must never be resumed here.
type FenceReconciler interface {
	// Reconcile returns the paused domains that must NOT be resumed. An
	// error keeps the host fenced; the hook is run again.
	Reconcile(ctx context.Context, paused []string) (drop []string, err error)
	// Unreconciled returns evacuations of this host that Nova shows and
	// that were not reconciled yet; `hvguard-agent --unfence` refuses
	// while there are any.
	Unreconciled(ctx context.Context) ([]string, error)
}

// noReconcile is the default hook until issue 4 is wired: "reconciled,
// drop nothing", and no unreconciled evacuations.
type noReconcile struct{}

func (noReconcile) Reconcile(context.Context, []string) ([]string, error) { return nil, nil }
func (noReconcile) Unreconciled(context.Context) ([]string, error)        { return nil, nil }

// lateReconciler is the rejoin hook while the real one is not built yet
// (fencing starts before libvirt and Nova): until set, Reconcile fails, so
// a fenced host stays fenced and the hook is run again (every 2 s).
type lateReconciler struct {
	r atomic.Pointer[FenceReconciler]
}

var errReconcilerNotReady = errors.New("reconciliation not ready yet (the agent is starting)")

func (l *lateReconciler) set(r FenceReconciler) { l.r.Store(&r) }

func (l *lateReconciler) Reconcile(ctx context.Context, paused []string) ([]string, error) {
	if r := l.r.Load(); r != nil {
		return (*r).Reconcile(ctx, paused)
	}
	return nil, errReconcilerNotReady
}

func (l *lateReconciler) Unreconciled(ctx context.Context) ([]string, error) {
	if r := l.r.Load(); r != nil {
		return (*r).Unreconciled(ctx)
	}
	return nil, errReconcilerNotReady
}

// lateHV is fencing's hypervisor while libvirt is not connected yet
// (fencing starts first): every call fails until set, so a fence that is
// needed meanwhile cannot complete and escalates (reset if allowed, the
// watchdog no longer fed).
type lateHV struct {
	h atomic.Pointer[FenceHypervisor]
}

var errLibvirtNotConnected = errors.New("libvirt not connected yet (the agent is starting)")

func (l *lateHV) set(h FenceHypervisor) { l.h.Store(&h) }

func (l *lateHV) get() (FenceHypervisor, error) {
	if h := l.h.Load(); h != nil {
		return *h, nil
	}
	return nil, errLibvirtNotConnected
}

func (l *lateHV) ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error) {
	h, err := l.get()
	if err != nil {
		return nil, err
	}
	return h.ListDomains(ctx)
}

func (l *lateHV) State(ctx context.Context, uuid string) (lifecycle.State, error) {
	h, err := l.get()
	if err != nil {
		return lifecycle.StateUnknown, err
	}
	return h.State(ctx, uuid)
}

func (l *lateHV) Suspend(ctx context.Context, uuid string) error {
	h, err := l.get()
	if err != nil {
		return err
	}
	return h.Suspend(ctx, uuid)
}

func (l *lateHV) Resume(ctx context.Context, uuid string) error {
	h, err := l.get()
	if err != nil {
		return err
	}
	return h.Resume(ctx, uuid)
}

func (l *lateHV) Destroy(ctx context.Context, uuid string) error {
	h, err := l.get()
	if err != nil {
		return err
	}
	return h.Destroy(ctx, uuid)
}

// FenceHypervisor is what fencing needs from libvirt (*libvirtx.Conn).
type FenceHypervisor interface {
	ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error)
	State(ctx context.Context, uuid string) (lifecycle.State, error)
	Suspend(ctx context.Context, uuid string) error
	Resume(ctx context.Context, uuid string) error
	Destroy(ctx context.Context, uuid string) error
}

// FenceStats are the fencing loop's counters, read by the metrics collector.
type FenceStats struct {
	State          atomic.Pointer[string]
	Reason         atomic.Pointer[string] // fencing.Agent.Reason of the current state
	LastAck        atomic.Int64           // boot-clock nanos of the last landed renewal's send time
	LeaseHeld      atomic.Bool
	Renewals       atomic.Uint64
	RenewFailures  atomic.Uint64 // timed out, failed or conflict
	Beacons        atomic.Uint64 // beacons published (fencing.Beacon)
	PeersAsked     atomic.Uint64
	PeerAnswers    [6]atomic.Uint64 // by fencing.PeerAnswerKind
	PausedByHV     atomic.Int64     // size of the durable paused set
	Paused         atomic.Uint64    // pause operations that completed
	Destroyed      atomic.Uint64
	Resumed        atomic.Uint64
	FenceOpErrors  atomic.Uint64
	Alerts         atomic.Uint64
	Transitions    atomic.Uint64
	ResetRequested atomic.Uint64
	Watchdog       atomic.Int32 // watchdog.State, -1: none
	// PeerRefused counts the peer requests the endpoint refused, by
	// reason (peer.Handler.Refused).
	PeerRefused reasonCounter
	peerConns   atomic.Pointer[peer.ConnLimiter]
	// InvalidRecords: records (or guards) refused as untrusted: read,
	// found in a conflict, shown by a peer, or asked to be relayed.
	InvalidRecords atomic.Uint64
}

// reasonCounter counts events by reason and spaces their log lines.
type reasonCounter struct {
	mu     sync.Mutex
	n      map[string]uint64
	logged map[string]time.Time
}

func (r *reasonCounter) count(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]uint64{}
	}
	r.n[reason]++
}

func (r *reasonCounter) get(reason string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// logDue reports whether reason was not logged within every (and marks
// it logged now).
func (r *reasonCounter) logDue(reason string, now time.Time, every time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged == nil {
		r.logged = map[string]time.Time{}
	}
	if last, ok := r.logged[reason]; ok && now.Sub(last) < every {
		return false
	}
	r.logged[reason] = now
	return true
}

// fencer is the fencing goroutine: it owns the fencing.Agent and performs
// its Readys (docs/fencing.md). Everything that blocks (libvirt, NATS,
// peers, the reconciliation hook) runs off the loop and reports back
// through inbox.
type fencer struct {
	cfg       FenceConfig
	core      fencing.Config
	host      string
	log       *slog.Logger
	hv        FenceHypervisor
	nc        *nats.Conn
	store     *leaseStore
	client    *peer.Client
	secret    []byte
	accepted  [][]byte // further peer secrets accepted (a rotation)
	wd        *watchdog.Watchdog
	reset     func() error
	rec       FenceReconciler
	now       func() time.Time
	statePath string
	state     fenceStateFiles
	// runtimeErr: the last write of the runtime copy failed (loop only).
	runtimeErr bool
	membPath   string
	onTrans    func(fencing.Transition)
	subject    string

	a        *fencing.Agent
	inbox    chan func(time.Time) fencing.Ready
	domainsC chan []fencing.Domain
	relistC  chan struct{}
	events   chan fencing.FenceEvent
	// beacons: the newest beacon waiting to be published (capacity 1:
	// only the newest revision matters, an older one is superseded).
	beacons chan pendingBeacon
	// beaconMu guards lastBeacon: the revision the last beacon this
	// process published named (publishBeacon: the next one's Prev).
	beaconMu   sync.Mutex
	lastBeacon uint64
	// withdrawal: the last withdrawal of ours that landed (its receipt:
	// publishReceipt), under beaconMu. receiptDone: closed when the
	// receipt's publish ended (set on the loop before stopped closes).
	withdrawal  *pendingBeacon
	receiptDone chan struct{}
	sem         chan struct{}
	view        atomic.Pointer[fencing.PeerView]
	progress    atomic.Int64 // wall unix nanos of the last loop iteration
	stats       FenceStats
	keys        *fencing.Keyring // nil: signing off
	signer      fencing.Signer
	wdLast      watchdog.State
	wdOpen      func(path string) (watchdog.Device, error)
	// fail ends the agent (Run's context, with the cause): a watchdog
	// that cannot be armed late leaves the lease advertising a backstop
	// that is not there, so the agent leaves through the stop path
	// (withdrawal) instead of renewing such a lease.
	fail func(error)
	wg   sync.WaitGroup

	// The orderly stop (stop): stopReq is closed when Stop was handed to
	// the loop, stopped when its outcome is known (stopOutcome).
	stopOnce    sync.Once
	stopped     chan struct{}
	stopOutcome atomic.Int32
	guard       fencing.Guard // last valid guard (loop goroutine)
	members     []string
}

// newFencer builds the fencer and performs the start-up order of
// docs/fencing.md: read the durable state and the lease record (bounded),
// NewAgent, arm the hardware watchdog (fencing on, real action) when the
// Agent allows feeding it — arming feeds the device, so a restart whose
// lease lapsed meanwhile (a crash loop) must not arm it yet: the loop arms
// it once feeding is allowed — SetMembers (the cached membership), Domains
// (if libvirt answers already: hv may be a lateHV), Tick. A host that
// starts while fenced stays fenced.
func newFencer(ctx context.Context, cfg Config, log *slog.Logger, hv FenceHypervisor, nc *nats.Conn, opts Options) (*fencer, error) {
	fc := cfg.Fence
	bootID, err := readBootID()
	if err != nil {
		return nil, err
	}
	secret, accepted, err := readSecret(fc.PeerSecretFile)
	if err != nil {
		return nil, fmt.Errorf("fence.peer_secret_file %q: %w", fc.PeerSecretFile, err)
	}
	keys, signer, serr := fc.Signing.load(cfg.Host)
	if serr != nil {
		return nil, fmt.Errorf("%s %v: %s", serr.field, serr.val, serr.why)
	}
	f := &fencer{
		cfg: fc, core: fc.Core(cfg.Host, bootID), host: cfg.Host, log: log.With("component", "fencing"),
		hv: hv, nc: nc, store: &leaseStore{nc: nc, host: cfg.Host, create: fc.CreateBucket, signer: signer, keys: keys, log: log.With("component", "fencing")}, secret: secret, accepted: accepted,
		keys: keys, signer: signer,
		reset: opts.ResetHost, rec: opts.Reconciler, now: bootNow,
		statePath: filepath.Join(cfg.StateDir, fenceStateFile), membPath: filepath.Join(cfg.StateDir, fenceMembersFile),
		onTrans: opts.OnFenceTransition,
		inbox:   make(chan func(time.Time) fencing.Ready, 4096), domainsC: make(chan []fencing.Domain, 1),
		relistC: make(chan struct{}, 1), events: make(chan fencing.FenceEvent, fenceEventQueue), beacons: make(chan pendingBeacon, 1), sem: make(chan struct{}, fc.FenceConcurrency),
		stopped: make(chan struct{}), wdOpen: opts.OpenWatchdog,
	}
	if opts.WrapFenceHypervisor != nil {
		f.hv = opts.WrapFenceHypervisor(hv)
		hv = f.hv
	}
	if f.reset == nil {
		f.reset = SysrqReset
	}
	if f.rec == nil {
		f.rec = noReconcile{}
	}
	if f.wdOpen == nil {
		f.wdOpen = func(path string) (watchdog.Device, error) { return watchdog.OpenLinux(path) }
	}
	f.store.onInvalid = f.invalidRecord
	if keys.Enabled() {
		f.log.Info("signed lease records", "mode", string(keys.Mode), "key", signer.ID, "controller_keys", len(keys.Controllers), "host_keys", len(keys.Hosts))
	} else {
		f.log.Warn("lease records are NOT signed (fence.signing.mode: off): any holder of NATS credentials or of the peer secret can forge them (docs/security.md)")
	}
	f.core.Seed = uint64(time.Now().UnixNano())
	f.subject, _ = proto.FenceSubject(cfg.Host)
	f.client = &peer.Client{Host: cfg.Host, Secret: secret, Accepted: accepted, URL: fc.peerURL, Keys: keys,
		HTTP: &http.Client{Timeout: fc.PeerTimeout.D()}}
	f.stats.Watchdog.Store(-1)
	if f.core.HardwareWatchdog && opts.OpenWatchdog == nil {
		// A device that does not exist is a configuration error, found now
		// even when arming waits for the lease.
		if _, err := os.Stat(fc.WatchdogDevice); err != nil {
			return nil, fmt.Errorf("fence.watchdog_device: %w", err)
		}
	}

	// 1. The durable state (state_dir's copy, or the per-boot runtime
	// copy) and the current record.
	f.state = fenceStateFiles{stateDir: cfg.StateDir, statePath: f.statePath,
		runtimePath: filepath.Join(fc.RuntimeDir, fenceStateFile)}
	if err := os.MkdirAll(fc.RuntimeDir, 0o700); err != nil {
		f.log.Warn("fence.runtime_dir cannot be created: the fence state has only its state_dir copy", "dir", fc.RuntimeDir, "err", err)
	}
	d, _ := f.state.load(bootID, f.log)
	var cur *fencing.LeaseRecord
	var rev uint64
	rctx, cancel := context.WithTimeout(ctx, fenceStartTimeout)
	if st, err := f.store.get(rctx, fenceStartTimeout); err == nil {
		cur, rev, err = st.Read(rctx, cfg.Host)
		if err != nil && !isNotFound(err) {
			f.log.Warn("lease record unreadable at start; starting from the durable state", "host", cfg.Host, "err", err)
		}
	} else {
		f.log.Warn("lease bucket unreachable at start; starting from the durable state", "host", cfg.Host, "err", err)
	}
	cancel()
	// 2. The Agent.
	now := f.now()
	core := f.core
	// The wall clock in ms (the fencing clock if later: a host whose clock
	// is unset): no process takes an earlier process's incarnation, durable
	// state or not (Config.IncarnationFloor).
	core.IncarnationFloor = uint64(max(time.Now().UnixMilli(), now.UnixMilli(), 0))
	a, rd, err := fencing.NewAgent(core, d, cur, rev, now)
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	// 3. The hardware watchdog, armed before anything can wedge, if the
	// lease allows feeding it (else the loop arms it when it does; a
	// watchdog a crashed predecessor left running keeps counting).
	if f.core.HardwareWatchdog {
		if a.FeedWatchdog(now) {
			if err := f.armWatchdog(now); err != nil {
				return nil, err
			}
		} else if st := a.State(); st == fencing.StateFenced || st == fencing.StateAwaitingRelease || st == fencing.StateRejoining {
			// Restarted fenced (a crash, or a stop that fenced and left the
			// watchdog armed): fed again once this process listed (and
			// re-fenced) the domains.
			f.log.Warn("hardware watchdog not armed yet: restarted fenced; a watchdog left running keeps counting, "+
				"and it is armed once the domains are listed (and re-fenced)", "device", fc.WatchdogDevice, "state", string(st))
		} else {
			f.log.Error("hardware watchdog NOT armed at start: the lease lapsed while the agent was down (a crash or a crash loop); "+
				"a watchdog left running keeps counting, and it is armed once the lease is renewed or the fence is complete",
				"device", fc.WatchdogDevice, "state", string(a.State()), "reason", string(fencing.ReasonWatchdogNotArmedLeaseLapsed))
		}
	}
	f.a = a
	f.storeView()
	f.perform(ctx, rd)
	if m, err := loadMembers(f.membPath); err != nil {
		f.log.Warn("membership cache unreadable", "err", err)
	} else if len(m.Members) > 0 {
		f.members, f.guard = m.Members, m.Guard
		a.SetMembers(m.Members, m.Guard)
	}
	lctx, lcancel := context.WithTimeout(ctx, cfg.Libvirt.CallTimeout.D())
	snap, err := hv.ListDomains(lctx)
	lcancel()
	switch {
	case errors.Is(err, errLibvirtNotConnected):
		f.log.Info("fencing starts before libvirt: the domains are listed once it is connected")
	case err != nil:
		f.log.Warn("listing domains for fencing failed; retrying in the loop", "err", err)
	default:
		f.perform(ctx, a.Domains(f.now(), toFenceDomains(snap)))
	}
	f.perform(ctx, a.Tick(f.now()))
	f.afterIteration()
	f.log.Info("fencing started", "host", cfg.Host, "state", string(a.State()), "action", fc.Action,
		"backstop", string(f.core.Backstop()), "epoch", a.Epoch(), "paused", len(a.Paused()))
	return f, nil
}

func isNotFound(err error) bool {
	return err != nil && errors.Is(err, jetstream.ErrKeyNotFound)
}

// toFenceDomains maps a listing to the fencing inventory. Running means
// "can run guest code": running, blocked, and being shut down (the guest
// still runs its shutdown). Paused, shut off, crashed, PM-suspended cannot.
func toFenceDomains(snap []lifecycle.DomainSnapshot) []fencing.Domain {
	out := make([]fencing.Domain, 0, len(snap))
	for _, s := range snap {
		run := s.State == lifecycle.StateRunning || s.State == lifecycle.StateBlocked || s.State == lifecycle.StateShutdown
		out = append(out, fencing.Domain{UUID: s.UUID, Running: run})
	}
	return out
}

// postDomains hands a full listing to the loop (the latest one wins).
func (f *fencer) postDomains(snap []lifecycle.DomainSnapshot) {
	ds := toFenceDomains(snap)
	for {
		select {
		case f.domainsC <- ds:
			return
		default:
		}
		select {
		case <-f.domainsC: // drop the older listing
		default:
		}
	}
}

// relist asks the fencer to list the domains now (a domain started).
func (f *fencer) relist() {
	select {
	case f.relistC <- struct{}{}:
	default:
	}
}

// healthy reports whether the fencing loop made progress recently.
func (f *fencer) healthy() (bool, time.Duration) {
	age := time.Since(time.Unix(0, f.progress.Load()))
	return age <= FenceLoopStale, age
}

func (f *fencer) storeView() {
	v := f.a.PeerView()
	f.view.Store(&v)
}

// peerHandler is the peer endpoint, answering from the loop's snapshot.
func (f *fencer) peerHandler() http.Handler {
	return &peer.Handler{Host: f.host, Secret: f.secret, Accepted: f.accepted, Relayer: f.store, Signer: f.signer,
		View:    func() (fencing.PeerView, time.Time) { return *f.view.Load(), f.now() },
		Refused: f.peerRefused}
}

// peerRefused counts a refused peer request and logs it at WARN (at most
// once per reason per peerRefusedLogEvery: a flood must not flood the
// journal).
func (f *fencer) peerRefused(reason string) {
	f.stats.PeerRefused.count(reason)
	if f.stats.PeerRefused.logDue(reason, time.Now(), peerRefusedLogEvery) {
		f.log.Warn("peer request refused", "reason", reason, "refused_total", f.stats.PeerRefused.get(reason))
	}
}

// peerRefusedLogEvery spaces the WARN lines of refused peer requests of
// one reason (the metric counts every one).
const peerRefusedLogEvery = time.Minute

// servePeers listens on fence.peer_listen with the endpoint's limits
// (peer.NewServer's timeouts, at most peer.MaxConnsPerIP connections per
// address and peer.MaxConns in all).
func (f *fencer) servePeers() (func(), error) {
	ln, err := net.Listen("tcp", f.cfg.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("fence.peer_listen %q: %w", f.cfg.PeerListen, err)
	}
	mux := http.NewServeMux()
	mux.Handle(peer.Path, f.peerHandler())
	// A relay: opening the bucket, then Relay's CAS and the read after a
	// conflict, twice (natslease.Store.Relay retries once).
	rt := f.core.Timing.RenewTimeout
	lim, srv := peer.Endpoint(ln, mux, rt+2*(rt+natslease.ReadTimeout))
	f.stats.peerConns.Store(lim)
	return daemonkit.Serve(lim, srv, f.log, "peer endpoint"), nil
}

// run is the fencing loop. It returns when ctx ends, after its helpers.
func (f *fencer) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	f.wg.Add(2)
	go f.refreshMembers(ctx)
	go f.publishEvents(ctx)
	nextList := time.Time{}
	for {
		now := f.now()
		wait := min(f.a.NextDeadline().Sub(now), FenceMaxTick)
		if !nextList.IsZero() {
			wait = min(wait, nextList.Sub(now))
		}
		resetTimer(timer, wait)
		var rd fencing.Ready
		select {
		case <-ctx.Done():
			f.wg.Wait()
			return
		case <-timer.C:
			now = f.now()
			if !now.Before(nextList) {
				nextList = now.Add(f.relistEvery())
				f.listAsync(ctx)
			}
			rd = f.a.Tick(now)
		case fn := <-f.inbox:
			rd = fn(f.now())
		case ds := <-f.domainsC:
			rd = f.a.Domains(f.now(), ds)
		case <-f.relistC:
			f.listAsync(ctx)
		}
		f.perform(ctx, rd)
		f.afterIteration()
	}
}

func (f *fencer) relistEvery() time.Duration {
	switch f.a.State() {
	case fencing.StateHealthy, fencing.StateStarting:
		return fenceRelistIdle
	}
	return fenceRelistBusy
}

// listAsync lists the domains off the loop and posts the result.
func (f *fencer) listAsync(ctx context.Context) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		snap, err := f.hv.ListDomains(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.log.Warn("listing domains for fencing failed", "err", err)
			}
			return
		}
		f.postDomains(snap)
	}()
}

// armWatchdog opens and arms the hardware watchdog (which feeds it).
func (f *fencer) armWatchdog(now time.Time) error {
	dev, err := f.wdOpen(f.cfg.WatchdogDevice)
	if err != nil {
		return fmt.Errorf("fence.watchdog_device: %w", err)
	}
	wd := watchdog.New(dev)
	if err := wd.Arm(now, f.cfg.WatchdogTimeout.D()); err != nil {
		_ = dev.Close()
		return fmt.Errorf("fence.watchdog_device %s: %w", f.cfg.WatchdogDevice, err)
	}
	f.wd = wd
	f.wdLast = watchdog.Armed
	f.stats.Watchdog.Store(int32(watchdog.Armed))
	f.log.Info("hardware watchdog armed", "device", f.cfg.WatchdogDevice, "timeout", f.wd.Timeout())
	return nil
}

// afterIteration: the peer snapshot, the hardware watchdog, the stop, the
// progress stamp, the gauges.
func (f *fencer) afterIteration() {
	now := f.now()
	f.storeView()
	if f.core.HardwareWatchdog && f.wd == nil && !f.a.Stopping() && f.a.FeedWatchdog(now) {
		// Armed late (the lease had lapsed at start): now allowed.
		if err := f.armWatchdog(now); err != nil {
			f.stats.Watchdog.Store(int32(watchdog.Malfunction))
			f.log.Error("hardware watchdog cannot be armed: the agent stops (withdrawing its lease) rather than advertise a backstop that is not there",
				"host", f.host, "err", err)
			if f.fail != nil {
				f.fail(fmt.Errorf("fencing: %w", err))
				f.fail = nil
			}
		}
	}
	f.checkStop()
	if f.wd != nil {
		st := f.wd.Feed(now, f.a.FeedWatchdog(now))
		if st != f.wdLast {
			lvl := slog.LevelWarn
			if st == watchdog.Triggered || st == watchdog.Malfunction {
				lvl = slog.LevelError
			}
			f.log.Log(context.Background(), lvl, "hardware watchdog state changed", "state", st.String(),
				"from", f.wdLast.String(), "reason", string(f.a.Reason()), "err", f.wd.Err())
			f.wdLast = st
		}
		f.stats.Watchdog.Store(int32(st))
	}
	s := string(f.a.State())
	f.stats.State.Store(&s)
	r := string(f.a.Reason())
	f.stats.Reason.Store(&r)
	v := f.view.Load()
	f.stats.LastAck.Store(v.LastAck.UnixNano())
	f.stats.LeaseHeld.Store(f.a.LeaseHeld(now))
	f.stats.PausedByHV.Store(int64(len(f.a.Paused())))
	f.progress.Store(time.Now().UnixNano())
}

// post hands a result to the loop (from a helper goroutine).
func (f *fencer) post(ctx context.Context, fn func(time.Time) fencing.Ready) {
	select {
	case f.inbox <- fn:
	case <-ctx.Done():
	}
}

// perform carries out rd in the order fencing.Ready prescribes.
func (f *fencer) perform(ctx context.Context, rd fencing.Ready) {
	if rd.Persist != nil {
		serr, rerr := f.state.write(rd.Persist)
		if serr != nil {
			// Fence anyway: a fence matters more than remembering it.
			f.log.Error("fence state not persisted; fencing anyway", "host", f.host, "err", serr)
		}
		if (rerr != nil) != f.runtimeErr {
			// Logged when it starts and stops failing, not at every write.
			f.runtimeErr = rerr != nil
			if rerr != nil {
				f.log.Warn("runtime copy of the fence state not written (a state_dir lost within this boot would lose the lease age)",
					"host", f.host, "err", rerr)
			} else {
				f.log.Info("runtime copy of the fence state written again", "host", f.host)
			}
		}
	}
	if len(rd.Pause) > 0 {
		f.log.Error("FENCING: pausing domains", "host", f.host, "domains", len(rd.Pause), "reason", string(f.a.Reason()))
		for _, u := range rd.Pause {
			f.fenceOp(ctx, "pause", u)
		}
	}
	if len(rd.Destroy) > 0 {
		f.log.Error("FENCING: destroying domains", "host", f.host, "domains", len(rd.Destroy), "reason", string(f.a.Reason()))
		for _, u := range rd.Destroy {
			f.fenceOp(ctx, "destroy", u)
		}
	}
	if len(rd.Resume) > 0 {
		f.log.Warn("rejoined: resuming the domains hvguard paused", "host", f.host, "domains", len(rd.Resume))
		for _, u := range rd.Resume {
			f.resume(ctx, u)
		}
	}
	if len(rd.WouldFence) > 0 {
		f.log.Warn("monitor only (fence.action none): would have fenced these domains", "host", f.host,
			"domains", len(rd.WouldFence), "domain_uuids", rd.WouldFence, "reason", string(f.a.Reason()))
	}
	if rd.ResetHost {
		f.stats.ResetRequested.Add(1)
		f.log.Error("FENCING: RESETTING THE HOST (sysrq b)", "host", f.host, "reason", string(f.a.Reason()))
		if err := f.reset(); err != nil {
			f.stats.Alerts.Add(1)
			f.log.Error("HOST RESET FAILED", "host", f.host, "err", err)
		}
	}
	if rq := rd.Renew; rq != nil {
		f.renew(ctx, *rq)
	}
	if pr := rd.AskPeers; pr != nil {
		f.askPeers(ctx, *pr)
	}
	if rl := rd.Relayed; rl != nil {
		f.relayedBeacon(*rl)
	}
	if rd.Reconcile {
		f.reconcile(ctx, rd.ReconcileID, f.a.Paused())
	}
	if len(rd.LeftPaused) > 0 {
		f.log.Error("released after a declaration: domains hvguard paused are LEFT PAUSED (evacuated elsewhere); the operator decides",
			"host", f.host, "domain_uuids", rd.LeftPaused)
	}
	for _, tr := range rd.Transitions {
		f.transition(tr, rd.WouldFence)
	}
	for _, al := range rd.Alerts {
		f.stats.Alerts.Add(1)
		f.log.Error("FENCING ALERT", "host", f.host, "reason", string(al.Reason), "detail", al.Detail, "state", string(f.a.State()))
	}
}

// fenceOp pauses or destroys uuid off the loop (bounded concurrency) and
// reports it with FenceDone. A domain already paused or off counts as done.
func (f *fencer) fenceOp(ctx context.Context, op, uuid string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		select {
		case f.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var err error
		if op == "pause" {
			err = f.hv.Suspend(ctx, uuid)
			if err != nil {
				if st, serr := f.hv.State(ctx, uuid); serr == nil && !canRun(st) {
					err = nil // already paused, off or gone: it cannot run
				}
			}
		} else {
			err = f.hv.Destroy(ctx, uuid)
			if errors.Is(err, libvirtx.ErrInvalidState) || errors.Is(err, libvirtx.ErrNoDomain) {
				err = nil // already off (or gone)
			}
		}
		<-f.sem
		switch {
		case err != nil:
			f.stats.FenceOpErrors.Add(1)
			f.log.Error("fence operation failed (retried)", "host", f.host, "domain_uuid", uuid, "op", op, "err", err)
		case op == "pause":
			f.stats.Paused.Add(1)
		default:
			f.stats.Destroyed.Add(1)
		}
		f.post(ctx, func(now time.Time) fencing.Ready { return f.a.FenceDone(now, uuid, err) })
	}()
}

func canRun(st lifecycle.State) bool {
	return st == lifecycle.StateRunning || st == lifecycle.StateBlocked || st == lifecycle.StateShutdown
}

func (f *fencer) resume(ctx context.Context, uuid string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		select {
		case f.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		err := f.hv.Resume(ctx, uuid)
		<-f.sem
		if err != nil && !errors.Is(err, libvirtx.ErrNoDomain) {
			f.stats.FenceOpErrors.Add(1)
			f.log.Error("resume after rejoin failed; resume it by hand", "host", f.host, "domain_uuid", uuid, "err", err)
			return
		}
		f.stats.Resumed.Add(1)
	}()
}

// renew sends req off the loop (natslease.Store.Renew) and reports back.
func (f *fencer) renew(ctx context.Context, req fencing.RenewRequest) {
	f.stats.Renewals.Add(1)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		res := f.store.Renew(ctx, req, f.core.Timing.RenewTimeout)
		if res.Outcome != fencing.RenewAcked {
			f.stats.RenewFailures.Add(1)
		} else {
			f.beacon(req.Record, res.Revision)
		}
		f.post(ctx, func(now time.Time) fencing.Ready { return f.a.Renewed(now, req.Seq, res) })
	}()
}

// askPeers runs a peer round, each question bounded by the round deadline.
// The renewal a peer may relay is sealed by this host's key for the
// revision it is written on; a record a peer shows is verified like one
// read from NATS (a compromised peer can show anything).
func (f *fencer) askPeers(ctx context.Context, pr fencing.PeerRound) {
	left := pr.Deadline.Sub(f.now())
	pr.Renewal.Record = f.signer.Seal(pr.Renewal.Record, pr.Renewal.Revision)
	for _, p := range pr.Peers {
		f.stats.PeersAsked.Add(1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			actx, cancel := context.WithTimeout(ctx, left)
			ans, err := f.client.Ask(actx, p, pr)
			cancel()
			if c := ans.Current; c != nil {
				verr := f.keys.VerifyRecord(*c)
				if verr == nil && c.Host != f.host {
					verr = fmt.Errorf("%w: record of host %q", fencing.ErrInvalidRecord, c.Host)
				}
				if verr != nil {
					f.invalidRecord(f.host, ans.Revision, fmt.Errorf("shown by peer %s: %w", p, verr))
					ans.Current, ans.Invalid = nil, verr.Error()
				}
			}
			if int(ans.Kind) < len(f.stats.PeerAnswers) {
				f.stats.PeerAnswers[ans.Kind].Add(1)
			}
			if err != nil {
				f.log.Debug("peer unreachable", "host", f.host, "peer", p, "round", pr.ID, "err", err)
			}
			f.post(ctx, func(now time.Time) fencing.Ready { return f.a.PeerAnswered(now, pr.ID, p, ans) })
		}()
	}
}

// reconcile runs the rejoin hook off the loop, retrying until it succeeds
// (the host stays fenced meanwhile), and reports Reconciled.
func (f *fencer) reconcile(ctx context.Context, id uint64, paused []string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			drop, err := f.rec.Reconcile(ctx, slices.Clone(paused))
			if err == nil {
				if len(drop) > 0 {
					f.log.Warn("reconciliation: these paused domains were evacuated and will not be resumed", "host", f.host, "domain_uuids", drop)
				}
				f.post(ctx, func(now time.Time) fencing.Ready { return f.a.Reconciled(now, id, drop) })
				return
			}
			f.log.Error("rejoin reconciliation failed; staying fenced and retrying", "host", f.host, "err", err, "retry_in", reconcileRetry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(reconcileRetry):
			}
		}
	}()
}

// transition logs tr and publishes it as a fencing.FenceEvent on
// proto.FenceSubject(host), best effort (core NATS; see docs/fencing.md:
// the lease record is the authority, the event is for humans and tools).
func (f *fencer) transition(tr fencing.Transition, would []string) {
	f.stats.Transitions.Add(1)
	lvl := slog.LevelWarn
	switch tr.To {
	case fencing.StateHealthy:
		if tr.From == fencing.StateStarting {
			lvl = slog.LevelInfo
		}
	case fencing.StateFencing, fencing.StateFenced, fencing.StateAwaitingRelease:
		lvl = slog.LevelError
	}
	f.log.Log(context.Background(), lvl, "fence state transition", "host", f.host, "state", string(tr.To),
		"from", string(tr.From), "reason", string(tr.Reason), "epoch", tr.Epoch, "detail", tr.Detail)
	if f.onTrans != nil {
		f.onTrans(tr)
	}
	if f.subject == "" {
		return
	}
	ev := fencing.NewFenceEvent(f.host, f.core.BootID, tr, f.a.Paused(), would, time.Now())
	select {
	case f.events <- ev:
	default:
		f.log.Warn("fence event queue full; event dropped (logged above)", "host", f.host, "state", string(tr.To))
	}
}

// invalidRecord says loudly that a record (or the guard: host "") was
// refused as untrusted (signed records, docs/security.md): logged at
// ERROR, counted (hvguard_fence_invalid_records_total) and published as a
// fence event with reason InvalidLeaseRecord. Called from any goroutine.
func (f *fencer) invalidRecord(host string, rev uint64, err error) {
	f.stats.InvalidRecords.Add(1)
	f.log.Error("INVALID LEASE RECORD refused (forged, replayed or unverifiable)", "host", f.host, "key", host, "revision", rev, "err", err)
	if f.subject == "" {
		return
	}
	st := fencing.State("")
	if p := f.stats.State.Load(); p != nil {
		st = fencing.State(*p)
	}
	ev := fencing.FenceEvent{Schema: fencing.EventSchema, Host: f.host, BootID: f.core.BootID, From: st, To: st,
		Reason: fencing.ReasonInvalidLeaseRecord, Detail: fmt.Sprintf("key %q revision %d: %v", host, rev, err), At: time.Now().UTC()}
	select {
	case f.events <- ev:
	default:
	}
}

// pendingBeacon: the beacon of the renewal rec written at rev at at,
// sealed when it is published (publishBeacon).
type pendingBeacon struct {
	rec fencing.LeaseRecord
	rev uint64
	at  time.Time
}

// beacon queues the beacon of a renewal this agent wrote itself at rev
// (fencing.Beacon), replacing one not yet published. Never blocks.
func (f *fencer) beacon(rec fencing.LeaseRecord, rev uint64) {
	if f.nc == nil {
		return
	}
	m := pendingBeacon{rec: rec, rev: rev, at: time.Now()}
	if rec.State == fencing.LeaseWithdrawn {
		f.beaconMu.Lock()
		f.withdrawal = &m
		f.beaconMu.Unlock()
	}
	for range 2 {
		select {
		case f.beacons <- m:
			return
		default:
		}
		select {
		case <-f.beacons: // superseded
		default:
		}
	}
}

// relayedBeacon queues the beacon of a renewal of ours a peer relayed
// (fencing.Ready.Relayed): a relay writes none, and the controller takes
// beacons as this host's signs of life (controller/beaconloss.go). Not
// one already published past: the chain would restart (Prev 0) for a late
// relay. Best effort: this host reaches NATS only if a compromised node,
// not an outage, kept its own writes from landing.
func (f *fencer) relayedBeacon(rl fencing.RelayedLanding) {
	f.beaconMu.Lock()
	past := rl.Revision <= f.lastBeacon
	f.beaconMu.Unlock()
	if past {
		return
	}
	f.beacon(rl.Record, rl.Revision)
}

// fenceEventQueue bounds the fence events waiting to be published: a few
// per fence; more means NATS has been unwritable for a long time and the
// log has them anyway.
const fenceEventQueue = 64

// publishEvents publishes fence events off the loop: a core NATS publish
// can block on a blackholed connection (measured: 1.3 s until the
// outbound buffer limit), which must never stall fencing.
func (f *fencer) publishEvents(ctx context.Context) {
	defer f.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-f.beacons:
			if ctx.Err() != nil {
				// Back in the queue for flushBeacon (the orderly stop's
				// withdrawal beacon may be this one: reviewer X31); a newer
				// one queued meanwhile wins.
				select {
				case f.beacons <- m:
				default:
				}
				return
			}
			// Best effort: a beacon lost makes that one renewal count
			// for nothing only where the controller cannot verify the
			// record itself (fencing.Beacon); the next renewal sends one,
			// naming this one's revision if it left (Beacon.Prev).
			if err := f.publishBeacon(m); err != nil {
				f.log.Debug("beacon not published", "host", f.host, "revision", m.rev, "err", err)
			}
		case ev := <-f.events:
			if ctx.Err() != nil {
				return // stopping: a blackholed connection would block each publish
			}
			b, err := ev.Encode()
			if err == nil {
				err = f.nc.PublishMsg(delivery.EventMsg(f.subject, b, f.signer)) // signed: docs/events.md, "Signatures"
			}
			if err != nil {
				f.log.Warn("fence event not published (logged above)", "host", f.host, "state", string(ev.To), "err", err)
			}
		}
	}
}

// refreshMembers reads the bucket's membership and guard while NATS is
// connected, caches them on disk, and hands them to the loop.
func (f *fencer) refreshMembers(ctx context.Context) {
	defer f.wg.Done()
	for {
		every := f.cfg.MembersRefresh.D()
		if f.nc.IsConnected() && !f.readMembers(ctx) {
			// No guard known yet (the controller publishes it after its
			// first watch): without it the agent cannot be Held, so look
			// again soon.
			every = min(every, membersRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// membersRetry is the membership refresh period while no valid guard has
// been read yet.
const membersRetry = time.Second

// readMembers reports whether a valid guard was read.
func (f *fencer) readMembers(ctx context.Context) bool {
	st, err := f.store.get(ctx, natsReadTimeout)
	if err != nil {
		return false
	}
	m, g, err := st.Members(ctx)
	if err != nil {
		f.log.Warn("reading the lease bucket's membership failed; keeping the cached one", "err", err)
		return false
	}
	f.post(ctx, func(time.Time) fencing.Ready {
		// The core keeps its guard when g is not valid or older.
		f.members = m
		f.a.SetMembers(f.members, g)
		f.guard = f.a.Guard()
		if err := writeJSONAtomic(f.membPath, membersCache{Members: f.members, Guard: f.guard}); err != nil {
			f.log.Warn("membership cache not written", "err", err)
		}
		return fencing.Ready{}
	})
	return g.Valid()
}

// stopWait bounds the wait for the core's stop: two withdrawals of
// renew_timeout each (the second after a conflict with our own landed
// renewal), then a fence of fence_deadline; 2+2+5+1 = 10 s at the
// defaults, well inside systemd's TimeoutStopSec (30 s) with the outbox
// flush (shutdown_timeout, 10 s) after it.
func (f *fencer) stopWait() time.Duration {
	t := f.core.Timing
	return 2*t.RenewTimeout + t.FenceDeadline + stopSlack
}

// stop is the orderly stop of docs/fencing.md: it hands Agent.Stop to the
// loop (which keeps running: renewals stop, the withdrawal or the fence
// proceeds, the watchdog is fed as the Agent allows) and waits for its
// outcome, at most stopWait. The watchdog is magic-closed (on the loop)
// as soon as the withdrawal is confirmed (StopOutcome.MagicClose);
// otherwise — fenced, or not — it stays armed.
// Only the first call acts; later calls wait for the same outcome.
func (f *fencer) stop(reason string) fencing.StopOutcome {
	f.stopOnce.Do(func() {
		lvl := slog.LevelWarn
		if reason != stopReasonOrderly {
			lvl = slog.LevelError
		}
		f.log.Log(context.Background(), lvl, "stopping fencing: withdrawing the lease", "host", f.host, "reason", reason)
		select {
		case f.inbox <- func(now time.Time) fencing.Ready { return f.a.Stop(now, reason) }:
		case <-time.After(f.stopWait()):
			f.log.Error("fencing loop not taking the stop (wedged?)", "host", f.host)
		}
	})
	select {
	case <-f.stopped:
		f.waitReceipt() // off the loop: the watchdog is fed or closed meanwhile
	case <-time.After(f.stopWait()):
		f.log.Error("fencing stop did not complete in time: the hardware watchdog is LEFT ARMED (the host resets unless the agent comes back)",
			"host", f.host, "waited", f.stopWait(), "state", *f.stats.State.Load())
	}
	return fencing.StopOutcome(f.stopOutcome.Load())
}

// Stop reasons written into the withdrawn record.
const (
	stopReasonOrderly = "orderly-stop"
	// maxStopReason bounds the reason (an error message) in the record.
	maxStopReason = 200
)

// checkStop (on the loop) acts on the stop's outcome once it is known.
func (f *fencer) checkStop() {
	o := f.a.StopOutcome()
	if o == fencing.StopPending || f.stopOutcome.Load() != int32(fencing.StopPending) {
		return
	}
	f.stopOutcome.Store(int32(o))
	switch o {
	case fencing.StopWithdrawn:
		f.log.Warn("lease withdrawn: the controller will not declare this host; it is UNPROTECTED until the agent runs again", "host", f.host)
		f.flushBeacon()
		f.publishReceipt()
	case fencing.StopFenced:
		if f.wd != nil && !o.MagicClose() {
			f.log.Error(fmt.Sprintf("withdrawal not confirmed: domains fenced, the hardware watchdog stays armed: this host resets in %s unless hvguard-agent starts again",
				f.wd.Timeout()), "host", f.host, "paused", len(f.a.Paused()), "state", string(f.a.State()), "device", f.cfg.WatchdogDevice)
		} else {
			f.log.Error("stopped FENCED: every domain is fenced; the controller may declare this host", "host", f.host,
				"paused", len(f.a.Paused()), "state", string(f.a.State()))
		}
	default:
		f.log.Error("stopping with the fence INCOMPLETE: the hardware watchdog is LEFT ARMED and unfed (reset if allowed was requested)",
			"host", f.host, "state", string(f.a.State()), "watchdog", f.wd != nil)
	}
	if o.MagicClose() {
		f.disarm()
	}
	close(f.stopped)
}

// withdrawalBeaconFlush bounds the wait for the withdrawal's beacon to
// leave at an orderly stop (flushBeacon): long enough for a healthy
// connection, short enough not to hold the stop up on a dead one (the
// beacon is best effort; the withdrawn record is the evidence).
const withdrawalBeaconFlush = time.Second

// flushBeacon publishes the beacon still waiting (the withdrawal's: its
// state says withdrawn, fencing.Beacon.State) and flushes the connection,
// on the loop at an orderly stop: the event publisher may have stopped
// with the agent's context, and a controller that never saw the withdrawn
// record (a compromised node overwrote it before its watch delivered it)
// learns of the withdrawal only from this beacon (reviewer X11).
func (f *fencer) flushBeacon() {
	if f.nc == nil {
		return
	}
	select {
	case m := <-f.beacons:
		if err := f.publishBeacon(m); err != nil {
			f.log.Warn("withdrawal beacon not published", "host", f.host, "err", err)
			return
		}
	default:
	}
	if err := f.nc.FlushTimeout(withdrawalBeaconFlush); err != nil {
		f.log.Warn("withdrawal beacon not flushed", "host", f.host, "err", err)
	}
}

// receiptTimeout bounds the wait for the withdrawal receipt's publish
// ack at an orderly stop (publishReceipt): the stop's budget (stopWait,
// systemd's TimeoutStopSec) has room for it after the beacon's flush.
const receiptTimeout = 2 * time.Second

// receiptRetry: the pause between a refused receipt's publishes (within
// receiptTimeout).
const receiptRetry = 50 * time.Millisecond

// publishReceipt starts the publish of the receipt of the withdrawal
// that landed (natslease.ReceiptMsg) into the withdrawal receipts stream,
// off the loop — the loop feeds the watchdog until the magic close after
// it, and an ack that does not come held it 2 s (reviewer X57) — and
// sets receiptDone, closed when the publish ended; stop waits for it
// (at most receiptTimeout). At an orderly stop, on the loop: a controller
// reads a host's receipts before it declares the host, so the withdrawal
// counts even if its record was overwritten before the controller's
// watch delivered it and its beacon was lost on the way
// (docs/security.md, "Withdrawal receipts"). Not acknowledged: logged at
// ERROR — the beacon and the record remain the only evidence.
func (f *fencer) publishReceipt() {
	f.beaconMu.Lock()
	w := f.withdrawal
	f.beaconMu.Unlock()
	if f.nc == nil || w == nil {
		return
	}
	done := make(chan struct{})
	f.receiptDone = done
	go func() {
		defer close(done)
		msg, err := natslease.ReceiptMsg(f.signer, w.rec, w.rev, w.at)
		if err == nil {
			var js jetstream.JetStream
			if js, err = jetstream.New(f.nc); err == nil {
				// Retried until acknowledged or receiptTimeout: a server
				// whose stream ingest queue is full answers 429 at once
				// (a flood of a compromised node on its own receipt
				// subject — reviewer X60); a duplicate receipt is harmless.
				// Whichever stream captures the subject stores it: the
				// host's own (proto.WithdrawalStreamOf), or the older
				// shared one until the host is moved (docs/operations.md).
				ctx, cancel := context.WithTimeout(context.Background(), receiptTimeout)
				for {
					var ack *jetstream.PubAck
					ack, err = js.PublishMsg(ctx, msg)
					if err == nil && ack.Stream == proto.WithdrawalStream {
						f.log.Warn("withdrawal receipt stored in the shared stream "+proto.WithdrawalStream+", which cannot vouch for it: give this host its own stream (docs/operations.md)", "host", f.host)
					}
					if err == nil || ctx.Err() != nil {
						break
					}
					select {
					case <-ctx.Done():
					case <-time.After(receiptRetry):
					}
				}
				cancel()
			}
		}
		if err != nil {
			f.log.Error("withdrawal receipt not stored: a controller that missed the withdrawn record and its beacon could still declare this host (provision the host's own stream hvguard-withdrawals-HOST: docs/operations.md)", "host", f.host, "revision", w.rev, "err", err)
			return
		}
		f.log.Info("withdrawal receipt stored", "host", f.host, "revision", w.rev)
	}()
}

// waitReceipt waits for the receipt's publish (publishReceipt), at most
// receiptTimeout and a little.
func (f *fencer) waitReceipt() {
	if f.receiptDone == nil {
		return
	}
	select {
	case <-f.receiptDone:
	case <-time.After(receiptTimeout + 100*time.Millisecond):
	}
}

// publishBeacon seals m, naming the revision of the last beacon this
// process published as its Prev (the chain a controller checks for
// beacons lost on the way: controller/beaconloss.go), and publishes it.
// From the publisher goroutine, and from the loop at an orderly stop.
func (f *fencer) publishBeacon(m pendingBeacon) error {
	f.beaconMu.Lock()
	defer f.beaconMu.Unlock()
	prev := f.lastBeacon
	if m.rev <= prev {
		// Not after the last one: overtaken by the withdrawal's beacon
		// (flushBeacon, on the loop; reviewer X29), or the lease stream
		// rolled back and revisions are handed out again. Published as
		// the start of a new chain (Prev 0) — dropping it dropped every
		// beacon after a rollback until the stream passed the old
		// revision, the withdrawal's among them (reviewer X31).
		prev = 0
	}
	msg, err := natslease.BeaconMsg(f.signer, m.rec, m.rev, prev, m.at)
	if err != nil {
		return err
	}
	if err := f.nc.PublishMsg(msg); err != nil {
		return err
	}
	f.lastBeacon = m.rev
	f.stats.Beacons.Add(1)
	return nil
}

func (f *fencer) disarm() {
	if f.wd == nil {
		return
	}
	if err := f.wd.Disarm(); err != nil {
		f.log.Error("hardware watchdog not disarmed", "err", err)
		return
	}
	f.log.Info("hardware watchdog disarmed (magic close)")
}

// shutdown runs after the loop ended: a watchdog still armed (the stop
// did not withdraw — it fenced, or the fence is incomplete — or never
// ran) is closed WITHOUT the magic close, so it resets the host unless
// the next agent feeds it.
func (f *fencer) shutdown() {
	if f.wd == nil || f.wd.State() == watchdog.Disarmed {
		return
	}
	msg := "hardware watchdog left ARMED on exit: the fence is not known complete and the lease not withdrawn"
	if fencing.StopOutcome(f.stopOutcome.Load()) == fencing.StopFenced {
		msg = "hardware watchdog left ARMED on exit: fenced, the lease not withdrawn; the host resets unless hvguard-agent starts again"
	}
	f.log.Error(msg, "host", f.host, "state", *f.stats.State.Load(), "timeout", f.wd.Timeout(), "err", f.wd.Leave())
}

// fenceHV wraps the event loop's Hypervisor: every resync also makes the
// fencer list the domains (the fencing inventory follows the event loop).
type fenceHV struct {
	Hypervisor
	f *fencer
}

func (h fenceHV) ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error) {
	snap, err := h.Hypervisor.ListDomains(ctx)
	if err == nil {
		// The fencer lists for itself (through Options.WrapFenceHypervisor,
		// if set): one listing more per resync, and one inventory source.
		h.f.relist()
	}
	return snap, err
}
