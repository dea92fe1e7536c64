package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/proto"
)

// Consumer constants.
const (
	// ConsumerAckWait: a message not acknowledged within 30 s is delivered
	// again (the consumer crashed or hung between delivery and ack); the
	// fleet view drops the redelivery if it was applied (per-host seq).
	ConsumerAckWait = 30 * time.Second
	// ConsumerMaxAckPending bounds the messages in flight (delivered, not
	// yet acknowledged): applying one takes microseconds, so 512 keeps the
	// pipe full without holding much in memory.
	ConsumerMaxAckPending = 512
	// ConsumerInactive: a durable consumer whose controller is gone is
	// removed by the server after 24 h (a controller renamed or removed
	// must not pin the stream's messages forever).
	ConsumerInactive = 24 * time.Hour
	// ConsumerLagEvery is how often the consumer's lag (messages in the
	// stream not yet delivered to it) is read for metrics and status.
	ConsumerLagEvery = 5 * time.Second
	// ConsumerRefusedLogEvery spaces the log lines of refused events
	// (each is counted: ConsumerStats.Refused): a compromised node can
	// store forgeries in bulk, and the log must stay readable.
	ConsumerRefusedLogEvery = 10 * time.Second
)

// RefusedReasons are the reasons an event is refused
// (fencing.EventError.Reason), in the order of ConsumerStats.Refused.
var RefusedReasons = [...]string{fencing.EventUnsigned, fencing.EventForeignKey, fencing.EventUnknownSigner, fencing.EventBadSignature}

// ConsumerStats are the consumer's counters.
type ConsumerStats struct {
	Applied, Duplicates, OldIncarnation, Missing, NewIncarnation atomic.Uint64
	// Poison: messages that failed to decode, terminated (never
	// redelivered) and counted.
	Poison atomic.Uint64
	// Refused: events whose signature did not verify (Consumer.Keys), by
	// reason (RefusedReasons): terminated, never applied.
	Refused [len(RefusedReasons)]atomic.Uint64
	// Lag: messages in the stream not yet delivered (last read);
	// AckPending: delivered, not yet acknowledged.
	Lag, AckPending atomic.Int64
}

// Consumer is the fleet view's JetStream shell: one durable pull consumer
// per controller (leader or standby: every controller keeps its own view
// warm) on the lifecycle subjects of the event stream, explicit acks,
// bounded in flight. Each message is decoded and applied to the Fleet, then
// acknowledged; a message that does not decode is logged, counted and
// terminated, never redelivered, never blocking the stream.
type Consumer struct {
	JS jetstream.JetStream
	// Keys verifies each event's signature (fencing.Keyring.VerifyEvent,
	// against the key of the host its subject names) before the fleet
	// view and OnApplied see it; nil or signing off: nothing is checked.
	Keys *fencing.Keyring
	// ID names the durable consumer: hvguard-controller-<ID> (characters a
	// consumer name cannot hold become '_').
	ID  string
	Log *slog.Logger
	// Now is the clock of the view's receive times (time.Now if nil).
	Now func() time.Time
	// OnApplied, if set, is called (on the consumer's goroutine, under the
	// view's lock) after each message was applied: the recovery jobs
	// (issue 14) hook in here.
	OnApplied func(FleetEvent, Verdict)
	// OnSynced, if set, is called once the consumer has caught up with the
	// stream (no message pending) for the first time.
	OnSynced func()

	Stats ConsumerStats

	mu    sync.Mutex
	fleet *Fleet
	alive atomic.Int64 // UnixNano of the loop's last progress
	said  atomic.Int64 // UnixNano of the last refused event's log line
}

