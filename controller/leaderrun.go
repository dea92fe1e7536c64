package controller

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing/natslease"
)

// LeaderRunner is the NATS shell of Leader: it watches LeaderKey in the
// lease bucket, performs the core's lock writes by CAS (each bounded by
// the config's WriteTimeout, off the loop) and publishes the core's
// verdict for other goroutines through MayAct. One goroutine (Run) owns
// the core.
type LeaderRunner struct {
	KV   jetstream.KeyValue
	Core *Leader
	Log  *slog.Logger
	// Now is the controller's clock; it must count time while the process
	// is stopped (CLOCK_BOOTTIME), so a SIGSTOP'd leader sees its lease
	// lapsed when it resumes. time.Now if nil (tests).
	Now func() time.Time
	// OnChange, if set, is called (from Run's goroutine) on every election
	// or deposition.
	OnChange func(op LeaderOp)
	// OnSynced, if set, is called (from Run's goroutine) each time the
	// watch of LeaderKey has delivered the key's current value.
	OnSynced func()
	// Eligible, if set, is asked before every claim or renewal of the
	// lock (not before a resignation): while it says no, nothing is
	// written, so a leader's lock lapses after its TTL and a standby takes
	// over. The daemon says no while its connection to the agents' account
	// is down: the lock lives in the controllers' own account (ControlBucket,
	// a second connection), and a leader that can no longer watch the
	// leases must not keep the lock from a standby that can.
	Eligible func() bool

	mu         sync.Mutex
	leading    bool
	validUntil time.Time
	term       uint64
	holder     string
	holderTerm uint64
	alive      time.Time
}

// Holder returns the lock's holder and term as the watch last showed them
// ("" if none; safe for concurrent use).
func (r *LeaderRunner) Holder() (string, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holder, r.holderTerm
}

// Alive returns when Run's goroutine last made progress, on Now's clock:
// it goes round at least every RenewInterval/2 while watching, and every
// RewatchDelay while the watch cannot be established (safe for concurrent
// use; zero before Run).
func (r *LeaderRunner) Alive() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alive
}

func (r *LeaderRunner) markAlive() {
	now := r.now()
	r.mu.Lock()
	r.alive = now
	r.mu.Unlock()
}

func (r *LeaderRunner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// MayAct reports whether this controller may start an action now (safe
// for concurrent use; call it immediately before every action, with the
// same clock as Now).
func (r *LeaderRunner) MayAct(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leading && now.Before(r.validUntil)
}

// Term returns the term of the current claim (0: not leading).
func (r *LeaderRunner) Term() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.leading {
		return 0
	}
	return r.term
}

func (r *LeaderRunner) publish() {
	r.mu.Lock()
	r.leading, r.validUntil, r.term = r.Core.Leading(), r.Core.ValidUntil(), r.Core.Term()
	r.holder, r.holderTerm = r.Core.Holder()
	r.mu.Unlock()
}

type writeDone struct {
	rec     LockRecord
	outcome WriteOutcome
	rev     uint64
	cur     *LockRecord
}

