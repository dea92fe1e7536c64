package natslease_test

import (
	"testing"
	"time"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing/natslease"
)

// TestLastRevisionAtServerClock: the stream info answers with the lease
// stream's last revision and the server's clock ("ts"), which the
// controller bounds its own clock's offset with (controller.Tracker.
// ServerTime). On a real nats-server: the clock read lies between two
// readings of this process's (the same machine's) clock, and the
// revision is the last put's.
func TestLastRevisionAtServerClock(t *testing.T) {
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "h0", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	got, ts, err := natslease.LastRevisionAt(ctx, nc)
	back := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if got != rev {
		t.Fatalf("last revision %d, want %d", got, rev)
	}
	if ts.Before(sent.Add(-time.Millisecond)) || ts.After(back.Add(time.Millisecond)) {
		t.Fatalf("the server's clock read %s, not between %s and %s", ts.Format(time.RFC3339Nano), sent.Format(time.RFC3339Nano), back.Format(time.RFC3339Nano))
	}
}
