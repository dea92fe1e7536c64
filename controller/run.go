package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"hvguard/fencing/natslease"
)

// Runner defaults.
const (
	// TickInterval is how often the runner evaluates the tracker.
	TickInterval = 250 * time.Millisecond
	// GuardPublishInterval is how often the guard is published again (and
	// at once when the membership changes).
	GuardPublishInterval = 30 * time.Second
	// WriteTimeout bounds a declaration or release write.
	WriteTimeout = 2 * time.Second
	// RewatchDelay is the pause before a failed watch is re-established.
	RewatchDelay = time.Second
)

// Runner is the controller's I/O shell: it watches the lease bucket into
// the Tracker, ticks it, performs its declarations by CAS, publishes the
// guard and logs every loud decision. One goroutine (Run) owns the Tracker.
type Runner struct {
	Store   *natslease.Store
	Tracker *Tracker
	Log     *slog.Logger
	// Now is the controller's clock (time.Now if nil).
	Now func() time.Time
	// OnDecision, if set, is called with every decision after it was
	// performed (tests, metrics).
	OnDecision func(Decision, error)
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Run runs until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	tick := time.NewTicker(TickInterval)
	defer tick.Stop()
	var lastPublish time.Time
	published := -1
	for ctx.Err() == nil {
		updates := make(chan natslease.Update, 1024)
		synced := make(chan struct{})
		wctx, cancel := context.WithCancel(ctx)
		werr := make(chan error, 1)
		go func() { werr <- r.Store.Watch(wctx, updates, synced) }()
		watching := false
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case err := <-werr:
				log.Error("lease watch failed; declaring nothing until it is back", "err", err)
				break loop
			case <-synced:
				synced = nil
				watching = true
				r.Tracker.WatchStarted(r.now())
				log.Info("lease watch synced", "hosts", r.Tracker.Members())
			case u := <-updates:
				if u.Err != nil {
					log.Error("undecodable lease record", "host", u.Host, "err", u.Err)
					continue
				}
				for _, d := range r.Tracker.Observe(r.now(), u.Host, u.Revision, u.Record) {
					r.perform(ctx, log, d)
				}
			case <-tick.C:
				if !watching {
					continue // silence is measured only while watching
				}
				now := r.now()
				if n := r.Tracker.Members(); n != published || now.Sub(lastPublish) > GuardPublishInterval {
					if err := r.Store.PublishGuard(ctx, r.Tracker.Guard()); err != nil {
						log.Warn("publish guard", "err", err)
					} else {
						published, lastPublish = n, now
					}
				}
				for _, d := range r.Tracker.Tick(now) {
					r.perform(ctx, log, d)
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(RewatchDelay):
		}
	}
	return nil
}

func (r *Runner) perform(ctx context.Context, log *slog.Logger, d Decision) {
	var err error
	switch d.Op {
	case OpDeclare:
		_, err = r.Store.Write(ctx, d.Host, d.Revision, d.Record, WriteTimeout)
		if err != nil {
			log.Info("declaration not written (the host renewed, or NATS failed)", "host", d.Host, "err", err)
		} else {
			log.Warn("host declared expired", "host", d.Host, "epoch", d.Record.Epoch, "reason", d.Reason)
		}
	case OpRelease:
		_, err = r.Store.Write(ctx, d.Host, d.Revision, d.Record, WriteTimeout)
		if err != nil {
			err = fmt.Errorf("release %s: %w", d.Host, err)
			log.Error("release failed", "host", d.Host, "err", err)
		}
	case OpHoldStarted:
		log.Error("MASS FAILURE GUARD: holding, declaring nothing", "silent", d.Silent, "threshold", d.Threshold, "reason", d.Reason)
	case OpHoldEnded:
		log.Warn("mass failure guard: hold ended", "silent", d.Silent, "threshold", d.Threshold)
	case OpRefuse:
		log.Error("REFUSING host: its constants cannot be honoured; it will never be declared expired", "host", d.Host, "reason", d.Reason)
	case OpRefusedDue:
		log.Error("refused host is silent and will NOT be declared", "host", d.Host, "reason", d.Reason)
	case OpLeaseDeleted:
		log.Error("LEASE KEY DELETED: host unprotected, it will not be declared until its agent re-creates the key", "host", d.Host, "reason", d.Reason)
	case OpHeldBack:
		log.Warn("host due but held back by the mass-failure guard", "host", d.Host)
	default:
		err = errors.New("unknown decision")
	}
	if r.OnDecision != nil {
		r.OnDecision(d, err)
	}
}
