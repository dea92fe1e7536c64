package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// chooser supplies the simulation's choices (rapid draws or fuzz bytes).
type chooser interface {
	intn(label string, n int) int
}

// simulation of a compute node: domains with a real state, libvirt events
// delivered with per-domain order and arbitrary lag (or lost), and state
// checks answered with the real state at answer time. It drives a
// Debouncer the way the production loop does and checks the properties of
// doc.go on every decision.
type sim struct {
	d      *Debouncer
	c      chooser
	lossy  bool // events may be lost; checks may fail, be dropped or time out
	now    time.Time
	doms   []*simDom
	agenda []agendaItem
	seq    uint64
	bel    *belief
	rb     *rebootLedger
	buf    []Decision
	errs   []error
	// statistics
	reboots, lateStarts int
}

type simDom struct {
	uuid        string
	real        State // StateRunning, StatePaused, StateShutoff, StateGone
	busyUntil   time.Time
	lastDeliver time.Time
}

type agendaKind uint8

const (
	agDeliver agendaKind = iota
	agSetReal
	agAnswer
)

type agendaItem struct {
	at    time.Time
	seq   uint64
	kind  agendaKind
	dom   *simDom
	ev    Event
	st    State
	check uint64
	err   error
}

var errSimCheck = errors.New("sim: virDomainGetState failed")

func newSim(c chooser, cfg Config, ndom int, lossy bool) (*sim, error) {
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	s := &sim{d: d, c: c, lossy: lossy, now: t0, bel: newBelief(), rb: newRebootLedger(cfg.Window, true)}
	snap := make([]DomainSnapshot, 0, ndom)
	for i := range ndom {
		sd := &simDom{uuid: fmt.Sprintf("dom-%d", i), real: StateRunning}
		s.doms = append(s.doms, sd)
		snap = append(snap, DomainSnapshot{UUID: sd.uuid, State: StateRunning})
	}
	s.handle(s.d.AppendResync(s.buf[:0], snap, s.now))
	return s, nil
}

func (s *sim) failf(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf("t=%v: "+format, append([]any{s.now.Sub(t0)}, args...)...))
}

func (s *sim) schedule(it agendaItem) {
	s.seq++
	it.seq = s.seq
	i, _ := slices.BinarySearchFunc(s.agenda, it, func(a, b agendaItem) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return int(a.seq) - int(b.seq)
	})
	s.agenda = slices.Insert(s.agenda, i, it)
}

// emit schedules delivery of an event generated now, after lag, keeping
// per-domain order (libvirt delivers one connection's events in order).
func (s *sim) emit(sd *simDom, genAt time.Time, lag time.Duration, kind Kind, name, detail string) {
	at := genAt.Add(lag)
	if at.Before(sd.lastDeliver) {
		at = sd.lastDeliver
	}
	sd.lastDeliver = at
	s.schedule(agendaItem{at: at, kind: agDeliver, dom: sd, ev: Event{UUID: sd.uuid, Kind: kind, Event: name, Detail: detail}})
}

func (s *sim) setReal(sd *simDom, at time.Time, st State) {
	s.schedule(agendaItem{at: at, kind: agSetReal, dom: sd, st: st})
}

var (
	simOffTimes  = []time.Duration{500 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second, 14 * time.Second, 16 * time.Second, 40 * time.Second}
	simLags      = []time.Duration{0, 50 * time.Millisecond, time.Second, 5 * time.Second, 14 * time.Second, 16 * time.Second, 33 * time.Second, 90 * time.Second}
	simAdvances  = []time.Duration{0, 100 * time.Millisecond, time.Second, 5 * time.Second, 15 * time.Second, 40 * time.Second}
	simLatencies = []time.Duration{0, 10 * time.Millisecond, 500 * time.Millisecond, 3 * time.Second, 6 * time.Second}
)

