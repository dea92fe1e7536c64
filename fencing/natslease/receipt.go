package natslease

import (
	"context"
	"errors"
	"fmt"
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

// ReceiptMaxBytes bounds a receipt (a beacon is ~400 bytes) and
// WithdrawalStreamMaxBytes the stream: 4 receipts of 100 000 hosts.
const (
	ReceiptMaxBytes          = 4096
	WithdrawalStreamMaxBytes = 256 << 20
)

// WithdrawalStreamConfig is the stream of withdrawal receipts: every
// host's WithdrawalReceiptsKept last, kept until replaced; full, it
// refuses new ones; no direct gets, rollups, purges or deletes
// (HardenStream says why).
func WithdrawalStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              proto.WithdrawalStream,
		Description:       "hvguard: the agents' withdrawal receipts (docs/security.md, \"Withdrawal receipts\")",
		Subjects:          []string{proto.WithdrawnWildcard},
		Storage:           jetstream.FileStorage,
		Replicas:          max(replicas, 1),
		MaxMsgsPerSubject: proto.WithdrawalReceiptsKept,
		MaxBytes:          WithdrawalStreamMaxBytes,
		MaxMsgSize:        ReceiptMaxBytes,
		// Full, it refuses new receipts rather than dropping the oldest:
		// a flood of junk (reflected API answers, reviewer X57) must not
		// evict a host's receipt; a full stream makes every declaration
		// wait (ReadReceipts.Full).
		Discard:    jetstream.DiscardNew,
		DenyDelete: true,
		DenyPurge:  true,
	}
}

// EnsureWithdrawalStream returns the receipts stream, created (one
// replica) if missing and this user may; an existing one is not changed.
func EnsureWithdrawalStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, proto.WithdrawalStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, WithdrawalStreamConfig(1))
	}
	if err != nil {
		return nil, fmt.Errorf("withdrawal receipts stream %s: %w", proto.WithdrawalStream, err)
	}
	return st, nil
}

// ReceiptRead is what ReadReceipts found on a host's receipt subject.
type ReceiptRead struct {
	// Msgs: the messages kept on the subject, oldest first.
	Msgs []StoredReceipt
	// Full: the stream is (nearly) full — it refuses new receipts, so a
	// withdrawal's may have been refused.
	Full bool
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
// stream is full. Not only the last: anything published on the subject
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
	var res ReceiptRead
	if c := info.Config; c.MaxBytes > 0 && info.State.Bytes+2*uint64(max(c.MaxMsgSize, ReceiptMaxBytes)) > uint64(c.MaxBytes) ||
		c.MaxMsgs > 0 && info.State.Msgs+2 > uint64(c.MaxMsgs) {
		res.Full = true
	}
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
