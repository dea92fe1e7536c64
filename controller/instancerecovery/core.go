package instancerecovery

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Action is what the controller does about a stop.
type Action string

// Actions.
const (
	// ActionStart: Nova os-start (the server is SHUTOFF, no task).
	ActionStart Action = "start"
	// ActionHardReboot: Nova reboot HARD, where os-start is refused: the
	// server is in ERROR, or Nova still shows it active although its
	// domain is off (its power-state sync did not run within
	// SettleTimeout).
	ActionHardReboot Action = "hard-reboot"
	// ActionMasakari: a Masakari VM notification.
	ActionMasakari Action = "masakari"
	// ActionNotify: report only (mode notify); never written, never
	// counted in the budget.
	ActionNotify Action = "notify"
)

// Step is a report's stage: what happened to a stop.
type Step string

// Steps.
const (
	StepSkipped    Step = "skipped"     // nothing to do (Reason says why)
	StepWaiting    Step = "waiting"     // for Nova to settle, or a backoff
	StepActing     Step = "acting"      // intent recorded, action being performed
	StepVerifying  Step = "verifying"   // a recorded action found (another controller, or before a restart)
	StepRecovered  Step = "recovered"   // ACTIVE in Nova and the agent reports the domain running
	StepFailed     Step = "failed"      // the action was refused or did not take effect in time
	StepOverBudget Step = "over-budget" // the instance used its budget: nothing done
	StepNotified   Step = "notified"    // Masakari notification created, or reported (mode notify)
)

// Reason says why.
type Reason string

// Reasons (docs/controller.md "Instance recovery" lists them).
const (
	ReasonRebooted        Reason = "rebooted"              // classified rebooted: never a stop
	ReasonStoppedByNova   Reason = "stopped-by-nova"       // Nova stopped it on purpose
	ReasonNotClassified   Reason = "not-classified"        // the agent does not classify stops
	ReasonDetail          Reason = "detail-not-recovered"  // this libvirt detail is not in details
	ReasonUnknownOff      Reason = "unknown-not-recovered" // unknown stops are not recovered (unknown: false)
	ReasonTooOld          Reason = "too-old"               // reported longer than max_event_age ago
	ReasonRunningAgain    Reason = "running-again"         // the agent reported the domain running before any action
	ReasonUndefined       Reason = "undefined"             // the domain was undefined before any action
	ReasonNotInNova       Reason = "not-in-nova"           // Nova does not know the server (deleted, not an instance)
	ReasonMoved           Reason = "on-another-host"       // Nova places the server on another host
	ReasonNotProtected    Reason = "not-protected"         // the protection policy excludes it
	ReasonNovaBusy        Reason = "nova-task-in-flight"   // a task still in flight after settle_timeout
	ReasonNovaUnavailable Reason = "nova-unavailable"      // no answer from Nova within settle_timeout
	ReasonNotConfirmed    Reason = "unknown-not-confirmed" // unknown stop, Nova did not show SHUTOFF with no task
	ReasonUserStop        Reason = "stop-requested"        // unknown stop; Nova's newest stop action is a user's
	ReasonVMState         Reason = "nova-vm-state"         // a vm_state recovery does not touch (shelved, suspended, …)
	ReasonSettling        Reason = "nova-settling"         // waiting for vm_state stopped and no task
	ReasonBackoff         Reason = "backoff"               // waiting before the next action of a crash loop
	ReasonNovaStopped     Reason = "nova-stopped"          // SHUTOFF, no task: os-start
	ReasonNovaError       Reason = "nova-error"            // vm_state error: hard reboot
	ReasonNovaNotSynced   Reason = "nova-not-synced"       // active but off after settle_timeout: hard reboot
	ReasonBudget          Reason = "budget-exhausted"      // budget actions within budget_window used
	ReasonVerified        Reason = "active-and-running"    // Nova ACTIVE, no task, running + the agent's event
	ReasonRejected        Reason = "action-rejected"       // Nova or Masakari refused the action
	ReasonNotActive       Reason = "not-active-in-time"    // not ACTIVE and running within verify_timeout
	ReasonDeleted         Reason = "deleted-while-verifying"
	ReasonUnverified      Reason = "intent-not-verified" // an older recorded action closed unverified
	ReasonRecorded        Reason = "recorded-action"     // an intent recorded before: verified, not repeated
	ReasonHandled         Reason = "already-handled"     // the record has this stop's outcome
	ReasonCreated         Reason = "notification-created"
)

