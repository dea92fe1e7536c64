package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"hvguard/lifecycle"
	"hvguard/proto"
)

// Hypervisor is what the agent's loop needs from libvirt. *libvirtx.Conn
// implements it; the `make run` demo wraps it to delay some events the way a
// loaded libvirt delays them.
type Hypervisor interface {
	Events() <-chan lifecycle.Event
	ResyncNeeded() <-chan struct{}
	ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error)
	State(ctx context.Context, uuid string) (lifecycle.State, error)
}

// Sink durably accepts reported events (the outbox). Append assigns Seq.
type Sink interface {
	Append(ev *proto.LifecycleEvent) error
}

// Loop is the agent's event loop: it owns the debouncer, feeds it libvirt's
// events and timer ticks, runs the real-state checks it asks for on a bounded
// set of goroutines, and hands every report to the sink in decision order.
//
// Loop is the only goroutine that touches the debouncer, so per-domain order
// is the order of the decisions.
type Loop struct {
	host string
	log  *slog.Logger
	hv   Hypervisor
	deb  *lifecycle.Debouncer
	sink Sink
	// mark is the sink position of the last report (what domains.json
	// records with the states it saves); nil while unknown (no report yet
	// and the previous file's mark could not be followed).
	mark   *knownMark
	now    func() time.Time
	stats  *LoopStats
	checks chan struct{} // semaphore for state checks in flight

	checkResults chan checkResult
	listResults  chan listResult
	listing      bool // a ListDomains for a resync is in flight
	resyncAgain  bool // another resync was asked for while listing
	// touched holds the domains that had events while a listing was in
	// flight: the listing may predate those events, so it must not judge
	// them (see fresh).
	touched map[string]struct{}

	// cls is Nova-aware stop classification (nil: off, the debouncer's
	// reports are published as they are); see classify.go.
	cls      *classifying
	clsStats *ClassifyStats

	// Full reports (proto.TransitionInventory): due after a resync or a
	// gap marker, and every InventoryInterval.
	invDue   string    // reason of the full report due ("" = none)
	invAt    time.Time // last full report
	gapsSeen uint64    // the sink's gap markers already followed by a report

	knownPath string    // where the debouncer's beliefs are persisted ("" = not)
	dirty     bool      // reports since the last save
	savedAt   time.Time // last save

	// Heartbeat is called from the loop on every watchdog tick, proving
	// that the loop makes progress (see Run). May be nil.
	Heartbeat func()
	// HeartbeatEvery is the heartbeat period (default 1 s).
	HeartbeatEvery time.Duration
	// OnReport, if set, is called after each event is appended (demo, tests).
	OnReport func(proto.LifecycleEvent)
	// OnResync, if set, is called on the loop after each full domain
	// listing has been applied and its reports handed on, with the number
	// of domains listed (tests: the first call means the loop knows every
	// domain; see Options.OnResync).
	OnResync func(domains int)

	wg sync.WaitGroup
}

// LoopStats are the loop's counters, read by the metrics collector.
type LoopStats struct {
	EventsIn     atomic.Uint64
	Reports      [16]atomic.Uint64 // indexed by transitionIndex
	Suppressed   sync.Map          // reason -> *atomic.Uint64
	Checks       atomic.Uint64
	CheckErrors  atomic.Uint64
	Resyncs      atomic.Uint64
	ResyncErrors atomic.Uint64
	SinkErrors   atomic.Uint64
	Tracked      atomic.Int64
	StopsHeld    atomic.Int64 // stops in their window or awaiting a state check (Debouncer.Pending)
	LastLoop     atomic.Int64 // unix nanos of the last loop iteration
}

