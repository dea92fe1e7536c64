package controller_test

import (
	"fmt"
	"testing"

	"hvguard/controller"
)

// TestX63WithheldRelayAfterMigrationNATS (S, conditional as X62's on an
// operator moving a withdrawn host to its own stream; reviewer X63):
// X58's withheld relay (compute-1 puts back, over compute-3's
// withdrawal, a renewal compute-3 sealed for the withdrawal's prev_rev)
// combined with X62's migration (compute-3 moved to its own stream right
// after withdrawing, its receipt left in the shared stream, no longer
// read). The key's last value is then a TRUSTED record:
// Tracker.MayHideWrite is false, so ReceiptsCover (and every soundness
// check) is skipped, and the only evidence — the receipt SealedBefore
// would use — is in a stream not read. Wanted: not declared.
//   - moved=false (control): the receipt is read from the shared stream,
//     SealedBefore stops the declaration;
//   - moved=true: declared 5.25 s after withdrawing (loss machinery off;
//     5.24 s on). Closed: the watch skipped the withdrawal's revision
//     between the put-back record's PrevRev and its own, so receipts
//     matter (Tracker.ReceiptsMatter), and the new stream, created after
//     the value the record replaced, does not cover it
//     (Tracker.ReceiptsCover): the declaration waits; with
//     spanSkipMutation declared.
func TestX63WithheldRelayAfterMigrationNATS(t *testing.T) {
	for _, c := range []struct{ moved, loss, mut bool }{{false, false, false}, {true, false, false}, {true, true, false}, {true, false, true}} {
		t.Run(fmt.Sprintf("moved=%t/loss-machinery=%t/spanSkipMutation=%t", c.moved, c.loss, c.mut), func(t *testing.T) {
			if !c.loss {
				defer controller.SetBeaconLossMutation(true)()
			}
			if c.mut {
				defer controller.SetSpanSkipMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: true, migrate: true, moved: c.moved, wantWithdrawn: false, wantDeclared: c.mut})
		})
	}
}

// TestX63WithheldRelayReflectionEvictsReceiptNATS (S, no operator action;
// reviewer X63): shipped per-host streams, compute-3's receipt STORED.
// compute-1 puts back X58's withheld relay over the withdrawal (the
// key's last value is a trusted record: MayHideWrite false), then
// reflects message-get answers onto compute-3's receipt subject (X57):
// 4 of them evict the receipt (MaxMsgsPerSubject). The junk check, like
// every soundness check, runs only when MayHideWrite: no receipt is
// found, nothing is junk, the withdrawn host was declared 5.25 s after
// withdrawing. Wanted: not declared. reflect=0 is the control
// (SealedBefore stops it). Closed: the watch skipped the withdrawal's
// revision between the record's PrevRev and its own, so receipts matter
// (Tracker.ReceiptsMatter) and the junk makes the declaration wait; with
// spanSkipMutation declared.
func TestX63WithheldRelayReflectionEvictsReceiptNATS(t *testing.T) {
	for _, c := range []struct {
		reflect   int
		loss, mut bool
	}{{0, false, false}, {4, false, false}, {4, true, false}, {4, false, true}} {
		t.Run(fmt.Sprintf("reflect=%d/loss-machinery=%t/spanSkipMutation=%t", c.reflect, c.loss, c.mut), func(t *testing.T) {
			if !c.loss {
				defer controller.SetBeaconLossMutation(true)()
			}
			if c.mut {
				defer controller.SetSpanSkipMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: true, reflect: c.reflect, wantDeclared: c.mut})
		})
	}
}

// TestX63PutBackAfterMoveMakesTrustedStoredLateNATS (S, conditional on an
// operator moving (or re-adding) a withdrawn host's stream; reviewer
// X63): the X62 fix takes the stored time of the trusted record as the
// time since which the host's receipts must be in the stream. A put-back
// record (X58's withheld relay: sealed BEFORE the withdrawal) is stored
// whenever compute-1 likes: it waits until the operator moved compute-3
// to its own stream, puts the relay back (the watch trusts it:
// trustedStored = now, after the stream's creation), then overwrites it
// with garbage, so MayHideWrite is true — and ReceiptsCover says the new
// stream covers, though it was created after the withdrawal. Wanted: not
// declared.
//   - putAfterMove=false (control): relay put back before the move, then
//     garbage: ReceiptsCover refuses, the declaration waits;
//   - putAfterMove=true: declared 5.25 s after withdrawing. Closed:
//     coverage counts from when the value the record replaced (its
//     PrevRev, the previous trusted record) was stored
//     (hostState.trustedFrom), before the move; with coverFromMutation
//     declared.
func TestX63PutBackAfterMoveMakesTrustedStoredLateNATS(t *testing.T) {
	for _, c := range []struct{ after, mut bool }{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("putAfterMove=%t/coverFromMutation=%t", c.after, c.mut), func(t *testing.T) {
			defer controller.SetBeaconLossMutation(true)()
			if c.mut {
				defer controller.SetCoverFromMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: true, migrate: true, moved: true, putAfterMove: c.after, thenGarbage: true, wantDeclared: c.mut})
		})
	}
}
