package lifecycle

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// phase is what the Debouncer believes (and has reported) about a domain.
type phase uint8

const (
	phaseUnknown     phase = iota // seen, but never placed (first event was e.g. SHUTDOWN)
	phaseRunning                  // running or blocked
	phasePaused                   // SUSPENDED
	phasePMSuspended              // PMSUSPENDED
	phaseOff                      // stop reported, or defined and never started
)

// state returns the State hvguard reports for a phase.
func (p phase) state() State {
	switch p {
	case phaseRunning:
		return StateRunning
	case phasePaused:
		return StatePaused
	case phasePMSuspended:
		return StatePMSuspended
	case phaseOff:
		return StateShutoff
	}
	return StateUnknown
}

// phaseOf maps a real state to a phase; ok is false for states that do
// not place the domain (unknown, nostate, shutdown).
func phaseOf(s State) (p phase, ok bool) {
	switch s {
	case StateRunning, StateBlocked:
		return phaseRunning, true
	case StatePaused:
		return phasePaused, true
	case StatePMSuspended:
		return phasePMSuspended, true
	}
	if s.Off() {
		return phaseOff, true
	}
	return phaseUnknown, false
}

// domain is the per-domain record. Its size is fixed: nothing grows with
// the number of events.
type domain struct {
	uuid, name string
	phase      phase
	// learnedOff: phase is off because a listing or a Seed said so, not
	// because this Debouncer reported the stop (a domain first learnt
	// from a resync listing it off, or believed off from domains.json).
	// A STOPPED/CRASHED delivered now is a stop nobody was told about —
	// the event may predate the listing that found the domain off (the
	// agent's first listing races the events) — so it opens a pending
	// stop instead of being dropped as already reported.
	learnedOff bool
	// absorb: the next STARTED belongs to a start or reboot already
	// reported (real QEMU sends RESUMED then STARTED; a check found the
	// domain alive before its late start events arrived).
	absorb bool
	// pending stop: cause is its first stop-like event.
	pending bool
	cause   Event
	// shutdown is the detail of the last SHUTDOWN since the domain ran.
	shutdown string
	// deferred DEFINED, held behind a pending stop to keep report order.
	deferred   bool
	deferredEv Event
	// undefined: an UNDEFINED arrived while the stop was pending and no
	// DEFINED since. Nova's hard reboot undefines and redefines the domain
	// between destroy and start, so an undefine is not proof that the stop
	// is final; it is reported after the stop if the domain stays off.
	undefined   bool
	undefinedEv Event
	check       uint64 // outstanding check token, 0 = none
	checks      int    // checks issued for the current pending stop
	// held REBOOT burst (holdReboot): rbEvents REBOOT events not reported
	// yet (0: no burst), rbCause the first one's cause (or the stop it
	// cancelled), rbStart and rbLast when the first and the last of them
	// were observed. rbReported is when the domain's last reboot-event
	// report was made (zero: none). A burst and a pending stop never
	// coexist: a stop begins only after the burst is reported.
	rbEvents                    int
	rbCause                     Event
	rbStart, rbLast, rbReported time.Time
	deadline                    time.Time // of the pending stop's window or check, or of the held burst
	seq                         uint64    // heap tie-break
	hidx                        int       // index in the timer heap, -1 if absent
	mark                        uint64    // resync generation
}

// Debouncer holds STOPPED/CRASHED events of each domain for a window and
// has the caller check the domain's real state before a stop is reported.
// It is a pure state machine: it never reads the clock, never blocks and
// starts no goroutines; the caller passes now into every method and
// performs the returned decisions. It is not safe for concurrent use: one
// goroutine drives it.
//
// Decisions come in two forms. Observe, Tick, Resolve and Resync return a
// slice owned by the Debouncer, reused by the next call of any of these
// methods: use or copy it (append(ds, d.Observe(ev, now)...)) before
// calling again. AppendObserve, AppendTick, AppendResolve and AppendResync
// append to a caller-owned dst instead and return the extended slice (like
// append). Neither form allocates on the hot path once slices have grown.
type Debouncer struct {
	cfg       Config
	doms      map[string]*domain
	timers    timerHeap // domains with a pending stop or a held REBOOT burst
	stops     int       // pending stops (the rest of timers are held bursts)
	now       time.Time // the now of the current call, for held bursts reported by it
	nextCheck uint64
	gen       uint64
	c         Counters
	scratch   []*domain
	out       []Decision // returned by Observe, Tick, Resolve, Resync
}