func (s *LoopStats) suppressed(reason string) {
	v, _ := s.Suppressed.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

type checkResult struct {
	uuid  string
	check uint64
	state lifecycle.State
	err   error
}

type listResult struct {
	snap []lifecycle.DomainSnapshot
	err  error
}

// LoopConfig configures a Loop.
type LoopConfig struct {
	Host             string
	Lifecycle        lifecycle.Config
	CheckConcurrency int
	// KnownPath is the file that keeps what the agent last reported about
	// each domain across restarts (state_dir/domains.json); "" disables.
	KnownPath string
	// Classify turns Nova-aware stop classification on; nil: off, reports
	// are exactly the debouncer's.
	Classify *ClassifyConfig
}

// NewLoop builds the loop. now is the clock (time.Now in production).
func NewLoop(cfg LoopConfig, hv Hypervisor, sink Sink, log *slog.Logger, now func() time.Time) (*Loop, error) {
	deb, err := lifecycle.New(cfg.Lifecycle)
	if err != nil {
		return nil, err
	}
	if cfg.CheckConcurrency < 1 {
		cfg.CheckConcurrency = DefaultCheckConcurrency
	}
	if now == nil {
		now = time.Now
	}
	var mark *knownMark
	if cfg.KnownPath != "" {
		known, m, err := loadKnown(cfg.KnownPath)
		if err != nil {
			log.Error("known domain states lost; every domain will be announced again", "err", err)
		}
		known, mark = foldSince(known, m, sink, log)
		if err := deb.Seed(known); err != nil {
			return nil, err
		}
		if len(known) > 0 {
			log.Info("restored known domain states", "domains", len(known), "path", cfg.KnownPath)
		}
	}
	var cls *classifying
	if cfg.Classify != nil {
		if cls, err = newClassifying(cfg.Classify); err != nil {
			return nil, err
		}
	}
	return &Loop{
		mark:         mark,
		cls:          cls,
		clsStats:     &ClassifyStats{},
		knownPath:    cfg.KnownPath,
		host:         cfg.Host,
		log:          log,
		hv:           hv,
		deb:          deb,
		sink:         sink,
		now:          now,
		stats:        &LoopStats{},
		checks:       make(chan struct{}, cfg.CheckConcurrency),
		checkResults: make(chan checkResult, cfg.CheckConcurrency),
		listResults:  make(chan listResult, 1),
		touched:      map[string]struct{}{},
	}, nil
}

// Stats returns the loop's live counters.
func (l *Loop) Stats() *LoopStats { return l.stats }

// ClassifyStats returns classification's live counters (zero when off).
func (l *Loop) ClassifyStats() *ClassifyStats { return l.clsStats }

// Classifying reports whether classification is on.
func (l *Loop) Classifying() bool { return l.cls != nil }

// Run drives the loop until ctx is cancelled. It starts with a full resync
// (the debouncer learns every domain) and returns nil on cancellation after
// every in-flight check has finished.
func (l *Loop) Run(ctx context.Context) error {
	hb := l.HeartbeatEvery
	if hb <= 0 {
		hb = time.Second
	}
	ticker := time.NewTicker(hb)
	defer ticker.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	l.startResync(ctx)
	events := l.hv.Events()
	resync := l.hv.ResyncNeeded()
	var clsResults <-chan clsResult // nil (never ready) when classification is off
	if l.cls != nil {
		clsResults = l.cls.results
	}
	var ds []lifecycle.Decision
	for {
		ds = ds[:0]
		resynced := -1 // domains listed by a resync applied in this iteration
		beat := false  // the heartbeat ticked in this iteration
		select {
		case <-ctx.Done():
			l.stop(ctx)
			return nil
		case ev, ok := <-events:
			if !ok {
				l.stop(ctx)
				return errors.New("libvirt event channel closed")
			}
			// Take what else is already queued (bounded), so a burst
			// costs one loop iteration per batch, not per event.
			now := l.now()
			ds = l.observe(ds, ev, now)
		drain:
			for i := 1; i < EventBatch; i++ {
				select {
				case ev, ok := <-events:
					if !ok {
						break drain // reported closed on the next iteration
					}
					ds = l.observe(ds, ev, now)
				default:
					break drain
				}
			}
		case <-resync:
			l.startResync(ctx)
		case r := <-l.listResults:
			l.listing = false
			if r.err != nil {
				l.stats.ResyncErrors.Add(1)
				l.log.Warn("resync: listing domains failed; retrying", "err", r.err)
				l.resyncAgain = true
			} else {
				l.stats.Resyncs.Add(1)
				ds = append(ds, l.deb.Resync(l.fresh(r.snap), l.now())...)
				resynced = len(r.snap)
				l.log.Info("resync done", "domains", len(r.snap))
			}
			if l.resyncAgain {
				l.resyncAgain = false
				l.startResync(ctx)
			}
		case r := <-l.checkResults:
			ds = append(ds, l.deb.Resolve(r.uuid, r.check, r.state, r.err, l.now())...)
		case r := <-clsResults:
			l.answer(ctx, r)
		case <-timer.C:
			now := l.now()
			ds = append(ds, l.deb.Tick(now)...)
			if l.cls != nil {
				l.handleCls(ctx, l.cls.cls.Tick(now))
			}
		case <-ticker.C:
			// The heartbeat is sent from here, the loop whose progress
			// it proves: a wedged loop stops feeding systemd's watchdog.
			if l.Heartbeat != nil {
				l.Heartbeat()
			}
			l.saveKnown(false)
			beat = true
		}
		l.handle(ctx, ds)
		if resynced >= 0 {
			l.invDue = "resync"
		}
		if resynced >= 0 || beat {
			// Not on the event path: a gap marker or the interval is
			// noticed within a heartbeat (1 s).
			l.inventory()
		}
		if resynced >= 0 && l.OnResync != nil {
			l.OnResync(resynced)
		}
		l.stats.LastLoop.Store(l.now().UnixNano())
		l.stats.Tracked.Store(int64(l.deb.Len()))
		l.stats.StopsHeld.Store(int64(l.deb.Pending()))
		if next, ok := l.nextDeadline(); ok {
			resetTimer(timer, next.Sub(l.now()))
		}
	}
}

// nextDeadline is the earlier of the debouncer's and the classifier's.
func (l *Loop) nextDeadline() (time.Time, bool) {
	next, ok := l.deb.NextDeadline()
	if l.cls == nil {
		return next, ok
	}
	l.clsStats.Classifying.Store(int64(l.cls.cls.Pending()))
	l.clsStats.Queued.Store(int64(l.cls.queued()))
	if c, cok := l.cls.cls.NextDeadline(); cok && (!ok || c.Before(next)) {
		return c, true
	}
	return next, ok
}

// stop ends Run: waits for the checks and queries in flight, publishes the
// guest resets still held (lifecycle.FlushReboots) and the stops still
// being classified (unknown, agent-stopping) and saves the known states.
func (l *Loop) stop(ctx context.Context) {
	l.wg.Wait()
	// Held REBOOT bursts are reported now (a graceful stop loses none);
	// before the classification queues, which may hold them behind a stop.
	l.handle(ctx, l.deb.FlushReboots(l.now()))
	l.drainCls(ctx)
	if l.cls != nil {
		l.clsStats.Classifying.Store(0)
		l.clsStats.Queued.Store(0)
	}
	l.saveKnown(true)
}

// EventBatch bounds the events taken from libvirt's hand-off per loop
// iteration: large enough to amortise the loop's fixed cost in a burst,
// small enough that timers and check answers wait at most a few ms.
const EventBatch = 256

func (l *Loop) observe(ds []lifecycle.Decision, ev lifecycle.Event, now time.Time) []lifecycle.Decision {
	l.stats.EventsIn.Add(1)
	if l.listing {
		l.touched[ev.UUID] = struct{}{}
	}
	return append(ds, l.deb.Observe(ev, now)...)
}

func resetTimer(t *time.Timer, d time.Duration) {
	if d < 0 {
		d = 0
	}
	t.Reset(d)
}

func (l *Loop) startResync(ctx context.Context) {
	if l.listing {
		l.resyncAgain = true
		return
	}
	l.listing = true
	clear(l.touched)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		snap, err := l.hv.ListDomains(ctx)
		select {
		case l.listResults <- listResult{snap, err}:
		case <-ctx.Done():
		}
	}()
}

