package natslease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/proto"
)

// Withdrawal receipts. An agent's orderly stop writes its withdrawn record
// and publishes its beacon (core NATS, best effort). A controller that did
// not see the withdrawn record — a compromised node overwrote it before
// the watch delivered it — learns of the withdrawal only from that beacon,
// and a beacon lost on the way (a route or leaf connection closed as a
// slow consumer, a subscription that dropped it, a controller not running
// then) left it to judge the host by its last renewal: the withdrawn host,
// its guests running, was declared. The receipt is the same signed beacon,
// published with a JetStream publish ack into the host's own stream
// (proto.WithdrawalStreamOf), so it is stored, not just sent: before a controller declares a host it
// reads the host's receipts (ReadHostReceipts), and one naming a revision
// after the record it judges the host by stops the declaration
// (controller.Runner, docs/security.md "Withdrawal receipts").

// ReceiptMsg returns the withdrawal receipt of rec (the host's own
// withdrawn record) written at rev: its beacon (BeaconMsg, no Prev) on
// proto.WithdrawnSubject(rec.Host).
func ReceiptMsg(s fencing.Signer, rec fencing.LeaseRecord, rev uint64, at time.Time) (*nats.Msg, error) {
	if rec.State != fencing.LeaseWithdrawn {
		return nil, fmt.Errorf("withdrawal receipt of a %s record", rec.State)
	}
	m, err := BeaconMsg(s, rec, rev, 0, at)
	if err != nil {
		return nil, err
	}
	if m.Subject, err = proto.WithdrawnSubject(rec.Host); err != nil {
		return nil, err
	}
	return m, nil
}

// ReceiptMaxBytes bounds a receipt (headers and data; a beacon is ~400
// bytes): the stream's MaxMsgSize.
const ReceiptMaxBytes = 4096

// WithdrawalStreamConfig is host's own withdrawal receipts stream
// (proto.WithdrawalStreamOf; `hvguard-controller nats-accounts
// --receipts-streams` writes one per enrolled agent): its receipt subject
// only — no other host's publishes share its ingest queue, which,
// shared, a compromised node flooding its own receipt subject filled so
// that the server refused the withdrawing host's receipt (429, reviewer
// X60) —, its WithdrawalReceiptsKept last, kept until replaced, and no
// stream-wide limit: the subject's limits bound it (4 of at most
// ReceiptMaxBytes, plus nats-server's per-message overhead: 34 bytes and
// the subject). A flood can then only replace what is kept on the
// subject, which makes the host's declaration wait (junk), never fill
// the stream so that it refuses a receipt. A wildcard and a stream-wide
// limit let a compromised node's flood of reflected answers on fresh
// subjects fill it, and shrink it again after it refused a withdrawal's
// receipt (reviewer X58); and a stream-wide limit is reached by a flood
// on the subject itself in a cluster, where the limit counts the
// proposals in flight (jetstream_batching.go,
// checkMsgHeadersPreClusteredProposal) even when each replaces a kept
// message. No direct gets, rollups, purges or deletes (HardenStream says
// why). ReceiptsUnsound checks an existing stream against these rules.
func WithdrawalStreamConfig(replicas int, host string) (jetstream.StreamConfig, error) {
	name, err := proto.WithdrawalStreamOf(host)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	return jetstream.StreamConfig{
		Name:              name,
		Description:       "hvguard: " + host + "'s withdrawal receipts (docs/security.md, \"Withdrawal receipts\")",
		Subjects:          []string{subj},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          max(replicas, 1),
		MaxMsgsPerSubject: proto.WithdrawalReceiptsKept,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgSize:        ReceiptMaxBytes,
		Discard:           jetstream.DiscardNew, // no limit to reach: nothing is discarded
		DenyDelete:        true,
		DenyPurge:         true,
	}, nil
}

// wildcard reports whether subject s has a wildcard token.
func wildcard(s string) bool {
	return slices.ContainsFunc(strings.Split(s, "."), func(t string) bool { return t == "*" || t == ">" })
}

