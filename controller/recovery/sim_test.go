package recovery

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// cloud is a small model of Nova, Cinder and Masakari for the core's
// tests (host names compared without case, as Nova's MariaDB does) (a fake inside a pure core's tests: the runner's tests use real
// components).
type cloud struct {
	servers    map[string]*Server
	volumes    map[string]*VolumeInfo
	migrations []Migration
	forcedDown map[string]bool
	// computeRestarted: the source's nova-compute restarted (done
	// evacuations became completed: forced_down may be cleared).
	computeRestarted bool
	// noValidHost: evacuations fail in scheduling (migration error, no
	// destination, the server stays on the source).
	noValidHost    bool
	dest           string
	nextMig        int64
	fail           map[Op][]ErrKind // injected failures, consumed in order
	calls          []string         // every mutating call, in order
	notification   map[string]string
	notifyConflict bool
	// slow: listings a migration stays accepted before it finishes.
	slow  int
	polls map[int64]int
	wall  time.Time
}

func newCloud() *cloud {
	return &cloud{servers: map[string]*Server{}, volumes: map[string]*VolumeInfo{}, forcedDown: map[string]bool{},
		dest: "node2", nextMig: 100, polls: map[int64]int{}, fail: map[Op][]ErrKind{}, notification: map[string]string{}}
}

func (c *cloud) addServer(id, status string, vols ...string) {
	c.servers[id] = &Server{ID: id, Name: "vm-" + id, Status: status, Host: "node1", VolumeBacked: len(vols) > 0, Volumes: vols}
	for _, v := range vols {
		if c.volumes[v] == nil {
			c.volumes[v] = &VolumeInfo{ID: v, Attachments: []AttachmentInfo{{ID: "att-" + v, Server: id, Host: "node1"}}}
		}
	}
}

func (c *cloud) injected(op Op) (ErrKind, bool) {
	if q := c.fail[op]; len(q) > 0 {
		c.fail[op] = q[1:]
		return q[0], true
	}
	return ErrNone, false
}

func errResult(k ErrKind, op Op) Result {
	return Result{Kind: k, Err: fmt.Sprintf("injected %d on %s", k, op)}
}