// fresh removes from a listing what events have overtaken: a domain that had
// an event while the listing was in flight is kept but not judged (state
// unknown) when the debouncer still tracks it, and dropped when an event made
// the debouncer forget it (undefined) — so a stale row can neither invent a
// transition nor resurrect an undefined domain.
func (l *Loop) fresh(snap []lifecycle.DomainSnapshot) []lifecycle.DomainSnapshot {
	if len(l.touched) == 0 {
		return snap
	}
	out := snap[:0]
	for _, s := range snap {
		if _, ok := l.touched[s.UUID]; ok {
			if !l.deb.Tracks(s.UUID) {
				continue
			}
			s.State = lifecycle.StateUnknown
		}
		out = append(out, s)
	}
	clear(l.touched)
	return out
}

func (l *Loop) handle(ctx context.Context, ds []lifecycle.Decision) {
	for i := range ds {
		d := &ds[i]
		switch d.Op {
		case lifecycle.OpCheckState:
			l.check(ctx, d.UUID, d.Check)
		case lifecycle.OpReport:
			l.report(ctx, d)
		}
	}
}

// check asks libvirt for the domain's real state off the loop goroutine; the
// answer comes back through checkResults.
func (l *Loop) check(ctx context.Context, uuid string, token uint64) {
	l.stats.Checks.Add(1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		select {
		case l.checks <- struct{}{}:
		case <-ctx.Done():
			return
		}
		st, err := l.hv.State(ctx, uuid)
		<-l.checks
		if err != nil {
			l.stats.CheckErrors.Add(1)
		}
		select {
		case l.checkResults <- checkResult{uuid, token, st, err}:
		case <-ctx.Done():
		}
	}()
}