// step performs one random action.
func (s *sim) step() {
	sd := s.doms[s.c.intn("domain", len(s.doms))]
	idle := !s.now.Before(sd.busyUntil)
	switch s.c.intn("action", 13) {
	case 0:
		s.advance(simAdvances[s.c.intn("advance", len(simAdvances))])
	case 1: // Nova soft or hard reboot: stop, off for a while, start
		if !idle || sd.real != StateRunning {
			return
		}
		s.reboots++
		hard := s.c.intn("hard", 2) == 1
		off := simOffTimes[s.c.intn("offtime", len(simOffTimes))]
		lag := simLags[s.c.intn("startlag", len(simLags))]
		lost := s.lossy && s.c.intn("lost", 4) == 0
		if lag > DefaultWindow {
			s.lateStarts++
		}
		if hard {
			s.emit(sd, s.now, 0, KindShutdown, "SHUTDOWN", "HOST")
			s.emit(sd, s.now, simLags[s.c.intn("stoplag", 3)], KindStopped, "STOPPED", "DESTROYED")
		} else {
			s.emit(sd, s.now, 0, KindShutdown, "SHUTDOWN", "GUEST")
			s.emit(sd, s.now, simLags[s.c.intn("stoplag", 3)], KindStopped, "STOPPED", "SHUTDOWN")
		}
		sd.real = StateShutoff
		up := s.now.Add(off)
		s.setReal(sd, up, StateRunning)
		sd.busyUntil = up
		if lost {
			return
		}
		if hard && s.c.intn("redefine", 2) == 1 {
			s.emit(sd, up, lag, KindDefined, "DEFINED", "UPDATED")
		}
		s.emit(sd, up, lag, KindResumed, "RESUMED", "UNPAUSED")
		s.emit(sd, up, lag, KindStarted, "STARTED", "BOOTED")
	case 2: // destroy
		if !idle || !sd.real.Alive() {
			return
		}
		lag := simLags[s.c.intn("lag", len(simLags))]
		sd.real = StateShutoff
		if s.lossy && s.c.intn("lost", 4) == 0 {
			return // lost: only a resync can tell
		}
		s.emit(sd, s.now, lag, KindShutdown, "SHUTDOWN", "HOST")
		s.emit(sd, s.now, lag, KindStopped, "STOPPED", "DESTROYED")
	case 3: // start
		if !idle || sd.real != StateShutoff {
			return
		}
		lag := simLags[s.c.intn("lag", len(simLags))]
		sd.real = StateRunning
		if s.lossy && s.c.intn("lost", 4) == 0 {
			return
		}
		s.emit(sd, s.now, lag, KindResumed, "RESUMED", "UNPAUSED")
		s.emit(sd, s.now, lag, KindStarted, "STARTED", "BOOTED")
	case 4: // suspend
		if !idle || sd.real != StateRunning {
			return
		}
		sd.real = StatePaused
		s.emit(sd, s.now, simLags[s.c.intn("lag", len(simLags))], KindSuspended, "SUSPENDED", "PAUSED")
	case 5: // resume
		if !idle || sd.real != StatePaused {
			return
		}
		sd.real = StateRunning
		s.emit(sd, s.now, simLags[s.c.intn("lag", len(simLags))], KindResumed, "RESUMED", "UNPAUSED")
	case 6: // guest reboot, on_reboot=restart: REBOOT events only
		if !idle || sd.real != StateRunning {
			return
		}
		lag := simLags[s.c.intn("lag", len(simLags))]
		for range 1 + s.c.intn("reboots", 3) {
			s.emit(sd, s.now, lag, KindReboot, "REBOOT", "")
		}
	case 7: // panic, on_crash=destroy
		if !idle || sd.real != StateRunning {
			return
		}
		lag := simLags[s.c.intn("lag", len(simLags))]
		s.emit(sd, s.now, lag, KindSuspended, "SUSPENDED", "PAUSED")
		s.emit(sd, s.now, lag, KindCrashed, "CRASHED", "PANICKED")
		s.emit(sd, s.now, lag, KindStopped, "STOPPED", "CRASHED")
		sd.real = StateCrashed
	case 8: // panic, on_crash=restart
		if !idle || sd.real != StateRunning {
			return
		}
		lag := simLags[s.c.intn("lag", len(simLags))]
		s.emit(sd, s.now, lag, KindSuspended, "SUSPENDED", "PAUSED")
		s.emit(sd, s.now, lag, KindCrashed, "CRASHED", "PANICKED")
		s.emit(sd, s.now, lag, KindReboot, "REBOOT", "")
		s.emit(sd, s.now, lag, KindResumed, "RESUMED", "UNPAUSED")
		s.emit(sd, s.now, lag, KindReboot, "REBOOT", "")
	case 9: // undefine
		if !idle || !sd.real.Off() || sd.real == StateGone {
			return
		}
		sd.real = StateGone
		s.emit(sd, s.now, simLags[s.c.intn("lag", len(simLags))], KindUndefined, "UNDEFINED", "REMOVED")
	case 10: // define
		if !idle || sd.real != StateGone {
			return
		}
		sd.real = StateShutoff
		s.emit(sd, s.now, simLags[s.c.intn("lag", len(simLags))], KindDefined, "DEFINED", "ADDED")
	case 11:
		s.resync()
	case 12: // a reset loop: ~10 REBOOT events/s (measured) for up to 40 s
		if !idle || sd.real != StateRunning {
			return
		}
		n := 1 + s.c.intn("resets", 400)
		lag := simLags[s.c.intn("lag", len(simLags))]
		for i := range n {
			s.emit(sd, s.now.Add(time.Duration(i)*100*time.Millisecond), lag, KindReboot, "REBOOT", "")
		}
		sd.busyUntil = s.now.Add(time.Duration(n) * 100 * time.Millisecond)
	}
}