func (c *cloud) count(prefix string) int {
	n := 0
	for _, s := range c.calls {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// call performs s against the model.
func (c *cloud) call(s Step) Result {
	if k, ok := c.injected(s.Op); ok {
		if s.Mutating && k == ErrOther {
			// A timeout: the call may have landed; here it did not.
			c.calls = append(c.calls, "lost "+string(s.Op)+" "+s.Server)
		}
		return errResult(k, s.Op)
	}
	switch s.Op {
	case OpForceDown:
		c.calls = append(c.calls, "force-down "+s.NovaHost)
		c.forcedDown[strings.ToLower(s.NovaHost)] = true
	case OpClearForceDown:
		for _, m := range c.migrations {
			if strings.EqualFold(m.Source, s.NovaHost) && m.Status == "done" && !c.computeRestarted {
				return Result{Kind: ErrRefused, Err: "400 Ensure the compute service has been restarted"}
			}
		}
		c.calls = append(c.calls, "clear-force-down "+s.NovaHost)
		c.forcedDown[strings.ToLower(s.NovaHost)] = false
	case OpListServers:
		var out []Server
		for _, sv := range c.servers {
			if strings.EqualFold(sv.Host, s.NovaHost) { // MariaDB compares without case
				out = append(out, *sv)
			}
		}
		return Result{Servers: out}
	case OpVolume:
		v := c.volumes[s.Volume]
		if v == nil {
			return Result{Kind: ErrNotFound, Err: "404"}
		}
		cp := *v
		cp.Attachments = append([]AttachmentInfo(nil), v.Attachments...)
		return Result{Volume: cp}
	case OpRemoveAttachment:
		c.calls = append(c.calls, "remove-attachment "+s.Attachment)
		v := c.volumes[s.Volume]
		for i, a := range v.Attachments {
			if a.ID == s.Attachment {
				v.Attachments = append(v.Attachments[:i], v.Attachments[i+1:]...)
				return Result{}
			}
		}
		return Result{Kind: ErrNotFound, Err: "404 attachment"}
	case OpEvacuate:
		c.calls = append(c.calls, "evacuate-call "+s.Server)
		sv := c.servers[s.Server]
		if sv == nil {
			return Result{Kind: ErrNotFound, Err: "404"}
		}
		if !c.forcedDown[strings.ToLower(sv.Host)] {
			return Result{Kind: ErrRefused, Err: "400 Compute service of " + sv.Host + " is still in use"}
		}
		if sv.TaskState != "" {
			return Result{Kind: ErrConflict, Err: "409 task_state " + sv.TaskState}
		}
		c.calls = append(c.calls, "evacuate "+s.Server)
		c.nextMig++
		m := Migration{ID: c.nextMig, Instance: sv.ID, Source: sv.Host, Status: "accepted", Type: "evacuation", Created: c.wall}
		sv.TaskState = "rebuilding"
		c.migrations = append(c.migrations, m)
	case OpMigrations:
		// Evacuations progress between listings.
		for i := range c.migrations {
			m := &c.migrations[i]
			if m.Status != "accepted" {
				continue
			}
			if c.polls[m.ID]++; c.polls[m.ID] <= c.slow {
				continue
			}
			sv := c.servers[m.Instance]
			sv.TaskState = ""
			if c.noValidHost {
				m.Status = "error"
				sv.Status = "ERROR"
				continue
			}
			m.Status, m.Dest = "done", c.dest
			sv.Host = c.dest
			if sv.Status == "ERROR" {
				sv.Status = "ACTIVE"
			}
		}
		var out []Migration
		for _, m := range c.migrations {
			if strings.EqualFold(m.Source, s.NovaHost) && !m.Created.Before(s.Since) {
				out = append(out, m)
			}
		}
		return Result{Migrations: out}
	case OpServer:
		sv := c.servers[s.Server]
		if sv == nil {
			return Result{Kind: ErrNotFound, Err: "404"}
		}
		return Result{Server: *sv}
	case OpHostNotification:
		c.calls = append(c.calls, "host-notification "+s.NovaHost)
		if c.notifyConflict {
			return Result{Kind: ErrConflict, Err: "409 duplicate notification"}
		}
		c.notifyConflict = true // Masakari refuses duplicates
		id := fmt.Sprintf("n-%d", len(c.notification)+1)
		c.notification[id] = "new"
		return Result{NotificationID: id}
	case OpNotificationStatus:
		st := c.notification[s.NotificationID]
		switch st {
		case "new":
			c.notification[s.NotificationID] = "running"
		case "running":
			c.notification[s.NotificationID] = "finished"
		}
		return Result{NotificationStatus: st}
	}
	return Result{}
}

// sim drives the core like the runner does: a durable store of records
// (CAS by revision), a lease per host, the cloud, a clock.
// tb is what the simulation needs of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
}

type sim struct {
	t      tb
	cfg    Config
	core   *Core
	cloud  *cloud
	now    time.Time
	wall   time.Time
	leases map[string]*Lease
	kv     map[string]Record
	writes int
	events []Event
	// crashAfterCall: after this many mutating calls, the process dies
	// before recording the outcome (-1: never).
	crashAfterCall int
	mutating       int
	// beforeCall, if set, runs right before each mutating call (after
	// its gate); afterCall after the n-th mutating call, afterWrite after
	// the n-th write.
	beforeCall func(Step)
	afterCall  func(n int)
	afterWrite func(n int)
	// callsAt: the number of mutating calls made when an event was first
	// published.
	callsAt map[string]int
	// maxInFlight is the largest InFlight seen.
	maxInFlight int
}

var t0 = time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)

func declaredLease(host string) *Lease {
	return &Lease{Host: host, Present: true, State: LeaseExpired, Epoch: 2, Revision: 41, AgentState: "awaiting-release",
		Reason:    "no renewal for 30.6s (lease_ttl 15s + grace 15.51s) (declared by controller ctl-a, term 3)",
		SilentFor: 31 * time.Second, Due: 30510 * time.Millisecond}
}