// Event is one lifecycle event of a domain, as the fleet view applied it
// (duplicates and redeliveries already dropped).
type Event struct {
	Host        string
	Incarnation uint64
	Seq         uint64
	UUID, Name  string
	Transition  string // proto.Transition values
	State       string
	// Classification, ClassificationReason: on classified stops.
	Classification, ClassificationReason string
	// Detail: classify.ParseDetail of the libvirt detail (crashed,
	// failed, destroyed, shutdown-by-guest, …).
	Detail     string
	ObservedAt time.Time
}

// Key identifies the stop (StopKey).
func (e Event) Key() string { return StopKey(e.Host, e.Incarnation, e.Seq) }

// Classifications (proto.Classification values).
const (
	classRebooted   = "rebooted"
	classByNova     = "stopped-by-nova"
	classUnexpected = "stopped-unexpectedly"
	classUnknown    = "unknown"
)

// Server is Nova's view of a server.
type Server struct {
	// Found: false when Nova answered 404.
	Found                      bool
	Project, Host              string
	Status, VMState, TaskState string
	// PowerState is Nova's index (1 running, 4 shutdown, 6 crashed).
	PowerState int
	Metadata   map[string]string
	// StopByUser: the newest `stop` instance action has a user (a stop
	// API request), not Nova's own power sync (user_id null). Asked only
	// for unknown stops (Op.Actions): a user's stop looks exactly like a
	// synced crash in the server's states.
	StopByUser bool
}

// PowerRunning is Nova's power_state "running".
const PowerRunning = 1

func (s Server) activeRunning() bool {
	return s.VMState == "active" && s.TaskState == "" && s.PowerState == PowerRunning
}

// OpKind is what the runner must do.
type OpKind int

// Op kinds.
const (
	// OpLoad: read the instance's record; answer with Loaded.
	OpLoad OpKind = iota
	// OpQuery: ask Nova for the server; answer with NovaAnswer.
	OpQuery
	// OpWrite: write Record by CAS on Rev (0: create); answer with
	// Written. Check MayAct immediately before.
	OpWrite
	// OpAct: perform Action for Stop; answer with Acted. Check MayAct
	// immediately before.
	OpAct
	// OpReport: log, publish, count Report.
	OpReport
)

// Op is one decision.
type Op struct {
	Kind   OpKind
	UUID   string
	Record Record
	Rev    uint64
	Action Action
	Stop   Event
	Report Report
	// NovaHost (OpAct): the server's host in Nova's last answer (a
	// Masakari notification names it).
	NovaHost string
	// Actions (OpQuery): also read the server's instance actions to fill
	// Server.StopByUser.
	Actions bool
}

// Report is a progress event of one stop.
type Report struct {
	At                   time.Time `json:"at"`
	UUID                 string    `json:"uuid"`
	Name                 string    `json:"name,omitempty"`
	Host                 string    `json:"host"`
	Project              string    `json:"project,omitempty"`
	Stop                 string    `json:"stop"`
	Classification       string    `json:"classification,omitempty"`
	ClassificationReason string    `json:"classification_reason,omitempty"`
	Detail               string    `json:"detail,omitempty"`
	StopObservedAt       time.Time `json:"stop_observed_at"`
	Step                 Step      `json:"step"`
	Reason               Reason    `json:"reason"`
	Action               Action    `json:"action,omitempty"`
	// Attempt: the action's number within the budget window.
	Attempt int    `json:"attempt,omitempty"`
	Error   string `json:"error,omitempty"`
	// Took (TookSeconds in JSON): on recovered, from the agent's report
	// of the stop to Nova ACTIVE with the domain running.
	Took        time.Duration `json:"-"`
	TookSeconds float64       `json:"took_seconds,omitempty"`
	// Nova's view when decided.
	VMState   string `json:"vm_state,omitempty"`
	TaskState string `json:"task_state,omitempty"`
}

// WriteResult is what became of an OpWrite.
type WriteResult int

// Write results.
const (
	WriteLanded     WriteResult = iota
	WriteConflict               // the revision moved: another writer
	WriteUnknown                // no answer: it may have landed
	WriteNotActing              // MayAct said no: not sent
	WriteLoadFailed             // (Loaded only) the read failed
)