// Run runs until ctx ends; then, if leading, it resigns (stops acting at
// once and writes a released record, bounded by WriteTimeout) so a standby
// takes over after TakeoverAfter(ActMargin) instead of a whole TTL.
func (r *LeaderRunner) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	done := make(chan writeDone, 16)
	defer func() {
		ops := r.Core.Resign()
		r.publish()
		for _, op := range ops {
			if op.Kind == LeaderWrite {
				wctx, cancel := context.WithTimeout(context.Background(), r.Core.cfg.WriteTimeout)
				d := r.write(wctx, op)
				cancel()
				log.Info("leader lock released", "term", op.Record.Term, "outcome", d.outcome)
			}
			r.changed(log, op)
		}
	}()
	for ctx.Err() == nil {
		r.markAlive()
		w, err := r.KV.Watch(ctx, LeaderKey)
		if err != nil {
			log.Error("leader lock watch failed; not taking the lock until it is back", "err", err)
			if !sleepCtx(ctx, RewatchDelay) {
				return nil
			}
			continue
		}
		r.loop(ctx, log, w, done)
		_ = w.Stop()
		r.Core.WatchLost()
		if !sleepCtx(ctx, RewatchDelay) {
			return nil
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// loop serves one watch until it ends or ctx ends.
func (r *LeaderRunner) loop(ctx context.Context, log *slog.Logger, w jetstream.KeyWatcher, done chan writeDone) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	started := false
	for {
		r.markAlive()
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				log.Warn("leader lock watch ended")
				return
			}
			now := r.now()
			if e == nil { // initial values delivered
				if !started {
					started = true
					r.Core.WatchStarted(now)
					// No value before the marker: the key is absent.
					r.perform(ctx, log, r.Core.Observe(now, 0, nil), done)
				}
				if r.OnSynced != nil {
					r.OnSynced()
				}
				continue
			}
			if !started {
				started = true
				r.Core.WatchStarted(now)
			}
			var rec *LockRecord
			if e.Operation() == jetstream.KeyValuePut {
				lr, err := DecodeLockRecord(e.Value())
				if err != nil {
					// An undecodable lock is nobody's: treat it like any
					// value that must stand still before a takeover.
					log.Error("undecodable leader lock record", "revision", e.Revision(), "err", err)
					lr = LockRecord{Schema: LockSchema, Holder: "?undecodable", Term: 0, TTLMillis: r.Core.cfg.TTL.Milliseconds()}
				}
				rec = &lr
			}
			r.perform(ctx, log, r.Core.Observe(now, e.Revision(), rec), done)
		case d := <-done:
			r.perform(ctx, log, r.Core.WriteResult(r.now(), d.rec, d.outcome, d.rev, d.cur), done)
		case <-timer.C:
		}
		if started {
			r.perform(ctx, log, r.Core.Tick(r.now()), done)
		}
		now := r.now()
		timer.Reset(max(time.Millisecond, r.Core.NextDeadline(now).Sub(now)))
	}
}

func (r *LeaderRunner) perform(ctx context.Context, log *slog.Logger, ops []LeaderOp, done chan writeDone) {
	r.publish()
	for _, op := range append([]LeaderOp(nil), ops...) {
		if op.Kind == LeaderWrite {
			go func() {
				wctx, cancel := context.WithTimeout(ctx, r.Core.cfg.WriteTimeout)
				defer cancel()
				d := r.write(wctx, op)
				select {
				case done <- d:
				case <-ctx.Done():
				}
			}()
			continue
		}
		r.changed(log, op)
	}
}

func (r *LeaderRunner) changed(log *slog.Logger, op LeaderOp) {
	switch op.Kind {
	case LeaderElected:
		log.Warn("this controller is the leader", "term", op.Record.Term, "revision", op.Revision)
	case LeaderDeposed:
		log.Warn("this controller is no longer the leader", "reason", op.Reason)
	default:
		return
	}
	if r.OnChange != nil {
		r.OnChange(op)
	}
}

// write performs one lock write by CAS and classifies the answer.
func (r *LeaderRunner) write(ctx context.Context, op LeaderOp) writeDone {
	d := writeDone{rec: op.Record}
	if !op.Record.Released && r.Eligible != nil && !r.Eligible() {
		d.outcome = WriteUnknown // not written: never counted as landed
		return d
	}
	b, err := op.Record.Encode()
	if err != nil {
		d.outcome = WriteConflict // cannot happen; never counted as landed
		return d
	}
	var rev uint64
	if op.Revision == 0 {
		rev, err = r.KV.Create(ctx, LeaderKey, b)
	} else {
		rev, err = r.KV.Update(ctx, LeaderKey, b, op.Revision)
	}
	switch {
	case err == nil:
		d.outcome, d.rev = WriteLanded, rev
	case natslease.IsConflict(err):
		d.outcome = WriteConflict
		if e, gerr := r.KV.Get(ctx, LeaderKey); gerr == nil {
			d.rev = e.Revision()
			if lr, derr := DecodeLockRecord(e.Value()); derr == nil {
				d.cur = &lr
			}
		}
	default:
		// Timeouts, not connected, anything unclassified: treated as
		// unknown (the core retries on the same revision and counts it
		// only if it is later seen landed) — never as landed.
		d.outcome = WriteUnknown
	}
	return d
}