func newSim(t tb, cfg Config) *sim {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cl := newCloud()
	cl.wall = t0
	return &sim{t: t, cfg: cfg, core: c, cloud: cl, now: time.Unix(1000, 0), wall: t0,
		leases: map[string]*Lease{"node1": declaredLease("node1")}, kv: map[string]Record{}, crashAfterCall: -1,
		callsAt: map[string]int{}}
}

func evacuateConfig() Config {
	c := DefaultConfig()
	c.Mode = ModeEvacuate
	return c
}

func (s *sim) advance(d time.Duration) {
	s.now = s.now.Add(d)
	s.wall = s.wall.Add(d)
	s.cloud.wall = s.wall
}

// restart replaces the core by a fresh one that loads the durable records
// (a restart, or a new leader).
func (s *sim) restart() {
	c, err := New(s.cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	s.core = c
	for _, r := range s.kv {
		c.Load(r)
	}
}

func (s *sim) say(evs []Event) {
	for _, e := range evs {
		s.events = append(s.events, e)
		if _, ok := s.callsAt[e.Op]; !ok {
			s.callsAt[e.Op] = s.mutating
		}
	}
}

func (s *sim) perform(st Step) (crashed bool) {
	if st.Op != OpWrite {
		s.say(st.Events)
	}
	switch st.Op {
	case OpIdle, OpWait:
		return false
	case OpWrite:
		s.kv[st.Host] = *st.Record.clone()
		s.writes++
		s.core.Written(st.Record)
		s.say(st.Events)
		if s.afterWrite != nil {
			s.afterWrite(s.writes)
		}
		return false
	}
	if st.Gate != GateNone {
		ok, alt := s.core.Gate(s.now, s.wall, st, *s.leases[st.Host])
		if !ok {
			return s.perform(alt)
		}
	}
	if st.Mutating && s.beforeCall != nil {
		s.beforeCall(st)
	}
	res := s.cloud.call(st)
	if n := s.core.InFlight(); n > s.maxInFlight {
		s.maxInFlight = n
	}
	if st.Mutating {
		s.mutating++
		if s.mutating == s.crashAfterCall {
			return true
		}
		if s.afterCall != nil {
			s.afterCall(s.mutating)
		}
	}
	return s.perform(s.core.Done(s.now, s.wall, st, res))
}

// run drives every host until nothing is left to do or limit steps; it
// returns false if the process "crashed".
func (s *sim) run(limit int) bool {
	s.t.Helper()
	for i := 0; i < limit; i++ {
		busy := false
		var next time.Time
		hosts := make([]string, 0, len(s.leases))
		for h := range s.leases {
			hosts = append(hosts, h)
		}
		sort.Strings(hosts)
		for _, h := range hosts {
			l := *s.leases[h]
			if l.Present && l.State == LeaseExpired {
				st := s.core.Start(s.now, s.wall, l, "ctl-a term 3")
				if st.Op == OpWrite {
					busy = true
				}
				if s.perform(st) {
					return false
				}
			}
			st := s.core.Next(s.now, s.wall, h, *s.leases[h])
			switch st.Op {
			case OpIdle:
				s.perform(st)
				continue
			case OpWait:
				s.perform(st)
				next = earliest(next, st.Until)
				continue
			}
			busy = true
			if s.perform(st) {
				return false
			}
		}
		if !busy {
			if next.IsZero() {
				return true
			}
			s.advance(max(next.Sub(s.now), time.Millisecond))
		}
	}
	return true
}

func (s *sim) record(host string) Record {
	s.t.Helper()
	r, ok := s.kv[host]
	if !ok {
		s.t.Fatalf("no record for %s", host)
	}
	return r
}

func (s *sim) ops() []string {
	var out []string
	for _, e := range s.events {
		out = append(out, e.Op)
	}
	return out
}

func (s *sim) hasEvent(op string) bool {
	for _, e := range s.events {
		if e.Op == op {
			return true
		}
	}
	return false
}

// back makes host's lease active again (released, renewed, reconciled).
func (s *sim) back(host string) {
	l := s.leases[host]
	l.State, l.Revision, l.AgentState = LeaseActive, l.Revision+5, AgentHealthy
}