type phase int

const (
	phLoad    phase = iota // read the record
	phQuery                // ask Nova (settling)
	phWait                 // until due, then phQuery
	phIntent               // write the intent
	phAct                  // perform the action
	phVerify               // poll Nova until ACTIVE and the running event
	phOutcome              // write the outcome
)

type job struct {
	ev       Event
	start    time.Time // when the job began (settle timeout)
	phase    phase
	busy     bool
	reload   bool // leadership was lost: reload before anything else
	loaded   bool
	rec      Record
	rev      uint64
	pending  Record // the record being written
	due      time.Time
	server   Server
	action   Action
	attempt  int
	nonce    string // our intent's By
	ours     bool   // our intent, not yet performed
	acted    time.Time
	active   bool // Nova showed ACTIVE and running after the action
	running  bool // the agent reported the domain running after the stop
	gone     Reason
	waitSaid Reason
	outcome  Report // the outcome being written
}

type queued struct {
	ev Event
	// gone, running: what the events after the stop said (the job's).
	gone    Reason
	running bool
}

// Core is the instance recovery state machine. Not safe for concurrent
// use: one goroutine (the runner's) owns it.
type Core struct {
	cfg     Config
	leading bool
	jobs    map[string]*job
	queue   map[string][]queued
	nonces  uint64
}

// New returns a core for cfg (validated).
func New(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, jobs: map[string]*job{}, queue: map[string][]queued{}}, nil
}

// Config returns the configuration.
func (c *Core) Config() Config { return c.cfg }

// InProgress returns the number of stops being handled (queued ones
// included).
func (c *Core) InProgress() int {
	n := len(c.jobs)
	for _, q := range c.queue {
		n += len(q)
	}
	return n
}

func isRunning(transition string) bool {
	return transition == "started" || transition == "resumed" || transition == "rebooted"
}

// Event feeds one lifecycle event the fleet view applied.
func (c *Core) Event(now time.Time, ev Event) []Op {
	if ev.UUID == "" {
		return nil
	}
	j := c.jobs[ev.UUID]
	switch {
	case isRunning(ev.Transition) || ev.Transition == "undefined":
		gone := ReasonRunningAgain
		if ev.Transition == "undefined" {
			gone = ReasonUndefined
		}
		if q := c.queue[ev.UUID]; len(q) > 0 {
			// The last queued stop is over — unless a previous leader
			// acted on it (its record says so: a replayed stream after a
			// restart). Its job reads the record first when it begins.
			last := &q[len(q)-1]
			last.gone = gone
			last.running = last.running || isRunning(ev.Transition)
			return nil
		}
		if j == nil {
			return nil
		}
		if isRunning(ev.Transition) {
			j.running = true
		}
		if j.phase <= phWait && j.nonce == "" {
			j.gone = gone
			if !j.busy && j.loaded && j.phase != phLoad {
				return c.finish(now, j, StepSkipped, gone, "")
			}
			return c.step(now, j)
		}
		if j.phase == phIntent {
			j.gone = gone // the intent is being written: close it instead of acting
		}
		return append(c.verifyEvent(now, j), c.step(now, j)...)
	case ev.Transition != "stopped":
		return nil
	}
	if r, ok := c.screen(now, ev); !ok {
		return []Op{c.report(now, ev, nil, StepSkipped, r, "")}
	}
	if j != nil {
		c.queue[ev.UUID] = append(c.queue[ev.UUID], queued{ev: ev})
		return nil
	}
	return c.begin(now, ev, "", false)
}

func (c *Core) begin(now time.Time, ev Event, gone Reason, running bool) []Op {
	j := &job{ev: ev, start: now, phase: phLoad, gone: gone, running: running}
	c.jobs[ev.UUID] = j
	return c.step(now, j)
}

// screen decides from the event alone whether the stop may be recovered.
func (c *Core) screen(now time.Time, ev Event) (Reason, bool) {
	switch ev.Classification {
	case classRebooted:
		return ReasonRebooted, false
	case classByNova:
		return ReasonStoppedByNova, false
	case classUnexpected:
		if !contains(c.cfg.Details, ev.Detail) {
			return ReasonDetail, false
		}
	case classUnknown:
		if !c.cfg.Unknown {
			return ReasonUnknownOff, false
		}
	default:
		return ReasonNotClassified, false
	}
	if now.Sub(ev.ObservedAt) > c.cfg.MaxEventAge {
		return ReasonTooOld, false
	}
	return "", true
}