// New returns a Debouncer for cfg, or an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Debouncer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lifecycle.New: %w", err)
	}
	if cfg.CheckTimeout == 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	return &Debouncer{cfg: cfg, doms: make(map[string]*domain)}, nil
}

// Config returns the configuration the Debouncer was built with.
func (d *Debouncer) Config() Config { return d.cfg }

// Len returns the number of domains tracked. It is bounded by the number
// of defined domains: UNDEFINED, a resync listing without the domain, or a
// check answering StateGone forgets a domain.
func (d *Debouncer) Len() int { return len(d.doms) }

// Pending returns the number of stops currently held (in a window,
// awaiting a check answer, or waiting to recheck). Pending() <= Len().
func (d *Debouncer) Pending() int { return d.stops }

// RebootsHeld returns the number of domains whose REBOOT burst is held
// (not reported yet, see holdReboot). Pending()+RebootsHeld() <= Len().
func (d *Debouncer) RebootsHeld() int { return d.timers.len() - d.stops }

// Counters returns a copy of the cumulative counters.
func (d *Debouncer) Counters() Counters {
	c := d.c
	c.StopsPending = d.stops
	c.RebootsHeld = d.RebootsHeld()
	return c
}

// NextDeadline returns the earliest time at which Tick has work to do;
// ok is false when no stop is pending and no REBOOT burst is held. Arm the
// caller's single timer with it after every call.
func (d *Debouncer) NextDeadline() (deadline time.Time, ok bool) {
	if d.timers.len() == 0 {
		return time.Time{}, false
	}
	return d.timers.top().deadline, true
}

// report appends a report for dom, after the domain's held REBOOT burst
// if there is one (reports of a domain follow event order).
func (d *Debouncer) report(dst []Decision, dom *domain, t Transition, r Reason, st State, cause Event) []Decision {
	dst = d.flushReboot(dst, dom)
	return append(dst, Decision{Op: OpReport, UUID: dom.uuid, Name: dom.name, Transition: t, Reason: r, State: st, Cause: cause})
}

// Observe is AppendObserve into the Debouncer's reused slice (valid until
// the next Observe, Tick, Resolve or Resync).
func (d *Debouncer) Observe(ev Event, now time.Time) []Decision {
	d.out = d.AppendObserve(d.out[:0], ev, now)
	return d.out
}

// Tick is AppendTick into the Debouncer's reused slice (valid until the
// next Observe, Tick, Resolve or Resync).
func (d *Debouncer) Tick(now time.Time) []Decision {
	d.out = d.AppendTick(d.out[:0], now)
	return d.out
}

// Resolve is AppendResolve into the Debouncer's reused slice (valid until
// the next Observe, Tick, Resolve or Resync).
func (d *Debouncer) Resolve(uuid string, check uint64, st State, err error, now time.Time) []Decision {
	d.out = d.AppendResolve(d.out[:0], uuid, check, st, err, now)
	return d.out
}

// Resync is AppendResync into the Debouncer's reused slice (valid until
// the next Observe, Tick, Resolve or Resync).
func (d *Debouncer) Resync(snap []DomainSnapshot, now time.Time) []Decision {
	d.out = d.AppendResync(d.out[:0], snap, now)
	return d.out
}

// FlushReboots is AppendFlushReboots into the Debouncer's reused slice
// (valid until the next Observe, Tick, Resolve, Resync or FlushReboots).
func (d *Debouncer) FlushReboots(now time.Time) []Decision {
	d.out = d.AppendFlushReboots(d.out[:0], now)
	return d.out
}

// AppendFlushReboots reports every held REBOOT burst at once, in UUID
// order, for a caller about to stop (a graceful shutdown does not lose
// them; pending stops are left alone: they are settled after the restart
// from the persisted beliefs).
func (d *Debouncer) AppendFlushReboots(dst []Decision, now time.Time) []Decision {
	d.now = now
	held := d.scratch[:0]
	for _, dom := range d.timers.items {
		if dom.rbEvents > 0 {
			held = append(held, dom)
		}
	}
	slices.SortFunc(held, func(a, b *domain) int { return strings.Compare(a.uuid, b.uuid) })
	for i, dom := range held {
		dst = d.flushReboot(dst, dom)
		held[i] = nil
	}
	d.scratch = held[:0]
	return dst
}