// DurableName returns the durable consumer's name for a controller id.
func DurableName(id string) string {
	var b strings.Builder
	b.WriteString("hvguard-controller-")
	for _, r := range id {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// View calls f with the fleet view under its lock (f must not keep it).
func (c *Consumer) View(f func(*Fleet)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fleet == nil {
		c.fleet = NewFleet()
	}
	f(c.fleet)
}

// Alive returns the last time the consumer's loop made progress.
func (c *Consumer) Alive() time.Time { return time.Unix(0, c.alive.Load()) }

func (c *Consumer) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Config returns the durable consumer's configuration.
func (c *Consumer) Config() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:           DurableName(c.ID),
		Description:       "hvguard-controller " + c.ID + ": the fleet view",
		FilterSubject:     proto.LifecycleWildcard,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           ConsumerAckWait,
		MaxAckPending:     ConsumerMaxAckPending,
		InactiveThreshold: ConsumerInactive,
	}
}

// Run consumes until ctx ends, re-establishing the consumer after errors
// (the stream missing, NATS down) with a bounded backoff. The view lives in
// memory: at start the durable consumer is deleted and created again from
// the stream's first message, so a restarted controller rebuilds its view
// from everything the stream retains (a host whose retained history holds
// no full report is stale until its next one, at most 10 minutes). Within
// one run, reconnects resume where the consumer's acknowledgements left
// off.
func (c *Consumer) Run(ctx context.Context) error {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	c.View(func(*Fleet) {})
	fresh := false
	backoff := 500 * time.Millisecond
	synced := false
	for ctx.Err() == nil {
		c.alive.Store(time.Now().UnixNano())
		if !fresh {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.JS.DeleteConsumer(dctx, proto.StreamName, DurableName(c.ID))
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				fresh = true // (a missing stream: created below once it exists)
			} else {
				err = fmt.Errorf("delete the previous run's consumer %s: %w", DurableName(c.ID), err)
			}
			if !fresh {
				log.Warn("event stream consumer not started; retrying", "err", err, "retry_in", backoff)
				if !sleepCtx(ctx, backoff) {
					return nil
				}
				backoff = min(backoff*2, 10*time.Second)
				continue
			}
		}
		err := c.consume(ctx, log, &synced)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("event stream consumer stopped; re-establishing", "err", err, "retry_in", backoff)
		if !sleepCtx(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, 10*time.Second)
	}
	return nil
}

func (c *Consumer) consume(ctx context.Context, log *slog.Logger, synced *bool) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := c.JS.CreateOrUpdateConsumer(cctx, proto.StreamName, c.Config())
	cancel()
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s does not exist yet (the agents create it): %w", proto.StreamName, err)
		}
		return fmt.Errorf("consumer %s: %w", DurableName(c.ID), err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(ConsumerMaxAckPending / 2))
	if err != nil {
		return fmt.Errorf("consumer %s: %w", DurableName(c.ID), err)
	}
	defer it.Stop()
	log.Info("consuming the event stream", "consumer", DurableName(c.ID), "stream", proto.StreamName)
	errc := make(chan error, 1)
	msgs := make(chan jetstream.Msg)
	go func() {
		for {
			m, err := it.Next()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	lag := time.NewTicker(ConsumerLagEvery)
	defer lag.Stop()
	readLag := func() {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if info, err := cons.Info(ictx); err == nil {
			c.Stats.Lag.Store(int64(info.NumPending))
			c.Stats.AckPending.Store(int64(info.NumAckPending))
			if !*synced && info.NumPending == 0 {
				*synced = true
				if c.OnSynced != nil {
					c.OnSynced()
				}
			}
		}
	}
	readLag()
	for {
		c.alive.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-lag.C:
			readLag()
		case m := <-msgs:
			c.handle(log, m)
			if !*synced {
				if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
					readLag()
				}
			}
		}
	}
}

