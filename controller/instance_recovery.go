package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/classify"
	"hvguard/controller/instancerecovery"
	"hvguard/fencing/natslease"
)

// InstanceCloud is what instance recovery asks of OpenStack (the daemon
// adapts the openstack package's recovery adapter to it).
type InstanceCloud interface {
	// Server returns Nova's view; a 404 is Found=false, not an error.
	Server(ctx context.Context, id string) (instancerecovery.Server, error)
	// StopByUser reports whether the newest `stop` instance action of the
	// server has a user (a stop API request) rather than Nova's own power
	// sync (user_id null).
	StopByUser(ctx context.Context, id string) (bool, error)
	Start(ctx context.Context, id string) error
	HardReboot(ctx context.Context, id string) error
	// MasakariVM creates a Masakari VM notification for the server on
	// host (Nova's name of its compute host; the instance's stop,
	// reported at at) and returns its id.
	MasakariVM(ctx context.Context, id, host string, at time.Time) (string, error)
	// Refused reports whether err is a refusal (the action certainly did
	// not happen: 4xx), as opposed to an outcome that is unknown.
	Refused(err error) bool
}

// Instance recovery runner constants.
const (
	// InstanceCallTimeout bounds one KV read or write of the instance
	// bucket (as the leader lock's write timeout: after it the outcome is
	// unknown and the core reads the record again).
	InstanceCallTimeout = 2 * time.Second
	// InstanceTick is how often the runner gives the core the leadership
	// (MayAct) and runs what is due.
	InstanceTick = 250 * time.Millisecond
	// InstanceRecent is how many reports `status` keeps.
	InstanceRecent = 100
)

// InstanceRecoveryRunner is the I/O shell of instancerecovery.Core: it
// feeds the core the events the fleet view applied (Observe, called by the
// Consumer), the leadership (MayAct) and the results of the core's ops:
// records in the KV bucket hvguard-instance-recovery (CAS), Nova and
// Masakari calls (through Cloud, each bounded by CloudTimeout). MayAct is
// checked immediately before every record write and every action. One
// goroutine (Run) owns the core.
type InstanceRecoveryRunner struct {
	Core  *instancerecovery.Core
	KV    jetstream.KeyValue
	Cloud InstanceCloud
	// MayAct and LeaderNow: the leader lock's gate and its clock.
	MayAct    func(time.Time) bool
	LeaderNow func() time.Time
	// Now is the wall clock of the core (stop ages, budget, records);
	// time.Now if nil.
	Now          func() time.Time
	CloudTimeout time.Duration
	Log          *slog.Logger
	// OnReport is called (on Run's goroutine) with every report; a
	// standby's core reports only the stops it screens out (the daemon
	// publishes reports only while it leads).
	OnReport func(instancerecovery.Report)

	mu      sync.Mutex
	queue   []instancerecovery.Event
	synced  bool
	wake    chan struct{}
	recent  []instancerecovery.Report
	over    map[string]instancerecovery.Report
	counts  map[string]uint64 // step/reason
	actions map[instancerecovery.Action]uint64
	took    []time.Duration
	busy    int
}

func (r *InstanceRecoveryRunner) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
		r.over = map[string]instancerecovery.Report{}
		r.counts = map[string]uint64{}
		r.actions = map[instancerecovery.Action]uint64{}
	}
}

