package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/proto"
)

// Publisher timings and bounds.
const (
	// DefaultWindow is the number of publishes in flight (sent, ack not yet
	// received). At ~1 ms round trip it allows far more than 20 000
	// events/s; it also bounds what is re-sent after an error (re-sends
	// are deduplicated by JetStream) and the client's memory for pending
	// acks.
	DefaultWindow = 512
	// DefaultAckTimeout is how long a publish may wait for its ack before
	// the publisher rewinds and re-sends from the first unacked record.
	// Measured (nats-partitions.md): acks took up to 1.8 s under 30 %
	// packet loss, so 5 s does not mistake a lossy link for a dead one,
	// while a dead one is detected by the 2 s x 2 pings (ConnOptions)
	// in about the same time anyway. The outcome of a timed-out publish is
	// unknown (it may be stored late); re-sending with the same Msg-Id
	// makes that harmless.
	DefaultAckTimeout = 5 * time.Second
	// retryBackoffMin/Max bound the pause after a publish error before
	// re-sending, so an unreachable NATS does not make the publisher spin.
	// Max 2 s: once NATS is back, delivery resumes within ~2 s, like the
	// client's own reconnect backoff (ReconnectWaitMax).
	retryBackoffMin = 50 * time.Millisecond
	retryBackoffMax = 2 * time.Second
	// streamCheckTimeout bounds one JetStream API call of EnsureStream;
	// streamRetryMax bounds the pause between attempts while the stream is
	// missing or NATS is unreachable (an operator may take minutes to
	// provision it; 30 s keeps the ERROR log readable).
	streamCheckTimeout = 5 * time.Second
	streamRetryMax     = 30 * time.Second
)

// PublisherConfig configures a Publisher. Zero values mean the defaults.
type PublisherConfig struct {
	// Window is the maximum number of publishes awaiting their ack.
	Window int
	// AckTimeout bounds the wait for one publish ack.
	AckTimeout time.Duration
	// CreateStream lets Run create the proto.StreamName stream when it is
	// missing. An existing stream is never changed, with or without it:
	// Run checks that it captures the lifecycle subjects (logging at ERROR
	// what to provision until it does) and logs at WARN each setting that
	// differs from StreamConfig (EnsureStream). Either way the agent's NATS
	// user needs $JS.API.STREAM.INFO.HVGUARD_EVENTS.
	CreateStream bool
	// Signer is the host's key (fence.signing): every event is published
	// signed (EventMsg). The zero Signer publishes unsigned events.
	Signer fencing.Signer
}

// Publisher publishes an Outbox's records, in order, to the host's
// lifecycle subject via JetStream and acks them in the outbox when
// JetStream has stored them. Run drives it.
type Publisher struct {
	ob      *Outbox
	js      jetstream.JetStream
	cfg     PublisherConfig
	log     *slog.Logger
	host    string
	subject string

	ready     chan struct{} // closed once the stream is ensured (StreamReady)
	readyOnce sync.Once

	mu        sync.Mutex
	published uint64
	resent    uint64
	dupAcks   uint64
	drift     []StreamDrift
	lastErr   string
	lastErrAt time.Time
}

type flight struct {
	seq    uint64
	fut    jetstream.PubAckFuture
	sentAt time.Time
}

// NewPublisher returns a Publisher for ob on the agent's connection nc (the
// agent owns nc; build it with Connect or ConnOptions).
func NewPublisher(nc *nats.Conn, ob *Outbox, cfg PublisherConfig, log *slog.Logger) (*Publisher, error) {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if log == nil {
		log = slog.Default()
	}
	subject, err := proto.LifecycleSubject(ob.cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("new publisher: %w", err)
	}
	// Abandoned futures (after a rewind) stay pending in the client until
	// they resolve or time out, so allow a few windows of them.
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4*cfg.Window),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("new publisher: %w", err)
	}
	return &Publisher{
		ob: ob, js: js, cfg: cfg, host: ob.cfg.Host, subject: subject, ready: make(chan struct{}),
		log: log.With("component", "publisher", "host", ob.cfg.Host),
	}, nil
}

