package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/proto"
)

// Connection settings used by ConnOptions.
const (
	// PingInterval and MaxPingsOutstanding decide how fast a silently cut
	// link is noticed. nats-partitions.md measured 4-6 min with the client
	// defaults (2 min x 2) and 2-3 s with 1 s x 2; 2 s x 2 notices in
	// ~4-6 s at half the ping traffic, which is well inside the time the
	// controller needs to act on a host's silence.
	PingInterval        = 2 * time.Second
	MaxPingsOutstanding = 2
	// ReconnectWaitMin/Max bound the exponential reconnect backoff (with
	// jitter): reconnects are infinite (an agent must never give up on
	// NATS), the first ones fast (a restarted cluster took 4-7 s to be
	// usable again), later ones spaced so a fleet of agents does not hammer
	// a recovering cluster.
	ReconnectWaitMin = 250 * time.Millisecond
	ReconnectWaitMax = 5 * time.Second
	// ConnectTimeout bounds one TCP+TLS connect attempt.
	ConnectTimeout = 5 * time.Second
)

// ReconnectDelay is the wait before reconnect attempt n (1-based):
// exponential from ReconnectWaitMin to ReconnectWaitMax, with +-20 % jitter.
func ReconnectDelay(attempts int) time.Duration {
	d := ReconnectWaitMin
	for i := 1; i < attempts && d < ReconnectWaitMax; i++ {
		d *= 2
	}
	d = min(d, ReconnectWaitMax)
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// ConnOptions returns the options hvguard agents connect with: short
// pings, infinite reconnects with backoff, retry of the first connect (the
// agent starts even when NATS is down), and NO reconnect buffer: publishes
// while disconnected fail at once instead of being buffered in memory and
// replayed later (nats-partitions.md: "late writes"); the outbox is the
// only buffer, and it is on disk.
func ConnOptions(log *slog.Logger) []nats.Option {
	if log == nil {
		log = slog.Default()
	}
	return []nats.Option{
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(ReconnectDelay),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(-1),
		nats.Timeout(ConnectTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(*nats.Conn) { log.Info("nats connection closed") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("nats async error", "err", err)
		}),
	}
}

// Connect connects to url (comma-separated for a cluster) as client name
// with ConnOptions(log) followed by extra (e.g. credentials or TLS). Because the first connect is retried in the
// background, it returns a usable *nats.Conn even if NATS is down.
func Connect(url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append(append(ConnOptions(log), nats.Name(name)), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("nats connect %s: %w", url, err)
	}
	return nc, nil
}

// StreamConfig returns the recommended configuration of the proto.StreamName
// stream with the given number of replicas (3 on a 3-node cluster).
func StreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        proto.StreamName,
		Description: "hvguard agent events (see hvguard/proto)",
		Subjects:    proto.StreamSubjects(),
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      proto.StreamMaxAge,
		MaxBytes:    proto.StreamMaxBytes,
		Duplicates:  proto.StreamDuplicatesWindow,
		Replicas:    max(replicas, 1),
	}
}

// EnsureStream makes sure the proto.StreamName stream exists and captures
// the hvguard subjects. With create it creates the stream (1 replica) or
// updates an existing one to the recommended config (keeping its replica
// count). Without create it only checks, and the error tells the operator
// exactly what to provision.
func EnsureStream(ctx context.Context, js jetstream.JetStream, create bool) error {
	if create {
		cfg := StreamConfig(1)
		if s, err := js.Stream(ctx, proto.StreamName); err == nil {
			cfg.Replicas = s.CachedInfo().Config.Replicas
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: create or update: %w", proto.StreamName, err)
		}
		return nil
	}
	s, err := js.Stream(ctx, proto.StreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("ensure stream: JetStream stream %s does not exist and this agent may not create it; provision it with: %s",
			proto.StreamName, provisionCommand())
	}
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", proto.StreamName, err)
	}
	have := s.CachedInfo().Config.Subjects
	for _, want := range proto.RequiredStreamSubjects() {
		if !slices.ContainsFunc(have, func(h string) bool { return subjectCovers(h, want) }) {
			return fmt.Errorf("ensure stream: JetStream stream %s has subjects %q, which do not capture %q; fix it with: nats stream edit %s --subjects '%s'",
				proto.StreamName, have, want, proto.StreamName, strings.Join(proto.StreamSubjects(), ","))
		}
	}
	return nil
}

func provisionCommand() string {
	c := StreamConfig(3)
	return fmt.Sprintf("nats stream add %s --subjects '%s' --storage file --retention limits --discard old --max-age %s --max-bytes %d --dupe-window %s --replicas 3 (1 on a single server)",
		c.Name, strings.Join(c.Subjects, ","), c.MaxAge, c.MaxBytes, c.Duplicates)
}

// subjectCovers reports whether the stream subject filter pattern matches
// every subject that want (which may contain wildcards) matches.
func subjectCovers(pattern, want string) bool {
	p, w := strings.Split(pattern, "."), strings.Split(want, ".")
	for i, pt := range p {
		if pt == ">" {
			return len(w) > i
		}
		if i >= len(w) {
			return false
		}
		switch {
		case pt == "*":
			if w[i] == ">" {
				return false
			}
		case pt != w[i]:
			return false
		}
	}
	return len(p) == len(w)
}