// Tick tells the core whether it may act now and runs what is due.
func (c *Core) Tick(now time.Time, leading bool) []Op {
	if c.leading && !leading {
		for _, j := range c.jobs {
			j.reload = true // another leader may write meanwhile
		}
	}
	c.leading = leading
	var ops []Op
	for _, j := range c.sortedJobs() {
		ops = append(ops, c.step(now, j)...)
	}
	return ops
}

func (c *Core) sortedJobs() []*job {
	out := make([]*job, 0, len(c.jobs))
	for _, j := range c.jobs {
		out = append(out, j)
	}
	// deterministic order: by stop key
	for i := 1; i < len(out); i++ {
		for k := i; k > 0 && out[k].ev.Key() < out[k-1].ev.Key(); k-- {
			out[k], out[k-1] = out[k-1], out[k]
		}
	}
	return out
}

// NextDeadline returns when Tick next has something to do (zero: nothing
// timed).
func (c *Core) NextDeadline() time.Time {
	var next time.Time
	if !c.leading {
		return next // nothing is done while not leading
	}
	for _, j := range c.jobs {
		if j.busy || j.due.IsZero() {
			continue
		}
		if next.IsZero() || j.due.Before(next) {
			next = j.due
		}
	}
	return next
}

// step emits the op of a job's phase if it is idle, leading and due.
func (c *Core) step(now time.Time, j *job) []Op {
	if j.busy || !c.leading {
		return nil
	}
	if j.reload {
		j.reload, j.loaded, j.phase, j.due = false, false, phLoad, time.Time{}
	}
	if !j.due.IsZero() && now.Before(j.due) {
		return nil
	}
	j.due = time.Time{}
	switch j.phase {
	case phLoad:
		j.busy = true
		return []Op{{Kind: OpLoad, UUID: j.ev.UUID}}
	case phWait:
		j.phase = phQuery
		fallthrough
	case phQuery, phVerify:
		j.busy = true
		return []Op{{Kind: OpQuery, UUID: j.ev.UUID, Actions: j.ev.Classification == classUnknown && j.phase == phQuery}}
	case phIntent, phOutcome:
		j.busy = true
		return []Op{{Kind: OpWrite, UUID: j.ev.UUID, Record: j.pending, Rev: j.rev}}
	case phAct:
		j.busy = true
		return []Op{{Kind: OpAct, UUID: j.ev.UUID, Action: j.action, Stop: j.ev, NovaHost: j.server.Host}}
	}
	return nil
}

// Loaded answers an OpLoad: the record (nil: none) at revision rev, or
// WriteLoadFailed.
func (c *Core) Loaded(now time.Time, uuid string, rec *Record, rev uint64, res WriteResult) []Op {
	j := c.jobs[uuid]
	if j == nil || !j.busy || j.phase != phLoad {
		return nil
	}
	j.busy = false
	if res == WriteLoadFailed {
		j.due = now.Add(c.cfg.PollInterval)
		return nil
	}
	if rec == nil {
		rec = &Record{Schema: RecordSchema, UUID: uuid}
	}
	j.rec, j.rev, j.loaded = cloneRecord(*rec), rev, true
	if e := j.rec.entry(j.ev.Key()); e != nil {
		switch {
		case !e.open():
			return c.finish(now, j, StepSkipped, ReasonHandled, "")
		case j.ours && e.By == j.nonce:
			// Our own intent (its write's outcome was unknown), not yet
			// performed: perform it now.
			j.phase, j.ours = phAct, false
			return c.step(now, j)
		default:
			// An action recorded before (a restart, another leader): it
			// may have been performed; verify it, never repeat it.
			j.action, j.acted, j.nonce, j.phase = e.Action, e.ActedAt, e.By, phVerify
			j.due = time.Time{}
			ops := []Op{c.report(now, j.ev, nil, StepVerifying, ReasonRecorded, "")}
			return append(ops, c.step(now, j)...)
		}
	}
	if j.nonce != "" {
		// Our intent is not in the record: it did not land (or was
		// overwritten); decide again from Nova.
		j.nonce, j.ours = "", false
	}
	if j.gone != "" {
		return c.finish(now, j, StepSkipped, j.gone, "")
	}
	j.phase = phQuery
	return c.step(now, j)
}