// AppendObserve feeds one event delivered by libvirt (ev.At is carried in
// Decision.Cause; windows are measured from now). Events with an empty
// UUID or a Kind this package does not know are ignored
// (Counters.Ignored). See doc.go for what each event does.
func (d *Debouncer) AppendObserve(dst []Decision, ev Event, now time.Time) []Decision {
	d.now = now
	d.c.Events++
	if ev.UUID == "" || ev.Kind == KindUnknown || ev.Kind > KindReboot {
		d.c.Ignored++
		return dst
	}
	dom := d.doms[ev.UUID]
	if dom == nil {
		if ev.Kind == KindUndefined {
			// Never tracked: report, do not learn.
			return append(dst, Decision{Op: OpReport, UUID: ev.UUID, Name: ev.Name, Transition: TransitionUndefined, Reason: ReasonEvent, State: StateGone, Cause: ev})
		}
		dom = &domain{uuid: ev.UUID, name: ev.Name, hidx: -1, mark: d.gen}
		d.doms[ev.UUID] = dom
	} else if ev.Name != "" && ev.Name != dom.name {
		dom.name = ev.Name
	}
	if dom.pending {
		return d.observePending(dst, dom, ev, now)
	}
	switch ev.Kind {
	case KindStopped, KindCrashed:
		dom.absorb = false
		if dom.phase == phaseOff && !dom.learnedOff {
			d.c.Redundant++ // this stop was already reported
			return dst
		}
		if dom.learnedOff {
			d.c.StopsOfLearnedOff++
		}
		return d.beginStop(dst, dom, ev, now)
	case KindShutdown:
		dom.absorb = false
		dom.shutdown = ev.Detail
		d.c.Annotated++
		return dst
	case KindStarted:
		if dom.absorb {
			dom.absorb = false
			d.c.Folded++
			return dst
		}
		dom.phase, dom.shutdown = phaseRunning, ""
		return d.report(dst, dom, TransitionStarted, ReasonEvent, StateRunning, ev)
	case KindResumed:
		switch dom.phase {
		case phaseRunning:
			d.c.Redundant++ // keeps absorb: RESUMED, STARTED of a start already reported
			return dst
		case phaseOff:
			// Real QEMU start: RESUMED then STARTED. Report the start now;
			// fold the STARTED that follows.
			dom.phase, dom.shutdown, dom.absorb = phaseRunning, "", true
			return d.report(dst, dom, TransitionStarted, ReasonEvent, StateRunning, ev)
		}
		dom.phase, dom.shutdown = phaseRunning, ""
		return d.report(dst, dom, TransitionResumed, ReasonEvent, StateRunning, ev)
	case KindSuspended:
		dom.absorb = false
		dom.phase = phasePaused
		return d.report(dst, dom, TransitionSuspended, ReasonEvent, StatePaused, ev)
	case KindPMSuspended:
		dom.absorb = false
		dom.phase = phasePMSuspended
		return d.report(dst, dom, TransitionPMSuspended, ReasonEvent, StatePMSuspended, ev)
	case KindReboot:
		dom.absorb = false
		dom.phase, dom.shutdown = phaseRunning, ""
		if d.cfg.Window == 0 {
			dst = d.report(dst, dom, TransitionRebooted, ReasonRebootEvent, StateRunning, ev)
			dst[len(dst)-1].RebootEvents = 1
			return dst
		}
		d.holdReboot(dom, ev, now)
		return dst
	case KindDefined:
		if dom.phase == phaseUnknown && (ev.Detail == "ADDED" || ev.Detail == "RENAMED") {
			// A new persistent domain is defined, not running; libvirt
			// renames inactive domains only (its UNDEFINED/RENAMED forgot
			// the old name): unplaced, the next listing would begin a
			// stop of a domain that never ran.
			dom.phase = phaseOff
		}
		return d.report(dst, dom, TransitionDefined, ReasonEvent, dom.phase.state(), ev)
	case KindUndefined:
		dst = d.report(dst, dom, TransitionUndefined, ReasonEvent, StateGone, ev)
		d.forget(dom)
		return dst
	}
	return dst
}

