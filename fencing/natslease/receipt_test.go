package natslease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestWithdrawalReceipts: the receipts a host stored with a publish ack
// are what ReadReceipts reads back, oldest first (verified by the host's
// key); another host has none; a receipt of an active record is refused
// at the source; messages on a host's subject naming another host, a
// state other than withdrawn, or garbage are read with their error (not
// evidence; the caller decides); the stream refuses what would overflow
// it and says it is full (DiscardNew: nothing stored is evicted by a
// flood); a missing stream is a read error. EnsureWithdrawalStream
// creates the stream once and opens it after; it forbids direct gets,
// purges and deletes.
func TestWithdrawalReceipts(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	signers, ring := fleetKeys(t, "h0", "h1")
	st, err := natslease.EnsureWithdrawalStream(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.AllowDirect || !c.DenyPurge || !c.DenyDelete || c.MaxMsgsPerSubject != proto.WithdrawalReceiptsKept || c.Discard != jetstream.DiscardNew {
		t.Fatalf("receipts stream settings: direct %t, deny purge %t, deny delete %t, per subject %d, discard %v", c.AllowDirect, c.DenyPurge, c.DenyDelete, c.MaxMsgsPerSubject, c.Discard)
	}
	if _, err := natslease.EnsureWithdrawalStream(ctx, js); err != nil {
		t.Fatalf("opening the existing stream: %v", err)
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h0"); err != nil || len(rr.Msgs) != 0 || rr.Full {
		t.Fatalf("no receipt yet: %+v, %v", rr, err)
	}
	rec := fencing.LeaseRecord{Host: "h0", State: fencing.LeaseActive, Epoch: 3, Incarnation: 2, Seq: 7, BootID: "b"}
	if _, err := natslease.ReceiptMsg(signers["h0"], rec, 40, time.Now()); err == nil {
		t.Fatal("a receipt of an active record was made")
	}
	rec.State = fencing.LeaseWithdrawn
	for _, rev := range []uint64{40, 52} {
		rec.Seq++
		m, err := natslease.ReceiptMsg(signers["h0"], rec, rev, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(proto.WithdrawalStream)); err != nil {
			t.Fatal(err)
		}
	}
	rr, err := natslease.ReadReceipts(ctx, st, "h0")
	if err != nil || len(rr.Msgs) != 2 {
		t.Fatalf("h0's receipts: %+v, %v", rr, err)
	}
	b := rr.Msgs[1].Beacon
	if rr.Msgs[0].Beacon.Revision != 40 || b.Revision != 52 || b.Seq != rec.Seq || b.State != fencing.LeaseWithdrawn || b.Host != "h0" || rr.Msgs[1].Err != nil {
		t.Fatalf("h0's receipts: %+v", rr.Msgs)
	}
	if err := ring.VerifyBeacon(b); err != nil {
		t.Fatalf("the receipt does not verify with h0's key: %v", err)
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h1"); err != nil || len(rr.Msgs) != 0 {
		t.Fatalf("h1 has no receipt: %+v, %v", rr, err)
	}
	// Bad receipts on h1's subject (a reflected answer, or a user allowed
	// to publish there).
	subj, _ := proto.WithdrawnSubject("h1")
	other, _ := natslease.ReceiptMsg(signers["h0"], rec, 60, time.Now()) // h0's, on h1's subject
	active, _ := natslease.BeaconMsg(signers["h1"], fencing.LeaseRecord{Host: "h1", State: fencing.LeaseActive}, 61, 0, time.Now())
	for _, data := range [][]byte{other.Data, active.Data, []byte("not a beacon")} {
		if _, err := js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
	}
	rr, err = natslease.ReadReceipts(ctx, st, "h1")
	if err != nil || len(rr.Msgs) != 3 {
		t.Fatalf("h1's subject: %+v, %v", rr, err)
	}
	for i, m := range rr.Msgs {
		if m.Err == nil {
			t.Fatalf("message %d on h1's subject taken for h1's receipt: %+v", i, m)
		}
	}
	// A flood until the stream refuses: it says it is full, and h0's
	// receipts are still there.
	flood := make([]byte, 4000)
	for i := 0; ; i++ {
		s, _ := proto.WithdrawnSubject("x" + string(rune('a'+i%26)) + "-" + time.Now().Format("150405.000000000"))
		if _, err := js.Publish(ctx, s, flood); err != nil {
			break
		}
		if i > 80000 {
			t.Fatal("the stream never refused")
		}
	}
	rr, err = natslease.ReadReceipts(ctx, st, "h0")
	if err != nil || !rr.Full || len(rr.Msgs) != 2 {
		t.Fatalf("after the flood: full %t, h0's receipts %d (%v)", rr.Full, len(rr.Msgs), err)
	}
	// The stream gone: a read error (the declaration waits).
	if err := js.DeleteStream(ctx, proto.WithdrawalStream); err != nil {
		t.Fatal(err)
	}
	var re natslease.ReceiptReadError
	if _, err := natslease.ReadReceipts(ctx, st, "h0"); !errors.As(err, &re) {
		t.Fatalf("missing stream: %v (want a read error)", err)
	}
}
