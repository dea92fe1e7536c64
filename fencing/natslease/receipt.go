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
// reads the host's last receipt (LastReceipt), and one naming a revision
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
// host's WithdrawalReceiptsKept last, kept until replaced; no direct gets,
// rollups, purges or deletes (HardenStream says why).
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
		Discard:           jetstream.DiscardOld,
		DenyDelete:        true,
		DenyPurge:         true,
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

// ErrNoReceipt: the host has published no withdrawal receipt (kept).
var ErrNoReceipt = errors.New("no withdrawal receipt")

// ReceiptReadError: LastReceipt could not read the stream (as opposed to
// a receipt it read and could not decode).
type ReceiptReadError struct{ Err error }

func (e ReceiptReadError) Error() string { return e.Err.Error() }
func (e ReceiptReadError) Unwrap() error { return e.Err }

// LastReceipt reads host's last withdrawal receipt in st (a message get:
// no direct get) and decodes it; it checks that it is host's, not its
// signature (the caller's keyring: fencing.Keyring.VerifyBeacon).
// ErrNoReceipt when there is none.
func LastReceipt(ctx context.Context, st jetstream.Stream, host string) (fencing.Beacon, error) {
	subj, err := proto.WithdrawnSubject(host)
	if err != nil {
		return fencing.Beacon{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fencing.Beacon{}, ErrNoReceipt
	}
	if err != nil {
		return fencing.Beacon{}, ReceiptReadError{fmt.Errorf("read the withdrawal receipt of %s: %w", host, err)}
	}
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