// observePending handles an event for a domain whose stop is pending.
func (d *Debouncer) observePending(dst []Decision, dom *domain, ev Event, now time.Time) []Decision {
	switch ev.Kind {
	case KindStopped, KindCrashed:
		// One pending stop per domain; the deadline does not move.
		d.c.StopsMerged++
		dom.cause.Detail = mergeDetail(dom.cause.Detail, ev.Detail)
		return dst
	case KindShutdown:
		d.c.Annotated++
		if dom.shutdown == "" {
			dom.shutdown = ev.Detail
		}
		return dst
	case KindStarted:
		d.c.SuppressedStarted++
		return d.cancelStop(dst, dom, ReasonStartedWithinWindow, phaseRunning, false)
	case KindResumed:
		d.c.SuppressedResumed++
		return d.cancelStop(dst, dom, ReasonResumedWithinWindow, phaseRunning, true)
	case KindReboot:
		// The stop's outcome is this reboot: reported with the REBOOTs
		// that follow (on_crash=restart sends SUSPENDED, CRASHED, REBOOT,
		// RESUMED, REBOOT: one report).
		d.c.SuppressedReboot++
		dom.undefined, dom.undefinedEv = false, Event{}
		d.endPending(dom)
		dom.phase, dom.absorb, dom.shutdown = phaseRunning, false, ""
		cause := dom.cause
		dom.cause = Event{}
		d.holdReboot(dom, cause, now)
		return d.flushDeferred(dst, dom)
	case KindSuspended:
		d.c.SuppressedSuspended++
		dst = d.cancelStop(dst, dom, ReasonSuspendedWithinWindow, phasePaused, false)
		return d.report(dst, dom, TransitionSuspended, ReasonEvent, StatePaused, ev)
	case KindPMSuspended:
		d.c.SuppressedSuspended++
		dst = d.cancelStop(dst, dom, ReasonSuspendedWithinWindow, phasePMSuspended, false)
		return d.report(dst, dom, TransitionPMSuspended, ReasonEvent, StatePMSuspended, ev)
	case KindDefined:
		// Nova's hard reboot redefines the domain between destroy and
		// start. Hold the report behind the stop's so per-domain order
		// follows the events; repeated DEFINEDs collapse into the last.
		// A DEFINED voids an UNDEFINED held before it.
		d.c.Deferred++
		dom.deferred, dom.deferredEv = true, ev
		dom.undefined, dom.undefinedEv = false, Event{}
		return dst
	case KindUndefined:
		// Nova's hard reboot is destroy, undefine, define, start (measured
		// on a libvirt-driver nova-compute, test/e2e/openstack): hold the
		// undefine behind the pending stop. If the domain comes back it
		// is a reboot; if not, the check at window end finds it gone (or
		// off) and the stop, then the undefine, are reported.
		d.c.UndefinesHeld++
		dom.undefined, dom.undefinedEv = true, ev
		dom.deferred, dom.deferredEv = false, Event{}
		return dst
	}
	return dst
}

// mergeDetail appends detail to merged ("PANICKED+CRASHED") unless it is
// already there; bounded because libvirt's detail names are few.
func mergeDetail(merged, detail string) string {
	if detail == "" || merged == detail {
		return merged
	}
	if merged == "" {
		return detail
	}
	for part := range strings.SplitSeq(merged, "+") {
		if part == detail {
			return merged
		}
	}
	if len(merged) > 64 {
		return merged
	}
	return merged + "+" + detail
}

// holdReboot adds a REBOOT event (cause: the event, or the pending stop it
// cancelled) to dom's burst, opening one if none is held. The burst is
// reported as one rebooted (RebootEvents = its events) by Tick at
// rebootDeadline, or earlier, right before any other report of the domain
// (flushReboot). Window > 0 only.
func (d *Debouncer) holdReboot(dom *domain, cause Event, now time.Time) {
	dom.rbLast = now
	if dom.rbEvents > 0 {
		d.c.RebootsCoalesced++
		dom.rbEvents++
		dom.deadline = d.rebootDeadline(dom)
		d.timers.fix(dom)
		return
	}
	dom.rbCause, dom.rbStart, dom.rbEvents = cause, now, 1
	dom.deadline = d.rebootDeadline(dom)
	d.timers.push(dom)
}