// ReceiptsUnsound says why a receipts stream of configuration c cannot
// vouch that it stored every withdrawal receipt host published — that
// none was refused for room or for its ingest queue, nor dropped, since
// (nil: it can). It can when it is host's own stream
// (proto.WithdrawalStreamOf) capturing host's subject only; holds at
// most MaxMsgsPerSubject messages of at most MaxMsgSize bytes and has no
// stream-wide limit (WithdrawalStreamConfig says why); keeps them until
// replaced (limits retention, no MaxAge, no per-message TTL, schedules,
// rollups, purges or deletes); stores only what is published on its
// subject (no mirror, sources or subject transform); refuses nothing the
// subject's limit would replace (not sealed, no DiscardNewPerSubject);
// allows no direct gets (docs/security.md, "No direct gets"); and is
// stored as the shipped stream is (file storage, default persistence, no
// counters, acks, atomic or batched publishes: reviewer X60). What it
// cannot see: the JetStream storage of the account (AccountUnsound) or
// the server running out (docs/operations.md). For a host whose key may
// hide a write, a controller takes the absence of a withdrawal receipt
// as evidence only from such a stream (controller.ErrReceiptsUnsound).
func ReceiptsUnsound(c jetstream.StreamConfig, host string) error {
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return err
	}
	own, err := proto.WithdrawalStreamOf(host)
	if err != nil {
		return err
	}
	fix := func(format string, a ...any) error {
		return fmt.Errorf("the withdrawal receipts stream %s cannot vouch for %s's receipts: "+format+" (render its own stream with hvguard-controller nats-accounts --receipts-streams DIR, then nats stream add --config DIR/"+own+".json: docs/operations.md)", append([]any{c.Name, host}, a...)...)
	}
	for _, s := range c.Subjects {
		if wildcard(s) {
			return fix("it captures %q, a wildcard: a flood of reflected answers on fresh subjects can fill it, and a full stream refuses receipts", s)
		}
	}
	switch per, size := c.MaxMsgsPerSubject, c.MaxMsgSize; {
	case !slices.Contains(c.Subjects, subj):
		return fix("it does not capture %s (the host is not in it)", subj)
	case c.Name != own || len(c.Subjects) != 1:
		return fix("it is not the host's own stream (%s, capturing %s only): the other hosts' publishes share its ingest queue, and a compromised node flooding its own receipt subject fills it so that the server refuses this host's receipt (429, reviewer X60)", own, subj)
	case per <= 0:
		return fix("it keeps any number of messages per subject (max_msgs_per_subject %d)", per)
	case size <= 0:
		return fix("its messages have no size limit (max_msg_size %d)", size)
	case c.MaxBytes > 0 || c.MaxMsgs > 0:
		return fix("it has a stream-wide limit (max_bytes %d, max_msgs %d), which a flood reaches (in a cluster even on its subject), and then it refuses receipts: only the subject's limits may bound it", c.MaxBytes, c.MaxMsgs)
	case c.Retention != jetstream.LimitsPolicy:
		return fix("its retention is %v, not limits: messages are removed when consumed", c.Retention)
	case c.MaxAge > 0 || c.AllowMsgTTL || c.SubjectDeleteMarkerTTL > 0:
		return fix("its messages expire (max_age %s, allow_msg_ttl %t)", c.MaxAge, c.AllowMsgTTL)
	case c.Mirror != nil || len(c.Sources) > 0 || c.SubjectTransform != nil:
		return fix("it stores messages it did not capture (a mirror, sources or a subject transform)")
	case c.Sealed || c.DiscardNewPerSubject:
		return fix("it refuses messages (sealed %t, discard_new_per_subject %t)", c.Sealed, c.DiscardNewPerSubject)
	case c.AllowRollup || c.AllowMsgSchedules || !c.DenyPurge || !c.DenyDelete:
		return fix("its messages can be removed or replaced (allow_rollup_hdrs %t, allow_msg_schedules %t, deny_purge %t, deny_delete %t)", c.AllowRollup, c.AllowMsgSchedules, c.DenyPurge, c.DenyDelete)
	case c.AllowDirect || c.MirrorDirect:
		return fix("it allows direct gets (docs/security.md, \"No direct gets\")")
	// What only the shipped settings are known to do (reviewer X60: a
	// counter stream refuses every receipt; memory storage and
	// asynchronous persistence lose them at a restart or crash).
	case c.Storage != jetstream.FileStorage || c.PersistMode != jetstream.DefaultPersistMode:
		return fix("its receipts may be lost at a server restart (storage %v, persist_mode %v: want file, default)", c.Storage, c.PersistMode)
	case c.AllowMsgCounter || c.NoAck || c.AllowAtomicPublish || c.AllowBatchPublish:
		return fix("it handles messages otherwise than the shipped stream (allow_msg_counter %t, no_ack %t, allow_atomic %t, allow_batched %t)", c.AllowMsgCounter, c.NoAck, c.AllowAtomicPublish, c.AllowBatchPublish)
	}
	return nil
}

