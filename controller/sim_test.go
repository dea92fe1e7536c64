package controller

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"hvguard/fencing"
)

// The simulation: N hosts (agents: fencing.Agent behind an emulated shell),
// one NATS KV server (exact CAS semantics, global revisions), one
// controller (Tracker behind an emulated watcher), a peer network, and
// hardware watchdogs, advanced in real-time steps of simStep. Every clock
// runs at its own rate within the drift bound. Links can be cut per host
// and per direction; a write sent on a cut link is lost or lands late (on
// heal, like the measured 16 s late write); messages take random delays;
// agents restart (durable state kept); fences take random time.

const simStep = 100 * time.Millisecond

type domState int

const (
	domRunning domState = iota
	domPaused
	domDead
)

type simHost struct {
	name   string
	rack   int
	rate   float64
	agent  *fencing.Agent
	dur    *fencing.Durable
	doms   []domState
	dead   bool      // host reset: nothing runs any more
	downTo time.Time // agent process down until (real)
	feed   time.Time // last watchdog feed (real)

	cut, ackCut, iso int      // active link faults
	alone            int      // cut off from every peer, rack included
	late             []func() // writes held on a cut link, landing on heal

	fenceOps, resets int

	// Issue 10 (sim_stop_test.go): the host's configuration, its
	// hardware watchdog, libvirt outages and orderly stops.
	allowReset bool      // fence.allow_reset
	noWatchdog bool      // no hardware watchdog (backstop reset or none)
	wdArmed    bool      // the watchdog device is armed (counting down)
	lvDown     int       // libvirt unreachable: no listing, fence ops fail
	stopping   bool      // Stop called; the process leaves when it is done
	stopAt     time.Time // when Stop was called (real)
	stopDown   time.Duration
	stops      map[fencing.StopOutcome]int
}

type simMsg struct {
	at time.Time
	fn func()
}

type kvEntry struct {
	rev uint64
	rec fencing.LeaseRecord
	// deleted: a delete/purge marker at rev (rec: the record before).
	deleted bool
}

type sim struct {
	rnd   *rand.Rand
	now   time.Time // real time
	hosts []*simHost
	kv    map[string]kvEntry
	// declared: hosts the controller declared expired (the simulation
	// never releases them): none of their domains may ever run again.
	declared map[string]bool
	rev      uint64
	ctrl     *Tracker
	ctrlR    float64
	q        []simMsg
	events   []simEvent
	cfg      fencing.Config
	guard    fencing.Guard
	trace    []string
	errs     []string
	maxLate  time.Duration
	pLate    float64
	pSlow    float64 // share of messages slower than the renew timeout

	// Wiring mutations (sim_stop_test.go): feedAtStart arms (and so
	// feeds) the watchdog at every agent start, as the old start did;
	// disarmAlways magic-closes it on every orderly stop, whatever the
	// stop's outcome.
	feedAtStart, disarmAlways bool

	simMembership // guard publishing, growth, key deletes (sim_membership_test.go)
}

// simEvent is one scheduled fault.
type simEvent struct {
	at    time.Duration
	kind  string // cut-rack, cut-host, outage, lost-acks, restart; stop, crash-loop, libvirt-down (sim_stop_test.go); grow, guard-fail, delete-key, decommission (sim_membership_test.go)
	hosts []int
	dur   time.Duration
	up    time.Duration // crash-loop: how long each process lives
}

func (e simEvent) String() string {
	return fmt.Sprintf("%s@%s%v for %s", e.kind, e.at, e.hosts, e.dur)
}

func (s *sim) local(h *simHost) time.Time {
	return t0.Add(time.Duration(float64(s.now.Sub(t0)) * h.rate))
}

func (s *sim) ctrlNow() time.Time {
	return t0.Add(time.Duration(float64(s.now.Sub(t0)) * s.ctrlR))
}

func (s *sim) after(d time.Duration, fn func()) {
	s.q = append(s.q, simMsg{at: s.now.Add(d), fn: fn})
}

func (s *sim) delay(max time.Duration) time.Duration {
	return time.Duration(s.rnd.Int64N(int64(max) + 1))
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf("%6.1fs ", s.now.Sub(t0).Seconds())+fmt.Sprintf(format, args...))
}