// rebootDeadline is when dom's held burst is reported: RebootBurstGap after
// its last REBOOT, but not before Window after the domain's previous
// reboot-event report (one report per Window: a reset loop is reported once
// per Window, with the count) and never later than Window after the
// burst's first REBOOT (a reboot is never held longer than the window).
func (d *Debouncer) rebootDeadline(dom *domain) time.Time {
	at := dom.rbLast.Add(RebootBurstGap)
	if !dom.rbReported.IsZero() {
		if next := dom.rbReported.Add(d.cfg.Window); next.After(at) {
			at = next
		}
	}
	if limit := dom.rbStart.Add(d.cfg.Window); limit.Before(at) {
		at = limit
	}
	return at
}

// flushReboot reports dom's held REBOOT burst, if any, now.
func (d *Debouncer) flushReboot(dst []Decision, dom *domain) []Decision {
	if dom.rbEvents == 0 {
		return dst
	}
	d.timers.remove(dom)
	dst = append(dst, Decision{Op: OpReport, UUID: dom.uuid, Name: dom.name, Transition: TransitionRebooted,
		Reason: ReasonRebootEvent, State: StateRunning, Cause: dom.rbCause, RebootEvents: dom.rbEvents})
	dom.rbEvents, dom.rbCause = 0, Event{}
	dom.rbReported = d.now
	return dst
}

// beginStop opens a pending stop (or, with Window 0, reports it at once).
// A held REBOOT burst of the domain is reported first.
func (d *Debouncer) beginStop(dst []Decision, dom *domain, cause Event, now time.Time) []Decision {
	dst = d.flushReboot(dst, dom)
	dom.learnedOff = false // this stop is reported (or suppressed) by this Debouncer
	if d.cfg.Window == 0 {
		d.c.StopsReported++
		d.c.StopsPassThrough++
		dom.phase, dom.absorb = phaseOff, false
		st := StateShutoff
		if cause.Kind == KindCrashed {
			st = StateCrashed
		}
		dst = append(dst, Decision{Op: OpReport, UUID: dom.uuid, Name: dom.name, Transition: TransitionStopped, Reason: ReasonPassThrough, State: st, Cause: cause, Shutdown: dom.shutdown})
		dom.shutdown = ""
		return dst
	}
	d.c.StopsBegun++
	d.stops++
	dom.pending = true
	dom.cause = cause
	dom.check, dom.checks = 0, 0
	dom.deadline = now.Add(d.cfg.Window)
	d.timers.push(dom)
	return dst
}

// endPending clears the pending stop's bookkeeping.
func (d *Debouncer) endPending(dom *domain) {
	d.timers.remove(dom)
	if dom.pending {
		d.stops--
	}
	dom.pending = false
	dom.check, dom.checks = 0, 0
}

// flushDeferred appends a DEFINED held behind the stop just settled.
func (d *Debouncer) flushDeferred(dst []Decision, dom *domain) []Decision {
	if !dom.deferred {
		return dst
	}
	dom.deferred = false
	ev := dom.deferredEv
	dom.deferredEv = Event{}
	return d.report(dst, dom, TransitionDefined, ReasonEvent, dom.phase.state(), ev)
}

// settleUndefine reports an UNDEFINED held behind the stop just reported
// and forgets the domain.
func (d *Debouncer) settleUndefine(dst []Decision, dom *domain) []Decision {
	if !dom.undefined || d.doms[dom.uuid] != dom {
		return dst
	}
	dst = d.report(dst, dom, TransitionUndefined, ReasonEvent, StateGone, dom.undefinedEv)
	d.forget(dom)
	return dst
}

// cancelStop suppresses the pending stop: the domain came back.
func (d *Debouncer) cancelStop(dst []Decision, dom *domain, r Reason, p phase, absorb bool) []Decision {
	dom.undefined, dom.undefinedEv = false, Event{}
	d.endPending(dom)
	dom.phase, dom.absorb, dom.shutdown = p, absorb, ""
	dst = d.report(dst, dom, TransitionRebooted, r, p.state(), dom.cause)
	dom.cause = Event{}
	return d.flushDeferred(dst, dom)
}

// reportStop reports the pending stop as real.
func (d *Debouncer) reportStop(dst []Decision, dom *domain, r Reason, st State) []Decision {
	d.endPending(dom)
	d.c.StopsReported++
	dom.phase, dom.absorb = phaseOff, false
	dst = append(dst, Decision{Op: OpReport, UUID: dom.uuid, Name: dom.name, Transition: TransitionStopped, Reason: r, State: st, Cause: dom.cause, Shutdown: dom.shutdown})
	dom.cause, dom.shutdown = Event{}, ""
	return d.flushDeferred(dst, dom)
}