func (r *InstanceRecoveryRunner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Observe takes one event the fleet view applied (Consumer.OnApplied:
// called under the view's lock, so it only queues).
func (r *InstanceRecoveryRunner) Observe(fe FleetEvent, v Verdict) {
	if v == Duplicate || v == OldIncarnation || fe.DomainUUID == "" {
		return
	}
	r.init()
	ev := instancerecovery.Event{Host: fe.Host, Incarnation: fe.Incarnation, Seq: fe.Seq, UUID: fe.DomainUUID, Name: fe.DomainName,
		Transition: fe.Transition, State: fe.State, Classification: fe.Classification, ClassificationReason: fe.ClassificationReason,
		ObservedAt: fe.ObservedAt}
	if fe.Transition == "stopped" {
		ev.Detail = string(classify.ParseDetail(fe.LibvirtDetail))
	}
	r.mu.Lock()
	r.queue = append(r.queue, ev)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Synced tells the runner the consumer has caught up with the stream:
// until then (the replay of what the stream retains) it acts on nothing,
// so a replayed stop is never judged before the events that follow it.
func (r *InstanceRecoveryRunner) Synced() {
	r.init()
	r.mu.Lock()
	r.synced = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run drives the core until ctx ends.
func (r *InstanceRecoveryRunner) Run(ctx context.Context) error {
	r.init()
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	results := make(chan func() []instancerecovery.Op, 64)
	tick := time.NewTicker(InstanceTick)
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var ops []instancerecovery.Op
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
			r.mu.Lock()
			evs := r.queue
			r.queue = nil
			r.mu.Unlock()
			now := r.now()
			for _, ev := range evs {
				ops = append(ops, r.Core.Event(now, ev)...)
			}
			ops = append(ops, r.Core.Tick(now, r.mayAct())...)
		case f := <-results:
			ops = f()
		case <-tick.C:
			ops = r.Core.Tick(r.now(), r.mayAct())
		case <-timer.C:
			ops = r.Core.Tick(r.now(), r.mayAct())
		}
		r.perform(ctx, log, ops, results, &wg)
		r.mu.Lock()
		r.busy = r.Core.InProgress()
		r.mu.Unlock()
		if next := r.Core.NextDeadline(); !next.IsZero() {
			timer.Reset(max(time.Millisecond, time.Until(next)))
		}
	}
}

func (r *InstanceRecoveryRunner) mayAct() bool {
	r.mu.Lock()
	synced := r.synced
	r.mu.Unlock()
	return synced && r.MayAct(r.LeaderNow())
}

func (r *InstanceRecoveryRunner) perform(ctx context.Context, log *slog.Logger, ops []instancerecovery.Op,
	results chan<- func() []instancerecovery.Op, wg *sync.WaitGroup) {
	for _, op := range ops {
		if op.Kind == instancerecovery.OpReport {
			r.reported(log, op.Report)
			continue
		}
		wg.Go(func() {
			f := r.do(ctx, log, op)
			select {
			case results <- f:
			case <-ctx.Done():
			}
		})
	}
}

// do performs one op off the loop and returns the core's answer to run on
// the loop.
func (r *InstanceRecoveryRunner) do(ctx context.Context, log *slog.Logger, op instancerecovery.Op) func() []instancerecovery.Op {
	core := r.Core
	switch op.Kind {
	case instancerecovery.OpLoad:
		cctx, cancel := context.WithTimeout(ctx, InstanceCallTimeout)
		defer cancel()
		e, err := r.KV.Get(cctx, op.UUID)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return func() []instancerecovery.Op {
				return core.Loaded(r.now(), op.UUID, nil, 0, instancerecovery.WriteLanded)
			}
		case err != nil:
			log.Warn("instance record not read; retrying", "domain_uuid", op.UUID, "err", err)
			return func() []instancerecovery.Op {
				return core.Loaded(r.now(), op.UUID, nil, 0, instancerecovery.WriteLoadFailed)
			}
		}
		rec, err := instancerecovery.DecodeRecord(e.Value(), op.UUID)
		if err != nil {
			// An undecodable record: act on nothing for this instance
			// (an operator must look; deleting the key resets it).
			log.Error("undecodable instance record: not recovering this instance until it is fixed or deleted",
				"domain_uuid", op.UUID, "revision", e.Revision(), "err", err)
			return func() []instancerecovery.Op {
				return core.Loaded(r.now(), op.UUID, nil, 0, instancerecovery.WriteLoadFailed)
			}
		}
		rev := e.Revision()
		return func() []instancerecovery.Op {
			return core.Loaded(r.now(), op.UUID, &rec, rev, instancerecovery.WriteLanded)
		}
	case instancerecovery.OpQuery:
		cctx, cancel := context.WithTimeout(ctx, r.CloudTimeout)
		defer cancel()
		s, err := r.Cloud.Server(cctx, op.UUID)
		if err == nil && op.Actions && s.Found && s.VMState == "stopped" {
			s.StopByUser, err = r.Cloud.StopByUser(cctx, op.UUID)
		}
		if err != nil {
			log.Debug("Nova query failed", "domain_uuid", op.UUID, "err", err)
		}
		return func() []instancerecovery.Op { return core.NovaAnswer(r.now(), op.UUID, s, err) }
	case instancerecovery.OpWrite:
		res, rev := r.write(ctx, log, op)
		return func() []instancerecovery.Op { return core.Written(r.now(), op.UUID, rev, res) }
	case instancerecovery.OpAct:
		if !r.MayAct(r.LeaderNow()) {
			return func() []instancerecovery.Op { return core.Acted(r.now(), op.UUID, nil, true, false) }
		}
		// An orderly stop lets a started call finish (bounded) rather than
		// abandon it half-sent.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.CloudTimeout)
		defer cancel()
		var err error
		switch op.Action {
		case instancerecovery.ActionStart:
			err = r.Cloud.Start(cctx, op.UUID)
		case instancerecovery.ActionHardReboot:
			err = r.Cloud.HardReboot(cctx, op.UUID)
		case instancerecovery.ActionMasakari:
			var id string
			host := op.NovaHost
			if host == "" {
				host = op.Stop.Host
			}
			id, err = r.Cloud.MasakariVM(cctx, op.UUID, host, op.Stop.ObservedAt)
			if err == nil {
				log.Info("Masakari notification created", "domain_uuid", op.UUID, "notification", id)
			}
		default:
			err = fmt.Errorf("unknown action %q", op.Action)
		}
		r.mu.Lock()
		r.actions[op.Action]++
		r.mu.Unlock()
		refused := err != nil && r.Cloud.Refused(err)
		if err != nil {
			log.Warn("instance recovery action failed", "domain_uuid", op.UUID, "action", op.Action, "refused", refused, "err", err)
		}
		return func() []instancerecovery.Op { return core.Acted(r.now(), op.UUID, err, false, refused) }
	}
	return func() []instancerecovery.Op { return nil }
}

// write performs a record write by CAS, gated by MayAct.
func (r *InstanceRecoveryRunner) write(ctx context.Context, log *slog.Logger, op instancerecovery.Op) (instancerecovery.WriteResult, uint64) {
	b, err := op.Record.Encode()
	if err != nil {
		log.Error("instance record not encodable", "domain_uuid", op.UUID, "err", err)
		return instancerecovery.WriteConflict, 0
	}
	if !r.MayAct(r.LeaderNow()) {
		return instancerecovery.WriteNotActing, 0
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), InstanceCallTimeout)
	defer cancel()
	var rev uint64
	if op.Rev == 0 {
		rev, err = r.KV.Create(cctx, op.UUID, b)
	} else {
		rev, err = r.KV.Update(cctx, op.UUID, b, op.Rev)
	}
	switch {
	case err == nil:
		return instancerecovery.WriteLanded, rev
	case natslease.IsConflict(err) || errors.Is(err, jetstream.ErrKeyExists):
		return instancerecovery.WriteConflict, 0
	}
	log.Warn("instance record write: outcome unknown; reading it again", "domain_uuid", op.UUID, "err", err)
	return instancerecovery.WriteUnknown, 0
}