// NovaAnswer answers an OpQuery (err: Nova unavailable or a bad answer).
func (c *Core) NovaAnswer(now time.Time, uuid string, s Server, err error) []Op {
	j := c.jobs[uuid]
	if j == nil || !j.busy || (j.phase != phQuery && j.phase != phVerify) {
		return nil
	}
	j.busy = false
	if err == nil {
		j.server = s
	}
	if j.phase == phVerify {
		return c.verify(now, j, s, err)
	}
	if j.gone != "" {
		return c.finish(now, j, StepSkipped, j.gone, "")
	}
	if err != nil {
		if now.Sub(j.start) >= c.cfg.SettleTimeout {
			return c.finish(now, j, StepSkipped, ReasonNovaUnavailable, err.Error())
		}
		return c.wait(now, j, ReasonNovaUnavailable, now.Add(c.cfg.PollInterval))
	}
	act, r, wait := c.judge(now, j, s)
	switch {
	case wait:
		return c.wait(now, j, r, now.Add(c.cfg.PollInterval))
	case act == "":
		return c.finish(now, j, StepSkipped, r, "")
	case act == ActionNotify:
		return c.finish(now, j, StepNotified, r, "")
	}
	// Budget and backoff.
	n, last := j.rec.actions(now.Add(-c.cfg.BudgetWindow))
	if n >= c.cfg.Budget {
		return c.finish(now, j, StepOverBudget, ReasonBudget, fmt.Sprintf("%d actions within %s", n, c.cfg.BudgetWindow))
	}
	if n > 0 {
		if due := last.Add(c.backoff(n)); now.Before(due) {
			return c.wait(now, j, ReasonBackoff, due)
		}
	}
	// Record the intent, then act.
	c.nonces++
	j.action, j.attempt = act, n+1
	j.nonce = c.cfg.ID + "#" + strconv.FormatUint(c.nonces, 10) + "@" + strconv.FormatInt(now.UnixNano(), 36)
	j.ours = true
	p := cloneRecord(j.rec)
	closeOpen(&p, now)
	p.Stops = append(p.Stops, Entry{Stop: j.ev.Key(), Action: act, ActedAt: now, By: j.nonce, Reason: r})
	p.prune(now.Add(-c.cfg.BudgetWindow))
	j.pending, j.phase = p, phIntent
	return c.step(now, j)
}

// backoff is the wait after the previous action when n actions were taken
// within the window: Backoff·2^(n-1), capped.
func (c *Core) backoff(n int) time.Duration {
	d := c.cfg.Backoff
	for i := 1; i < n && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, c.cfg.MaxBackoff)
}

// judge decides from Nova's view: an action, a skip (act == ""), or wait.
func (c *Core) judge(now time.Time, j *job, s Server) (act Action, r Reason, wait bool) {
	if !s.Found {
		return "", ReasonNotInNova, false
	}
	if s.Host != "" && !SameHost(s.Host, j.ev.Host) {
		return "", ReasonMoved, false
	}
	if ok, _ := c.cfg.protected(s.Project, s.Metadata); !ok {
		return "", ReasonNotProtected, false
	}
	// Nova's power_state lags: it learns of a stop only at its own sync,
	// ~15–17 s after libvirt's STOPPED (34–47 s under load), i.e. often
	// after the agent's report. So "active, running" in Nova is no reason
	// to skip: the agent's stream says whether the domain runs again (a
	// running event ends the job: running-again).
	settled := now.Sub(j.start) >= c.cfg.SettleTimeout
	if s.TaskState != "" {
		if settled {
			return "", ReasonNovaBusy, false
		}
		return "", ReasonSettling, true
	}
	unknown := j.ev.Classification == classUnknown
	byMode := func(restart Action, r Reason) (Action, Reason, bool) {
		switch c.cfg.Mode {
		case ModeMasakari:
			return ActionMasakari, r, false
		case ModeNotify:
			return ActionNotify, r, false
		}
		return restart, r, false
	}
	switch s.VMState {
	case "stopped":
		if unknown && s.StopByUser {
			return "", ReasonUserStop, false
		}
		return byMode(ActionStart, ReasonNovaStopped)
	case "active":
		switch {
		case unknown && settled:
			return "", ReasonNotConfirmed, false
		case unknown:
			return "", ReasonSettling, true
		case settled:
			// Nova's power sync did not run: os-start is refused on an
			// active server; Masakari's engine stops and starts it itself.
			return byMode(ActionHardReboot, ReasonNovaNotSynced)
		}
		// Wait for Nova's own sync in every mode: acting meanwhile races
		// with its stop (a Masakari engine's stop would get a 409).
		return "", ReasonSettling, true
	case "error":
		if unknown {
			return "", ReasonNotConfirmed, false
		}
		return byMode(ActionHardReboot, ReasonNovaError)
	}
	return "", ReasonVMState, false
}