// forget drops dom. Its held burst, if any, was reported by the report
// that precedes every forget (undefined).
func (d *Debouncer) forget(dom *domain) {
	d.endPending(dom)
	delete(d.doms, dom.uuid)
}

// issueCheck asks the caller for the real state of dom.
func (d *Debouncer) issueCheck(dst []Decision, dom *domain, now time.Time) []Decision {
	d.nextCheck++
	d.c.ChecksIssued++
	dom.check = d.nextCheck
	dom.checks++
	dom.deadline = now.Add(d.cfg.CheckTimeout)
	d.timers.push(dom)
	return append(dst, Decision{Op: OpCheckState, UUID: dom.uuid, Name: dom.name, Reason: ReasonWindowEnd, Cause: dom.cause, Shutdown: dom.shutdown, Check: dom.check})
}

// AppendTick processes every deadline at or before now: an ended window or
// recheck interval yields an OpCheckState; a check unanswered for
// CheckTimeout counts as failed (a new check, or after MaxChecks a stop
// with ReasonStateCheckFailed).
func (d *Debouncer) AppendTick(dst []Decision, now time.Time) []Decision {
	d.now = now
	for d.timers.len() > 0 {
		dom := d.timers.top()
		if dom.deadline.After(now) {
			break
		}
		if dom.rbEvents > 0 {
			dst = d.flushReboot(dst, dom)
			continue
		}
		d.timers.remove(dom)
		if dom.check != 0 {
			d.c.ChecksTimedOut++
			dom.check = 0
			if dom.checks >= d.cfg.MaxChecks {
				d.c.StopsCheckFailed++
				dst = d.reportStop(dst, dom, ReasonStateCheckFailed, StateUnknown)
				dst = d.settleUndefine(dst, dom)
				continue
			}
		}
		dst = d.issueCheck(dst, dom, now)
	}
	return dst
}

// AppendResolve answers the OpCheckState with token check: st is the state read
// from libvirt, err the error of that read. An answer whose token is not
// the domain's outstanding check (the stop was settled or re-checked
// meanwhile, or the domain is forgotten) is ignored.
//
// Alive states (State.Alive, except StateShutdown) suppress the stop
// (rebooted, ReasonRunningAtWindowEnd); Off states report it (stopped,
// ReasonOffAtWindowEnd; StateGone then also reports undefined and forgets
// the domain). An error, StateShutdown (still going down) or an
// unclassified state schedules a recheck after RecheckInterval; after
// MaxChecks checks the stop is reported with ReasonStateCheckFailed.
func (d *Debouncer) AppendResolve(dst []Decision, uuid string, check uint64, st State, err error, now time.Time) []Decision {
	d.now = now
	dom := d.doms[uuid]
	if dom == nil || !dom.pending || check == 0 || dom.check != check {
		d.c.ChecksStale++
		return dst
	}
	d.timers.remove(dom)
	dom.check = 0
	if err == nil && st != StateShutdown {
		if p, ok := phaseOf(st); ok {
			if p != phaseOff {
				// Alive: its start events, if any, are late; absorb them.
				d.c.SuppressedRunning++
				d.endPending(dom)
				dom.phase, dom.absorb, dom.shutdown = p, true, ""
				dom.undefined, dom.undefinedEv = false, Event{}
				dst = d.report(dst, dom, TransitionRebooted, ReasonRunningAtWindowEnd, st, dom.cause)
				dom.cause = Event{}
				return d.flushDeferred(dst, dom)
			}
			d.c.StopsOffAtWindowEnd++
			dst = d.reportStop(dst, dom, ReasonOffAtWindowEnd, st)
			if st == StateGone {
				ev := Event{UUID: dom.uuid, Name: dom.name, Kind: KindUndefined, Event: "CHECK", Detail: "GONE", At: now}
				if dom.undefined {
					ev = dom.undefinedEv
				}
				dst = d.report(dst, dom, TransitionUndefined, ReasonOffAtWindowEnd, StateGone, ev)
				d.forget(dom)
				return dst
			}
			return d.settleUndefine(dst, dom)
		}
	}
	d.c.ChecksInconclusive++
	if dom.checks >= d.cfg.MaxChecks {
		d.c.StopsCheckFailed++
		if err != nil {
			st = StateUnknown
		}
		dst = d.reportStop(dst, dom, ReasonStateCheckFailed, st)
		return d.settleUndefine(dst, dom)
	}
	dom.deadline = now.Add(d.cfg.RecheckInterval)
	d.timers.push(dom)
	return dst
}

