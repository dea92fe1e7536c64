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

// Errors a declaration waits on (reported to OnDecision; the tracker
// decides the host again at its next tick): the host's receipts were
// tampered with, or the stream cannot vouch that it stored every receipt.
var (
	ErrReceiptsTampered = errors.New("not declared: a message that is not the host's withdrawal receipt was stored on its receipt subject after its last one (a reflected JetStream answer? docs/security.md, \"Withdrawal receipts\"): a withdrawal's receipt may be hidden")
	// ErrReceiptsUnsound: no receipts stream, or one that may have refused
	// or dropped a receipt (natslease.ReceiptsUnsound: a wildcard a flood
	// can fill, then shrink after it refused a receipt — reviewer X58; a
	// stream shared by every host, whose ingest queue one host's flood
	// fills — reviewer X60).
	ErrReceiptsUnsound = errors.New("not declared: the withdrawal receipts stream cannot vouch that it stored every receipt the host published (missing, or configured so it may refuse or drop one: docs/operations.md): the absence of its receipt is no evidence")
	// ErrReceiptAfterSeal: the host's receipt names a withdrawal after the
	// revision its trusted record was sealed for (Tracker.SealedBefore).
	ErrReceiptAfterSeal = errors.New("not declared: the host's withdrawal receipt names a withdrawal after the revision its trusted record was sealed for: that record was written over the withdrawal by someone else (a withheld relay?)")
)

// receiptJunkMutation: junk on a host's receipt subject changes nothing
// (reviewer X57's hole); receiptSealedMutation: a receipt naming a
// revision between the trusted record's PrevRev and its own changes
// nothing (reviewer X58's); receiptUnsoundMutation: a missing receipts
// stream, or one that cannot vouch for its receipts, changes nothing
// (X58's other: a full stream shrunk after it refused a receipt). Tests
// only.
var receiptJunkMutation, receiptSealedMutation, receiptUnsoundMutation bool

