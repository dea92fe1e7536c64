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

// TestWithdrawalReceipts: a withdrawal's receipt stored with a publish ack
// is what LastReceipt reads back (the last of several; verified by the
// host's key); another host has none (ErrNoReceipt); a receipt of an
// active record is refused at the source; a receipt on a host's subject
// naming another host, a state other than withdrawn, or garbage is an
// error that is not a read error (not evidence, the caller logs it); a
// missing stream is a read error. EnsureWithdrawalStream creates the
// stream once and opens it after; it forbids direct gets, purges and
// deletes.
func TestWithdrawalReceipts(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	signers, ring := fleetKeys(t, "h0", "h1")
	st, err := natslease.EnsureWithdrawalStream(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.AllowDirect || !c.DenyPurge || !c.DenyDelete || c.MaxMsgsPerSubject != proto.WithdrawalReceiptsKept {
		t.Fatalf("receipts stream settings: direct %t, deny purge %t, deny delete %t, per subject %d", c.AllowDirect, c.DenyPurge, c.DenyDelete, c.MaxMsgsPerSubject)
	}
	if _, err := natslease.EnsureWithdrawalStream(ctx, js); err != nil {
		t.Fatalf("opening the existing stream: %v", err)
	}
	if _, err := natslease.LastReceipt(ctx, st, "h0"); !errors.Is(err, natslease.ErrNoReceipt) {
		t.Fatalf("no receipt yet: %v", err)
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
	b, err := natslease.LastReceipt(ctx, st, "h0")
	if err != nil {
		t.Fatal(err)
	}
	if b.Revision != 52 || b.Seq != rec.Seq || b.State != fencing.LeaseWithdrawn || b.Host != "h0" {
		t.Fatalf("last receipt: %+v", b)
	}
	if err := ring.VerifyBeacon(b); err != nil {
		t.Fatalf("the receipt does not verify with h0's key: %v", err)
	}
	if _, err := natslease.LastReceipt(ctx, st, "h1"); !errors.Is(err, natslease.ErrNoReceipt) {
		t.Fatalf("h1 has no receipt: %v", err)
	}
	// Bad receipts on h1's subject (a user allowed to publish there).
	subj, _ := proto.WithdrawnSubject("h1")
	other, _ := natslease.ReceiptMsg(signers["h0"], rec, 60, time.Now()) // h0's, on h1's subject
	active, _ := natslease.BeaconMsg(signers["h1"], fencing.LeaseRecord{Host: "h1", State: fencing.LeaseActive}, 61, 0, time.Now())
	for name, data := range map[string][]byte{"another host's": other.Data, "an active beacon": active.Data, "garbage": []byte("not a beacon")} {
		if _, err := js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
		_, err := natslease.LastReceipt(ctx, st, "h1")
		var re natslease.ReceiptReadError
		if err == nil || errors.Is(err, natslease.ErrNoReceipt) || errors.As(err, &re) {
			t.Fatalf("%s receipt on h1's subject: %v (want a decoding error, not a read error)", name, err)
		}
	}
	// The stream gone: a read error (the declaration waits).
	if err := js.DeleteStream(ctx, proto.WithdrawalStream); err != nil {
		t.Fatal(err)
	}
	var re natslease.ReceiptReadError
	if _, err := natslease.LastReceipt(ctx, st, "h0"); !errors.As(err, &re) {
		t.Fatalf("missing stream: %v (want a read error)", err)
	}
}