func (s *sim) resync() {
	var snap []DomainSnapshot
	for _, sd := range s.doms {
		if sd.real != StateGone {
			snap = append(snap, DomainSnapshot{UUID: sd.uuid, State: sd.real})
		}
	}
	s.rb.resynced()
	s.handle(s.d.AppendResync(s.buf[:0], snap, s.now))
}

// advance moves the clock by dt, delivering events, firing the timer and
// answering checks in time order, as the production loop would.
func (s *sim) advance(dt time.Duration) {
	target := s.now.Add(dt)
	for {
		next, hasTimer := s.d.NextDeadline()
		if len(s.agenda) > 0 && (!hasTimer || !s.agenda[0].at.After(next)) {
			next, hasTimer = s.agenda[0].at, false
		} else if !hasTimer {
			break
		}
		if next.After(target) {
			break
		}
		if next.After(s.now) {
			s.now = next
		}
		if hasTimer {
			s.handle(s.d.AppendTick(s.buf[:0], s.now))
			continue
		}
		it := s.agenda[0]
		s.agenda = s.agenda[1:]
		switch it.kind {
		case agDeliver:
			it.ev.At = s.now
			s.rb.observed(it.ev, s.now)
			s.handle(s.d.AppendObserve(s.buf[:0], it.ev, s.now))
		case agSetReal:
			it.dom.real = it.st
		case agAnswer:
			st := it.dom.real
			out := s.d.AppendResolve(s.buf[:0], it.dom.uuid, it.check, st, it.err, s.now)
			if it.err == nil && st.Alive() {
				for _, dc := range out {
					if dc.UUID == it.dom.uuid && dc.Transition == TransitionStopped {
						s.failf("check answered %v but reported %v", st, dc)
					}
				}
			}
			s.handle(out)
		}
	}
	s.now = target
}

func (s *sim) dom(uuid string) *simDom {
	for _, sd := range s.doms {
		if sd.uuid == uuid {
			return sd
		}
	}
	return nil
}

// handle checks and performs decisions.
func (s *sim) handle(out []Decision) {
	for _, dc := range out {
		sd := s.dom(dc.UUID)
		if sd == nil {
			s.failf("decision for unknown domain: %v", dc)
			continue
		}
		if err := s.bel.apply(dc); err != nil {
			s.failf("%v", err)
		}
		if err := s.rb.apply(dc, s.now); err != nil {
			s.failf("%v", err)
		}
		switch {
		case dc.Op == OpCheckState:
			lat := simLatencies[s.c.intn("latency", 4)]
			var err error
			if s.lossy {
				switch s.c.intn("answer", 6) {
				case 0:
					continue // answer lost: must time out
				case 1:
					err = errSimCheck
				case 2:
					lat = simLatencies[4] // beyond CheckTimeout
				}
			}
			s.schedule(agendaItem{at: s.now.Add(lat), kind: agAnswer, dom: sd, check: dc.Check, err: err})
		case dc.Transition == TransitionStopped && sd.real.Alive():
			if dc.Reason == ReasonOffAtWindowEnd || !s.lossy && dc.Reason == ReasonStateCheckFailed {
				s.failf("false stop: %s is %v: %v", sd.uuid, sd.real, dc)
			}
		}
	}
	if err := s.d.checkInvariants(); err != nil {
		s.failf("invariant: %v", err)
	}
	if s.d.Len() > len(s.doms) {
		s.failf("Len %d > %d domains", s.d.Len(), len(s.doms))
	}
}

// settle delivers everything and lets every pending stop resolve.
func (s *sim) settle() {
	for range 3 {
		s.advance(5 * time.Minute)
	}
}

// consistent reports domains whose reported state differs from reality.
func (s *sim) consistent() error {
	for _, sd := range s.doms {
		off, known := s.bel.off[sd.uuid]
		switch {
		case sd.real == StateGone:
		case !known:
			return fmt.Errorf("%s is %v but unknown to the reports", sd.uuid, sd.real)
		case off != sd.real.Off():
			return fmt.Errorf("%s is %v but reports say off=%v", sd.uuid, sd.real, off)
		}
	}
	if p := s.d.Pending(); p != 0 {
		return fmt.Errorf("%d stops still pending after settling", p)
	}
	if err := s.rb.settled(); err != nil {
		return err
	}
	return nil
}
