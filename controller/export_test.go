package controller

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetPinMutation lets the external tests (package controller_test) turn
// pinMutation on (memory.go); it returns the function that turns it off.
func SetPinMutation(on bool) func() {
	pinMutation = on
	return func() { pinMutation = false }
}

// SetStoredMutation lets the external tests turn storedMutation on.
func SetStoredMutation(on bool) func() {
	storedMutation = on
	return func() { storedMutation = false }
}

// SetRollbackCheckMutation lets the external tests turn
// rollbackCheckMutation on.
func SetRollbackCheckMutation(on bool) func() {
	rollbackCheckMutation = on
	return func() { rollbackCheckMutation = false }
}

// defaultParallel is how many of this package's parallel tests run at
// once when go test is not given -parallel. They are NATS attack and
// runner tests that mostly wait on lease timing (a few seconds of CPU in
// 20-30 s of wall time each), so GOMAXPROCS (2 on the CI machine) would
// leave the package's ~9 min sequential. Tests that switch a mutation on
// stay sequential: Go runs top-level parallel tests only after every
// sequential one has finished, so no mutation is ever on beside them.
const defaultParallel = "6"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", defaultParallel); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// SetBeaconMissMutation turns beaconMissMutation on until the returned
// func is called (sequential tests only).
func SetBeaconMissMutation(on bool) func() {
	beaconMissMutation = on
	return func() { beaconMissMutation = false }
}

// SetBeaconChainMutation turns beaconChainMutation on until the returned
// func is called (sequential tests only).
func SetBeaconChainMutation(on bool) func() {
	beaconChainMutation = on
	return func() { beaconChainMutation = false }
}

// ConfirmPoll exposes the runner's marker and confirmation poll
// (rollbackconfirm.go).
type ConfirmPoll struct{ p confirmPoll }

// PollResult is one poll's result: the hosts confirmed, whether the
// marker was read and stands.
type PollResult struct {
	Confirmed     []string
	Known, Marker bool
}

func (c *ConfirmPoll) Poll(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger, gated []string, now time.Time) PollResult {
	r := c.p.poll(ctx, kv, log, gated, now)
	out := PollResult{Known: r.known, Marker: r.marker}
	for _, t := range r.confirmed {
		out.Confirmed = append(out.Confirmed, t.host)
	}
	return out
}

// SetReceiptMutation turns receiptMutation on until the returned func is
// called (sequential tests only).
func SetReceiptMutation(on bool) func() {
	receiptMutation = on
	return func() { receiptMutation = false }
}

// SetBeaconLossMutation turns beaconLossMutation on (the tracker ignores
// lost beacons: a loss no counter sees) until the returned func is called
// (sequential tests only).
func SetBeaconLossMutation(on bool) func() {
	beaconLossMutation = on
	return func() { beaconLossMutation = false }
}

// SetReceiptJunkMutation turns receiptJunkMutation on until the returned
// func is called (sequential tests only).
func SetReceiptJunkMutation(on bool) func() {
	receiptJunkMutation = on
	return func() { receiptJunkMutation = false }
}

// SetActRecheckMutation turns actRecheckMutation on until the returned
// func is called (sequential tests only).
func SetActRecheckMutation(on bool) func() {
	actRecheckMutation = on
	return func() { actRecheckMutation = false }
}

// SetReceiptUnsoundMutation turns receiptUnsoundMutation on until the
// returned func is called (sequential tests only).
func SetReceiptUnsoundMutation(on bool) func() {
	receiptUnsoundMutation = on
	return func() { receiptUnsoundMutation = false }
}

// SetReceiptStaleMutation turns receiptStaleMutation on until the
// returned func is called (sequential tests only).
func SetReceiptStaleMutation(on bool) func() {
	receiptStaleMutation = on
	return func() { receiptStaleMutation = false }
}

// SetReceiptStaleMargin sets receiptStaleMargin until the returned func
// is called (sequential tests only).
func SetReceiptStaleMargin(d time.Duration) func() {
	receiptStaleMargin = d
	return func() { receiptStaleMargin = ReceiptStaleMargin }
}

// The rigs' receipts streams are created by the one nats-server the
// rig starts (natspermtest.StartServer), moments before its hosts'
// records: no two servers' clocks to cover, so the margin (1 s in
// production, for two streams' leaders on different servers) is cut to
// 10 ms for this package's tests (TestReceiptsCover restores it).
func init() { receiptStreamClockMargin = 10 * time.Millisecond }

// SetWithdrawalLayersMutation switches off, until the returned func is
// called, the tracker's refusals of a record sealed before a standing
// withdrawal (reviewers X103, X104: sealedBeforeWithdrawalMutation,
// withdrawalProcessOlderMutation, lateWithdrawalMutation,
// otherProcessOlderActiveMutation): the receipt tests' mutation cases
// show the runner's receipt layer alone (sequential tests only).
func SetWithdrawalLayersMutation(on bool) func() {
	set := func(v bool) {
		sealedBeforeWithdrawalMutation, withdrawalProcessOlderMutation = v, v
		lateWithdrawalMutation, otherProcessOlderActiveMutation = v, v
	}
	set(on)
	return func() { set(false) }
}