// Run publishes until ctx is done (then it returns ctx.Err()) or the
// outbox is closed. It first makes sure the stream exists (EnsureStream
// with CreateStream), retrying until it does; meanwhile events wait in the
// outbox. Records are sent in seq order with up to Window in
// flight; acks are applied in order. On any publish error or ack timeout
// it abandons what is in flight and re-sends from the first unacked record
// after a backoff, so per-host order is preserved on the stream (JetStream
// drops the re-sent duplicates by Nats-Msg-Id).
func (p *Publisher) Run(ctx context.Context) error {
	var (
		inflight []flight
		next     = p.ob.ackedSeq() // send records with seq > next
		maxSent  = next            // records <= maxSent were sent before (re-sends)
		backoff  = retryBackoffMin
		failing  bool
		timer    = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	if err := p.ensureStream(ctx); err != nil {
		return err
	}
	rewind := func(err error) error {
		p.setErr(err)
		if !failing {
			p.log.Warn("publish failed; will re-send from the first unacked event",
				"err", err, "in_flight", len(inflight), "depth", p.ob.unackedUpTo(^uint64(0)))
		}
		failing = true
		inflight = nil
		next = p.ob.ackedSeq()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, retryBackoffMax)
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		changed := p.ob.changedCh()
		if len(inflight) < p.cfg.Window {
			recs, err := p.ob.read(next, p.cfg.Window-len(inflight))
			if errors.Is(err, ErrClosed) {
				return err
			}
			if err != nil {
				if err := rewind(err); err != nil {
					return err
				}
				continue
			}
			sendErr := error(nil)
			for _, r := range recs {
				msg := EventMsg(p.subject, r.Data, p.cfg.Signer)
				msg.Header.Set(jetstream.MsgIDHeader, proto.MsgID(p.host, p.ob.inc, r.Seq))
				// No client-side retry on "no responders": a retried
				// message could land after later ones; the rewind below
				// re-sends in order instead.
				fut, err := p.js.PublishMsgAsync(msg, jetstream.WithRetryAttempts(0),
					jetstream.WithExpectStream(proto.StreamName))
				if err != nil {
					sendErr = fmt.Errorf("publish seq %d: %w", r.Seq, notConnected(err))
					break
				}
				inflight = append(inflight, flight{seq: r.Seq, fut: fut, sentAt: time.Now()})
				next = r.Seq
				p.mu.Lock()
				if r.Seq <= maxSent {
					p.resent++
				} else {
					p.published++
					maxSent = r.Seq
				}
				p.mu.Unlock()
			}
			if sendErr != nil {
				if err := rewind(sendErr); err != nil {
					return err
				}
				continue
			}
		}
		if len(inflight) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
			}
			continue
		}
		head := inflight[0]
		timer.Reset(time.Until(head.sentAt.Add(p.cfg.AckTimeout)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ack := <-head.fut.Ok():
			if ack.Duplicate {
				p.mu.Lock()
				p.dupAcks++
				p.mu.Unlock()
			}
			p.ob.ack(head.seq)
			inflight = inflight[1:]
			if failing {
				p.log.Info("publishing again", "acked_seq", head.seq)
				failing = false
			}
			backoff = retryBackoffMin
		case err := <-head.fut.Err():
			if err := rewind(fmt.Errorf("publish seq %d: %w", head.seq, err)); err != nil {
				return err
			}
		case <-timer.C:
			if err := rewind(fmt.Errorf("publish seq %d: no ack within %s", head.seq, p.cfg.AckTimeout)); err != nil {
				return err
			}
		}
	}
}

