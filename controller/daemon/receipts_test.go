package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestCheckReceiptStreams: at start the controller creates each enrolled
// host's own receipts stream where its user may (make run) and says
// every host has one; a host whose subject the older shared stream
// captures (its own stream cannot be created: NATS refuses overlapping
// subjects) is named at ERROR, and the others still get theirs.
func TestCheckReceiptStreams(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	checkReceiptStreams(ctx, js, log, []string{"h0", "h1"})
	if !strings.Contains(buf.String(), "every enrolled host has its own stream") {
		t.Fatalf("log: %s", buf.String())
	}
	for _, h := range []string{"h0", "h1"} {
		if err := natslease.StreamOfReceiptsUnsound(ctx, js, h); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
	}
	// h2 still in the shared stream; h3 new.
	cfg, _ := natslease.WithdrawalStreamConfig(1, "h2")
	cfg.Name = proto.WithdrawalStream
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	checkReceiptStreams(ctx, js, log, []string{"h2", "h3"})
	out := buf.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "hosts=[h2]") || !strings.Contains(out, "not the host's own stream") {
		t.Fatalf("h2 in the shared stream not named at ERROR: %s", out)
	}
	if err := natslease.StreamOfReceiptsUnsound(ctx, js, "h3"); err != nil {
		t.Fatalf("h3 after h2's stream could not be created: %v", err)
	}
}
