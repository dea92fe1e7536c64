package libvirtx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"libvirt.org/go/libvirt"

	"hvguard/lifecycle"
)

// Status is a point-in-time view of a Conn, for health checks, metrics and
// logs.
type Status struct {
	URI              string
	Connected        bool      // a session is installed and not known to be dead
	Reconnects       uint64    // successful reconnects since Dial
	Overflows        uint64    // events that could not be handed off (buffer full); each requested a resync
	EventsIn         uint64    // events received from libvirt (delivered = EventsIn - Overflows)
	LastConnectError string    // error of the last failed connect attempt ("" if none yet)
	EventLoopTick    time.Time // last heartbeat of the libvirt event loop goroutine (every 1s while healthy)

	LastLossReason string // why the connection was last lost ("" if never)
	Abandoned      uint64 // calls, connects and teardowns given up after their timeout (their goroutine was left inside libvirt)
}

// Conn is a supervised connection to one libvirt URI. It reconnects by
// itself after the connection is lost; its methods are safe for concurrent
// use.
type Conn struct {
	cfg Config
	log *slog.Logger

	events chan lifecycle.Event
	resync chan struct{}

	// sendMu orders the callbacks' sends on events against Close closing it.
	// It is held only for a non-blocking send, never across a libvirt call.
	sendMu       sync.Mutex
	sendClosed   bool
	inOverflow   bool
	burstDropped uint64

	mu          sync.Mutex
	sess        *session // nil while disconnected
	nextGen     uint64
	lastConnErr string
	lastLoss    string
	closed      bool

	pending *attempt // outstanding connect attempt; owned by Dial, then the supervisor, then Close

	wake      chan struct{} // capacity 1: a session may have died
	done      chan struct{} // closed by Close
	supDone   chan struct{} // closed when the supervisor has returned
	closeOnce sync.Once
	closeErr  error

	reconnects atomic.Uint64
	overflows  atomic.Uint64
	eventsIn   atomic.Uint64
	abandoned  atomic.Uint64
}

// session is one libvirt connection with its registrations.
type session struct {
	virt    *libvirt.Connect
	gen     uint64
	cbIDs   []int
	closeCB bool

	dead atomic.Pointer[string] // set (once) with the reason when the connection is lost

	// Guarded by Conn.mu.
	leases     int  // calls using virt right now
	retired    bool // torn down: the last lease closes virt
	virtClosed bool
}

// errClosing is returned by connect attempts interrupted by Close.
var errClosing = errors.New("libvirtx: closing")

// Dial connects to cfg.URI, bounded by cfg.ConnectTimeout and ctx, and
// registers the event callbacks. On success it starts the supervisor, which
// reconnects forever (with backoff) whenever the connection is lost, until
// Close. A failed first connect returns an error and no Conn. A nil log
// means slog.Default().
func Dial(ctx context.Context, cfg Config, log *slog.Logger) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("uri", cfg.URI)
	if err := startEventLoop(log); err != nil {
		return nil, err
	}
	c := &Conn{
		cfg:     cfg,
		log:     log,
		events:  make(chan lifecycle.Event, cfg.EventBuffer),
		resync:  make(chan struct{}, 1),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		supDone: make(chan struct{}),
	}
	s, err := c.connect(ctx)
	if err != nil {
		if c.pending != nil && c.pending.orphan(c) {
			c.abandoned.Add(1)
		}
		c.pending = nil
		c.sendMu.Lock()
		c.sendClosed = true // a late connect of the orphan must not deliver
		c.sendMu.Unlock()
		return nil, fmt.Errorf("libvirtx: dial %s: %w", cfg.URI, err)
	}
	c.mu.Lock()
	c.sess = s
	c.mu.Unlock()
	log.Info("connected to libvirt")
	go c.supervise()
	return c, nil
}

// Events returns the hand-off channel of domain events (capacity
// Config.EventBuffer). It is closed by Close.
func (c *Conn) Events() <-chan lifecycle.Event { return c.events }

// ResyncNeeded returns a channel of capacity 1 that is signalled when events
// may have been lost: an event did not fit into the hand-off buffer, or the
// connection was re-established (after every callback was registered
// again). The consumer should then call ListDomains and reconcile. It is not
// closed by Close.
func (c *Conn) ResyncNeeded() <-chan struct{} { return c.resync }

