package agent

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/proto"
)

// TestX57ReceiptHoldsLoopBeforeDisarm ((c), reviewer X57; a config the
// agent accepts). checkStop runs on the fencing loop — the loop that
// feeds the hardware watchdog — and at StopWithdrawn it now does
// flushBeacon (≤ 1 s) THEN publishReceipt (≤ receiptTimeout, 2 s) BEFORE
// the magic close (disarm). fence.watchdog_timeout is accepted down to
// 1 s (any positive whole seconds). When the receipt's ack does not come
// (the stream not provisioned yet while anything — a reader on
// hvguard.v1.> with the shipped Reader permissions — subscribes to the
// subject, so no "no responders"; or a NATS stall just after the
// withdrawal landed), the loop is held 2 s without a feed: a watchdog of
// ≤ 2 s resets the host after its orderly withdrawal — its guests killed,
// and, withdrawn, never declared nor evacuated. Measured here: how long
// publishReceipt holds the loop with the stream missing and a reader
// subscribed. Fails today (2 s ≥ the smallest accepted watchdog_timeout,
// 1 s). Fix: disarm (magic close) before publishing the receipt — the
// withdrawal already landed —, or publish it off the loop; and/or
// refuse watchdog_timeout below flush + receipt + a loop period.
// Closed: the publish runs off the loop (publishReceipt), and the stop
// waits for it after the loop's outcome (waitReceipt).
func TestX57ReceiptHoldsLoopBeforeDisarm(t *testing.T) {
	const host = "h0.example.org"
	nc, _, _ := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	// A reader (dashboard) subscribed to every hvguard subject.
	sub, err := nc.SubscribeSync(proto.SubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = nc.Flush()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fencer{nc: nc, host: host, beacons: make(chan pendingBeacon, 1), log: log}
	f.beacon(fencing.LeaseRecord{Host: host, State: fencing.LeaseWithdrawn, Seq: 2}, 33)
	start := time.Now()
	f.publishReceipt()
	held := time.Since(start)
	f.waitReceipt()                 // the publish ends off the loop (its ack never comes here)
	const minWatchdog = time.Second // the smallest fence.watchdog_timeout the agent accepts
	if held >= minWatchdog {
		t.Fatalf("publishReceipt held the fencing loop %s before the watchdog's magic close (checkStop: flush ≤ %s, then the receipt, then disarm): with the flush, up to %s unfed: a watchdog_timeout of %s or less (accepted down to %s) resets the host after its orderly withdrawal",
			held.Round(10*time.Millisecond), withdrawalBeaconFlush, (held + withdrawalBeaconFlush).Round(100*time.Millisecond), (held + withdrawalBeaconFlush).Truncate(time.Second), minWatchdog)
	}
}