// SetSpanSkipMutation turns spanSkipMutation on until the returned func
// is called (sequential tests only).
func SetSpanSkipMutation(on bool) func() {
	spanSkipMutation = on
	return func() { spanSkipMutation = false }
}

// SetCoverFromMutation turns coverFromMutation on until the returned
// func is called (sequential tests only).
func SetCoverFromMutation(on bool) func() {
	coverFromMutation = on
	return func() { coverFromMutation = false }
}

// SetReceiptSinceMutation turns receiptSinceMutation on until the
// returned func is called (sequential tests only).
func SetReceiptSinceMutation(on bool) func() {
	receiptSinceMutation = on
	return func() { receiptSinceMutation = false }
}

// SetReceiptSealedMutation turns receiptSealedMutation on until the
// returned func is called (sequential tests only).
func SetReceiptSealedMutation(on bool) func() {
	receiptSealedMutation = on
	return func() { receiptSealedMutation = false }
}

// SetPrevStoredMutation turns prevStoredMutation on until the returned
// func is called (reviewer X64's holes back).
func SetPrevStoredMutation(on bool) func() {
	prevStoredMutation = on
	return func() { prevStoredMutation = false }
}

// SetCreateChainMutation turns createChainMutation on until the returned
// func is called (reviewer X65's delete loop back).
func SetCreateChainMutation(on bool) func() {
	createChainMutation = on
	return func() { createChainMutation = false }
}

// SetVouchMutation turns vouchMutation (and, with cover, only
// vouchCoverMutation) on until the returned func is called (reviewer
// X65's delete loop across a start back).
func SetVouchMutation(cover bool) func() {
	if cover {
		vouchCoverMutation = true
	} else {
		vouchMutation = true
	}
	return func() { vouchMutation, vouchCoverMutation = false, false }
}

// SetProcAfterMutation turns procAfterMutation on until the returned
// func is called (reviewer X70's old receipt back).
func SetProcAfterMutation(on bool) func() {
	procAfterMutation = on
	return func() { procAfterMutation = false }
}

// SetBootOrderMutation turns bootOrderMutation on until the returned
// func is called (reviewer X66's hole back).
func SetBootOrderMutation(on bool) func() {
	bootOrderMutation = on
	return func() { bootOrderMutation = false }
}

// SetReceiptBootMutation turns receiptBootMutation on until the returned
// func is called (reviewer X67's stale receipt back).
func SetReceiptBootMutation(on bool) func() {
	receiptBootMutation = on
	return func() { receiptBootMutation = false }
}

// SetOtherBootForgedMutation turns otherBootForgedMutation on until the
// returned func is called (reviewer X67's live host declared).
func SetOtherBootForgedMutation(on bool) func() {
	otherBootForgedMutation = on
	return func() { otherBootForgedMutation = false }
}

// SetSameBootMutation turns sameBootMutation on until the returned func
// is called (reviewer X68's in-boot state loss back).
func SetSameBootMutation(on bool) func() {
	sameBootMutation = on
	return func() { sameBootMutation = false }
}

// SetUnseenPrevMutation turns unseenPrevMutation on until the returned
// func is called (reviewer X69's earlier-life records trusted again).
func SetUnseenPrevMutation(on bool) func() {
	unseenPrevMutation = on
	return func() { unseenPrevMutation = false }
}

// SetReusedRevMutation turns reusedRevMutation on until the returned
// func is called (reviewer X69's reused revisions back).
func SetReusedRevMutation(on bool) func() {
	reusedRevMutation = on
	return func() { reusedRevMutation = false }
}

// SetBeaconBudgetMutation sets beaconBudgetMutation (run.go) and returns
// its reset.
func SetBeaconBudgetMutation(on bool) func() {
	beaconBudgetMutation = on
	return func() { beaconBudgetMutation = false }
}

// MaxLaterValues is maxLaterValues (vouch.go).
const MaxLaterValues = maxLaterValues

// SetChargeFirstMutation sets chargeFirstMutation (run.go) and returns
// its reset.
func SetChargeFirstMutation(on bool) func() {
	chargeFirstMutation = on
	return func() { chargeFirstMutation = false }
}

// SetLaterCompactMutation sets laterCompactMutation (vouch.go) and
// returns its reset.
func SetLaterCompactMutation(on bool) func() {
	laterCompactMutation = on
	return func() { laterCompactMutation = false }
}

// SetHeldBackMutation turns heldBackMutation on until the returned func is
// called (reviewer X85's held-back records of a process not refused).
func SetHeldBackMutation(on bool) func() {
	heldBackMutation = on
	return func() { heldBackMutation = false }
}

// SetSealedProcMutation turns sealedProcMutation on until the returned
// func is called (reviewer X89's same-process receipt rule off).
func SetSealedProcMutation(on bool) func() {
	sealedProcMutation = on
	return func() { sealedProcMutation = false }
}

// SetAdjacentMutation sets adjacentMutation (the watch's adjacency
// ignored); the returned func clears it.
func SetAdjacentMutation() func() {
	adjacentMutation = true
	return func() { adjacentMutation = false }
}