// SameHost reports whether Nova's host name a and the agent's b name the
// same machine: equal, or equal first labels (one of them short), case
// insensitive.
func SameHost(a, b string) bool {
	if strings.EqualFold(a, b) {
		return true
	}
	fa, _, da := strings.Cut(a, ".")
	fb, _, db := strings.Cut(b, ".")
	return (!da || !db) && strings.EqualFold(fa, fb)
}

func (c *Core) wait(now time.Time, j *job, r Reason, due time.Time) []Op {
	j.phase, j.due = phWait, due
	var ops []Op
	if j.waitSaid != r {
		j.waitSaid = r
		ops = append(ops, c.report(now, j.ev, j, StepWaiting, r, ""))
	}
	return append(ops, c.step(now, j)...)
}

// Acted answers an OpAct. notActing: MayAct said no, nothing was sent.
// definite: the error is a refusal (the action certainly did not happen);
// otherwise it may have happened and is verified.
func (c *Core) Acted(now time.Time, uuid string, err error, notActing, definite bool) []Op {
	j := c.jobs[uuid]
	if j == nil || !j.busy || j.phase != phAct {
		return nil
	}
	j.busy = false
	if notActing {
		// Not performed: still ours; reload (another leader may have
		// closed it) before performing it.
		j.reload = true
		return c.step(now, j)
	}
	j.ours = false
	j.acted = now
	if err != nil && definite {
		if j.running {
			// It came back by itself just before the action (Nova refused
			// to start an active server).
			return c.outcome(now, j, StepSkipped, ReasonRunningAgain, err.Error())
		}
		return c.outcome(now, j, StepFailed, ReasonRejected, err.Error())
	}
	if j.action == ActionMasakari {
		if err != nil {
			return c.outcome(now, j, StepFailed, ReasonRejected, err.Error())
		}
		return c.outcome(now, j, StepNotified, ReasonCreated, "")
	}
	j.phase, j.due = phVerify, now.Add(c.cfg.PollInterval)
	return c.step(now, j)
}

// verify handles Nova's answer after an action.
func (c *Core) verify(now time.Time, j *job, s Server, err error) []Op {
	if err == nil {
		switch {
		case !s.Found:
			return c.outcome(now, j, StepFailed, ReasonDeleted, "")
		case s.activeRunning():
			j.active = true
		default:
			j.active = false
		}
	}
	if j.action == ActionMasakari {
		// A Masakari notification recorded before a restart: its result
		// is Masakari's; the record says notified.
		return c.outcome(now, j, StepNotified, ReasonRecorded, "")
	}
	if j.active && j.running {
		return c.outcome(now, j, StepRecovered, ReasonVerified, "")
	}
	if now.Sub(j.acted) >= c.cfg.VerifyTimeout {
		msg := fmt.Sprintf("after %s: Nova vm_state %q task %q power %d, agent reported running: %v",
			c.cfg.VerifyTimeout, j.server.VMState, j.server.TaskState, j.server.PowerState, j.running)
		return c.outcome(now, j, StepFailed, ReasonNotActive, msg)
	}
	j.due = now.Add(c.cfg.PollInterval)
	return c.step(now, j)
}

// verifyEvent: the running event arrived while verifying.
func (c *Core) verifyEvent(now time.Time, j *job) []Op {
	if j.phase == phVerify && !j.busy && j.active && j.running {
		return c.outcome(now, j, StepRecovered, ReasonVerified, "")
	}
	return nil
}