// EventMsg returns the message publishing an event's data on subject,
// signed by s, the host's key: proto.EventSignerHeader and
// proto.EventSigHeader (fencing.Signer.SignEvent over the subject and
// data), none for the zero Signer. The outbox keeps the data only; the
// signature is made at each send and is the same for a re-send (ed25519
// is deterministic), which JetStream drops by its Nats-Msg-Id as before.
func EventMsg(subject string, data []byte, s fencing.Signer) *nats.Msg {
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if id, sig := s.SignEvent(subject, data); sig != "" {
		msg.Header.Set(proto.EventSignerHeader, id)
		msg.Header.Set(proto.EventSigHeader, sig)
	}
	return msg
}

// StreamReady is closed once Run has found (or created) the stream and it
// captures the lifecycle subjects. Other publishers on the same stream
// (the agent's reconcile events) wait for it instead of racing the
// stream's creation at start.
func (p *Publisher) StreamReady() <-chan struct{} { return p.ready }

// ensureStream runs EnsureStream until it succeeds or ctx ends.
func (p *Publisher) ensureStream(ctx context.Context) error {
	backoff, lastMsg := retryBackoffMin, ""
	for {
		cctx, cancel := context.WithTimeout(ctx, streamCheckTimeout)
		drift, err := EnsureStream(cctx, p.js, p.cfg.CreateStream)
		err = notConnected(err)
		cancel()
		if err == nil {
			p.log.Info("stream ready", "stream", proto.StreamName, "created_if_missing", p.cfg.CreateStream, "settings_differing", len(drift))
			p.reportDrift(drift)
			p.readyOnce.Do(func() { close(p.ready) })
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.setErr(err)
		if msg := err.Error(); msg != lastMsg {
			p.log.Error("JetStream stream not usable; events wait in the outbox", "err", err, "retry_in", backoff)
			lastMsg = msg
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, streamRetryMax)
	}
}

// reportDrift logs each setting of the stream that differs from
// StreamConfig at WARN (the agent leaves it as it is) and keeps them for
// Stats.
func (p *Publisher) reportDrift(drift []StreamDrift) {
	p.mu.Lock()
	p.drift = drift
	p.mu.Unlock()
	for _, d := range drift {
		args := []any{"stream", proto.StreamName, "setting", d.Setting, "have", d.Have, "recommended", d.Want}
		if d.Risk != "" {
			args = append(args, "risk", d.Risk, "fix", d.Fix)
		}
		p.log.Warn("JetStream stream setting differs from hvguard's recommendation; left unchanged", args...)
	}
}

// notConnected makes the client's error for a publish while disconnected
// (no reconnect buffer: "outbound buffer limit exceeded") say what it means.
func notConnected(err error) error {
	if errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("not connected to NATS: %w", err)
	}
	return err
}

func (p *Publisher) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastErr = err.Error()
	p.lastErrAt = time.Now()
}

// Flush waits until every record appended before the call is acked by
// JetStream (for a graceful shutdown: call it with a deadline before
// cancelling Run). If ctx ends first it returns an error saying how many
// remain; they stay in the outbox on disk and are sent after the restart.
func (p *Publisher) Flush(ctx context.Context) error {
	target := p.ob.lastRecordSeq()
	for {
		changed := p.ob.changedCh()
		n := p.ob.unackedUpTo(target)
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush: %d events not yet acked by JetStream (kept in the outbox on disk): %w", n, ctx.Err())
		case <-changed:
		}
	}
}

// Stats returns the outbox's and the publisher's counters and gauges. The
// last error is the more recent of the two.
func (p *Publisher) Stats() Stats {
	s := p.ob.Stats()
	p.mu.Lock()
	defer p.mu.Unlock()
	s.Published, s.Resent, s.DupAcks = p.published, p.resent, p.dupAcks
	s.StreamDrift = len(p.drift)
	for _, d := range p.drift {
		if d.Risk != "" {
			s.StreamDriftRisky++
		}
	}
	if p.lastErrAt.After(s.LastErrorAt) {
		s.LastError, s.LastErrorAt = p.lastErr, p.lastErrAt
	}
	return s
}