// Status returns counters and the connection state.
func (c *Conn) Status() Status {
	c.mu.Lock()
	st := Status{
		URI:              c.cfg.URI,
		Connected:        c.sess != nil && c.sess.dead.Load() == nil,
		LastConnectError: c.lastConnErr,
		LastLossReason:   c.lastLoss,
	}
	if c.sess != nil {
		if r := c.sess.dead.Load(); r != nil {
			st.LastLossReason = *r // lost, supervisor not yet reacting
		}
	}
	c.mu.Unlock()
	st.Reconnects = c.reconnects.Load()
	st.Overflows = c.overflows.Load()
	st.EventsIn = c.eventsIn.Load()
	st.Abandoned = c.abandoned.Load()
	st.EventLoopTick = eventLoopTick()
	return st
}

// Close stops the supervisor, deregisters every callback, closes the
// libvirt connection and closes the Events channel. It is idempotent; later
// calls return the first call's result. Calls made after Close fail with
// ErrNotConnected. On a hung daemon the teardown is given up after
// Config.CallTimeout (see the package doc on goroutines left behind).
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.done)
		<-c.supDone // the supervisor never touches a session after this
		c.mu.Lock()
		s := c.sess
		c.sess = nil
		c.mu.Unlock()
		if c.pending != nil {
			if c.pending.orphan(c) {
				c.abandoned.Add(1)
			}
			c.pending = nil
		}
		if s != nil {
			c.closeErr = c.dropSession(s)
		}
		c.sendMu.Lock()
		c.sendClosed = true
		close(c.events)
		c.sendMu.Unlock()
		c.log.Info("libvirt connection closed")
	})
	return c.closeErr
}

// ---- event callbacks (run on the event loop goroutine: never block) ----

func (c *Conn) onLifecycle(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventLifecycle) {
	at := time.Now()
	uuid, name := ident(d)
	kind, event, detail := mapLifecycle(int(ev.Event), ev.Detail)
	c.deliver(lifecycle.Event{UUID: uuid, Name: name, Kind: kind, Event: event, Detail: detail, At: at})
}

func (c *Conn) onReboot(_ *libvirt.Connect, d *libvirt.Domain) {
	at := time.Now()
	uuid, name := ident(d)
	c.deliver(lifecycle.Event{UUID: uuid, Name: name, Kind: lifecycle.KindReboot, Event: "REBOOT", At: at})
}

// ident copies UUID and name out of a borrowed domain. Both accessors read
// the local virDomain object; neither goes over the wire.
func ident(d *libvirt.Domain) (uuid, name string) {
	if d == nil {
		return "", ""
	}
	uuid, _ = d.GetUUIDString()
	name, _ = d.GetName()
	return strings.ToLower(uuid), name
}

// deliver hands ev to the consumer without blocking. If the buffer is full
// the event is counted as an overflow and a resync is requested; a warning
// is logged once per burst.
func (c *Conn) deliver(ev lifecycle.Event) {
	var startBurst bool
	var endedBurst uint64
	c.sendMu.Lock()
	if c.sendClosed {
		c.sendMu.Unlock()
		return
	}
	c.eventsIn.Add(1)
	select {
	case c.events <- ev:
		if c.inOverflow {
			c.inOverflow = false
			endedBurst = c.burstDropped
		}
	default:
		c.overflows.Add(1)
		c.signalResync()
		if !c.inOverflow {
			c.inOverflow = true
			c.burstDropped = 0
			startBurst = true
		}
		c.burstDropped++
	}
	c.sendMu.Unlock()
	if startBurst {
		c.log.Warn("event hand-off buffer full: events are not delivered until it drains; resync requested",
			"domain_uuid", ev.UUID, "reason", "overflow", "capacity", cap(c.events))
	}
	if endedBurst > 0 {
		c.log.Info("event hand-off buffer drained", "reason", "overflow burst over", "undelivered", endedBurst)
	}
}

func (c *Conn) signalResync() {
	select {
	case c.resync <- struct{}{}:
	default:
	}
}