// AppendResync reconciles the Debouncer with a full domain listing taken after
// events may have been lost (reconnect, hand-off overflow). Pending stops
// survive untouched (their check reads the real state anyway). For other
// domains:
//   - unknown domain: learnt, reported defined (ReasonResync, State = its
//     listed state), so consumers learn every domain exactly once; one
//     listed off is "learnt off": a STOPPED/CRASHED delivered later (the
//     stop raced the listing) opens a pending stop instead of being
//     dropped as already reported;
//   - believed alive (or unplaced), listed off: a stop begins, taking the
//     same window/check path as a STOPPED event (Cause.Event "RESYNC");
//   - believed off, listed alive: started (ReasonResync); later start
//     events are absorbed as after a check that found it alive;
//   - running <-> paused/pmsuspended changes: suspended/resumed/pmsuspended;
//   - known domain missing from the listing: a pending stop is reported
//     (ReasonUndefinedWithinWindow), then undefined (ReasonResync), and the
//     domain is forgotten. Missing domains are reported in UUID order.
//
// Listed states that place nothing (unknown, nostate, shutdown) change
// nothing.
func (d *Debouncer) AppendResync(dst []Decision, snap []DomainSnapshot, now time.Time) []Decision {
	d.now = now
	d.c.Resyncs++
	d.gen++
	for _, s := range snap {
		if s.UUID == "" {
			continue
		}
		cause := Event{UUID: s.UUID, Name: s.Name, Event: "RESYNC", Detail: s.State.String(), At: now}
		dom := d.doms[s.UUID]
		if dom == nil {
			dom = &domain{uuid: s.UUID, name: s.Name, hidx: -1}
			dom.phase, _ = phaseOf(s.State)
			dom.learnedOff = dom.phase == phaseOff
			d.doms[s.UUID] = dom
			dom.mark = d.gen
			cause.Kind = KindDefined
			dst = d.report(dst, dom, TransitionDefined, ReasonResync, s.State, cause)
			continue
		}
		dom.mark = d.gen
		if s.Name != "" && s.Name != dom.name {
			dom.name = s.Name
		}
		if dom.pending {
			continue
		}
		p, ok := phaseOf(s.State)
		if !ok || p == dom.phase {
			continue
		}
		if p == phaseOff {
			cause.Kind = KindStopped
			dst = d.beginStop(dst, dom, cause, now)
			continue
		}
		old := dom.phase
		dom.phase, dom.shutdown = p, ""
		var t Transition
		switch {
		case old == phaseUnknown:
			continue // never placed, nothing reported wrong: learn silently
		case old == phaseOff:
			t, cause.Kind = TransitionStarted, KindStarted
			dom.absorb = true
		case p == phaseRunning:
			t, cause.Kind = TransitionResumed, KindResumed
		case p == phasePaused:
			t, cause.Kind = TransitionSuspended, KindSuspended
		default:
			t, cause.Kind = TransitionPMSuspended, KindPMSuspended
		}
		dst = d.report(dst, dom, t, ReasonResync, s.State, cause)
	}
	missing := d.scratch[:0]
	for _, dom := range d.doms {
		if dom.mark != d.gen {
			missing = append(missing, dom)
		}
	}
	slices.SortFunc(missing, func(a, b *domain) int { return strings.Compare(a.uuid, b.uuid) })
	for i, dom := range missing {
		if dom.pending {
			d.c.StopsUndefined++
			dst = d.reportStop(dst, dom, ReasonUndefinedWithinWindow, StateGone)
		}
		dst = d.report(dst, dom, TransitionUndefined, ReasonResync, StateGone, Event{UUID: dom.uuid, Name: dom.name, Kind: KindUndefined, Event: "RESYNC", Detail: "missing", At: now})
		d.forget(dom)
		missing[i] = nil
	}
	d.scratch = missing[:0]
	return dst
}
