package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"hvguard/fencing/natslease"
)

// Withdrawal receipts (natslease.ReceiptMsg; docs/security.md,
// "Withdrawal receipts"). Every hole the beacon-loss machinery left
// (beaconloss.go: a leaf node that lost only the withdrawing host's
// beacon, a companion that wrote nothing during a route stall, a host
// renewing through hidden relays for more than 5 minutes, a controller
// not running when the beacon was sent) was a withdrawal the controller
// never saw: its record overwritten by a compromised node before the
// watch delivered it, its beacon lost on the way. The agent's receipt of
// its withdrawal is stored in a JetStream stream with a publish ack, so
// the leader reads the host's last one right before it writes a
// declaration, and a receipt naming a withdrawal after the record the
// host is judged by is the withdrawal beacon the tracker missed
// (Tracker.ObserveWithdrawal): the host is not declared.

// ReceiptReadTimeout bounds the read of a host's last receipt before its
// declaration (on the runner's loop, like the declaration's own write,
// WriteTimeout).
const ReceiptReadTimeout = 2 * time.Second

// ErrWithdrawalReceipt is reported to OnDecision for a declaration not
// written because the host's withdrawal receipt names a withdrawal the
// tracker had not seen.
var ErrWithdrawalReceipt = errors.New("not declared: the host's withdrawal receipt names a withdrawal after the record it was judged by")

// receiptMutation: no receipt is read before a declaration, as before.
// Tests only.
var receiptMutation bool

// checkReceipt reads d.Host's last withdrawal receipt before its
// declaration is written. It returns ErrWithdrawalReceipt when the receipt
// (signed by the host's key) names a withdrawal the tracker takes as news
// — after the host's last trusted record and its beacons' newest: the
// tracker now has the host withdrawn — and an error when the receipt
// could not be read (the declaration waits: the tracker decides it again
// at its next tick). A receipt the tracker already knew, or older than
// what the host wrote since, changes nothing: the declaration proceeds.
// An undecodable or unverifiable receipt is not evidence of a withdrawal
// (with the shipped permissions only the host publishes on its subject):
// logged, the declaration proceeds.
func (r *Runner) checkReceipt(ctx context.Context, log *slog.Logger, d Decision) error {
	if r.Receipts == nil || receiptMutation {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ReceiptReadTimeout)
	defer cancel()
	b, err := natslease.LastReceipt(ctx, r.Receipts, d.Host)
	switch {
	case errors.Is(err, natslease.ErrNoReceipt):
		return nil
	case isReadErr(err):
		log.Warn("declaration waits: the host's withdrawal receipt could not be read (retried at the next tick)", "host", d.Host, "err", err)
		return fmt.Errorf("declaration not written: %w", err)
	case err != nil:
		log.Error("INVALID WITHDRAWAL RECEIPT ignored (not evidence of a withdrawal)", "host", d.Host, "err", err)
		return nil
	}
	if err := r.Store.Keys.VerifyBeacon(b); err != nil {
		log.Error("INVALID WITHDRAWAL RECEIPT ignored: not signed by the host's key", "host", d.Host, "revision", b.Revision, "err", err)
		return nil
	}
	news := false
	// A copy: the tracker reuses its decisions' slice, which the caller
	// may be ranging over (Tick's).
	for _, w := range slices.Clone(r.Tracker.ObserveWithdrawal(r.now(), d.Host, b.Revision)) {
		if w.Op == OpWithdrawn {
			news = true
			w.Reason = fmt.Sprintf("withdrawn: its withdrawal receipt (stored in the stream, signed by its key) names its withdrawal at revision %d, after its last trusted record — the withdrawn record and its beacon were not seen (overwritten? lost?): host unprotected, not declared, not recovered", b.Revision)
			r.perform(ctx, log, w)
		}
	}
	if !news {
		return nil
	}
	log.Error("DECLARATION STOPPED by the host's withdrawal receipt: it withdrew after the record it was judged by", "host", d.Host, "receipt_revision", b.Revision, "judged_revision", d.Revision)
	return ErrWithdrawalReceipt
}

// isReadErr: err is LastReceipt's failure to read the stream (as opposed
// to a receipt it read and could not decode).
func isReadErr(err error) bool {
	var re natslease.ReceiptReadError
	return errors.As(err, &re)
}