// lost marks s dead (first reason wins) and wakes the supervisor. Safe on
// the event loop goroutine.
func (c *Conn) lost(s *session, reason string) {
	s.dead.CompareAndSwap(nil, &reason)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// ---- connecting ----

// attempt is one NewConnect+setup running in its own goroutine, so that a
// NewConnect blocked by a hung daemon never blocks the supervisor.
type attempt struct {
	finished chan struct{}

	mu       sync.Mutex
	done     bool
	orphaned bool
	sess     *session
	err      error
}

func (c *Conn) startAttempt() *attempt {
	a := &attempt{finished: make(chan struct{})}
	go func() {
		s, err := c.open()
		a.mu.Lock()
		a.done, a.sess, a.err = true, s, err
		orphan := a.orphaned
		a.mu.Unlock()
		close(a.finished)
		if orphan && s != nil {
			c.log.Info("abandoned libvirt connect finished late; closing it")
			_ = c.teardown(s)
		}
	}()
	return a
}

// orphan gives the attempt up: its session is torn down when (or, if it has
// already finished, as soon as) it is there. It reports whether the attempt
// is still blocked inside libvirt.
func (a *attempt) orphan(c *Conn) (stillRunning bool) {
	a.mu.Lock()
	if !a.done {
		a.orphaned = true
		a.mu.Unlock()
		return true
	}
	s := a.sess
	a.sess = nil
	a.mu.Unlock()
	if s != nil {
		_ = c.teardown(s)
	}
	return false
}

// connect waits for a connect attempt, bounded by ConnectTimeout, ctx and
// Close. An attempt still blocked at the timeout is kept pending and waited
// for again by the next call, so at most one NewConnect is outstanding.
func (c *Conn) connect(ctx context.Context) (*session, error) {
	if c.pending == nil {
		c.pending = c.startAttempt()
	}
	a := c.pending
	t := time.NewTimer(c.cfg.ConnectTimeout)
	defer t.Stop()
	select {
	case <-a.finished:
		c.pending = nil
		return a.sess, a.err
	case <-t.C:
		return nil, fmt.Errorf("connect: no answer within %v (NewConnect still blocked; is libvirtd hung?)", c.cfg.ConnectTimeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("connect: %w", ctx.Err())
	case <-c.done:
		return nil, errClosing
	}
}

// open runs in an attempt goroutine: NewConnect, keepalive, close callback
// and event callbacks. On error nothing is left open.
func (c *Conn) open() (*session, error) {
	v, err := libvirt.NewConnect(c.cfg.URI)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	c.mu.Lock()
	c.nextGen++
	s := &session{virt: v, gen: c.nextGen}
	c.mu.Unlock()

	if !inProcess(c.cfg.URI) {
		// Needs the event loop running; detects a hung daemon (close reason
		// KEEPALIVE after about interval*(count+1)).
		if err := v.SetKeepAlive(int(c.cfg.KeepAliveInterval/time.Second), c.cfg.KeepAliveCount); err != nil {
			c.log.Warn("keepalive not enabled: a hung libvirtd will not be detected", "reason", err.Error())
		}
	}
	if err := v.RegisterCloseCallback(func(_ *libvirt.Connect, r libvirt.ConnectCloseReason) {
		c.lost(s, closeReasonName(int(r)))
	}); err != nil {
		c.log.Warn("close callback not registered", "reason", err.Error())
	} else {
		s.closeCB = true
	}
	id, err := v.DomainEventLifecycleRegister(nil, c.onLifecycle)
	if err != nil {
		_ = c.teardown(s)
		return nil, fmt.Errorf("register lifecycle event callback: %w", err)
	}
	s.cbIDs = append(s.cbIDs, id)
	id, err = v.DomainEventRebootRegister(nil, c.onReboot)
	if err != nil {
		_ = c.teardown(s)
		return nil, fmt.Errorf("register reboot event callback: %w", err)
	}
	s.cbIDs = append(s.cbIDs, id)
	return s, nil
}

// teardown deregisters s's callbacks and its close callback and retires it:
// its connection is closed now, or by the last call still using it.
// Deregistration errors on a dead connection are expected and only logged.
func (c *Conn) teardown(s *session) error {
	for _, id := range s.cbIDs {
		if err := s.virt.DomainEventDeregister(id); err != nil {
			c.log.Debug("deregister event callback", "reason", err.Error())
		}
	}
	s.cbIDs = nil
	if s.closeCB {
		if err := s.virt.UnregisterCloseCallback(); err != nil {
			c.log.Debug("unregister close callback", "reason", err.Error())
		}
		s.closeCB = false
	}
	c.mu.Lock()
	s.retired = true
	closeNow := s.leases == 0 && !s.virtClosed
	if closeNow {
		s.virtClosed = true
	}
	c.mu.Unlock()
	if closeNow {
		if _, err := s.virt.Close(); err != nil {
			return fmt.Errorf("libvirtx: close connection: %w", err)
		}
	}
	return nil
}

// dropSession uninstalls s (if installed) and tears it down, giving up
// after CallTimeout if libvirt does not answer.
func (c *Conn) dropSession(s *session) error {
	c.mu.Lock()
	if c.sess == s {
		c.sess = nil
	}
	c.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- c.teardown(s) }()
	t := time.NewTimer(c.cfg.CallTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		c.abandoned.Add(1)
		c.log.Warn("teardown of libvirt connection abandoned", "reason", fmt.Sprintf("no answer within %v", c.cfg.CallTimeout))
		return fmt.Errorf("libvirtx: teardown: no answer within %v", c.cfg.CallTimeout)
	}
}

// ---- supervision ----

func (c *Conn) supervise() {
	defer close(c.supDone)
	var tick <-chan time.Time
	if !inProcess(c.cfg.URI) {
		// Backup for the close callback: IsAlive is answered locally.
		t := time.NewTicker(c.cfg.KeepAliveInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		case <-tick:
			c.checkAlive()
		}
		c.mu.Lock()
		s := c.sess
		c.mu.Unlock()
		if s == nil {
			continue
		}
		reason := s.dead.Load()
		if reason == nil {
			continue
		}
		c.mu.Lock()
		c.lastLoss = *reason
		c.mu.Unlock()
		c.log.Warn("libvirt connection lost; reconnecting", "reason", *reason)
		if err := c.dropSession(s); err != nil {
			c.log.Debug("teardown of lost connection", "reason", err.Error())
		}
		if !c.reconnect() {
			return
		}
	}
}

// checkAlive asks libvirt whether the installed session's transport is
// still open.
func (c *Conn) checkAlive() {
	s, err := c.acquire()
	if err != nil {
		return
	}
	alive, err := boundedCall(c, context.Background(), s, func(v *libvirt.Connect) (bool, error) { return v.IsAlive() })
	if err == nil && !alive {
		c.lost(s, "IsAlive reports the connection closed")
	}
}

// reconnect retries until a session is installed (true) or Close (false).
func (c *Conn) reconnect() bool {
	for n := 0; ; n++ {
		s, err := c.connect(context.Background())
		if errors.Is(err, errClosing) {
			return false
		}
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				_ = c.teardown(s)
				return false
			}
			c.sess = s
			c.mu.Unlock()
			c.reconnects.Add(1)
			c.log.Info("reconnected to libvirt; callbacks registered again, resync requested", "reason", "reconnect", "attempts", n+1)
			c.signalResync()
			if s.dead.Load() != nil { // lost again already: go round once more
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
			return true
		}
		c.mu.Lock()
		c.lastConnErr = err.Error()
		c.mu.Unlock()
		d := backoffDelay(n, c.cfg.ReconnectMin, c.cfg.ReconnectMax, rand.Int64N)
		c.log.Warn("reconnect failed", "reason", err.Error(), "attempt", n+1, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return false
		}
	}
}

// backoffDelay returns the wait before retry number attempt+1: min doubled
// per attempt, capped at max, with "equal jitter" (a uniformly random value
// in [d/2, d]). randN(n) must return a value in [0, n).
func backoffDelay(attempt int, min, max time.Duration, randN func(int64) int64) time.Duration {
	d := min
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + time.Duration(randN(int64(d-half)+1))
}
