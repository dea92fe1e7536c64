// Package watchdog is the hardware watchdog for self-fencing, split as in
// medik8s self-node-remediation: a small Device interface, a state layer
// (Watchdog: disarmed, armed, triggered, malfunction) that owns every
// decision, a thin Linux device layer (/dev/watchdog ioctls and writes) and
// a fake device that reuses the same state layer, so tests exercise the
// real logic.
//
// The state layer never reads the clock and starts no goroutines: the
// fencing loop calls Feed(now, allowed) on every iteration, with allowed =
// fencing.Agent.FeedWatchdog(now). A wedged loop therefore stops feeding
// and the host resets after the timeout; a separate ticker goroutine would
// hide exactly that failure.
package watchdog

import (
	"errors"
	"fmt"
	"time"
)

// Device is a watchdog device.
type Device interface {
	// SetTimeout sets the timeout and returns the one the device accepted
	// (drivers round it).
	SetTimeout(d time.Duration) (time.Duration, error)
	// Keepalive feeds the device.
	Keepalive() error
	// MagicClose disarms the device (writes 'V', then closes): the orderly
	// shutdown path only.
	MagicClose() error
	// Close closes without disarming: the device keeps counting down.
	Close() error
}

// State is the state of the watchdog.
type State int

// States.
const (
	// Disarmed: not armed (fencing off, or after an orderly shutdown).
	Disarmed State = iota
	// Armed: armed and fed while allowed.
	Armed
	// Triggered: feeding stopped because it was not allowed; the host will
	// reset when the device times out (unless feeding is allowed again in
	// time).
	Triggered
	// Malfunction: the device failed (arm, feed or close); say so loudly.
	Malfunction
)

var stateNames = [...]string{"disarmed", "armed", "triggered", "malfunction"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Watchdog is the state layer over a Device.
type Watchdog struct {
	dev      Device
	state    State
	timeout  time.Duration
	interval time.Duration
	lastFeed time.Time
	err      error
}

// New returns a disarmed watchdog over dev.
func New(dev Device) *Watchdog { return &Watchdog{dev: dev} }

// Arm sets the timeout and arms the watchdog; it is fed at most every
// timeout/4 after that.
func (w *Watchdog) Arm(now time.Time, timeout time.Duration) error {
	got, err := w.dev.SetTimeout(timeout)
	if err != nil {
		w.state, w.err = Malfunction, err
		return fmt.Errorf("watchdog: arm with timeout %s: %w", timeout, err)
	}
	if got > timeout {
		w.state = Malfunction
		w.err = fmt.Errorf("watchdog: device timeout %s longer than the %s asked for", got, timeout)
		return w.err
	}
	w.timeout, w.interval = got, got/4
	if err := w.dev.Keepalive(); err != nil {
		w.state, w.err = Malfunction, err
		return fmt.Errorf("watchdog: first keepalive: %w", err)
	}
	w.state, w.lastFeed = Armed, now
	return nil
}

// Timeout returns the timeout the device accepted.
func (w *Watchdog) Timeout() time.Duration { return w.timeout }

// State returns the state.
func (w *Watchdog) State() State { return w.state }

// Err returns the device error that caused Malfunction.
func (w *Watchdog) Err() error { return w.err }

// Feed feeds the device if allowed (and due), or stops feeding (Triggered)
// if not. It returns the state after the call.
func (w *Watchdog) Feed(now time.Time, allowed bool) State {
	switch w.state {
	case Disarmed, Malfunction:
		return w.state
	}
	if !allowed {
		w.state = Triggered
		return w.state
	}
	w.state = Armed
	if now.Sub(w.lastFeed) < w.interval {
		return w.state
	}
	if err := w.dev.Keepalive(); err != nil {
		w.state, w.err = Malfunction, fmt.Errorf("watchdog: keepalive: %w", err)
		return w.state
	}
	w.lastFeed = now
	return w.state
}

// Disarm disarms on orderly shutdown (magic close). A Triggered watchdog is
// NOT disarmed: the fence it backs is not complete, so the reset must come.
func (w *Watchdog) Disarm() error {
	switch w.state {
	case Triggered:
		return errors.Join(errors.New("watchdog: triggered: not disarming, the host will reset"), w.dev.Close())
	case Disarmed:
		return nil
	}
	if err := w.dev.MagicClose(); err != nil {
		w.state, w.err = Malfunction, err
		return fmt.Errorf("watchdog: magic close: %w", err)
	}
	w.state = Disarmed
	return nil
}

// Leave closes the device WITHOUT disarming it (no magic close): the
// watchdog keeps counting from its last feed and resets the host unless a
// later process feeds it. For a process that leaves while the fence it
// backs is incomplete (an orderly stop whose fence missed its deadline).
func (w *Watchdog) Leave() error {
	if w.state == Disarmed {
		return nil
	}
	w.state = Triggered
	return w.dev.Close()
}

// Fake is a fake Device with time passed in: it "fires" when not fed for
// its timeout. Tests drive it with the real Watchdog state layer.
type Fake struct {
	Timeout   time.Duration
	LastFeed  time.Time
	Armed     bool
	Closed    bool
	FailFeeds bool
	// Now is the fake's clock, set by the test before each call.
	Now time.Time
}

// SetTimeout implements Device.
func (f *Fake) SetTimeout(d time.Duration) (time.Duration, error) {
	f.Timeout, f.Armed, f.LastFeed = d, true, f.Now
	return d, nil
}

// Keepalive implements Device.
func (f *Fake) Keepalive() error {
	if f.FailFeeds {
		return errors.New("fake keepalive failure")
	}
	if f.Fired(f.Now) {
		return errors.New("fake watchdog already fired")
	}
	f.LastFeed = f.Now
	return nil
}

// MagicClose implements Device.
func (f *Fake) MagicClose() error { f.Armed, f.Closed = false, true; return nil }

// Close implements Device (stays armed).
func (f *Fake) Close() error { f.Closed = true; return nil }

// Fired reports whether the fake would have reset the host by now.
func (f *Fake) Fired(now time.Time) bool {
	return f.Armed && now.Sub(f.LastFeed) > f.Timeout
}
