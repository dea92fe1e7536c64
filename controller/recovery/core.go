package recovery

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Server is what the runner reads of a server from Nova.
type Server struct {
	ID, Name, Status, TaskState string
	// Host is the server's compute host ("" when none).
	Host         string
	VolumeBacked bool
	// Volumes are the ids of the volumes attached to it.
	Volumes []string
}

// VolumeInfo is what the runner reads of a volume from Cinder.
type VolumeInfo struct {
	ID          string
	Multiattach bool
	Attachments []AttachmentInfo
}

// AttachmentInfo is one attachment of a volume.
type AttachmentInfo struct{ ID, Server, Host string }

// Migration is one of Nova's migrations (evacuations) from the host.
type Migration struct {
	ID                     int64
	Instance, Source, Dest string
	Status, Type           string
	Created                time.Time
}

// Op is the kind of a Step.
type Op string

// Steps.
const (
	// OpIdle: nothing to do for the host now.
	OpIdle Op = "idle"
	// OpWait: nothing before Until (Reason says why).
	OpWait Op = "wait"
	// OpWrite: write Record by CAS (only the leader; MayAct right before),
	// then tell the core with Written; publish Events once it landed.
	OpWrite Op = "write"
	// Calls: perform against OpenStack, tell the core with Done.
	OpForceDown          Op = "force-down"
	OpListServers        Op = "list-servers"
	OpVolume             Op = "volume"
	OpRemoveAttachment   Op = "remove-attachment"
	OpEvacuate           Op = "evacuate"
	OpMigrations         Op = "migrations"
	OpServer             Op = "server"
	OpHostNotification   Op = "host-notification"
	OpNotificationStatus Op = "notification-status"
	OpClearForceDown     Op = "clear-force-down"
)

// Gate is what the runner must confirm on a fresh read of the lease key
// right before a call (Core.Gate).
type Gate int

// Gates.
const (
	GateNone Gate = iota
	// GateDeclared: destructive; the declaration must still stand (Check).
	GateDeclared
	// GateBack: the host must be back (lease active, agent healthy).
	GateBack
)

// Step is the core's next decision for one host.
type Step struct {
	Op   Op
	Host string
	// Record: OpWrite's new record.
	Record *Record
	// Call arguments.
	NovaHost, Server, Volume, Attachment, NotificationID string
	// Since: OpMigrations (wall clock).
	Since time.Time
	// Gate: re-read the lease and pass Core.Gate right before the call;
	// Mutating: ask MayAct right before the call.
	Gate     Gate
	Mutating bool
	// Precheck: OpServer reads the server right before its evacuation
	// (it must still be on the declared host, no task in flight).
	Precheck bool
	// Until: OpWait.
	Until  time.Time
	Reason string
	// Events to publish once the step was carried out (OpWrite: once it
	// landed; OpWait/OpIdle: at once, by the leader).
	Events []Event
}

// ErrKind classifies a failed call.
type ErrKind int

// Error kinds.
const (
	ErrNone ErrKind = iota
	// ErrNotFound: 404.
	ErrNotFound
	// ErrConflict: 409 (a server busy in another task, a duplicate
	// Masakari notification).
	ErrConflict
	// ErrRefused: 400 and other refusals (Nova refusing to clear
	// forced_down while done evacuations exist; NoValidHost).
	ErrRefused
	// ErrOther: anything else, timeouts included (the outcome of a
	// mutating call is unknown).
	ErrOther
)

// Result is a call's outcome.
type Result struct {
	Kind       ErrKind
	Err        string
	Servers    []Server
	Server     Server
	Volume     VolumeInfo
	Migrations []Migration
	// NotificationID and NotificationStatus: Masakari.
	NotificationID, NotificationStatus string
}

