package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
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
//
// An asynchronous error is logged at ERROR; a permission violation (the
// server refused a publish or subscribe: the account's permissions do not
// allow this subject) is logged with the subject and the permission it
// lacks, and counted in stats (when given).
func ConnOptions(log *slog.Logger, stats ...*ConnStats) []nats.Option {
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
			if errors.Is(err, nats.ErrPermissionViolation) {
				for _, st := range stats {
					if st != nil {
						st.PermissionDenied.Add(1)
					}
				}
				log.Error("NATS permission denied: this user's permissions on the NATS server do not allow the operation "+
					"(see docs/security.md, \"NATS permissions\")", "permission", PermissionOf(err), "err", err)
				return
			}
			log.Error("nats async error", "err", err)
		}),
	}
}

// ConnStats counts what a connection's asynchronous error handler saw.
type ConnStats struct {
	// PermissionDenied counts the server's permission violations.
	PermissionDenied atomic.Uint64
}

// PermissionOf names the permission a violation error lacks, e.g.
// `publish "$KV.hvguard-leases._guard"` (the server's message:
// "Permissions Violation for Publish to \"…\""), or "" when err is not
// one.
func PermissionOf(err error) string {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return ""
	}
	m := permissionRe.FindStringSubmatch(err.Error())
	if m == nil {
		return "unknown"
	}
	return strings.ToLower(m[1]) + " " + m[2]
}

var permissionRe = regexp.MustCompile(`(?i)Permissions Violation for (Publish|Subscription) to ("[^"]*"|\S+)`)

// Connect connects to url (comma-separated for a cluster) as client name
// with ConnOptions(log) followed by extra (e.g. credentials or TLS). Because the first connect is retried in the
// background, it returns a usable *nats.Conn even if NATS is down.
func Connect(url, name string, log *slog.Logger, stats *ConnStats, extra ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append(append(ConnOptions(log, stats), nats.Name(name)), extra...)...)
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
		// No stream purge, no message delete: nothing of hvguard's needs
		// them, and on a server with jetstream { strict: false } an
		// agent's PubAck aimed at $JS.API.STREAM.PURGE.HVGUARD_EVENTS
		// purged every event below its sequence (reviewer X17).
		DenyDelete: true,
		DenyPurge:  true,
	}
}

