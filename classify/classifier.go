package classify

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config bounds the classification. Zero fields take the defaults.
type Config struct {
	// QueryTimeout: a Nova query not answered within it counts as failed
	// (nova-slow). Measured: servers/detail 0.1–1 s on a busy 2-core host,
	// up to 5.1 s (nova-api's own request time) during make e2e's storm at
	// load 43–46.
	QueryTimeout time.Duration
	// CacheTTL: a servers listing this young (and requested after the stop
	// began) classifies a stop without a new query, so stops whose windows
	// end together share one request.
	CacheTTL time.Duration
	// PollInterval: how often held stops are re-queried (one listing for
	// all of them).
	PollInterval time.Duration
	// MaxHold: the longest a stop is held for an operation in flight, from
	// the first view that explained it; then it is reported held-too-long.
	// Nova's reboots kept domains off up to 51 s under load (30 guests,
	// 2 cores).
	MaxHold time.Duration
	// NovaLostAfter: a held stop without a successful Nova view for this
	// long is reported unknown (nova-lost-while-held).
	NovaLostAfter time.Duration
	// RetryBackoff: after a failed or timed-out servers query, stops that
	// need a first view are reported unknown at once, without a query, for
	// this long (Nova down must not cost every stop a timeout).
	RetryBackoff time.Duration
	// ClockSkew: tolerance between Nova's clock (action start_time) and
	// this host's (when the stop began). A user's stop request precedes the
	// guest's shutdown; Nova's own reaction comes after its 15 s lifecycle
	// delay, so anything below ~10 s separates them.
	ClockSkew time.Duration
}

// Defaults.
const (
	// DefaultQueryTimeout is twice the slowest servers/detail seen during
	// the storm (5.1 s in nova-api's log, make e2e, load 43–46). At 3 s
	// (until 2026-12-02) 8 of 81 Nova reboots in that storm timed out and
	// were reported as unknown stops. Only a stop whose window ends while
	// Nova is that slow waits longer; with Nova answering, the report
	// comes with its answer.
	DefaultQueryTimeout  = 10 * time.Second
	DefaultCacheTTL      = time.Second
	DefaultPollInterval  = 2 * time.Second
	DefaultMaxHold       = 5 * time.Minute
	DefaultNovaLostAfter = 30 * time.Second
	DefaultRetryBackoff  = 5 * time.Second
	DefaultClockSkew     = 5 * time.Second
)

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{QueryTimeout: DefaultQueryTimeout, CacheTTL: DefaultCacheTTL, PollInterval: DefaultPollInterval,
		MaxHold: DefaultMaxHold, NovaLostAfter: DefaultNovaLostAfter, RetryBackoff: DefaultRetryBackoff, ClockSkew: DefaultClockSkew}
}