// Event is a progress event (published on the controller's recovery
// subject, logged, counted).
type Event struct {
	Host     string `json:"host"`
	Op       string `json:"op"`
	Phase    Phase  `json:"phase,omitempty"`
	Instance string `json:"instance,omitempty"`
	Why      Why    `json:"why,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Error    string `json:"error,omitempty"`
}

// memory is what the core keeps of a host between steps, not durable: a
// restart or a new leader starts it afresh (and re-derives what it needs
// from the record and OpenStack).
type memory struct {
	// own: keys whose intent this process wrote (the call may be made).
	own map[string]bool
	// retryAt: backoff per key.
	retryAt map[string]time.Time
	// verify: instances whose migration is done; the server is checked.
	verify map[string]bool
	// requested: when (core clock) an evacuation was seen requested.
	requested map[string]time.Time
	// onHost: when (core clock) a server was read on the declared host
	// with no task, right before its evacuation (Precheck).
	onHost   map[string]time.Time
	slowSaid map[string]bool
	failed   map[string]int
	nextPoll time.Time
	// until: no step before it (a wait); releaseAt: the next attempt to
	// clear forced_down.
	until, releaseAt time.Time
	why              string
	said             string
}

// Core is the recovery core: every host's record and memory. Not safe for
// concurrent use: the runner serialises calls.
type Core struct {
	cfg  Config
	recs map[string]*Record
	mem  map[string]*memory
}

// New returns a core.
func New(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, recs: map[string]*Record{}, mem: map[string]*memory{}}, nil
}

// Config returns the core's configuration.
func (c *Core) Config() Config { return c.cfg }

func (c *Core) memory(host string) *memory {
	m := c.mem[host]
	if m == nil {
		m = &memory{own: map[string]bool{}, retryAt: map[string]time.Time{}, verify: map[string]bool{},
			requested: map[string]time.Time{}, onHost: map[string]time.Time{}, slowSaid: map[string]bool{}, failed: map[string]int{}}
		c.mem[host] = m
	}
	return m
}

// Load sets host's record as read from the bucket (start, leadership
// gained, a CAS conflict), forgetting what this process knew of it: its
// intents are then another process's (their calls may have landed).
func (c *Core) Load(r Record) {
	c.recs[r.Host] = r.clone()
	delete(c.mem, r.Host)
}

// Forget drops everything (leadership lost: the records are re-read when
// it comes back).
func (c *Core) Forget() {
	c.recs = map[string]*Record{}
	c.mem = map[string]*memory{}
}

// Record returns a copy of host's record (nil if none).
func (c *Core) Record(host string) *Record {
	if r := c.recs[host]; r != nil {
		return r.clone()
	}
	return nil
}

// Hosts returns the hosts with a record, sorted.
func (c *Core) Hosts() []string {
	out := make([]string, 0, len(c.recs))
	for h := range c.recs {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// Why returns what host's recovery waits for now ("" if nothing).
func (c *Core) Why(host string) string {
	if m := c.mem[host]; m != nil {
		return m.why
	}
	return ""
}

// InFlight returns the evacuations in flight over every host being
// recovered (a stopped or finished recovery follows nothing: its
// leftover intents never hold the budget).
func (c *Core) InFlight() int {
	n := 0
	for _, r := range c.recs {
		if !r.Phase.active() {
			continue
		}
		for _, in := range r.Instances {
			if in.Evac == Intent || in.Evac == Requested {
				n++
			}
		}
	}
	return n
}

// ActiveHosts returns the hosts being recovered (force-down to the last
// evacuation or notification).
func (c *Core) ActiveHosts() int {
	n := 0
	for _, r := range c.recs {
		if r.Phase.active() {
			n++
		}
	}
	return n
}

// Written tells the core r landed in the bucket (the record it returned
// with OpWrite): r becomes current, and the intents it added are this
// process's own (their calls may now be made).
func (c *Core) Written(r *Record) {
	old := c.recs[r.Host]
	m := c.memory(r.Host)
	if old == nil || old.Epoch != r.Epoch || old.LeaseRevision != r.LeaseRevision {
		delete(c.mem, r.Host)
		m = c.memory(r.Host)
		old = &Record{}
	}
	if r.ForceDown == Intent && old.ForceDown != Intent {
		m.own["force-down"] = true
	}
	oldInst := map[string]Instance{}
	for _, in := range old.Instances {
		oldInst[in.ID] = in
	}
	for _, in := range r.Instances {
		o := oldInst[in.ID]
		if in.Evac == Intent && (o.Evac != Intent || o.Attempts != in.Attempts) {
			m.own["evac:"+in.ID] = true
		}
		for j, v := range in.Volumes {
			for k, a := range v.Attachments {
				var oa Attachment
				if j < len(o.Volumes) && k < len(o.Volumes[j].Attachments) {
					oa = o.Volumes[j].Attachments[k]
				}
				if a.Progress == Intent && (oa.Progress != Intent || oa.Attempts != a.Attempts) {
					m.own["att:"+a.ID] = true
				}
			}
		}
	}
	if r.Masakari != nil && r.Masakari.Progress == Intent && (old.Masakari == nil || old.Masakari.Progress != Intent || old.Masakari.Attempts != r.Masakari.Attempts) {
		m.own["masakari"] = true
	}
	c.recs[r.Host] = r.clone()
	m.said, m.why, m.until = "", "", time.Time{}
}

// write returns the step writing n (stamped at wall), with events.
func write(wall time.Time, n *Record, evs ...Event) Step {
	n.UpdatedAt = wall.UTC()
	if _, ok := n.PhaseAt[n.Phase]; !ok {
		if n.PhaseAt == nil {
			n.PhaseAt = map[Phase]time.Time{}
		}
		n.PhaseAt[n.Phase] = wall.UTC()
	}
	for i := range evs {
		evs[i].Host = n.Host
		if evs[i].Phase == "" {
			evs[i].Phase = n.Phase
		}
	}
	return Step{Op: OpWrite, Host: n.Host, Record: n, Events: evs}
}

// wait returns a wait step; its event is said once per distinct reason.
func (c *Core) wait(host string, until time.Time, reason string, ev *Event) Step {
	m := c.memory(host)
	m.why, m.until = reason, until
	s := Step{Op: OpWait, Host: host, Until: until, Reason: reason}
	if ev != nil && m.said != reason {
		m.said = reason
		ev.Host = host
		if ev.Reason == "" {
			ev.Reason = reason
		}
		s.Events = []Event{*ev}
	}
	return s
}

// Start considers a new recovery for l's host, whose lease the tracker
// shows expired: it returns the write creating the record, or why not
// (OpWait: a refusal that may pass; OpIdle: already started, or
// refused). by names this controller and its term.
func (c *Core) Start(now, wall time.Time, l Lease, by string) Step {
	r := c.recs[l.Host]
	if r != nil && r.Epoch == l.Epoch && r.LeaseRevision == l.Revision {
		return Step{Op: OpIdle, Host: l.Host}
	}
	if w, why := Confirm(l); w != "" {
		ev := &Event{Op: "refused", Why: w}
		if w.Temporary() {
			return c.wait(l.Host, now.Add(PollInterval), string(w)+": "+why, ev)
		}
		s := c.wait(l.Host, now.Add(PollInterval), string(w)+": "+why, ev)
		s.Op = OpIdle
		return s
	}
	if c.cfg.Mode != ModeNotify && c.ActiveHosts() >= c.cfg.MaxHosts {
		return c.wait(l.Host, now.Add(PollInterval), fmt.Sprintf("queued: %d hosts are being recovered (max_hosts %d)", c.ActiveHosts(), c.cfg.MaxHosts), &Event{Op: "queued"})
	}
	var evs []Event
	if r != nil && !r.Phase.Final() {
		evs = append(evs, Event{Op: "superseded", Phase: r.Phase, Reason: fmt.Sprintf("the recovery of epoch %d (revision %d) ends: the host was declared again (epoch %d, revision %d)", r.Epoch, r.LeaseRevision, l.Epoch, l.Revision)})
	}
	n := &Record{Schema: RecordSchema, Host: l.Host, NovaHost: c.cfg.NovaHost(l.Host), Mode: c.cfg.Mode,
		Epoch: l.Epoch, LeaseRevision: l.Revision, DeclaredBy: DeclaredBy(l.Reason), StartedBy: by, StartedAt: wall.UTC()}
	if r != nil && r.ForceDown != Pending && r.Phase != PhaseDone {
		// The earlier recovery may have left the service forced down:
		// this one releases it (forcing it down again is harmless).
		n.ForceDown = Intent
	}
	if c.cfg.Mode == ModeNotify {
		n.Phase = PhaseNotified
		n.Reason = "declared (epoch " + fmt.Sprint(l.Epoch) + "); mode notify: nothing called (would force down, remove its attachments and evacuate)"
		return write(wall, n, append(evs, Event{Op: "notified", Reason: n.Reason})...)
	}
	n.Phase = PhaseForceDown
	n.Reason = fmt.Sprintf("declaration of epoch %d by %s confirmed: recovering (mode %s)", l.Epoch, n.DeclaredBy, c.cfg.Mode)
	return write(wall, n, append(evs, Event{Op: "started", Reason: n.Reason})...)
}

// Next returns host's next step. l is the tracker's view of the lease
// (the runner reads the key again right before a gated call).
func (c *Core) Next(now, wall time.Time, host string, l Lease) Step {
	r := c.recs[host]
	if r == nil || r.Phase.Final() {
		return Step{Op: OpIdle, Host: host}
	}
	m := c.memory(host)
	if now.Before(m.until) {
		return Step{Op: OpWait, Host: host, Until: m.until, Reason: m.why}
	}
	if c.cfg.Mode == ModeNotify && r.Mode != ModeNotify {
		// This controller calls nothing, not even to release.
		return c.wait(host, now.Add(PollInterval), fmt.Sprintf("started in mode %s by %s; this controller's mode is notify: not continued", r.Mode, r.StartedBy), &Event{Op: "mode-mismatch"})
	}
	switch r.Phase {
	case PhaseRecovered, PhaseStopped, PhaseReleasing:
		return c.release(now, wall, r, m, l)
	}
	if c.cfg.Mode != r.Mode {
		return c.wait(host, now.Add(PollInterval), fmt.Sprintf("started in mode %s by %s; this controller's mode is %s: not continued", r.Mode, r.StartedBy, c.cfg.Mode), &Event{Op: "mode-mismatch"})
	}
	if nh := c.cfg.NovaHost(host); !sameHost(r.NovaHost, nh) {
		// recovery.nova_hosts changed since the recovery started (a wrong
		// mapping fixed): the record's nova-compute host may be another,
		// live host. Never continued; the operator decides.
		return c.wait(host, now.Add(PollInterval), fmt.Sprintf("started for nova-compute host %s; recovery.nova_hosts now maps %s to %s: not continued (check %s — it may be forced down — and delete this record to recover %s afresh)",
			r.NovaHost, host, nh, r.NovaHost, nh), &Event{Op: "nova-host-changed"})
	}
	if w, why := Check(r, l); w != "" {
		return c.refuse(now, wall, r, w, why)
	}
	switch r.Phase {
	case PhaseForceDown:
		if r.ForceDown == Pending {
			n := r.clone()
			n.ForceDown, n.Reason = Intent, "forcing the nova-compute service of "+r.NovaHost+" down"
			return write(wall, n)
		}
		return Step{Op: OpForceDown, Host: host, NovaHost: r.NovaHost, Gate: GateDeclared, Mutating: true}
	case PhaseList:
		return Step{Op: OpListServers, Host: host, NovaHost: r.NovaHost}
	case PhaseDetach:
		return c.detach(now, wall, r, m)
	case PhaseEvacuate:
		return c.evacuate(now, wall, r, m)
	case PhaseMasakari:
		return c.masakari(now, wall, r, m)
	}
	return Step{Op: OpIdle, Host: host}
}

// Gate checks fresh, the lease key read right before s's call: ok, or
// the step to take instead (a wait, or the write stopping the recovery).
func (c *Core) Gate(now, wall time.Time, s Step, fresh Lease) (bool, Step) {
	r := c.recs[s.Host]
	if r == nil {
		return false, Step{Op: OpIdle, Host: s.Host}
	}
	switch s.Gate {
	case GateDeclared:
		if w, why := Check(r, fresh); w != "" {
			return false, c.refuse(now, wall, r, w, why)
		}
	case GateBack:
		if !back(r, fresh) {
			return false, c.wait(s.Host, now.Add(PollInterval), "the host is not back any more: forced_down kept", nil)
		}
	}
	return true, s
}

// refuse turns a failed Check into a step: a temporary refusal waits, a
// permanent one stops the recovery's destructive steps.
func (c *Core) refuse(now, wall time.Time, r *Record, w Why, why string) Step {
	if w.Temporary() {
		return c.wait(r.Host, now.Add(PollInterval), "paused: "+string(w)+": "+why, &Event{Op: "paused", Why: w})
	}
	n := r.clone()
	n.Phase, n.Reason = PhaseStopped, "stopped before "+string(r.Phase)+" completed: "+string(w)+": "+why
	return write(wall, n, Event{Op: "stopped", Why: w, Reason: n.Reason})
}

// Done integrates the outcome of s's call and returns the write that
// records it (or a wait).
func (c *Core) Done(now, wall time.Time, s Step, res Result) Step {
	r := c.recs[s.Host]
	if r == nil {
		return Step{Op: OpIdle, Host: s.Host}
	}
	m := c.memory(s.Host)
	n := r.clone()
	switch s.Op {
	case OpForceDown:
		if res.Kind != ErrNone {
			return c.wait(s.Host, now.Add(c.cfg.RetryBase), "force-down failed (retrying): "+res.Err, &Event{Op: "force-down-failed", Error: res.Err})
		}
		n.ForceDown, n.Phase, n.Reason = Completed, PhaseList, "nova-compute of "+r.NovaHost+" forced down"
		return write(wall, n, Event{Op: "forced-down", Reason: n.Reason})
	case OpListServers:
		if res.Kind != ErrNone {
			return c.wait(s.Host, now.Add(c.cfg.RetryBase), "listing the host's servers failed (retrying): "+res.Err, &Event{Op: "list-failed", Error: res.Err})
		}
		c.listed(n, res.Servers)
		n.Phase = PhaseDetach
		n.Reason = fmt.Sprintf("%d instances listed, %d with volumes", len(n.Instances), withVolumes(n))
		return write(wall, n, Event{Op: "listed", Reason: n.Reason})
	case OpVolume:
		return c.volumeRead(now, wall, n, m, s, res)
	case OpRemoveAttachment:
		return c.attachmentRemoved(now, wall, n, m, s, res)
	case OpEvacuate:
		return c.evacuated(now, wall, n, m, s, res)
	case OpMigrations:
		return c.migrations(now, wall, n, m, res)
	case OpServer:
		if s.Precheck {
			return c.prechecked(now, wall, n, m, s, res)
		}
		return c.serverChecked(now, wall, n, m, s, res)
	case OpHostNotification, OpNotificationStatus:
		return c.notified(now, wall, n, m, s, res)
	case OpClearForceDown:
		return c.cleared(now, wall, n, m, res)
	}
	return Step{Op: OpIdle, Host: s.Host}
}

func withVolumes(r *Record) int {
	k := 0
	for _, in := range r.Instances {
		if len(in.Volumes) > 0 {
			k++
		}
	}
	return k
}

// evacuable are the statuses Nova evacuates (vm_state active, stopped,
// error) and the status each must be back in (prior power state; ERROR
// comes back as anything but ERROR).
var evacuable = map[string]string{"ACTIVE": "ACTIVE", "SHUTOFF": "SHUTOFF", "ERROR": ""}

func (c *Core) listed(n *Record, servers []Server) {
	sort.Slice(servers, func(i, j int) bool { return servers[i].ID < servers[j].ID })
	n.Instances = nil
	for _, s := range servers {
		if s.Host != "" && !sameHost(s.Host, n.NovaHost) {
			continue // not on the declared host (any more)
		}
		in := Instance{ID: s.ID, Name: s.Name, Status: s.Status, TaskState: s.TaskState, VolumeBacked: s.VolumeBacked}
		for _, v := range s.Volumes {
			in.Volumes = append(in.Volumes, Volume{ID: v})
		}
		switch _, ok := evacuable[s.Status]; {
		case n.Mode != ModeEvacuate:
		case strings.HasPrefix(s.TaskState, "rebuild"):
			// An evacuation (an earlier recovery's, or anyone's) is in
			// flight: follow its migration, never start another one.
			// No intent time: its migration is older than this
			// recovery; the newest evacuation of the server from the
			// host is the one in flight.
			in.Evac = Requested
			in.Note = "an evacuation was in flight when listed (task_state " + s.TaskState + "): followed"
		case !ok:
			in.Evac, in.Note = Unrecoverable, "status "+s.Status+": Nova evacuates only ACTIVE, SHUTOFF and ERROR servers"
		}
		n.Instances = append(n.Instances, in)
	}
}

// detach removes the dead host's attachments, one call at a time.
func (c *Core) detach(now, wall time.Time, r *Record, m *memory) Step {
	for i, in := range r.Instances {
		for j, v := range in.Volumes {
			if !v.Checked {
				if t := m.retryAt["vol:"+v.ID]; now.Before(t) {
					return c.wait(r.Host, t, "reading volume "+v.ID+" failed; retrying", nil)
				}
				return Step{Op: OpVolume, Host: r.Host, Server: in.ID, Volume: v.ID}
			}
			for k, a := range v.Attachments {
				key := "att:" + a.ID
				switch a.Progress {
				case Pending, Failed:
					if t := m.retryAt[key]; now.Before(t) {
						return c.wait(r.Host, t, "removing attachment "+a.ID+" failed; retrying", nil)
					}
					n := r.clone()
					na := &n.Instances[i].Volumes[j].Attachments[k]
					if a.Progress == Failed && a.Attempts >= c.cfg.MaxAttempts {
						na.Progress = Unrecoverable
						return write(wall, n, Event{Op: "attachment-not-removed", Instance: in.ID, Reason: "attachment " + a.ID + " of volume " + v.ID + " not removed after " + fmt.Sprint(a.Attempts) + " attempts: " + a.Note})
					}
					na.Progress, na.Attempts = Intent, a.Attempts+1
					n.Reason = "removing attachment " + a.ID + " (host " + a.Host + ") of volume " + v.ID
					return write(wall, n)
				case Intent:
					return Step{Op: OpRemoveAttachment, Host: r.Host, Server: in.ID, Volume: v.ID, Attachment: a.ID, Gate: GateDeclared, Mutating: true}
				}
			}
		}
	}
	n := r.clone()
	n.Phase = PhaseEvacuate
	if r.Mode == ModeMasakari {
		n.Phase = PhaseMasakari
	}
	n.Reason = "the dead host's attachments removed"
	return write(wall, n, Event{Op: "detached", Reason: n.Reason})
}

func (c *Core) volumeRead(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	for i := range n.Instances {
		in := &n.Instances[i]
		if in.ID != s.Server {
			continue
		}
		for j := range in.Volumes {
			v := &in.Volumes[j]
			if v.ID != s.Volume {
				continue
			}
			if res.Kind == ErrNotFound {
				v.Checked, v.Note = true, "volume not found: nothing to remove"
				return write(wall, n)
			}
			if res.Kind != ErrNone {
				// Cinder not answering (unreachable, timeout, 5xx) is
				// waited out, with backoff: a volume-backed rebuild needs
				// Cinder anyway, and evacuating before the dead host's
				// attachment is gone is what this step exists to avoid.
				// An answer that refuses is tried max_attempts times.
				k := "vol:" + v.ID
				tries := m.tries(k)
				if res.Kind != ErrOther && tries >= c.cfg.MaxAttempts {
					v.Checked, v.Note = true, "could not be read ("+res.Err+"): its attachments were not removed"
					return write(wall, n, Event{Op: "volume-unreadable", Instance: in.ID, Error: res.Err, Reason: "volume " + v.ID + ": " + v.Note})
				}
				m.retryAt[k] = now.Add(c.cfg.backoff(tries))
				return c.wait(n.Host, m.retryAt[k], "reading volume "+v.ID+" failed: "+res.Err, &Event{Op: "volume-read-failed", Instance: in.ID, Error: res.Err})
			}
			v.Checked, v.Multiattach = true, res.Volume.Multiattach
			if v.Multiattach {
				v.Note = "multiattach: attachments left to Nova"
				return write(wall, n)
			}
			for _, a := range res.Volume.Attachments {
				// Only the declared host's attachment of this very
				// instance: never another host's, never another
				// server's.
				if !sameHost(a.Host, n.NovaHost) || a.Server != "" && a.Server != in.ID {
					continue
				}
				v.Attachments = append(v.Attachments, Attachment{ID: a.ID, Server: a.Server, Host: a.Host})
			}
			if len(v.Attachments) == 0 {
				v.Note = "no attachment of " + n.NovaHost
			}
			return write(wall, n)
		}
	}
	return Step{Op: OpIdle, Host: n.Host}
}

// tries counts the failed reads of key (memory only: a restart reads
// again).
func (m *memory) tries(key string) int {
	m.failed[key]++
	return m.failed[key]
}

func (c *Core) attachmentRemoved(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	for i := range n.Instances {
		for j := range n.Instances[i].Volumes {
			for k := range n.Instances[i].Volumes[j].Attachments {
				a := &n.Instances[i].Volumes[j].Attachments[k]
				if a.ID != s.Attachment {
					continue
				}
				switch res.Kind {
				case ErrNone, ErrNotFound:
					a.Progress, a.Note = Completed, ""
					if res.Kind == ErrNotFound {
						a.Note = "already gone"
					}
					n.Reason = "attachment " + a.ID + " of volume " + s.Volume + " removed"
					return write(wall, n, Event{Op: "attachment-removed", Instance: s.Server, Reason: n.Reason})
				}
				a.Progress, a.Note = Failed, res.Err
				m.retryAt["att:"+a.ID] = now.Add(c.cfg.backoff(a.Attempts))
				if res.Kind == ErrOther {
					// Cinder did not answer: not an attempt Cinder
					// refused (waited out, like a volume read).
					a.Attempts--
				}
				return write(wall, n, Event{Op: "attachment-remove-failed", Instance: s.Server, Error: res.Err, Reason: "attachment " + a.ID + " of volume " + s.Volume})
			}
		}
	}
	return Step{Op: OpIdle, Host: n.Host}
}

// evacuate follows the evacuations in flight and starts new ones within
// the budget.
func (c *Core) evacuate(now, wall time.Time, r *Record, m *memory) Step {
	followed := false
	// since: the oldest migration that may matter. An evacuation adopted
	// in flight (no intent time) may be older than the recovery: all.
	since := r.StartedAt.Add(-MigrationClockSkew)
	for _, in := range r.Instances {
		switch {
		case in.Evac == Requested, in.Evac == Intent && !m.own["evac:"+in.ID]:
			followed = true
			if in.IntentAt.IsZero() {
				since = time.Time{}
			} else if t := in.IntentAt.Add(-MigrationClockSkew); t.Before(since) {
				since = t
			}
		}
		if m.verify[in.ID] {
			return Step{Op: OpServer, Host: r.Host, Server: in.ID}
		}
	}
	if followed && !now.Before(m.nextPoll) {
		m.nextPoll = now.Add(PollInterval)
		return Step{Op: OpMigrations, Host: r.Host, NovaHost: r.NovaHost, Since: since}
	}
	inflight := c.InFlight()
	var next time.Time
	terminal := 0
	for i, in := range r.Instances {
		key := "evac:" + in.ID
		switch in.Evac {
		case Completed, Unrecoverable, Skipped:
			terminal++
		case Intent:
			if m.own[key] {
				if t, ok := m.onHost[in.ID]; !ok || now.Sub(t) > PollInterval || now.Before(t) {
					// Nova evacuates a server from wherever it is now:
					// read it first, it must still be on the declared
					// host.
					return Step{Op: OpServer, Host: r.Host, Server: in.ID, Precheck: true}
				}
				return Step{Op: OpEvacuate, Host: r.Host, Server: in.ID, NovaHost: r.NovaHost, Gate: GateDeclared, Mutating: true}
			}
		case Pending, Failed:
			if t := m.retryAt[key]; now.Before(t) {
				next = earliest(next, t)
				continue
			}
			n := r.clone()
			ni := &n.Instances[i]
			if in.Evac == Failed && in.Attempts >= c.cfg.MaxAttempts {
				ni.Evac = Unrecoverable
				n.Reason = "instance " + in.ID + " not recovered after " + fmt.Sprint(in.Attempts) + " attempts: " + in.Note
				return write(wall, n, Event{Op: "unrecoverable", Instance: in.ID, Reason: n.Reason})
			}
			if inflight >= c.cfg.MaxEvacuations {
				next = earliest(next, now.Add(PollInterval))
				continue
			}
			ni.Evac, ni.Attempts, ni.IntentAt = Intent, in.Attempts+1, wall.UTC()
			n.Reason = fmt.Sprintf("evacuating %s (attempt %d)", in.ID, ni.Attempts)
			return write(wall, n)
		}
	}
	if terminal == len(r.Instances) {
		n := r.clone()
		n.Phase = PhaseRecovered
		n.Reason = c.summary(n)
		return write(wall, n, Event{Op: "recovered", Reason: n.Reason})
	}
	if followed {
		next = earliest(next, m.nextPoll)
	}
	if next.IsZero() {
		next = now.Add(PollInterval)
	}
	return c.wait(r.Host, next, fmt.Sprintf("evacuating: %d in flight over all hosts (max_evacuations %d)", inflight, c.cfg.MaxEvacuations), nil)
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

func (c *Core) summary(r *Record) string {
	done, unrec := 0, r.Unrecoverable()
	for _, in := range r.Instances {
		if in.Evac == Completed {
			done++
		}
	}
	s := fmt.Sprintf("%d of %d instances recovered; host stays forced down until its agent rejoins and reconciles", done, len(r.Instances))
	if len(unrec) > 0 {
		s += "; NOT RECOVERED: " + strings.Join(unrec, "; ")
	}
	return s
}

func (c *Core) inst(n *Record, id string) *Instance {
	for i := range n.Instances {
		if n.Instances[i].ID == id {
			return &n.Instances[i]
		}
	}
	return nil
}

// prechecked integrates the read of a server right before its
// evacuation: evacuate only a server still on the declared host with no
// task in flight; never one found on another host (Nova would evacuate it
// from there: a host nobody declared).
func (c *Core) prechecked(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	in := c.inst(n, s.Server)
	if in == nil || in.Evac != Intent || !m.own["evac:"+in.ID] {
		return Step{Op: OpIdle, Host: n.Host}
	}
	switch res.Kind {
	case ErrNone:
	case ErrNotFound:
		delete(m.own, "evac:"+in.ID)
		in.Evac, in.Note = Skipped, "server deleted"
		return write(wall, n, Event{Op: "evacuate-skipped", Instance: in.ID, Reason: in.Note})
	default:
		return c.wait(n.Host, now.Add(PollInterval), "reading server "+in.ID+" before its evacuation failed: "+res.Err, nil)
	}
	sv := res.Server
	switch {
	case sameHost(sv.Host, n.NovaHost) && sv.TaskState == "":
		m.onHost[in.ID] = now
		return Step{Op: OpIdle, Host: n.Host}
	case sameHost(sv.Host, n.NovaHost):
		// A task in flight (an evacuation landed late, ...): what Nova
		// answers with a 409; follow the migrations.
		return c.evacuated(now, wall, n, m, s, Result{Kind: ErrConflict, Err: "task_state " + sv.TaskState + " (read before evacuating)"})
	}
	delete(m.own, "evac:"+in.ID)
	delete(m.onHost, in.ID)
	if sv.Host != "" && sv.TaskState == "" && sv.Status != "ERROR" {
		// Rebuilt elsewhere (an earlier attempt whose migration was not
		// matched, clocks apart): done.
		in.Evac, in.Dest, in.Note = Completed, sv.Host, "found "+sv.Status+" on "+sv.Host+" when about to evacuate it again"
		n.Reason = "instance " + in.ID + " " + sv.Status + " on " + sv.Host
		return write(wall, n, Event{Op: "evacuated", Instance: in.ID, Reason: n.Reason + " (" + in.Note + ")"})
	}
	in.Evac = Unrecoverable
	in.Note = "found on " + orNone(sv.Host) + " (" + sv.Status + "), not on the declared host " + n.NovaHost + ": never evacuated from another host; check it"
	n.Reason = "instance " + in.ID + ": " + in.Note
	return write(wall, n, Event{Op: "unrecoverable", Instance: in.ID, Reason: n.Reason})
}

func (c *Core) evacuated(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	in := c.inst(n, s.Server)
	if in == nil {
		return Step{Op: OpIdle, Host: n.Host}
	}
	delete(m.own, "evac:"+in.ID)
	delete(m.onHost, in.ID)
	switch res.Kind {
	case ErrNone:
		in.Evac, in.Note = Requested, ""
		m.requested[in.ID] = now
		n.Reason = "evacuation of " + in.ID + " requested"
		return write(wall, n, Event{Op: "evacuate-requested", Instance: in.ID, Reason: fmt.Sprintf("attempt %d", in.Attempts)})
	case ErrConflict:
		// Busy in another task: an evacuation may be running already
		// (ours, landed late): follow the migrations.
		in.Evac, in.Note = Requested, "Nova: "+res.Err
		m.requested[in.ID] = now
		return write(wall, n, Event{Op: "evacuate-conflict", Instance: in.ID, Error: res.Err})
	case ErrNotFound:
		in.Evac, in.Note = Skipped, "server deleted"
		return write(wall, n, Event{Op: "evacuate-skipped", Instance: in.ID, Reason: in.Note})
	case ErrRefused:
		return c.attemptFailed(now, wall, n, m, in, "Nova refused the evacuation: "+res.Err)
	}
	// Unknown outcome (timeout, connection): the call may have landed.
	// Keep the intent; the migrations tell (IntentSettle).
	n.Reason = "evacuation of " + in.ID + ": outcome unknown (" + res.Err + "); following the migrations"
	return write(wall, n, Event{Op: "evacuate-unknown", Instance: in.ID, Error: res.Err})
}

func (c *Core) attemptFailed(now, wall time.Time, n *Record, m *memory, in *Instance, note string) Step {
	in.Evac, in.Note = Failed, note
	if in.Migration > in.After {
		in.After = in.Migration
	}
	delete(m.verify, in.ID)
	m.retryAt["evac:"+in.ID] = now.Add(c.cfg.backoff(in.Attempts))
	n.Reason = "evacuation of " + in.ID + " failed (attempt " + fmt.Sprint(in.Attempts) + "): " + note
	return write(wall, n, Event{Op: "evacuation-failed", Instance: in.ID, Reason: n.Reason})
}

// migrations matches Nova's evacuations from the host to the instances
// followed.
func (c *Core) migrations(now, wall time.Time, n *Record, m *memory, res Result) Step {
	if res.Kind != ErrNone {
		return c.wait(n.Host, now.Add(PollInterval), "listing migrations failed: "+res.Err, &Event{Op: "migrations-failed", Error: res.Err})
	}
	changed := false
	var evs []Event
	for i := range n.Instances {
		in := &n.Instances[i]
		if in.Evac != Requested && !(in.Evac == Intent && !m.own["evac:"+in.ID]) {
			continue
		}
		var mig *Migration
		for k := range res.Migrations {
			g := &res.Migrations[k]
			if g.Instance != in.ID || g.ID <= in.After || !sameHost(g.Source, n.NovaHost) || g.Type != "" && g.Type != "evacuation" ||
				!in.IntentAt.IsZero() && g.Created.Before(in.IntentAt.Add(-MigrationClockSkew)) {
				continue
			}
			if mig == nil || g.ID > mig.ID {
				mig = g
			}
		}
		if mig == nil {
			if in.Evac == Intent && wall.Sub(in.IntentAt) >= IntentSettle {
				// Another process's intent whose call never created a
				// migration: it did not land; issue it again.
				m.own["evac:"+in.ID] = true
			}
			if in.Evac == Requested && wall.Sub(in.IntentAt) >= IntentSettle {
				// Answered (or refused as busy, 409) but no evacuation
				// appeared: Nova creates the migration before it
				// answers, so none came of it. A failed attempt.
				st := c.attemptFailed(now, wall, n, m, in, "no evacuation migration appeared within "+IntentSettle.String()+" of the request ("+orNone(in.Note)+")")
				evs = append(evs, st.Events...)
				changed = true
				continue
			}
			if t, ok := m.requested[in.ID]; ok && now.Sub(t) > EvacuationSlowAfter && !m.slowSaid[in.ID] {
				m.slowSaid[in.ID] = true
				evs = append(evs, Event{Op: "evacuation-slow", Instance: in.ID, Reason: "no migration seen after " + EvacuationSlowAfter.String()})
			}
			continue
		}
		if in.Evac == Intent || in.Migration != mig.ID {
			in.Evac, in.Migration, changed = Requested, mig.ID, true
			if _, ok := m.requested[in.ID]; !ok {
				m.requested[in.ID] = now
			}
		}
		switch mig.Status {
		case "done", "completed":
			m.verify[in.ID] = true
		case "error", "failed":
			note := "migration " + fmt.Sprint(mig.ID) + " " + mig.Status
			if mig.Status == "error" && mig.Dest == "" {
				note += " (no destination: NoValidHost, the server stays on " + n.NovaHost + ")"
			}
			st := c.attemptFailed(now, wall, n, m, in, note)
			evs = append(evs, st.Events...)
			changed = true
		default:
			if now.Sub(m.requested[in.ID]) > EvacuationSlowAfter && !m.slowSaid[in.ID] {
				m.slowSaid[in.ID] = true
				evs = append(evs, Event{Op: "evacuation-slow", Instance: in.ID, Reason: "migration " + fmt.Sprint(mig.ID) + " still " + mig.Status})
			}
		}
	}
	if !changed {
		for i := range evs {
			evs[i].Host = n.Host
		}
		return Step{Op: OpIdle, Host: n.Host, Events: evs}
	}
	return write(wall, n, evs...)
}

func (c *Core) serverChecked(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	in := c.inst(n, s.Server)
	if in == nil {
		return Step{Op: OpIdle, Host: n.Host}
	}
	switch res.Kind {
	case ErrNone:
	case ErrNotFound:
		delete(m.verify, in.ID)
		in.Evac, in.Note = Skipped, "server deleted"
		return write(wall, n, Event{Op: "evacuate-skipped", Instance: in.ID, Reason: in.Note})
	default:
		return c.wait(n.Host, now.Add(PollInterval), "reading server "+in.ID+" failed: "+res.Err, nil)
	}
	sv, want := res.Server, evacuable[in.Status]
	switch {
	case sv.Status == "ERROR" && sv.TaskState == "":
		return c.attemptFailed(now, wall, n, m, in, "the server is in ERROR on "+orNone(sv.Host)+" after migration "+fmt.Sprint(in.Migration))
	case sv.Host == "" || sameHost(sv.Host, n.NovaHost) || sv.TaskState != "":
		// Not there yet (the rebuild may still start it).
		if now.Sub(m.requested[in.ID]) > EvacuationSlowAfter && !m.slowSaid[in.ID] {
			m.slowSaid[in.ID] = true
			return c.wait(n.Host, now.Add(PollInterval), "", &Event{Op: "evacuation-slow", Instance: in.ID,
				Reason: fmt.Sprintf("migration done but the server is %s/%s on %s (want %s on another host)", sv.Status, orNone(sv.TaskState), orNone(sv.Host), orAny(want))})
		}
		delete(m.verify, in.ID)
		return Step{Op: OpIdle, Host: n.Host}
	}
	delete(m.verify, in.ID)
	in.Evac, in.Dest, in.Note = Completed, sv.Host, ""
	n.Reason = "instance " + in.ID + " " + sv.Status + " on " + sv.Host
	evs := []Event{{Op: "evacuated", Instance: in.ID, Reason: n.Reason}}
	if want != "" && sv.Status != want {
		// The rebuild is over (no task) but not in the prior state: a
		// failed attempt left the server in ERROR, whose rebuild ends
		// ACTIVE. Said, not waited for (it will not change by itself).
		in.Note = "back " + sv.Status + ", was " + in.Status + " before the failure: set it back if it must be " + in.Status
		evs = append(evs, Event{Op: "state-differs", Instance: in.ID, Reason: in.Note})
	}
	return write(wall, n, evs...)
}

// sameHost compares host names as Nova and Cinder do (their MariaDB
// columns compare without case; the adapter checks them so too).
func sameHost(a, b string) bool { return a != "" && strings.EqualFold(a, b) }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orAny(s string) string {
	if s == "" {
		return "anything but ERROR"
	}
	return s
}

// masakari hands the host to Masakari and follows the notification.
func (c *Core) masakari(now, wall time.Time, r *Record, m *memory) Step {
	ms := r.Masakari
	if ms == nil {
		ms = &Notification{}
	}
	switch ms.Progress {
	case Pending, Failed:
		if t := m.retryAt["masakari"]; now.Before(t) {
			return c.wait(r.Host, t, "the Masakari notification failed; retrying", nil)
		}
		n := r.clone()
		if ms.Progress == Failed && ms.Attempts >= c.cfg.MaxAttempts {
			n.Phase = PhaseRecovered
			n.Reason = "NOT RECOVERED: the Masakari notification failed " + fmt.Sprint(ms.Attempts) + " times; host stays forced down"
			return write(wall, n, Event{Op: "unrecoverable", Reason: n.Reason})
		}
		n.Masakari = &Notification{Progress: Intent, Attempts: ms.Attempts + 1}
		n.Reason = "notifying Masakari (COMPUTE_HOST)"
		return write(wall, n)
	case Intent:
		// Ours or another process's: Masakari refuses a duplicate (409),
		// which counts as notified.
		return Step{Op: OpHostNotification, Host: r.Host, NovaHost: r.NovaHost, Gate: GateDeclared, Mutating: true}
	case Requested:
		if ms.ID == "" {
			n := r.clone()
			n.Phase, n.Reason = PhaseRecovered, "handed to Masakari (it reported a duplicate notification; outcome not followed)"
			return write(wall, n, Event{Op: "recovered", Reason: n.Reason})
		}
		if now.Before(m.nextPoll) {
			return c.wait(r.Host, m.nextPoll, "Masakari notification "+ms.ID+" "+orNone(ms.Status), nil)
		}
		m.nextPoll = now.Add(PollInterval)
		return Step{Op: OpNotificationStatus, Host: r.Host, NotificationID: ms.ID}
	}
	return Step{Op: OpIdle, Host: r.Host}
}

func (c *Core) notified(now, wall time.Time, n *Record, m *memory, s Step, res Result) Step {
	ms := n.Masakari
	if ms == nil {
		return Step{Op: OpIdle, Host: n.Host}
	}
	if s.Op == OpHostNotification {
		switch res.Kind {
		case ErrNone, ErrConflict:
			ms.Progress, ms.ID = Requested, res.NotificationID
			n.Reason = "Masakari notified (" + orNone(ms.ID) + ")"
			return write(wall, n, Event{Op: "masakari-notified", Reason: n.Reason, Error: res.Err})
		}
		ms.Progress = Failed
		m.retryAt["masakari"] = now.Add(c.cfg.backoff(ms.Attempts))
		n.Reason = "the Masakari notification failed: " + res.Err
		return write(wall, n, Event{Op: "masakari-failed", Error: res.Err})
	}
	if res.Kind != ErrNone {
		return c.wait(n.Host, now.Add(PollInterval), "reading the Masakari notification failed: "+res.Err, nil)
	}
	if res.NotificationStatus == ms.Status {
		return Step{Op: OpIdle, Host: n.Host}
	}
	ms.Status = res.NotificationStatus
	switch ms.Status {
	case "finished", "failed", "ignored":
		n.Phase = PhaseRecovered
		n.Reason = "Masakari notification " + ms.ID + " " + ms.Status + "; host stays forced down until its agent rejoins and reconciles"
		if ms.Status != "finished" {
			n.Reason = "NOT RECOVERED: " + n.Reason
		}
		return write(wall, n, Event{Op: "recovered", Reason: n.Reason})
	}
	n.Reason = "Masakari notification " + ms.ID + " " + ms.Status
	return write(wall, n, Event{Op: "masakari-status", Reason: n.Reason})
}

// release keeps the host forced down until it is back, then clears
// forced_down (policy on-rejoin) or says it is the operator's.
func (c *Core) release(now, wall time.Time, r *Record, m *memory, l Lease) Step {
	if r.ForceDown == Pending {
		n := r.clone()
		n.Phase = PhaseDone
		n.Reason = strings.TrimSpace(r.Reason + "; nothing to release (never forced down)")
		return write(wall, n, Event{Op: "done", Reason: n.Reason})
	}
	if !back(r, l) {
		return c.wait(r.Host, now.Add(PollInterval), fmt.Sprintf("%s stays forced down until its agent rejoins and reconciles (lease %s, agent %s)",
			r.NovaHost, orNone(l.State), orNone(l.AgentState)), nil)
	}
	if c.cfg.Release == ReleaseManual {
		n := r.clone()
		n.Phase = PhaseDone
		n.Reason = "the host is back (agent rejoined and reconciled); forced_down left to the operator (release: manual): openstack compute service set --up " + r.NovaHost + " nova-compute"
		return write(wall, n, Event{Op: "back", Reason: n.Reason})
	}
	if r.Phase != PhaseReleasing {
		n := r.clone()
		n.Phase, n.Reason = PhaseReleasing, "the host is back (agent rejoined and reconciled): clearing forced_down"
		return write(wall, n)
	}
	if now.Before(m.releaseAt) {
		return c.wait(r.Host, m.releaseAt, "clearing forced_down again at the next attempt: "+orNone(r.ReleaseRefused), nil)
	}
	return Step{Op: OpClearForceDown, Host: r.Host, NovaHost: r.NovaHost, Gate: GateBack, Mutating: true}
}

func (c *Core) cleared(now, wall time.Time, n *Record, m *memory, res Result) Step {
	switch res.Kind {
	case ErrNone:
		n.Phase, n.ReleaseRefused = PhaseDone, ""
		n.Reason = "forced_down of " + n.NovaHost + " cleared"
		return write(wall, n, Event{Op: "released", Reason: n.Reason})
	case ErrRefused:
		m.releaseAt = now.Add(c.cfg.ReleaseRetry)
		why := "Nova refuses to clear forced_down of " + n.NovaHost + " (" + res.Err + "): evacuations from it stay 'done' until its nova-compute has restarted — restart nova-compute on " + n.NovaHost + "; retrying every " + c.cfg.ReleaseRetry.String()
		if n.ReleaseRefused == res.Err {
			return c.wait(n.Host, m.releaseAt, why, nil)
		}
		n.ReleaseRefused = res.Err
		n.Reason = why
		return write(wall, n, Event{Op: "release-refused", Reason: why, Error: res.Err})
	}
	m.releaseAt = now.Add(c.cfg.ReleaseRetry)
	return c.wait(n.Host, m.releaseAt, "clearing forced_down failed (retrying): "+res.Err, &Event{Op: "release-failed", Error: res.Err})
}
