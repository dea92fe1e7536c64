package natslease_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing/natslease"
)

// TestLeaseBucketForbidsRollups: a bucket created by CreateBucket (what
// EnsureBucket creates) forbids rollups; one provisioned the old way
// (`nats kv add` alone: KV streams allow rollups) is reported by
// WarnRollup at ERROR with RollupWarning, and DisallowRollup (what
// `nats stream edit --no-allow-rollup` does) closes it while KV writes
// and deletes keep working.
func TestLeaseBucketForbidsRollups(t *testing.T) {
	ctx := context.Background()
	nc, err := nats.Connect(deliverytest.StartJetStream(t, t.TempDir(), -1).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))

	kv, err := js.CreateKeyValue(ctx, natslease.BucketConfig(1)) // the old provisioning
	if err != nil {
		t.Fatal(err)
	}
	if !natslease.WarnRollup(ctx, js, log) || !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "--no-allow-rollup") {
		t.Fatalf("a bucket allowing rollups not reported: %q", buf.String())
	}
	if err := natslease.DisallowRollup(ctx, js); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if natslease.WarnRollup(ctx, js, log) || buf.Len() != 0 {
		t.Fatalf("after DisallowRollup still reported: %q", buf.String())
	}
	if _, err := kv.Put(ctx, "h0", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "h0"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "h0"); err == nil || !strings.Contains(err.Error(), "10111") {
		t.Fatalf("purge (a rollup) after DisallowRollup: %v, want refused (10111)", err)
	}

	if err := js.DeleteKeyValue(ctx, "hvguard-leases"); err != nil {
		t.Fatal(err)
	}
	if _, err := natslease.EnsureBucket(ctx, js, true); err != nil {
		t.Fatal(err)
	}
	if allowed, err := natslease.RollupAllowed(ctx, js); err != nil || allowed {
		t.Fatalf("bucket created by EnsureBucket: rollups allowed %v (%v)", allowed, err)
	}
}
