package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"

	"github.com/nats-io/nats.go/jetstream"
)

// TestX58WithheldRelayLaundersHiddenWithdrawalNATS (S; reviewer X58). The
// rig of TestWithdrawalReceiptStopsDeclarationNATS (a real nats-server
// with the shipped permissions, compute-3's withdrawal hidden by a watch
// skip, its beacon lost where no counter sees — beaconLossMutation), but
// the compromised compute-1 does not overwrite the withdrawal with
// garbage: it writes (a plain KV put, which its user may do on any lease
// key) a GENUINE record of compute-3 that never landed — an active
// renewal compute-3 sealed for revision P (the last revision the
// controller saw in its key) and handed to compute-1 as a relay question,
// which compute-1 withheld. compute-3 then withdrew by CAS on P (landed
// at R = P+1) and stored its receipt. compute-1 writes the withheld
// record at R+1: its PrevRev P is not below the last revision the
// tracker saw (P: the withdrawal was hidden), so it is no replay
// (fencing.StaleRecord, replay()) and is TRUSTED; trustedRev = R+1, so
// Tracker.MayHideWrite is false and the receipt (naming R < trustedRev)
// "is older than what the host wrote since": ObserveWithdrawal says
// nothing, the declaration proceeds, and the withdrawn compute-3 (its
// guests running) is declared. No reflection, no junk on the receipt
// subject — the receipt is read, verifies, and is ignored.
//   - "garbage" (control): the rig's garbage overwrite: not declared;
//   - "withheld-relay": declared (FAILED so; closed: a verified receipt
//     naming a revision between the trusted record's PrevRev and its own
//     makes the declaration wait, Tracker.SealedBefore; with
//     receiptSealedMutation it is declared);
//   - "withheld-relay/loss-machinery-on": the same with the beacon-loss
//     machinery on (in this rig it refuses compute-3 after the garbage);
//   - ".../beacon-delivered": compute-3's withdrawal beacon not lost.
func TestX58WithheldRelayLaundersHiddenWithdrawalNATS(t *testing.T) {
	for _, c := range []struct {
		name                        string
		withheld, loss, beacon, mut bool
	}{
		{name: "garbage"},
		{name: "withheld-relay", withheld: true},
		{name: "withheld-relay/receiptSealedMutation", withheld: true, mut: true},
		{name: "withheld-relay/loss-machinery-on", withheld: true, loss: true},
		{name: "withheld-relay/loss-machinery-on/beacon-delivered", withheld: true, loss: true, beacon: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !c.loss {
				defer controller.SetBeaconLossMutation(true)()
			}
			if c.mut {
				defer controller.SetReceiptSealedMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, withheld: c.withheld, beacon: c.beacon,
				wantDeclared: c.mut, wantWithdrawn: !c.withheld || c.beacon})
		})
	}
}

// TestX58FullStreamShrunkAfterRefusal (S; reviewer X58). ReadReceipts'
// Full was a reading of the stream's bytes NOW; what decides is whether
// the stream refused the victim's receipt THEN. With DiscardNew, a
// message on a subject at its MaxMsgsPerSubject limit is still stored
// when the stream is full, provided the subject's oldest message is at
// least as large (nats-server filestore.storeRawMsg, "asl"): the
// compromised node can SHRINK a full stream by replacing its 4 KB
// flood answers with ~200-byte ones (a msg get of a 1-byte lease value).
// So: (1) flood the stream to full (X57: 68 000 reflected answers on
// fresh hvguard.v1.<x>.withdrawn subjects, 4 per subject), (2) compute-3
// withdraws: its receipt is REFUSED (the agent logs an ERROR, nothing
// more), (3) compute-1 overwrites compute-3's withdrawn record
// (MayHideWrite true), (4) compute-1 shrinks the stream by a few
// replacements: not full, compute-3's subject holds nothing, no junk:
// the withdrawn compute-3 was declared. The junk is published directly
// in place of reflected answers (same subjects, same sizes; X57's flood
// test shows the reflection path).
//   - "older-stream": the previous release's stream (a wildcard,
//     DiscardNew, a stream-wide limit — 1 MiB here to keep the flood
//     small): the attack still works on it, and ReadReceipts now says the
//     stream cannot vouch for compute-3's receipts (Unsound), which makes
//     its declaration wait (TestWithdrawalReceiptStopsDeclarationNATS,
//     "no-receipt/older-stream"; declared with receiptUnsoundMutation);
//   - "shipped": each host has its own stream, capturing its subject
//     only, without a stream-wide limit (natslease.WithdrawalStreamConfig):
//     the flood on fresh subjects stores nothing, one on the other hosts'
//     subjects keeps 4 each in their streams, and compute-3's receipt is
//     stored.
func TestX58FullStreamShrunkAfterRefusal(t *testing.T) {
	for _, older := range []bool{true, false} {
		name := "shipped"
		if older {
			name = "older-stream"
		}
		t.Run(name, func(t *testing.T) { x58FullStream(t, older) })
	}
}