// errNoReceiptsStream: no stream captures host's receipts.
func errNoReceiptsStream(host string) error {
	own, err := proto.WithdrawalStreamOf(host)
	if err != nil {
		return err
	}
	return fmt.Errorf("no withdrawal receipts stream captures %s's receipts: provision its own (%s: hvguard-controller nats-accounts --receipts-streams DIR, then nats stream add --config DIR/%s.json; docs/operations.md)", host, own, own)
}

// EnsureWithdrawalStream returns host's own receipts stream
// (WithdrawalStreamConfig), creating it (one replica) when it is missing
// and this user may (make run, tests; the shipped permissions do not: it
// is provisioned, docs/operations.md). The creation fails while the
// older shared stream (proto.WithdrawalStream) still captures host's
// subject (NATS refuses overlapping streams): docs/operations.md says
// how to move a host to its own stream.
func EnsureWithdrawalStream(ctx context.Context, js jetstream.JetStream, host string) (jetstream.Stream, error) {
	cfg, err := WithdrawalStreamConfig(1, host)
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		st, err := js.Stream(ctx, cfg.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			st, err = js.CreateStream(ctx, cfg)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && try < 3 {
				continue // created meanwhile (the controller, the agent)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("withdrawal receipts stream %s: %w", cfg.Name, err)
		}
		return st, nil
	}
}

// OpenReceipts returns the stream that captures host's withdrawal
// receipts: its own (proto.WithdrawalStreamOf), or else the older shared
// one (proto.WithdrawalStream) if it captures host's subject — read, so
// that a receipt stored there still stops a declaration, though it
// cannot vouch for the receipts it lacks (ReceiptsUnsound) —, or nil
// (and no error) if there is none.
func OpenReceipts(ctx context.Context, js jetstream.JetStream, host string) (jetstream.Stream, error) {
	own, err := proto.WithdrawalStreamOf(host)
	if err != nil {
		return nil, err
	}
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, own)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return st, err
	}
	st, err = js.Stream(ctx, proto.WithdrawalStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, s := range st.CachedInfo().Config.Subjects {
		if subjectMatches(s, subj) {
			return st, nil
		}
	}
	return nil, nil
}

// subjectMatches reports whether filter (NATS wildcards) matches the
// literal subject subj.
func subjectMatches(filter, subj string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subj, ".")
	for i, t := range f {
		switch {
		case t == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case t != "*" && t != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// StreamOfReceiptsUnsound says why no stream can vouch for host's
// withdrawal receipts (nil: its own can): none captures them, or the one
// that does cannot (ReceiptsUnsound).
func StreamOfReceiptsUnsound(ctx context.Context, js jetstream.JetStream, host string) error {
	st, err := OpenReceipts(ctx, js, host)
	switch {
	case err != nil:
		return fmt.Errorf("withdrawal receipts of %s: %w", host, err)
	case st == nil:
		return errNoReceiptsStream(host)
	}
	return ReceiptsUnsound(st.CachedInfo().Config, host)
}

// ReceiptRead is what ReadReceipts found on a host's receipt subject.
type ReceiptRead struct {
	// Msgs: the messages kept on the subject, oldest first.
	Msgs []StoredReceipt
	// Unsound: why the stream cannot vouch that it stored every receipt
	// the host published (ReceiptsUnsound; nil: it can) — the absence of
	// a receipt is then no evidence.
	Unsound error
	// Since: when the stream was created. It vouches for nothing before:
	// a receipt published then went elsewhere, or nowhere (the caller
	// compares it with what it judges the host by: reviewer X62).
	Since time.Time
}

// StoredReceipt is one message on a host's receipt subject: its stream
// sequence and stored time, and its beacon — or why it is not one of
// the host's withdrawal receipts (Err; the signature is the caller's to
// check: fencing.Keyring.VerifyBeacon).
type StoredReceipt struct {
	Seq    uint64
	Stored time.Time
	Beacon fencing.Beacon
	Err    error
}

// ReceiptReadError: ReadReceipts could not read the stream.
type ReceiptReadError struct{ Err error }

func (e ReceiptReadError) Error() string { return e.Err.Error() }
func (e ReceiptReadError) Unwrap() error { return e.Err }

// ReadReceipts reads every message kept on host's receipt subject in st
// (at most WithdrawalReceiptsKept, or what an operator's stream keeps:
// one stream info and a message get each — no direct get) and whether the
// stream can vouch that it stored every receipt the host published
// (ReceiptsUnsound). Not only the last: anything published on the subject
// is stored — with the shipped permissions only the host publishes
// there, but the JetStream API publishes its answers on whatever reply
// subject a request names, with the server's rights ("reflection",
// docs/security.md), and one reflected answer after a host's receipt hid
// it from a reader of the last message only (reviewer X57).
func ReadReceipts(ctx context.Context, st jetstream.Stream, host string) (ReceiptRead, error) {
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return ReceiptRead{}, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return ReceiptRead{}, ReceiptReadError{fmt.Errorf("read the withdrawal receipts of %s: %w", host, err)}
	}
	res := ReceiptRead{Unsound: ReceiptsUnsound(info.Config, host), Since: info.Created}
	n := info.State.Subjects[subj]
	seq := info.State.FirstSeq
	for range n {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // fewer left than the info said (a limit dropped one)
		}
		if err != nil {
			return ReceiptRead{}, ReceiptReadError{fmt.Errorf("read the withdrawal receipts of %s: %w", host, err)}
		}
		r := StoredReceipt{Seq: m.Sequence, Stored: m.Time}
		r.Beacon, r.Err = decodeReceipt(host, m)
		res.Msgs = append(res.Msgs, r)
		seq = m.Sequence + 1
	}
	return res, nil
}