// handle applies one message and acknowledges it.
func (c *Consumer) handle(log *slog.Logger, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		c.poison(log, m, 0, fmt.Errorf("no JetStream metadata: %w", err))
		return
	}
	if err := c.verify(m); err != nil {
		c.refuse(log, m, meta.Sequence.Stream, err)
		return
	}
	ev, err := proto.DecodeLifecycle(m.Data())
	if err != nil {
		c.poison(log, m, meta.Sequence.Stream, err)
		return
	}
	if subj, serr := proto.LifecycleSubject(ev.Host); serr != nil || subj != m.Subject() {
		c.poison(log, m, meta.Sequence.Stream, fmt.Errorf("host %q does not match the subject %s", ev.Host, m.Subject()))
		return
	}
	fe := FleetEventOf(meta.Sequence.Stream, ev)
	c.mu.Lock()
	v := c.fleet.Apply(c.now(), fe)
	h := c.fleet.Host(fe.Host)
	if c.OnApplied != nil {
		c.OnApplied(fe, v)
	}
	c.mu.Unlock()
	switch v {
	case Applied:
		c.Stats.Applied.Add(1)
	case Duplicate:
		c.Stats.Duplicates.Add(1)
	case OldIncarnation:
		c.Stats.OldIncarnation.Add(1)
	case AppliedAfterMissing:
		c.Stats.Applied.Add(1)
		c.Stats.Missing.Add(1)
		log.Warn("events missing from a host: its view is stale until its next full report", "host", fe.Host, "seq", fe.Seq, "reason", h.StaleReason)
	case AppliedNewIncarnation:
		c.Stats.Applied.Add(1)
		c.Stats.NewIncarnation.Add(1)
		log.Warn("host has a new incarnation (its agent's state directory was recreated): its view is stale until its next full report",
			"host", fe.Host, "incarnation", proto.Incarnation(fe.Incarnation).String())
	}
	if err := m.Ack(); err != nil {
		// Redelivered after AckWait and dropped then as a duplicate.
		log.Debug("ack failed", "stream_seq", meta.Sequence.Stream, "err", err)
	}
}

// poison logs, counts and terminates a message that cannot be applied: it
// is never redelivered and never blocks the messages behind it.
func (c *Consumer) poison(log *slog.Logger, m jetstream.Msg, streamSeq uint64, err error) {
	c.Stats.Poison.Add(1)
	data := m.Data()
	if len(data) > 200 {
		data = data[:200]
	}
	log.Error("undecodable message on the event stream: terminated (not redelivered)", "subject", m.Subject(),
		"stream_seq", streamSeq, "err", err, "data", string(data))
	if terr := m.TermWithReason("hvguard-controller: " + err.Error()); terr != nil {
		log.Warn("terminating a poison message failed (it will be redelivered and terminated again)", "err", terr)
	}
}

// verify checks m's signature against the key of the host its subject
// names (nil: accepted).
func (c *Consumer) verify(m jetstream.Msg) error {
	if !c.Keys.Enabled() {
		return nil
	}
	host, _, err := proto.SubjectHost(m.Subject())
	if err != nil {
		return err // poison: the stream captures only host subjects
	}
	h := m.Headers()
	return c.Keys.VerifyEvent(host, m.Subject(), m.Data(), h.Get(proto.EventSignerHeader), h.Get(proto.EventSigHeader))
}

// refuse counts, logs (at most once every ConsumerRefusedLogEvery) and
// terminates an event that is not trusted: it is never applied, never
// redelivered, and never blocks the messages behind it.
func (c *Consumer) refuse(log *slog.Logger, m jetstream.Msg, streamSeq uint64, err error) {
	var ee *fencing.EventError
	if !errors.As(err, &ee) {
		c.poison(log, m, streamSeq, err)
		return
	}
	for i, r := range RefusedReasons {
		if r == ee.Reason {
			c.Stats.Refused[i].Add(1)
		}
	}
	now := c.now().UnixNano()
	if last := c.said.Load(); now-last >= int64(ConsumerRefusedLogEvery) && c.said.CompareAndSwap(last, now) {
		log.Warn("event refused: its signature does not verify (never applied; further refusals are counted, logged at most every "+
			ConsumerRefusedLogEvery.String()+")", "subject", m.Subject(), "stream_seq", streamSeq, "reason", ee.Reason, "err", err)
	}
	if terr := m.TermWithReason("hvguard-controller: " + err.Error()); terr != nil {
		log.Debug("terminating a refused event failed (it will be redelivered and refused again)", "err", terr)
	}
}