func (h *simHost) agentUp(now time.Time) bool {
	return !h.dead && h.agent != nil && !now.Before(h.downTo)
}

// newSim builds a simulation; hosts are split into racks of rackSize.
func newSim(seed uint64, n, rackSize, domains int, drift float64, guard Config, events []simEvent) *sim {
	return newSimWith(seed, n, rackSize, domains, drift, guard, events, nil)
}

// newSimWith is newSim with configure applied to each host before its
// agent starts (its configuration: allow_reset, watchdog).
func newSimWith(seed uint64, n, rackSize, domains int, drift float64, guard Config, events []simEvent, configure func(h *simHost)) *sim {
	s := &sim{rnd: rand.New(rand.NewPCG(seed, 7)), now: t0, kv: map[string]kvEntry{}, declared: map[string]bool{}, events: events,
		maxLate: 20 * time.Second, pLate: 0.3}
	rate := func() float64 { return 1 + (s.rnd.Float64()*2-1)*drift }
	s.ctrlR = rate()
	s.rackSize = rackSize
	var err error
	if s.ctrl, err = NewTracker(guard); err != nil {
		panic(err)
	}
	for i := range n {
		h := &simHost{name: fmt.Sprintf("h%02d", i), rack: i / rackSize, rate: rate(), doms: make([]domState, domains)}
		if configure != nil {
			configure(h)
		}
		s.hosts = append(s.hosts, h)
		// The bucket already holds every host's record (steady state).
		s.rev++
		cfg := s.hostConfig(h)
		s.kv[h.name] = kvEntry{rev: s.rev, rec: fencing.LeaseRecord{Schema: 1, Host: h.name, BootID: "b", State: fencing.LeaseActive,
			FencingEnabled: true, Action: cfg.Action, Backstop: cfg.Backstop(), Timing: cfg.Timing}}
		s.ctrl.Observe(s.ctrlNow(), h.name, s.rev, ptr(s.kv[h.name].rec))
	}
	s.guard = s.ctrl.Guard()
	s.ctrl.GuardPublished(s.guard, nil)
	s.kvGuard = s.guard
	for _, h := range s.hosts {
		// Steady state: each agent renewed at t0.
		h.dur = &fencing.Durable{Host: h.name, BootID: "b", HaveLease: true, LastAck: t0, Incarnation: 1}
		s.startAgent(h)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func (s *sim) hostConfig(h *simHost) fencing.Config {
	c := fencing.DefaultConfig(h.name, "b")
	c.Enabled = true
	c.HardwareWatchdog = !h.noWatchdog
	c.AllowReset = h.allowReset
	c.Seed = uint64(h.rack*1000) + uint64(len(h.name))
	return c
}

func (s *sim) startAgent(h *simHost) {
	var cur *fencing.LeaseRecord
	var rev uint64
	if e, ok := s.kv[h.name]; ok && !e.deleted && h.cut == 0 && h.ackCut == 0 {
		cur, rev = ptr(e.rec), e.rev
	}
	a, r, err := fencing.NewAgent(s.hostConfig(h), h.dur, cur, rev, s.local(h))
	if err != nil {
		panic(err)
	}
	h.agent = a
	s.armIfAllowed(h, a)
	a.SetMembers(s.memberNames(), s.kvGuard)
	s.apply(h, a, r)
	if h.lvDown == 0 {
		s.apply(h, a, a.Domains(s.local(h), s.inventory(h)))
	}
}

// armIfAllowed arms (and so feeds) the hardware watchdog when the agent
// allows feeding: arming writes a keepalive, so an agent arming at every
// start would keep a crash-looping host with a lapsed lease alive
// (feedAtStart is that mutation).
func (s *sim) armIfAllowed(h *simHost, a *fencing.Agent) {
	if h.noWatchdog || h.dead {
		return
	}
	if s.feedAtStart || a.FeedWatchdog(s.local(h)) {
		h.wdArmed, h.feed = true, s.now
	}
}

func (s *sim) inventory(h *simHost) []fencing.Domain {
	var ds []fencing.Domain
	for i, d := range h.doms {
		if d != domDead {
			ds = append(ds, fencing.Domain{UUID: fmt.Sprintf("%s-d%d", h.name, i), Running: d == domRunning})
		}
	}
	return ds
}

func domIndex(uuid string) int {
	var i int
	fmt.Sscanf(uuid[strings.LastIndex(uuid, "-d")+2:], "%d", &i)
	return i
}

// deliver calls fn on agent a of h, if that process is still the one up.
func (s *sim) deliver(h *simHost, a *fencing.Agent, fn func(now time.Time) fencing.Ready) {
	if h.agent != a || !h.agentUp(s.now) {
		return
	}
	s.apply(h, a, fn(s.local(h)))
}

func (s *sim) apply(h *simHost, a *fencing.Agent, r fencing.Ready) {
	for _, tr := range r.Transitions {
		s.logf("%s %s", h.name, tr)
	}
	if r.Persist != nil {
		h.dur = r.Persist
	}
	if r.ResetHost {
		s.logf("%s RESET", h.name)
		h.resets++
		s.kill(h)
		return
	}
	for _, u := range r.Pause {
		h.fenceOps++
		i := domIndex(u)
		d := s.delay(time.Second)
		if s.rnd.IntN(20) == 0 {
			d = 8 * time.Second // a slow libvirt: the deadline may be missed
		}
		s.after(d, func() {
			if h.dead {
				return
			}
			if h.lvDown > 0 {
				s.deliver(h, a, func(now time.Time) fencing.Ready { return a.FenceDone(now, u, errLibvirtDown) })
				return
			}
			if h.doms[i] == domRunning {
				h.doms[i] = domPaused
			}
			s.deliver(h, a, func(now time.Time) fencing.Ready { return a.FenceDone(now, u, nil) })
		})
	}
	for _, u := range r.Resume {
		i := domIndex(u)
		if h.doms[i] == domPaused {
			h.doms[i] = domRunning
			s.logf("%s resume %s", h.name, u)
		}
	}
	if r.Renew != nil {
		req := *r.Renew
		s.sendRenew(h, req, func(res fencing.RenewResult) {
			s.deliver(h, a, func(now time.Time) fencing.Ready { return a.Renewed(now, req.Seq, res) })
		})
	}
	if r.AskPeers != nil {
		for _, p := range r.AskPeers.Peers {
			s.ask(h, a, *r.AskPeers, s.host(p))
		}
	}
	if r.Reconcile {
		id := r.ReconcileID
		s.after(s.delay(time.Second), func() {
			s.deliver(h, a, func(now time.Time) fencing.Ready { return a.Reconciled(now, id, nil) })
		})
	}
	if len(r.Resume) > 0 {
		s.checkSafety()
	}
}

var errLibvirtDown = fmt.Errorf("libvirt not answering")

func (s *sim) host(name string) *simHost {
	for _, h := range s.hosts {
		if h.name == name {
			return h
		}
	}
	panic(name)
}

// cas applies a compare-and-set at the server now and returns the result.
func (s *sim) cas(host string, rev uint64, rec fencing.LeaseRecord) fencing.RenewResult {
	e, ok := s.kv[host]
	if res, conflict := s.casConflict(host, rev, rec); conflict {
		return res
	}
	if ok && !e.deleted && e.rec.State == fencing.LeaseExpired && rec.State == fencing.LeaseActive {
		s.errs = append(s.errs, fmt.Sprintf("%.1fs: an active record (seq %d) overwrote %s's declaration", s.now.Sub(t0).Seconds(), rec.Seq, host))
	}
	if rec.State == fencing.LeaseExpired {
		s.declared[host] = true
	}
	s.rev++
	s.kv[host] = kvEntry{rev: s.rev, rec: rec}
	rv := s.rev
	s.after(s.delay(500*time.Millisecond), func() { s.observe(host, rv, &rec) })
	return fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: rv}
}

// observe delivers a value of host's key to the controller (rec nil: a
// delete marker).
func (s *sim) observe(host string, rev uint64, rec *fencing.LeaseRecord) {
	for _, d := range s.ctrl.Observe(s.ctrlNow(), host, rev, rec) {
		s.logf("controller %s", d)
	}
}

// sendRenew sends a CAS of req to req.Record.Host's key over h's link (h
// is the owner, or a peer relaying); reply gets the answer if it makes it
// back.
func (s *sim) sendRenew(h *simHost, req fencing.RenewRequest, reply func(fencing.RenewResult)) {
	land := func() {
		res := s.cas(req.Record.Host, req.Revision, req.Record)
		s.after(s.delay(300*time.Millisecond), func() {
			if h.cut == 0 && h.ackCut == 0 && !h.dead {
				reply(res)
			}
		})
	}
	if h.cut > 0 {
		if s.rnd.Float64() < s.pLate {
			h.late = append(h.late, land)
		}
		return
	}
	d := s.delay(300 * time.Millisecond)
	if s.rnd.Float64() < s.pSlow {
		d = 2500 * time.Millisecond // slower than the renew timeout
	}
	s.after(d, func() {
		if h.cut > 0 {
			if s.rnd.Float64() < s.pLate {
				h.late = append(h.late, land)
			}
			return
		}
		land()
	})
}

func (s *sim) reachable(a, b *simHost) bool {
	if a.dead || b.dead || a.alone > 0 || b.alone > 0 {
		return false
	}
	return a.rack == b.rack || (a.iso == 0 && b.iso == 0)
}

// ask sends a peer question from x (agent a) to p; p answers from its own
// state and relays when it can renew.
func (s *sim) ask(x *simHost, a *fencing.Agent, rd fencing.PeerRound, p *simHost) {
	if !s.reachable(x, p) {
		return
	}
	answer := func(ans fencing.PeerAnswer) {
		s.after(s.delay(300*time.Millisecond), func() {
			if s.reachable(p, x) {
				s.logf("%s answer from %s round %d: %d rev %d", x.name, p.name, rd.ID, ans.Kind, ans.Revision)
				s.deliver(x, a, func(now time.Time) fencing.Ready { return a.PeerAnswered(now, rd.ID, p.name, ans) })
			}
		})
	}
	s.after(s.delay(300*time.Millisecond), func() {
		if !p.agentUp(s.now) || !s.reachable(x, p) {
			return
		}
		st := p.agent.PeerStatus(s.local(p))
		k := st.Answer()
		if k != fencing.PeerRelayFailed {
			answer(fencing.PeerAnswer{Kind: k})
			return
		}
		done := false
		var relay func(req fencing.RenewRequest, retry bool)
		relay = func(req fencing.RenewRequest, retry bool) {
			s.sendRenew(p, req, func(res fencing.RenewResult) {
				if done {
					return
				}
				// The relay contract: a conflict with the requester's own
				// active record of the same epoch is retried once on its
				// revision (never over an expired or released record).
				if c := res.Current; res.Outcome == fencing.RenewConflict && retry && c != nil && c.RelayRetryOver(req.Record) {
					req.Revision = res.Revision
					relay(req, false)
					return
				}
				done = true
				if res.Outcome == fencing.RenewAcked {
					answer(fencing.PeerAnswer{Kind: fencing.PeerRelayed, Revision: res.Revision})
				} else {
					answer(fencing.PeerAnswer{Kind: fencing.PeerRelayFailed, Revision: res.Revision, Current: res.Current,
						KeyAbsent: res.Outcome == fencing.RenewConflict && res.Current == nil})
				}
			})
		}
		relay(rd.Renewal, true)
		s.after(fencing.DefaultRenewTimeout, func() {
			if !done {
				done = true
				answer(fencing.PeerAnswer{Kind: fencing.PeerRelayFailed})
			}
		})
	})
}

func (s *sim) kill(h *simHost) {
	h.dead = true
	for i := range h.doms {
		h.doms[i] = domDead
	}
}

// start and end of a link fault on h.
func (s *sim) fault(h *simHost, kind string, delta int) {
	switch kind {
	case "cut":
		h.cut += delta
		if h.cut == 0 {
			late := h.late
			h.late = nil
			for _, fn := range late {
				s.after(s.delay(s.maxLate), fn)
			}
		}
	case "ack":
		h.ackCut += delta
	case "iso":
		h.iso += delta
	}
}

func (s *sim) startEvent(e simEvent) {
	s.logf("EVENT %s", e)
	if s.startGlobalEvent(e) {
		return
	}
	for _, i := range e.hosts {
		h := s.hosts[i]
		switch e.kind {
		case "cut-rack":
			s.fault(h, "cut", 1)
			s.fault(h, "iso", 1)
			s.after(e.dur, func() { s.fault(h, "cut", -1); s.fault(h, "iso", -1) })
		case "cut-host":
			s.fault(h, "cut", 1)
			h.alone++
			s.after(e.dur, func() { s.fault(h, "cut", -1); h.alone-- })
		case "outage":
			s.fault(h, "cut", 1)
			s.after(e.dur, func() { s.fault(h, "cut", -1) })
		case "lost-acks":
			s.fault(h, "ack", 1)
			s.after(e.dur, func() { s.fault(h, "ack", -1) })
		case "restart":
			s.crash(h, e.dur)
		case "delete-key", "decommission":
			s.startMembershipEvent(e, h)
		default:
			s.startStopEvent(e, h)
		}
	}
}

// crash ends h's agent process without a stop (a crash, SIGKILL, OOM, or a
// hang as far as the watchdog is concerned: nothing feeds it) and starts
// it again after down.
func (s *sim) crash(h *simHost, down time.Duration) {
	if !h.dead && h.agentUp(s.now) {
		h.downTo = s.now.Add(down)
		h.agent = nil
		h.stopping = false
		s.after(down, func() {
			if !h.dead {
				s.logf("%s agent restarts", h.name)
				s.startAgent(h)
			}
		})
	}
}

// step advances the simulation by one simStep.
func (s *sim) step() {
	s.now = s.now.Add(simStep)
	for _, e := range s.events {
		if t0.Add(e.at).Equal(s.now) {
			s.startEvent(e)
		}
	}
	for {
		i := slices.IndexFunc(s.q, func(m simMsg) bool { return !m.at.After(s.now) })
		if i < 0 {
			break
		}
		m := s.q[i]
		s.q = slices.Delete(s.q, i, i+1)
		m.fn()
	}
	s.membershipStep()
	for _, h := range s.hosts {
		if h.agentUp(s.now) {
			a := h.agent
			s.apply(h, a, a.Tick(s.local(h)))
			if h.agentUp(s.now) && a.FeedWatchdog(s.local(h)) && !h.noWatchdog {
				h.wdArmed, h.feed = true, s.now
			}
			if h.agentUp(s.now) && h.stopping {
				s.stopStep(h, a)
			}
		}
		if !h.dead && h.wdArmed && time.Duration(float64(s.now.Sub(h.feed))*h.rate) > fencing.DefaultWatchdogTimeout {
			s.logf("%s WATCHDOG RESET", h.name)
			h.resets++
			s.kill(h)
		}
	}
	for _, d := range s.ctrl.Tick(s.ctrlNow()) {
		s.logf("controller %s", d)
		if d.Op == OpDeclare {
			d := d
			s.after(s.delay(300*time.Millisecond), func() {
				if res := s.cas(d.Host, d.Revision, d.Record); res.Outcome == fencing.RenewAcked {
					s.logf("controller DECLARED %s expired", d.Host)
				}
			})
		}
	}
	s.checkSafety()
}

// checkSafety: no host the controller declared expired has a domain that
// can run.
func (s *sim) checkSafety() {
	for _, h := range s.hosts {
		if !s.declared[h.name] || h.dead {
			continue
		}
		for i, d := range h.doms {
			if d == domRunning {
				s.errs = append(s.errs, fmt.Sprintf("%.1fs: %s declared expired while domain %d runs", s.now.Sub(t0).Seconds(), h.name, i))
				return
			}
		}
	}
}

func (s *sim) fenced() (ops, resets int) {
	for _, h := range s.hosts {
		ops += h.fenceOps
		resets += h.resets
	}
	return
}
