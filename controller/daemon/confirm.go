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

// ConfirmRollback writes an operator's confirmation of each host to the
// control bucket, as this controller's configuration connects to it (the
// nats.control user when set: only controllers can write there), and
// returns each host's revision. The running controllers' rollback gates
// (controller/rollbackgate.go) take a confirmation written after their
// tracker started afresh on a rolled-back lease stream.
func ConfirmRollback(ctx context.Context, cfg Config, hosts []string, by, reason string, now time.Time) ([]uint64, error) {
	sect, what := cfg.NATS.NATSConfig, "nats"
	if cfg.NATS.Control.Set() {
		sect, what = cfg.NATS.ControlSection(), "nats.control"
	}
	opts, err := sect.OptionsFor(what)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ConfirmTimeout)
	defer cancel()
	nc, err := nats.Connect(cfg.NATS.URL(), append(opts, nats.Name("hvguard-controller confirm-rollback"), nats.Timeout(ConfirmTimeout))...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s (%s): %w", cfg.NATS.URL(), what, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream (%s): %w", what, err)
	}
	kv, err := controller.EnsureControlBucket(ctx, js, false)
	if err != nil {
		return nil, err
	}
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