// report publishes a debouncer report, or, with classification on, holds
// a stop for classification (and keeps the domain's later reports behind
// it).
func (l *Loop) report(ctx context.Context, d *lifecycle.Decision) {
	l.dirty = true
	if l.cls != nil && l.route(ctx, d) {
		return
	}
	l.publish(d, "", "")
}

// publish appends the report to the sink, with the stop's classification
// ("" = not classified).
func (l *Loop) publish(d *lifecycle.Decision, cl proto.Classification, clReason string) {
	now := l.now()
	ev := proto.LifecycleEvent{
		Schema:        proto.SchemaVersion,
		Host:          l.host,
		DomainUUID:    d.UUID,
		DomainName:    d.Name,
		Transition:    proto.Transition(d.Transition),
		Reason:        string(d.Reason),
		State:         d.State.String(),
		LibvirtEvent:  d.Cause.Event,
		LibvirtDetail: d.Cause.Detail,
		OccurredAt:    d.Cause.At,
		ObservedAt:    now,

		Classification:       cl,
		ClassificationReason: clReason,
		RebootEvents:         uint64(d.RebootEvents),
	}
	if ev.OccurredAt.IsZero() {
		ev.OccurredAt = now
	}
	if d.Transition == lifecycle.TransitionRebooted && d.Reason != lifecycle.ReasonRebootEvent {
		l.stats.suppressed(string(d.Reason))
	}
	l.stats.Reports[transitionIndex(ev.Transition)].Add(1)
	if err := l.sink.Append(&ev); err != nil {
		// The outbox counts and announces what it could not keep and
		// writes a gap marker; the loop must not stop for it.
		l.stats.SinkErrors.Add(1)
		l.log.Error("outbox refused an event", "domain_uuid", d.UUID, "transition", d.Transition, "err", err)
		return
	}
	l.mark = &knownMark{inc: ev.Incarnation, seq: ev.Seq}
	// Stops, suppressed stops and gaps are what an operator asks about at
	// 3 a.m.: INFO. Routine transitions (a busy host makes thousands) are
	// DEBUG; every one of them is in the event stream with its reason.
	// A reboot standing for more REBOOT events than one reset makes is
	// a guest resetting repeatedly (a reset loop is reported once per
	// window): INFO too.
	lvl := slog.LevelDebug
	if d.Transition == lifecycle.TransitionStopped || (d.Transition == lifecycle.TransitionRebooted && d.Reason != lifecycle.ReasonRebootEvent) ||
		d.RebootEvents > lifecycle.RebootEventsPerReset {
		lvl = slog.LevelInfo
	}
	if l.log.Enabled(context.Background(), lvl) {
		l.log.Log(context.Background(), lvl, "reported",
			"domain_uuid", d.UUID, "domain", d.Name, "transition", string(d.Transition),
			"reason", string(d.Reason), "state", d.State.String(), "seq", ev.Seq,
			"libvirt_event", d.Cause.Event, "libvirt_detail", d.Cause.Detail,
			"classification", string(cl), "classification_reason", clReason, "reboot_events", d.RebootEvents)
	}
	if l.OnReport != nil {
		l.OnReport(ev)
	}
}

// InventoryInterval is how often a full report is sent even when nothing
// asked for one: it bounds how long a consumer's view can stay stale after
// a loss the agent cannot see (a message lost in the stream itself). 10
// minutes: a host with 100 domains adds ~10 KB per 10 minutes.
const InventoryInterval = 10 * time.Minute

