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
// published with a JetStream publish ack into proto.WithdrawalStream, so
// it is stored, not just sent: before a controller declares a host it
// reads the host's receipts (ReadReceipts), and one naming a revision
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

// WithdrawalStreamConfig is the stream of withdrawal receipts of hosts
// (the enrolled agents: `hvguard-controller nats-accounts
// --receipts-stream`): their subjects, each named — no wildcard, so
// nothing else is stored —, each host's WithdrawalReceiptsKept last, kept
// until replaced, and no stream-wide limit: the subjects' limits bound it
// (each host's last 4 of at most ReceiptMaxBytes, plus nats-server's
// per-message overhead: 34 bytes and the subject), so a flood can only replace what is kept on an
// enrolled host's subject (which makes that host's declaration wait:
// junk), never fill the stream so that it refuses a receipt. A wildcard
// and a stream-wide limit let a compromised node's flood of reflected
// answers on fresh subjects fill it, and shrink it again after it refused
// a withdrawal's receipt (reviewer X58); and a stream-wide limit is
// reached by a flood on the named subjects too in a cluster, where the
// limit counts the proposals in flight (jetstream_batching.go,
// checkMsgHeadersPreClusteredProposal) even when each replaces a kept
// message. No direct gets, rollups, purges or deletes (HardenStream says
// why). ReceiptsUnsound checks an existing stream against these rules.
func WithdrawalStreamConfig(replicas int, hosts []string) (jetstream.StreamConfig, error) {
	if len(hosts) == 0 {
		return jetstream.StreamConfig{}, errors.New("withdrawal receipts stream: no host")
	}
	subjects, err := withdrawnSubjects(hosts)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	return withdrawalStreamConfig(replicas, subjects), nil
}

// withdrawnSubjects are hosts' receipt subjects.
func withdrawnSubjects(hosts []string) ([]string, error) {
	subjects := make([]string, 0, len(hosts))
	for _, h := range hosts {
		s, err := proto.WithdrawnSubject(h)
		if err != nil {
			return nil, err
		}
		subjects = append(subjects, s)
	}
	return subjects, nil
}

// wildcard reports whether subject s has a wildcard token.
func wildcard(s string) bool {
	return slices.ContainsFunc(strings.Split(s, "."), func(t string) bool { return t == "*" || t == ">" })
}

func withdrawalStreamConfig(replicas int, subjects []string) jetstream.StreamConfig {
	subjects = slices.Clone(subjects)
	slices.Sort(subjects)
	subjects = slices.Compact(subjects)
	return jetstream.StreamConfig{
		Name:              proto.WithdrawalStream,
		Description:       "hvguard: the agents' withdrawal receipts (docs/security.md, \"Withdrawal receipts\")",
		Subjects:          subjects,
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
	}
}

// ReceiptsUnsound says why a receipts stream of configuration c cannot
// vouch that it stored every withdrawal receipt host published — that
// none was refused for room, nor dropped, since (nil: it can). It can when
// it names host's subject and only named subjects, holds at most
// MaxMsgsPerSubject messages of at most MaxMsgSize bytes on each and has
// no stream-wide limit (WithdrawalStreamConfig says why); keeps them until
// replaced (limits retention, no MaxAge, no per-message TTL, schedules,
// rollups, purges or deletes); stores only what is published on its
// subjects (no mirror, sources or subject transform); refuses nothing a
// subject's limit would replace (not sealed, no DiscardNewPerSubject);
// allows no direct gets (docs/security.md, "No direct gets"); and is
// stored as the shipped stream is (file storage, default persistence, no
// counters, acks, atomic or batched publishes: reviewer X60). What it
// cannot see: the JetStream storage of the account or the server running
// out (docs/operations.md). For a host whose key may hide a write, a
// controller takes the absence of a withdrawal receipt as evidence only
// from such a stream (controller.ErrReceiptsUnsound).
func ReceiptsUnsound(c jetstream.StreamConfig, host string) error {
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return err
	}
	fix := func(format string, a ...any) error {
		return fmt.Errorf("the withdrawal receipts stream cannot vouch for %s's receipts: "+format+" (render its configuration with hvguard-controller nats-accounts --receipts-stream, then nats stream edit "+proto.WithdrawalStream+" --config FILE: docs/operations.md)", append([]any{host}, a...)...)
	}
	for _, s := range c.Subjects {
		if wildcard(s) {
			return fix("it captures %q, a wildcard: a flood of reflected answers on fresh subjects can fill it, and a full stream refuses receipts", s)
		}
	}
	switch per, size := c.MaxMsgsPerSubject, c.MaxMsgSize; {
	case !slices.Contains(c.Subjects, subj):
		return fix("it does not capture %s (the host is not in it: add it)", subj)
	case per <= 0:
		return fix("it keeps any number of messages per subject (max_msgs_per_subject %d)", per)
	case size <= 0:
		return fix("its messages have no size limit (max_msg_size %d)", size)
	case c.MaxBytes > 0 || c.MaxMsgs > 0:
		return fix("it has a stream-wide limit (max_bytes %d, max_msgs %d), which a flood reaches (in a cluster even on the named subjects), and then it refuses receipts: only the subjects' limits may bound it", c.MaxBytes, c.MaxMsgs)
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

// EnsureWithdrawalStream returns the receipts stream. Missing, it is
// created (one replica) for hosts, if hosts are given and this user may
// (make run, tests; the shipped permissions do not: it is provisioned,
// docs/operations.md). Existing, it is changed only to add hosts whose
// subject it does not name, if this user may and it has no wildcard; a
// change refused, or a stream with a wildcard, is not an error:
// ReceiptsUnsound (read with every ReadReceipts) says what it cannot
// vouch for.
func EnsureWithdrawalStream(ctx context.Context, js jetstream.JetStream, hosts ...string) (jetstream.Stream, error) {
	want, err := withdrawnSubjects(hosts)
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		st, err := js.Stream(ctx, proto.WithdrawalStream)
		if errors.Is(err, jetstream.ErrStreamNotFound) && len(want) > 0 {
			st, err = js.CreateStream(ctx, withdrawalStreamConfig(1, want))
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && try < 3 {
				continue // created meanwhile (another agent): add to it
			}
		}
		if err != nil {
			return nil, fmt.Errorf("withdrawal receipts stream %s: %w", proto.WithdrawalStream, err)
		}
		cur := st.CachedInfo().Config
		subjects := slices.Clone(cur.Subjects)
		for _, s := range want {
			if !slices.Contains(subjects, s) {
				subjects = append(subjects, s)
			}
		}
		if len(subjects) == len(cur.Subjects) || try >= 3 || slices.ContainsFunc(cur.Subjects, wildcard) {
			return st, nil
		}
		if _, err := js.UpdateStream(ctx, withdrawalStreamConfig(cur.Replicas, subjects)); err != nil {
			return st, nil // not this user's to change
		}
		// Read it back: another agent may have changed it meanwhile.
	}
}

// ReceiptRead is what ReadReceipts found on a host's receipt subject.
type ReceiptRead struct {
	// Msgs: the messages kept on the subject, oldest first.
	Msgs []StoredReceipt
	// Unsound: why the stream cannot vouch that it stored every receipt
	// the host published (ReceiptsUnsound; nil: it can) — the absence of
	// a receipt is then no evidence.
	Unsound error
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
	res := ReceiptRead{Unsound: ReceiptsUnsound(info.Config, host)}
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