// EnsureStream makes sure the proto.StreamName stream exists and captures
// the subjects hvguard needs. It never changes an existing stream: with
// create it creates a missing one (StreamConfig(1)); an existing one is
// only read (an operator's limits, replicas and added subjects are theirs,
// and the agent then needs no stream-admin rights), and every setting that
// differs from StreamConfig is returned as a StreamDrift for the caller to
// report. A stream that does not capture proto.RequiredStreamSubjects is an
// error naming the command that adds them; one that lacks only the
// optional reconcile subject is usable and reported as drift (with a Risk).
func EnsureStream(ctx context.Context, js jetstream.JetStream, create bool) ([]StreamDrift, error) {
	s, err := js.Stream(ctx, proto.StreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if !create {
			return nil, fmt.Errorf("ensure stream: JetStream stream %s does not exist and this agent may not create it; provision it with: %s",
				proto.StreamName, provisionCommand())
		}
		s, err = js.CreateStream(ctx, StreamConfig(1))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile (another agent, an operator): use theirs.
			s, err = js.Stream(ctx, proto.StreamName)
		} else if err != nil {
			return nil, fmt.Errorf("ensure stream %s: create: %w", proto.StreamName, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", proto.StreamName, err)
	}
	have := s.CachedInfo().Config
	for _, want := range proto.RequiredStreamSubjects() {
		if !covered(have.Subjects, want) {
			return nil, fmt.Errorf("ensure stream: JetStream stream %s has subjects %q, which do not capture %q; the agent does not change an existing stream: add it with: %s",
				proto.StreamName, have.Subjects, want, editSubjectsCommand(have.Subjects))
		}
	}
	return streamDrift(have), nil
}

// StreamDrift is one setting of the existing stream that differs from
// StreamConfig. The agent reports it and leaves it as it is.
type StreamDrift struct {
	// Setting is the setting's name as in `nats stream info` JSON, e.g.
	// "max_age" or "subjects".
	Setting string
	// Have is the stream's value, Want the recommended one.
	Have, Want string
	// Risk says what the difference can cost hvguard's delivery, or is
	// empty when it costs nothing (bigger limits, more subjects).
	Risk string
	// Fix is the command that sets the recommended value, when Risk is set.
	Fix string
}

// streamDrift compares an existing stream's config with StreamConfig.
// Replicas, description and settings StreamConfig leaves at the server's
// default but an operator may tune without affecting hvguard are not
// compared.
func streamDrift(have jetstream.StreamConfig) []StreamDrift {
	want := StreamConfig(have.Replicas)
	var d []StreamDrift
	add := func(setting, h, w, risk, fix string) {
		if risk == "" {
			fix = ""
		}
		d = append(d, StreamDrift{Setting: setting, Have: h, Want: w, Risk: risk, Fix: fix})
	}
	edit := "nats stream edit " + proto.StreamName
	var missing []string
	for _, w := range want.Subjects {
		if !covered(have.Subjects, w) {
			missing = append(missing, w)
		}
	}
	extra := slices.ContainsFunc(have.Subjects, func(h string) bool { return !slices.Contains(want.Subjects, h) })
	if len(missing) > 0 || extra {
		risk := ""
		if len(missing) > 0 {
			risk = fmt.Sprintf("%q not captured: those events cannot be stored (publishes fail and are retried)", missing)
		}
		add("subjects", strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","), risk, editSubjectsCommand(have.Subjects))
	}
	if have.Storage != want.Storage {
		add("storage", have.Storage.String(), want.Storage.String(), "events are lost when the NATS servers restart",
			"recreate the stream with --storage file (storage cannot be edited)")
	}
	if have.Retention != want.Retention {
		add("retention", have.Retention.String(), want.Retention.String(),
			"events can be removed before every consumer has read them",
			"recreate the stream with --retention limits (retention cannot be edited)")
	}
	if have.Discard != want.Discard {
		add("discard", have.Discard.String(), want.Discard.String(),
			"a full stream refuses new events instead of dropping the oldest: the agents' outboxes fill",
			edit+" --discard old")
	}
	limit := func(setting string, h, w int64, format func(int64) string, risk, flag string) {
		if h == w {
			return
		}
		if h > w || h <= 0 { // bigger, or unlimited (-1 / 0 for max_age)
			risk = ""
		}
		add(setting, format(h), format(w), risk, edit+" "+flag+" "+format(w))
	}
	dur := func(v int64) string { return time.Duration(v).String() }
	num := func(v int64) string { return fmt.Sprint(v) }
	limit("max_age", int64(have.MaxAge), int64(want.MaxAge), dur,
		"a controller away longer than this misses events (it then sees a seq hole and resyncs)", "--max-age")
	limit("max_bytes", have.MaxBytes, want.MaxBytes, num,
		"the oldest events go sooner: a controller away for long sees seq holes and resyncs", "--max-bytes")
	if have.Duplicates < want.Duplicates {
		add("duplicate_window", have.Duplicates.String(), want.Duplicates.String(),
			"re-sends after a NATS outage longer than this can be stored twice (consumers drop them by seq)",
			edit+" --dupe-window "+want.Duplicates.String())
	} else if have.Duplicates != want.Duplicates {
		add("duplicate_window", have.Duplicates.String(), want.Duplicates.String(), "", "")
	}
	if have.MaxMsgs > 0 {
		add("max_msgs", num(have.MaxMsgs), "-1", "the oldest events go sooner: a controller away for long sees seq holes and resyncs", edit+" --max-msgs -1")
	}
	if have.MaxMsgsPerSubject > 0 {
		add("max_msgs_per_subject", num(have.MaxMsgsPerSubject), "-1",
			"each host's older events are removed as soon as it has this many: consumers see seq holes", edit+" --max-msgs-per-subject -1")
	}
	if t := have.SubjectTransform; t != nil && t.Destination != "" {
		add("subject_transform", t.Source+" -> "+t.Destination, "none",
			"events are stored under other subjects: consumers reading hvguard's subjects see none of them",
			"remove subject_transform from the stream's config: nats stream info --json "+proto.StreamName+" > s.json, edit it, "+edit+" --config s.json")
	}
	if have.NoAck {
		add("no_ack", "true", "false", "publishes are never acked: every event is re-sent until the outbox is full, then events are dropped",
			"recreate the stream without --no-ack")
	}
	if have.Sealed {
		add("sealed", "true", "false", "a sealed stream refuses every publish: events stay in the outbox until it is full, then are dropped",
			"provision a new, unsealed stream")
	}
	if !have.DenyPurge || !have.DenyDelete {
		add("deny_purge,deny_delete", fmt.Sprintf("%t,%t", have.DenyPurge, have.DenyDelete), "true,true",
			"a purge or message delete removes events no consumer has read; any agent can aim one on a server with jetstream { strict: false } (docs/security.md)",
			edit+" --deny-purge --deny-delete -f")
	}
	if have.MaxMsgSize > 0 && have.MaxMsgSize < proto.MaxMessageSize {
		add("max_msg_size", num(int64(have.MaxMsgSize)), "-1",
			fmt.Sprintf("events up to %d bytes are refused", proto.MaxMessageSize), edit+" --max-msg-size -1")
	}
	return d
}

// covered reports whether one of the stream subjects captures want.
func covered(subjects []string, want string) bool {
	return slices.ContainsFunc(subjects, func(h string) bool { return subjectCovers(h, want) })
}

// editSubjectsCommand is the `nats stream edit` command that adds the
// missing hvguard subjects to have, keeping the subjects already there.
func editSubjectsCommand(have []string) string {
	subjects := slices.Clone(have)
	for _, w := range proto.StreamSubjects() {
		if !covered(subjects, w) {
			subjects = append(subjects, w)
		}
	}
	return fmt.Sprintf("nats stream edit %s --subjects '%s'", proto.StreamName, strings.Join(subjects, ","))
}

func provisionCommand() string {
	c := StreamConfig(3)
	return fmt.Sprintf("nats stream add %s --subjects '%s' --storage file --retention limits --discard old --max-age %s --max-bytes %d --dupe-window %s --deny-delete --deny-purge --replicas 3 (1 on a single server)",
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