func x58FullStream(t *testing.T, older bool) {
	const victim = "compute-3.example.org"
	hosts := []string{"compute-1.example.org", "compute-2.example.org", victim}
	_, _, js := controllertest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var st jetstream.Stream // compute-3's receipts stream
	var err error
	if older {
		st, err = js.CreateStream(ctx, natspermtest.OlderReceiptsConfig(1<<20))
	} else {
		for _, h := range hosts {
			st, err = natslease.EnsureWithdrawalStream(ctx, js, h) // the victim's last
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("x", 3900))  // a ~4 KB reflected answer
	small := []byte(strings.Repeat("y", 150)) // a msg get answer of a 1-byte value
	pctx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 500*time.Millisecond) }
	pub := func(subj string, data []byte) error {
		c, cancel := pctx()
		defer cancel()
		_, err := js.Publish(c, subj, data)
		return err
	}
	// (1) fill: 4 big answers per fresh subject until refused (or, on the
	// shipped stream, 200 subjects: none stored), then small ones; and 4
	// big ones on every enrolled host's subject but compute-3's.
	nsubj := 0
	for full := false; !full && nsubj < 2000; nsubj++ {
		for i := 0; i < 4; i++ {
			if err := pub(fmt.Sprintf("hvguard.v1.x58-%d.withdrawn", nsubj), big); err != nil {
				full = true
				break
			}
		}
		if !older && nsubj == 2 {
			break
		}
	}
	for i := 0; older; i++ {
		if err := pub(fmt.Sprintf("hvguard.v1.x58s-%d.withdrawn", i), small); err != nil {
			break
		}
	}
	for _, h := range hosts[:2] {
		subj, _ := proto.WithdrawnSubject(h)
		for range 8 {
			_ = pub(subj, big)
		}
	}
	// (2) compute-3's genuine receipt.
	f := newFleetOf(t, []string{victim})
	rec := controllertest.HostRecord(victim)
	rec.State, rec.Seq = fencing.LeaseWithdrawn, 7
	m, err := natslease.ReceiptMsg(f.signers[victim], rec, 1234, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, ccancel := pctx()
	_, perr := js.PublishMsg(c, m)
	ccancel()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the flood: stream %d msgs, %d bytes; compute-3's receipt: %v", info.State.Msgs, info.State.Bytes, perr)
	if !older {
		if perr != nil {
			t.Fatalf("the shipped stream refused compute-3's receipt after a flood: %v", perr)
		}
		if info.State.Msgs != 1 {
			t.Fatalf("compute-3's stream holds %d messages: want its receipt only", info.State.Msgs)
		}
		for _, h := range hosts[:2] {
			rr, err := natslease.ReadHostReceipts(ctx, js, h)
			if err != nil || len(rr.Msgs) != proto.WithdrawalReceiptsKept {
				t.Fatalf("%s's stream after the flood on its subject: %d messages (want the last %d), %v", h, len(rr.Msgs), proto.WithdrawalReceiptsKept, err)
			}
		}
		rr, err := natslease.ReadReceipts(ctx, st, victim)
		if err != nil || len(rr.Msgs) != 1 || rr.Msgs[0].Err != nil || rr.Unsound != nil {
			t.Fatalf("compute-3's receipt in the shipped stream: %+v, unsound %v, err %v", rr.Msgs, rr.Unsound, err)
		}
		return
	}
	if perr == nil {
		t.Fatal("rig: the receipt was stored in the full older stream")
	}
	// (4) shrink: replace 4 big answers (subjects at their limit) by small
	// ones.
	for i := 0; i < 4; i++ {
		if err := pub(fmt.Sprintf("hvguard.v1.x58-%d.withdrawn", i), small); err != nil {
			t.Fatalf("shrink refused: %v", err)
		}
	}
	rr, err := natslease.ReadReceipts(ctx, st, victim)
	if err != nil {
		t.Fatal(err)
	}
	if info, err = st.Info(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the shrink: stream %d bytes of %d; compute-3's subject: %d message(s); unsound: %v", info.State.Bytes, info.Config.MaxBytes, len(rr.Msgs), rr.Unsound)
	if len(rr.Msgs) != 0 {
		t.Fatalf("rig: compute-3's subject holds %d messages", len(rr.Msgs))
	}
	if rr.Unsound == nil {
		t.Fatal("compute-3's receipt was refused by the full stream, which was shrunk since, and ReadReceipts says the stream vouches for its receipts: the withdrawn host (key overwritten) is declared")
	}
}