// reported logs, counts and keeps a report; OnReport publishes it.
func (r *InstanceRecoveryRunner) reported(log *slog.Logger, rep instancerecovery.Report) {
	lvl := slog.LevelInfo
	switch rep.Step {
	case instancerecovery.StepSkipped:
		lvl = slog.LevelDebug
		if rep.Classification == "stopped-unexpectedly" || rep.Classification == "unknown" {
			lvl = slog.LevelInfo
		}
	case instancerecovery.StepFailed, instancerecovery.StepOverBudget:
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "instance recovery: "+string(rep.Step), "domain_uuid", rep.UUID, "domain", rep.Name,
		"host", rep.Host, "stop", rep.Stop, "classification", rep.Classification, "detail", rep.Detail, "reason", rep.Reason,
		"action", rep.Action, "attempt", rep.Attempt, "vm_state", rep.VMState, "task_state", rep.TaskState, "took", rep.Took, "err", rep.Error)
	r.mu.Lock()
	r.counts[string(rep.Step)+"/"+string(rep.Reason)]++
	if rep.Step != instancerecovery.StepWaiting {
		r.recent = append(r.recent, rep)
		if len(r.recent) > InstanceRecent {
			r.recent = r.recent[len(r.recent)-InstanceRecent:]
		}
	}
	switch rep.Step {
	case instancerecovery.StepOverBudget:
		r.over[rep.UUID] = rep
	case instancerecovery.StepRecovered:
		r.took = append(r.took, rep.Took)
		delete(r.over, rep.UUID)
	}
	// Over budget until the window has passed since the report.
	window := r.Core.Config().BudgetWindow
	for u, o := range r.over {
		if rep.At.Sub(o.At) > window {
			delete(r.over, u)
		}
	}
	r.mu.Unlock()
	if r.OnReport != nil {
		r.OnReport(rep)
	}
}

// InstanceRecoveryView is the runner's state for status and metrics.
type InstanceRecoveryView struct {
	Mode       instancerecovery.Mode              `json:"mode"`
	InProgress int                                `json:"in_progress"`
	Recent     []instancerecovery.Report          `json:"recent"`
	OverBudget []instancerecovery.Report          `json:"over_budget"`
	Counts     map[string]uint64                  `json:"counts"`
	Actions    map[instancerecovery.Action]uint64 `json:"actions"`
	// Took: stop reported → ACTIVE and running, of every recovery.
	Took []time.Duration `json:"-"`
}

// View returns a copy of the runner's state (safe for concurrent use).
func (r *InstanceRecoveryRunner) View() InstanceRecoveryView {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	v := InstanceRecoveryView{Mode: r.Core.Config().Mode, InProgress: r.busy, Recent: append([]instancerecovery.Report(nil), r.recent...),
		Counts: map[string]uint64{}, Actions: map[instancerecovery.Action]uint64{}, Took: append([]time.Duration(nil), r.took...)}
	for k, n := range r.counts {
		v.Counts[k] = n
	}
	for k, n := range r.actions {
		v.Actions[k] = n
	}
	for _, o := range r.over {
		v.OverBudget = append(v.OverBudget, o)
	}
	return v
}

// InstanceRecoveryEventSchema is the version of InstanceRecoveryEvent.
const InstanceRecoveryEventSchema = 1

// InstanceRecoveryEvent is a report as the leading controller publishes it
// on proto.ControllerInstanceRecoverySubject (JSON; decoders tolerate
// unknown fields).
type InstanceRecoveryEvent struct {
	Schema     int    `json:"schema"`
	Controller string `json:"controller"`
	Term       uint64 `json:"term"`
	instancerecovery.Report
}