// gapMarkers is implemented by the outbox: how many gap markers it has
// appended (each is followed by a full report, so the consumer's view,
// stale from the gap, becomes complete again).
type gapMarkers interface{ GapMarkers() uint64 }

// inventory appends a full report if one is due: after a resync, after a
// gap marker, every InventoryInterval. Run after a resync and on every
// heartbeat, not per event. Its content is what consumers last
// heard of each domain (known: a stop still held is "running").
func (l *Loop) inventory() {
	now := l.now()
	if g, ok := l.sink.(gapMarkers); ok {
		if n := g.GapMarkers(); n != l.gapsSeen {
			l.gapsSeen = n
			l.invDue = "gap"
		}
	}
	if l.invDue == "" && !l.invAt.IsZero() && now.Sub(l.invAt) >= InventoryInterval {
		l.invDue = "periodic"
	}
	if l.invDue == "" {
		return
	}
	known := l.known()
	doms := make([]proto.InventoryDomain, len(known))
	for i, k := range known {
		doms[i] = proto.InventoryDomain{UUID: k.UUID, Name: k.Name, State: k.State.String()}
	}
	reason := l.invDue
	l.invDue, l.invAt = "", now
	for _, ev := range proto.InventoryMessages(l.host, reason, doms) {
		ev.OccurredAt, ev.ObservedAt = now, now
		if err := l.sink.Append(&ev); err != nil {
			// Counted and announced by the outbox (a gap marker follows,
			// and with it the next full report).
			l.stats.SinkErrors.Add(1)
			l.log.Error("outbox refused a full report", "part", ev.InventoryPart, "parts", ev.InventoryParts, "err", err)
			return
		}
		l.mark = &knownMark{inc: ev.Incarnation, seq: ev.Seq}
		l.stats.Reports[transitionIndex(ev.Transition)].Add(1)
		if l.OnReport != nil {
			l.OnReport(ev)
		}
	}
	l.log.Debug("full report sent", "reason", reason, "domains", len(doms))
}

// saveKnown persists the debouncer's beliefs when they changed, at most
// every KnownSaveInterval unless forced (shutdown).
func (l *Loop) saveKnown(force bool) {
	if l.knownPath == "" || !l.dirty {
		return
	}
	now := l.now()
	if !force && now.Sub(l.savedAt) < KnownSaveInterval {
		return
	}
	if err := saveKnown(l.knownPath, l.known(), l.mark, now); err != nil {
		l.log.Error("saving known domain states failed", "path", l.knownPath, "err", err)
		return
	}
	l.dirty, l.savedAt = false, now
}

// known is what to persist: the debouncer's beliefs, except that a domain
// whose stop is held for classification (not yet published) is saved as
// running, what consumers last heard. After a crash mid-hold the start's
// resync then finds it off and reports the stop again: never lost.
func (l *Loop) known() []lifecycle.DomainSnapshot {
	k := l.deb.Known()
	if l.cls == nil || len(l.cls.held) == 0 {
		return k
	}
	seen := map[string]bool{}
	for i := range k {
		if _, ok := l.cls.held[k[i].UUID]; ok {
			k[i].State = lifecycle.StateRunning
			seen[k[i].UUID] = true
		}
	}
	for uuid, d := range l.cls.held {
		if !seen[uuid] { // undefined since, the undefine queued behind the stop
			k = append(k, lifecycle.DomainSnapshot{UUID: uuid, Name: d.Name, State: lifecycle.StateRunning})
		}
	}
	return k
}

// transitions lists the reported transitions in metric order.
var transitions = []proto.Transition{
	proto.TransitionStarted, proto.TransitionStopped, proto.TransitionRebooted,
	proto.TransitionSuspended, proto.TransitionResumed, proto.TransitionPMSuspended,
	proto.TransitionDefined, proto.TransitionUndefined, proto.TransitionInventory,
}

func transitionIndex(t proto.Transition) int {
	for i, x := range transitions {
		if x == t {
			return i
		}
	}
	return len(transitions) // "other"
}

// String summarises the loop for systemd's STATUS= line.
func (s *LoopStats) String() string {
	return fmt.Sprintf("domains=%d events=%d stops=%d reboots=%d",
		s.Tracked.Load(), s.EventsIn.Load(),
		s.Reports[transitionIndex(proto.TransitionStopped)].Load(),
		s.Reports[transitionIndex(proto.TransitionRebooted)].Load())
}
