package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
)

// ConfirmTimeout bounds `hvguard-controller confirm-rollback`'s
// connection and writes.
const ConfirmTimeout = 10 * time.Second

// controlBucket connects as this controller's configuration connects to
// the control bucket (the nats.control user when set: only controllers
// can write there) and opens it; done closes the connection.
func controlBucket(ctx context.Context, cfg Config, name string) (kv jetstream.KeyValue, done func(), err error) {
	sect, what := cfg.NATS.NATSConfig, "nats"
	if cfg.NATS.Control.Set() {
		sect, what = cfg.NATS.ControlSection(), "nats.control"
	}
	opts, err := sect.OptionsFor(what)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(cfg.NATS.URL(), append(opts, nats.Name("hvguard-controller "+name), nats.Timeout(ConfirmTimeout))...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s (%s): %w", cfg.NATS.URL(), what, err)
	}
	js, err := jetstream.New(nc)
	if err == nil {
		kv, err = controller.EnsureControlBucket(ctx, js, false)
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return kv, nc.Close, nil
}

// ConfirmRollback writes an operator's confirmation of each host to the
// control bucket and returns each host's revision. The controllers'
// rollback gates (controller/rollbackgate.go) take a confirmation written
// after the rollback marker.
func ConfirmRollback(ctx context.Context, cfg Config, hosts []string, by, reason string, now time.Time) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, ConfirmTimeout)
	defer cancel()
	kv, done, err := controlBucket(ctx, cfg, "confirm-rollback")
	if err != nil {
		return nil, err
	}
	defer done()
	revs := make([]uint64, 0, len(hosts))
	for _, h := range hosts {
		rev, err := controller.WriteRollbackConfirmation(ctx, kv, controller.RollbackConfirmation{Host: h, By: by, Reason: reason, At: now})
		if err != nil {
			return revs, err
		}
		revs = append(revs, rev)
	}
	return revs, nil
}

// MarkRollback writes the controllers' rollback marker by hand (a lease
// stream restored while no controller ran: none found it) and returns
// its revision; with clear it deletes the marker instead (returning the
// revision of the marker deleted): controllers started from now on run
// without the gate (running ones keep theirs until they restart).
func MarkRollback(ctx context.Context, cfg Config, by, reason string, now time.Time, clear bool) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, ConfirmTimeout)
	defer cancel()
	kv, done, err := controlBucket(ctx, cfg, "mark-rollback")
	if err != nil {
		return 0, err
	}
	defer done()
	if !clear {
		return controller.WriteRollbackMarker(ctx, kv, controller.RollbackMarker{By: by, At: now, Reason: reason})
	}
	_, rev, err := controller.ReadRollbackMarker(ctx, kv)
	if err != nil && rev == 0 {
		return 0, err
	}
	if err := kv.Delete(ctx, controller.RollbackMarkerKey, jetstream.LastRevision(rev)); err != nil {
		return 0, fmt.Errorf("delete %s (revision %d): %w", controller.RollbackMarkerKey, rev, err)
	}
	return rev, nil
}