// outcome writes the stop's outcome, then reports it.
func (c *Core) outcome(now time.Time, j *job, st Step, r Reason, msg string) []Op {
	p := cloneRecord(j.rec)
	e := p.entry(j.ev.Key())
	if e == nil {
		p.Stops = append(p.Stops, Entry{Stop: j.ev.Key(), Action: j.action, ActedAt: j.acted, By: j.nonce})
		e = &p.Stops[len(p.Stops)-1]
	}
	e.Outcome, e.Reason, e.DecidedAt = st, r, now
	p.prune(now.Add(-c.cfg.BudgetWindow))
	j.pending, j.phase, j.due = p, phOutcome, time.Time{}
	j.outcome = c.report(now, j.ev, j, st, r, msg).Report
	return c.step(now, j)
}

// Written answers an OpWrite.
func (c *Core) Written(now time.Time, uuid string, rev uint64, res WriteResult) []Op {
	j := c.jobs[uuid]
	if j == nil || !j.busy || (j.phase != phIntent && j.phase != phOutcome) {
		return nil
	}
	j.busy = false
	if res != WriteLanded {
		// Conflict: another writer; unknown: it may have landed; not
		// acting: not sent. Read the record again and decide from it
		// (our own intent is recognised by its nonce).
		j.reload = true
		return c.step(now, j)
	}
	j.rec, j.rev = j.pending, rev
	if j.phase == phOutcome {
		r := j.outcome
		r.At = now
		if r.Step == StepRecovered {
			r.Took = now.Sub(j.ev.ObservedAt)
			r.TookSeconds = r.Took.Seconds()
		}
		return c.done(now, j, r)
	}
	if j.gone != "" {
		// Running again (or undefined) while the intent was written:
		// close it without acting.
		j.ours = false
		return c.outcome(now, j, StepSkipped, j.gone, "")
	}
	j.phase, j.running = phAct, false // only a start reported after the action verifies it
	ops := []Op{c.report(now, j.ev, j, StepActing, j.pending.entry(j.ev.Key()).Reason, "")}
	return append(ops, c.step(now, j)...)
}

// finish ends a job without a record write (nothing was recorded for it).
func (c *Core) finish(now time.Time, j *job, st Step, r Reason, msg string) []Op {
	return c.done(now, j, c.report(now, j.ev, j, st, r, msg).Report)
}

// done reports r, removes the job and starts the next queued stop.
func (c *Core) done(now time.Time, j *job, r Report) []Op {
	ops := []Op{{Kind: OpReport, UUID: j.ev.UUID, Report: r}}
	delete(c.jobs, j.ev.UUID)
	q := c.queue[j.ev.UUID]
	if len(q) == 0 {
		return ops
	}
	next := q[0]
	if len(q) == 1 {
		delete(c.queue, j.ev.UUID)
	} else {
		c.queue[j.ev.UUID] = q[1:]
	}
	if rr, ok := c.screen(now, next.ev); !ok {
		return append(ops, c.report(now, next.ev, nil, StepSkipped, rr, ""))
	}
	return append(ops, c.begin(now, next.ev, next.gone, next.running)...)
}

func (c *Core) report(now time.Time, ev Event, j *job, st Step, r Reason, msg string) Op {
	rep := Report{At: now, UUID: ev.UUID, Name: ev.Name, Host: ev.Host, Stop: ev.Key(), Classification: ev.Classification,
		ClassificationReason: ev.ClassificationReason, Detail: ev.Detail, StopObservedAt: ev.ObservedAt, Step: st, Reason: r, Error: msg}
	if j != nil {
		rep.Project, rep.VMState, rep.TaskState = j.server.Project, j.server.VMState, j.server.TaskState
		rep.Action, rep.Attempt = j.action, j.attempt
	}
	return Op{Kind: OpReport, UUID: ev.UUID, Report: rep}
}

func cloneRecord(r Record) Record {
	r.Stops = append([]Entry(nil), r.Stops...)
	return r
}

// closeOpen closes every open intent of r (an older stop's action never
// verified: the controller that recorded it is gone and the instance
// stopped again since).
func closeOpen(r *Record, now time.Time) {
	for i := range r.Stops {
		if r.Stops[i].open() {
			r.Stops[i].Outcome, r.Stops[i].Reason, r.Stops[i].DecidedAt = StepFailed, ReasonUnverified, now
		}
	}
}