// checkReceipt reads d.Host's withdrawal receipts before its declaration
// is written (natslease.ReadHostReceipts: every message kept on its
// subject in its own stream).
// It returns ErrWithdrawalReceipt when the newest one that is the host's
// (decoded, signed by its key) names a withdrawal the tracker takes as
// news — after the host's last trusted record and its beacons' newest:
// the tracker now has the host withdrawn. It returns an error, and the
// declaration waits, when the receipts could not be read; and — only for
// a host whose key holds a later value than the record it is judged by,
// which may hide a withdrawal (Tracker.MayHideWrite) — when anything
// that is not the host's receipt was stored after its newest one (junk
// can be published there by the JetStream API's reflection: one answer
// after the receipt hid it from a reader of the last message, four
// evicted it — reviewer X57), or when there is no receipts stream or it
// cannot vouch that it stored every receipt the host published
// (natslease.ReceiptsUnsound: one capturing a wildcard was filled by a
// flood of reflected answers on fresh subjects, refused the receipt, and
// was shrunk again before the declaration — reviewer X58; one shared by
// every host, whose ingest queue a compromised node filled with
// publishes on its own receipt subject so that the server refused the
// withdrawing host's receipt — reviewer X60). A receipt the
// tracker already knew, or older than what the host wrote since,
// changes nothing: the declaration proceeds.
func (r *Runner) checkReceipt(ctx context.Context, log *slog.Logger, d Decision) error {
	if receiptMutation {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ReceiptReadTimeout)
	defer cancel()
	if r.Receipts == nil {
		// A runner without the agents' JetStream (tests, embedded uses;
		// the daemon always has it) waits only for a key that may hide a
		// write: it reads no receipt to weigh against a skip.
		if r.Tracker.MayHideWrite(d.Host) && !receiptUnsoundMutation {
			log.Error("DECLARATION WAITS: the host's key holds a later value than the record it is judged by, which may hide its withdrawal, and no withdrawal receipts are read to show there was none (a runner without the agents' JetStream connection)", "host", d.Host)
			return ErrReceiptsUnsound
		}
		return nil
	}
	rr, err := natslease.ReadHostReceipts(ctx, r.Receipts, d.Host)
	if err != nil {
		log.Warn("declaration waits: the host's withdrawal receipts could not be read (retried at the next tick)", "host", d.Host, "err", err)
		return fmt.Errorf("declaration not written: %w", err)
	}
	var newest *natslease.StoredReceipt
	var junk []string
	for i := len(rr.Msgs) - 1; i >= 0; i-- {
		m := &rr.Msgs[i]
		if m.Err == nil {
			m.Err = r.Store.Keys.VerifyBeacon(m.Beacon)
		}
		if m.Err == nil {
			newest = m
			break
		}
		junk = append(junk, fmt.Sprintf("sequence %d stored %s: %v", m.Seq, m.Stored.UTC().Format(time.RFC3339), m.Err))
	}
	mayHide := r.Tracker.ReceiptsMatter(d.Host)
	if mayHide && len(junk) > 0 && !receiptJunkMutation {
		log.Error("DECLARATION WAITS: the host's receipt subject holds messages that are not its withdrawal receipts after its last one — reflected JetStream answers, a compromised node's doing; the host is not declared until its next receipt or an operator removes them (docs/security.md, \"Withdrawal receipts\")", "host", d.Host, "junk", junk)
		return ErrReceiptsTampered
	}
	// unsound: for a host whose key may hide a withdrawal, the absence of
	// a newer receipt is evidence only from a stream that could not have
	// refused or dropped one (checked once no receipt stopped the
	// declaration).
	unsound := func() error {
		if !mayHide || receiptUnsoundMutation {
			return nil
		}
		if rr.Unsound == nil && !r.Tracker.ReceiptsCover(d.Host, rr.Since) {
			// Reviewer X62: a stream created after the record the host
			// is judged by vouches for nothing before it existed.
			rr.Unsound = fmt.Errorf("the host's receipts stream was created at %s, not before the record the host is judged by was stored (or that time is unknown: a pin of an earlier release, a record carried across a rollback): it cannot vouch for receipts published before it existed", rr.Since.UTC().Format(time.RFC3339))
		}
		if rr.Unsound == nil && r.ReceiptsAccount != nil {
			rr.Unsound = r.ReceiptsAccount(ctx) // reviewer X60: a capped account
		}
		if rr.Unsound == nil {
			return nil
		}
		log.Error("DECLARATION WAITS: the host's key holds a later value than the record it is judged by, which may hide its withdrawal, and the withdrawal receipts stream cannot vouch that it stored every receipt the host published: the host is not declared until the stream is fixed (docs/security.md, \"Withdrawal receipts\")", "host", d.Host, "why", rr.Unsound)
		return ErrReceiptsUnsound
	}
	if newest == nil {
		return unsound()
	}
	b := newest.Beacon
	if r.Tracker.SealedBefore(d.Host, b) && !receiptSealedMutation {
		// The withdrawal landed between the revision the trusted record
		// was sealed for and the one it landed at: that record was not
		// the host's write on its key's state — a renewal it sealed and a
		// compromised peer withheld, put back over the withdrawal (a
		// withdrawn host was declared 5.25 s after withdrawing: reviewer
		// X58, TestX58WithheldRelayLaundersHiddenWithdrawalNATS).
		log.Error("DECLARATION WAITS: the host's withdrawal receipt names a withdrawal after the revision its trusted record was sealed for — that record was written over the withdrawal by someone else (a withheld relay?); the host is not declared until it writes again (docs/security.md, \"Withdrawal receipts\")", "host", d.Host, "receipt_revision", b.Revision, "judged_revision", d.Revision)
		return ErrReceiptAfterSeal
	}
	if r.Tracker.ReceiptStale(d.Host, b, newest.Stored) {
		// From before the record the host is judged by, though it names a
		// later revision: a receipt of the lease bucket's earlier life
		// (re-created, or rolled back) — reviewer X59.
		log.Info("the host's withdrawal receipt is from before its trusted record (the host wrote a newer record, stored later): not evidence of a withdrawal now", "host", d.Host, "receipt_revision", b.Revision, "receipt_stored", newest.Stored, "judged_revision", d.Revision)
		return unsound()
	}
	news := false
	// A copy: the tracker reuses its decisions' slice, which the caller
	// may be ranging over (Tick's).
	for _, w := range slices.Clone(r.Tracker.ObserveWithdrawalBy(r.now(), d.Host, b.Revision, b.BootID, b.Incarnation)) {
		if w.Op == OpWithdrawn {
			news = true
			w.Reason = fmt.Sprintf("withdrawn: its withdrawal receipt (stored in the stream, signed by its key) names its withdrawal at revision %d, after its last trusted record — the withdrawn record and its beacon were not seen (overwritten? lost?): host unprotected, not declared, not recovered", b.Revision)
			r.perform(ctx, log, w)
		}
	}
	if !news {
		return unsound()
	}
	log.Error("DECLARATION STOPPED by the host's withdrawal receipt: it withdrew after the record it was judged by", "host", d.Host, "receipt_revision", b.Revision, "judged_revision", d.Revision)
	return ErrWithdrawalReceipt
}