func (c *Config) fill() error {
	d := DefaultConfig()
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
		n   string
	}{
		{&c.QueryTimeout, d.QueryTimeout, "query_timeout"}, {&c.CacheTTL, d.CacheTTL, "cache_ttl"},
		{&c.PollInterval, d.PollInterval, "poll_interval"}, {&c.MaxHold, d.MaxHold, "max_hold"},
		{&c.NovaLostAfter, d.NovaLostAfter, "nova_lost_after"}, {&c.RetryBackoff, d.RetryBackoff, "retry_backoff"},
		{&c.ClockSkew, d.ClockSkew, "clock_skew"},
	} {
		if *f.v < 0 {
			return fmt.Errorf("classify: config %s=%v: must not be negative", f.n, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.NovaLostAfter < c.QueryTimeout {
		return fmt.Errorf("classify: config nova_lost_after=%v: must be at least query_timeout=%v", c.NovaLostAfter, c.QueryTimeout)
	}
	return nil
}

// Stop is a stop whose debounce window ended with the domain really off.
type Stop struct {
	UUID   string
	Detail Detail
	// Began is when the stop began (the STOPPED event's delivery). A Nova
	// view is used for the stop only if it was requested at or after
	// Began: Nova records an operation's task_state before it touches the
	// domain, so such a view shows any operation that caused the stop.
	Began time.Time
}

type phase uint8

const (
	phaseView    phase = iota + 1 // waiting for a servers listing
	phaseActions                  // waiting for its instance actions
	phaseHeld                     // an operation explains it
)

type verdict uint8

const (
	verdictNone         verdict = iota
	verdictRequest              // a user's stop request preceded the stop
	verdictNotRequested         // Nova's own stop, or a request after the stop
)

type pending struct {
	Stop
	added     time.Time
	phase     phase
	query     uint64 // servers listing waited for (0: none yet)
	actQuery  uint64 // actions query in flight (phaseActions)
	actSent   time.Time
	verdict   verdict
	view      Server // last view used
	viewed    bool
	lastView  time.Time // when that view was answered
	task      TaskState // explaining operation (held)
	everHeld  bool      // an operation explained it at some view
	heldSince time.Time
	nextPoll  time.Time
}

// Classifier classifies stops from Nova's view. It is a pure state machine
// in the style of lifecycle.Debouncer: it never reads the clock (now is
// passed in), performs no I/O and is driven by one goroutine. Every method
// returns the decisions to carry out, in order; queries are carried out by
// the caller, off the event path, and answered with ServersResult and
// ActionsResult. Arm one timer from NextDeadline and call Tick when it
// fires.
type Classifier struct {
	cfg   Config
	stops map[string]*pending

	token uint64

	// the servers listing in flight
	inflight     uint64
	inflightSent time.Time

	// the last successful listing
	cache      map[string]Server
	cacheAsked time.Time // when it was requested
	cacheAt    time.Time // when it was answered
	cacheOK    bool

	downUntil time.Time // after a failed listing: first views are not tried before

	out []Decision
	c   Counters
}

// New returns a Classifier.
func New(cfg Config) (*Classifier, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Classifier{cfg: cfg, stops: make(map[string]*pending),
		c: Counters{Reports: make(map[Classification]uint64, 4)}}, nil
}

// Config returns the configuration in use (defaults filled in).
func (c *Classifier) Config() Config { return c.cfg }

// Counters returns a copy of the counters.
func (c *Classifier) Counters() Counters {
	out := c.c
	out.Reports = make(map[Classification]uint64, len(c.c.Reports))
	for k, v := range c.c.Reports {
		out.Reports[k] = v
	}
	out.Pending = len(c.stops)
	for _, p := range c.stops {
		if p.everHeld {
			out.Held++
		}
	}
	return out
}

// Pending returns the number of stops being classified.
func (c *Classifier) Pending() int { return len(c.stops) }

// Classifying reports whether a stop of uuid is being classified (waiting
// for Nova or held): the caller keeps that domain's later reports back
// until its Report, to keep per-domain order.
func (c *Classifier) Classifying(uuid string) bool { _, ok := c.stops[uuid]; return ok }

// Add hands over a stop whose window ended with the domain off. A stop of
// a domain already being classified is ignored (the debouncer reports a
// stop once until the domain is alive again, see Alive).
func (c *Classifier) Add(s Stop, now time.Time) []Decision {
	c.out = c.out[:0]
	c.c.Added++
	if _, dup := c.stops[s.UUID]; dup || s.UUID == "" {
		c.c.Duplicate++
		return c.out
	}
	c.stops[s.UUID] = &pending{Stop: s, added: now, phase: phaseView}
	c.step(now)
	return c.out
}

// Alive tells the classifier that libvirt shows the domain alive again
// (a start, resume or reboot event, or a state check): a stop being
// classified is reported rebooted at once.
func (c *Classifier) Alive(uuid string, now time.Time) []Decision {
	c.out = c.out[:0]
	if p, ok := c.stops[uuid]; ok {
		r := ReasonStartedBeforeClassified
		if p.everHeld {
			r = ReasonStartedDuringOperation
		}
		c.report(p, Rebooted, r, now)
	}
	c.step(now)
	return c.out
}

// Drain reports every stop still being classified as unknown with reason
// agent-stopping, in deterministic order, and forgets them: the caller is
// shutting down and must not lose a stop it was holding. Queries in flight
// are abandoned (their answers are stale).
func (c *Classifier) Drain(now time.Time) []Decision {
	c.out = c.out[:0]
	for _, p := range c.sorted() {
		c.report(p, Unknown, ReasonAgentStopping, now)
	}
	c.inflight = 0
	return c.out
}

// Tick advances time: timeouts, polls of held stops, bounds.
func (c *Classifier) Tick(now time.Time) []Decision {
	c.out = c.out[:0]
	c.step(now)
	return c.out
}

// ErrNovaSlow may be passed to ServersResult/ActionsResult by a caller
// whose own deadline cut the query short; any error does.
var ErrNovaSlow = errors.New("classify: nova did not answer in time")

// ServersResult answers an OpQueryServers: servers is every instance Nova
// places on this host; err non-nil if the query failed (servers ignored).
// An answer with another token than the query in flight is ignored.
func (c *Classifier) ServersResult(token uint64, servers []Server, err error, now time.Time) []Decision {
	c.out = c.out[:0]
	if token == 0 || token != c.inflight {
		c.c.StaleAnswers++
		c.step(now)
		return c.out
	}
	sent := c.inflightSent
	c.inflight = 0
	if err != nil {
		c.c.QueryFailures++
		r := ReasonNovaUnavailable
		if errors.Is(err, ErrNovaSlow) {
			r = ReasonNovaSlow
		}
		c.listingFailed(token, r, now)
	} else {
		m := make(map[string]Server, len(servers))
		for _, s := range servers {
			m[s.UUID] = s
		}
		c.cache, c.cacheAsked, c.cacheAt, c.cacheOK = m, sent, now, true
		for _, p := range c.sorted() {
			if p.query == token {
				p.query = 0
				c.judge(p, now)
			}
		}
	}
	c.step(now)
	return c.out
}

// ActionsResult answers an OpQueryActions for uuid: the instance's actions
// (any order; a few of the newest suffice), or err if the query failed.
func (c *Classifier) ActionsResult(token uint64, uuid string, actions []Action, err error, now time.Time) []Decision {
	c.out = c.out[:0]
	p, ok := c.stops[uuid]
	if !ok || token == 0 || p.phase != phaseActions || p.actQuery != token {
		c.c.StaleAnswers++
		c.step(now)
		return c.out
	}
	p.actQuery = 0
	if err != nil {
		c.c.QueryFailures++
		r := ReasonNovaUnavailable
		if errors.Is(err, ErrNovaSlow) {
			r = ReasonNovaSlow
		}
		c.report(p, Unknown, r, now)
		c.step(now)
		return c.out
	}
	p.verdict = c.judgeActions(p, actions)
	p.phase = phaseView
	c.decide(p, now)
	c.step(now)
	return c.out
}

// judgeActions decides whether a user's stop request preceded the stop:
// the newest "stop" action was requested by a user (Nova's own sync has
// none) no later than Began + ClockSkew.
func (c *Classifier) judgeActions(p *pending, actions []Action) verdict {
	var newest *Action
	for i := range actions {
		a := &actions[i]
		if a.Name == ActionStop && (newest == nil || a.Start.After(newest.Start)) {
			newest = a
		}
	}
	if newest != nil && newest.UserID != "" && !newest.Start.After(p.Began.Add(c.cfg.ClockSkew)) {
		return verdictRequest
	}
	return verdictNotRequested
}

// NextDeadline returns when Tick must next be called, if anything waits on
// time.
func (c *Classifier) NextDeadline() (time.Time, bool) {
	var next time.Time
	ok := false
	at := func(t time.Time) {
		if !ok || t.Before(next) {
			next, ok = t, true
		}
	}
	if c.inflight != 0 {
		at(c.inflightSent.Add(c.cfg.QueryTimeout))
	}
	for _, p := range c.stops {
		if p.everHeld {
			at(p.heldSince.Add(c.cfg.MaxHold))
		}
		switch p.phase {
		case phaseActions:
			at(p.actSent.Add(c.cfg.QueryTimeout))
		case phaseHeld:
			at(p.lastView.Add(c.cfg.NovaLostAfter))
			if p.query == 0 {
				at(maxTime(p.nextPoll, c.downUntil))
			}
		case phaseView:
			if p.query == 0 && c.inflight == 0 {
				at(p.added) // due now (normally handled within the same call)
			}
		}
	}
	return next, ok
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// step applies timeouts and bounds, then plans the next listing.
func (c *Classifier) step(now time.Time) {
	// A listing not answered in time fails as slow.
	if c.inflight != 0 && !now.Before(c.inflightSent.Add(c.cfg.QueryTimeout)) {
		tok := c.inflight
		c.inflight = 0
		c.c.QueryTimeouts++
		c.listingFailed(tok, ReasonNovaSlow, now)
	}
	for _, p := range c.sorted() {
		switch {
		case p.everHeld && !now.Before(p.heldSince.Add(c.cfg.MaxHold)):
			c.c.HeldTooLong++
			c.report(p, StoppedByNova, ReasonHeldTooLong, now)
		case p.phase == phaseActions && !now.Before(p.actSent.Add(c.cfg.QueryTimeout)):
			c.c.QueryTimeouts++
			c.report(p, Unknown, ReasonNovaSlow, now)
		case p.phase == phaseHeld && !now.Before(p.lastView.Add(c.cfg.NovaLostAfter)):
			c.report(p, Unknown, ReasonNovaLost, now)
		}
	}
	c.plan(now)
}

// plan is the batch planner: every stop needing a view either uses the
// cached listing (young enough, requested after the stop began), waits for
// the listing in flight (requested after it began), is reported unknown
// while Nova is backing off, or joins one new listing.
func (c *Classifier) plan(now time.Time) {
	need := false
	for _, p := range c.sorted() {
		if p.query != 0 {
			continue
		}
		switch p.phase {
		case phaseView:
			if c.cacheOK && !c.cacheAsked.Before(p.Began) && now.Sub(c.cacheAt) <= c.cfg.CacheTTL {
				c.c.FromCache++
				c.judge(p, now)
				continue
			}
			if c.inflight != 0 {
				if !c.inflightSent.Before(p.Began) {
					p.query = c.inflight
				}
				continue // else: the next listing
			}
			if now.Before(c.downUntil) {
				c.report(p, Unknown, ReasonNovaUnavailable, now)
				continue
			}
			need = true
		case phaseHeld:
			if now.Before(p.nextPoll) || now.Before(c.downUntil) {
				continue
			}
			if c.inflight != 0 {
				if !c.inflightSent.Before(p.lastView) {
					p.query = c.inflight
				}
				continue
			}
			need = true
		}
	}
	if !need || c.inflight != 0 {
		return
	}
	c.token++
	c.inflight, c.inflightSent = c.token, now
	c.c.ServerQueries++
	c.out = append(c.out, Decision{Op: OpQueryServers, Token: c.token})
	// Held stops due within half a poll interval join this listing early,
	// so the polls of stops held at slightly different times align.
	early := now.Add(c.cfg.PollInterval / 2)
	for _, p := range c.sorted() {
		if p.query != 0 {
			continue
		}
		if (p.phase == phaseView) || (p.phase == phaseHeld && !early.Before(p.nextPoll)) {
			p.query = c.token
		}
	}
}

// listingFailed ends the waits on listing tok: first views are reported
// unknown; held stops keep holding (bounded by NovaLostAfter and MaxHold)
// and are polled again after the backoff.
func (c *Classifier) listingFailed(tok uint64, r Reason, now time.Time) {
	c.downUntil = now.Add(c.cfg.RetryBackoff)
	for _, p := range c.sorted() {
		if p.query != tok {
			continue
		}
		p.query = 0
		switch p.phase {
		case phaseView:
			c.report(p, Unknown, r, now)
		case phaseHeld:
			p.nextPoll = now.Add(c.cfg.PollInterval)
		}
	}
}

// judge classifies p from the cached listing.
func (c *Classifier) judge(p *pending, now time.Time) {
	s, ok := c.cache[p.UUID]
	p.viewed, p.lastView = true, now
	if !ok {
		p.view = Server{UUID: p.UUID}
		c.report(p, StoppedByNova, ReasonNotOnHost, now)
		return
	}
	p.view = s
	c.decide(p, now)
}

// decide applies the classification table (docs/classification.md) to
// p.view.
func (c *Classifier) decide(p *pending, now time.Time) {
	s := p.view
	if s.TaskState.Explains() {
		if s.TaskState == TaskPoweringOff {
			// Nova's power-state sync sets powering-off when it reacts to
			// an unexpected stop: only a user's earlier request explains.
			switch p.verdict {
			case verdictNone:
				c.askActions(p, now)
				return
			case verdictNotRequested:
				c.report(p, StoppedUnexpectedly, ReasonNovaSyncedStop, now)
				return
			}
		}
		c.hold(p, s.TaskState, now)
		return
	}
	held := p.everHeld
	switch s.VMState {
	case VMActive:
		switch {
		case held && s.PowerState == PowerRunning:
			c.report(p, Rebooted, ReasonOperationCompleted, now)
		case held:
			c.report(p, StoppedUnexpectedly, ReasonOperationLeftDomainOff, now)
		default:
			c.report(p, StoppedUnexpectedly, ReasonNoOperation, now)
		}
	case VMStopped:
		switch p.verdict {
		case verdictNone:
			c.askActions(p, now)
		case verdictRequest:
			c.report(p, StoppedByNova, ReasonStopRequested, now)
		default:
			c.report(p, StoppedUnexpectedly, ReasonNovaSyncedStop, now)
		}
	case VMShelved, VMShelvedOffloaded, VMSuspended, VMSoftDeleted, VMDeleted, VMResized:
		c.report(p, StoppedByNova, ReasonNovaVMState, now)
	case VMBuilding:
		c.hold(p, s.TaskState, now)
	case VMError:
		c.report(p, StoppedUnexpectedly, ReasonNovaError, now)
	default:
		c.report(p, StoppedUnexpectedly, ReasonVMStateMismatch, now)
	}
}

func (c *Classifier) askActions(p *pending, now time.Time) {
	c.token++
	p.phase, p.actQuery, p.actSent = phaseActions, c.token, now
	c.c.ActionQueries++
	c.out = append(c.out, Decision{Op: OpQueryActions, UUID: p.UUID, Token: c.token})
}

func (c *Classifier) hold(p *pending, task TaskState, now time.Time) {
	first := !p.everHeld
	if first {
		p.everHeld, p.heldSince = true, now
		c.c.Holds++
	}
	p.phase = phaseHeld
	if first || (task != p.task && task != TaskNone) {
		p.task = task
		c.out = append(c.out, Decision{Op: OpHold, UUID: p.UUID, Reason: ReasonOperationInFlight, Detail: p.Detail,
			Began: p.Began, Task: task, VMState: p.view.VMState})
	}
	p.nextPoll = now.Add(c.cfg.PollInterval)
}

func (c *Classifier) report(p *pending, cl Classification, r Reason, now time.Time) {
	d := Decision{Op: OpReport, UUID: p.UUID, Classification: cl, Reason: r, Detail: p.Detail, Began: p.Began,
		Task: p.task, Held: now.Sub(p.added)}
	if p.viewed {
		d.VMState = p.view.VMState
	}
	c.c.Reports[cl]++
	c.out = append(c.out, d)
	delete(c.stops, p.UUID)
}

// sorted returns the pending stops in a deterministic order (by when they
// began, then uuid), so decisions do not depend on map order.
func (c *Classifier) sorted() []*pending {
	ps := make([]*pending, 0, len(c.stops))
	for _, p := range c.stops {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *pending) int {
		if c := a.Began.Compare(b.Began); c != 0 {
			return c
		}
		return strings.Compare(a.UUID, b.UUID)
	})
	return ps
}
