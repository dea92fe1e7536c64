package natslease_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX60ReceiptsUnsoundMisses (reviewer X60): settings under which the
// stream refuses or loses a receipt, yet ReceiptsUnsound vouches.
//   - allow_msg_counter: a counter stream refuses every message without
//     Nats-Incr — every receipt (checked on a real server);
//   - storage memory / persist_mode async: receipts lost at a server
//     restart or crash ("kept until replaced" does not hold).
func TestX60ReceiptsUnsoundMisses(t *testing.T) {
	base, err := natslease.WithdrawalStreamConfig(1, "h0")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mod  func(*jetstream.StreamConfig)
	}{
		{"allow_msg_counter", func(c *jetstream.StreamConfig) { c.AllowMsgCounter = true }},
		{"memory storage", func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }},
		{"persist async", func(c *jetstream.StreamConfig) { c.PersistMode = jetstream.AsyncPersistMode }},
	} {
		cfg := base
		c.mod(&cfg)
		if err := natslease.ReceiptsUnsound(cfg, "h0"); err == nil {
			t.Errorf("%s: ReceiptsUnsound vouches", c.name)
		}
	}
	// The counter stream on a real server: the receipt refused.
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	cfg := base
	cfg.AllowMsgCounter = true
	cfg.Discard = jetstream.DiscardOld // a counter stream refuses discard new; ReceiptsUnsound checks neither
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Logf("server refuses a counter receipts stream: %v", err)
		return
	}
	signers, _ := fleetKeys(t, "h0")
	rec := fencing.LeaseRecord{Host: "h0", State: fencing.LeaseWithdrawn, Epoch: 3, Incarnation: 2, Seq: 7, BootID: "b"}
	m, err := natslease.ReceiptMsg(signers["h0"], rec, 40, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, perr := js.PublishMsg(ctx, m)
	rr, err := natslease.ReadHostReceipts(ctx, js, "h0")
	t.Logf("counter stream: receipt publish %v; read %d msgs, unsound %v (%v)", perr, len(rr.Msgs), rr.Unsound, err)
	if perr != nil && rr.Unsound == nil {
		t.Errorf("a counter receipts stream refused the receipt (%v) and vouches", perr)
	}
}