// ReadHostReceipts reads host's withdrawal receipts (ReadReceipts) from
// the stream that captures them (OpenReceipts). With none, it reads no
// message and says so in Unsound.
func ReadHostReceipts(ctx context.Context, js jetstream.JetStream, host string) (ReceiptRead, error) {
	st, err := OpenReceipts(ctx, js, host)
	if err != nil {
		return ReceiptRead{}, ReceiptReadError{fmt.Errorf("open the withdrawal receipts of %s: %w", host, err)}
	}
	if st == nil {
		return ReceiptRead{Unsound: errNoReceiptsStream(host)}, nil
	}
	return ReadReceipts(ctx, st, host)
}

// decodeReceipt decodes m as host's withdrawal receipt.
func decodeReceipt(host string, m *jetstream.RawStreamMsg) (fencing.Beacon, error) {
	b, err := fencing.DecodeBeacon(m.Data)
	switch {
	case err != nil:
		return fencing.Beacon{}, fmt.Errorf("withdrawal receipt of %s (stream sequence %d): %w", host, m.Sequence, err)
	case b.Host != host:
		return fencing.Beacon{}, fmt.Errorf("withdrawal receipt of %q on the subject of %q (stream sequence %d)", b.Host, host, m.Sequence)
	case b.State != fencing.LeaseWithdrawn:
		return fencing.Beacon{}, fmt.Errorf("withdrawal receipt of %s (stream sequence %d) names no withdrawal", host, m.Sequence)
	}
	return b, nil
}

// AccountUnsound says why the receipts stream's account may refuse a
// receipt for room although the stream vouches (nil: it cannot): a cap
// on the account's JetStream file storage (any tier). An agent can fill
// a capped account with lease values on fresh keys until a receipt is
// refused, then shrink its values again — nothing shows the refusal
// (reviewer X60, TestX60StorageFilledRefusesReceiptThenShrunkNATS). js
// is a connection of the stream's account.
func AccountUnsound(ctx context.Context, js jetstream.JetStream) error {
	ai, err := js.AccountInfo(ctx)
	if err != nil {
		return fmt.Errorf("the withdrawal receipts' account: %w", err)
	}
	capped := ai.Limits.MaxStore > 0
	for _, t := range ai.Tiers {
		capped = capped || t.Limits.MaxStore > 0
	}
	if capped {
		return fmt.Errorf("the withdrawal receipts stream's account caps its JetStream storage (max_file %d): an agent can fill it with lease values so that a receipt is refused, then shrink them again — remove the account's max_file (docs/operations.md)", ai.Limits.MaxStore)
	}
	return nil
}
