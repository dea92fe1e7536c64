package natslease_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing/natslease"
)

// TestLeaseBucketForbidsRollups: a bucket created by CreateBucket (what
// EnsureBucket creates) forbids rollups and direct gets; one provisioned
// the old way (`nats kv add` alone: KV streams allow both) is reported by
// WarnStream at ERROR with StreamWarning, and HardenStream (what `nats
// stream edit --no-allow-rollup --no-allow-direct` does) closes it while
// KV reads (the stream API's message get), writes and deletes keep
// working.
func TestLeaseBucketForbidsRollups(t *testing.T) {
	ctx := context.Background()
	_, js, kv := oldBucket(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var err error
	if !natslease.WarnStream(ctx, js, log) || !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "--no-allow-rollup --no-allow-direct --deny-purge --deny-delete") {
		t.Fatalf("a bucket allowing rollups not reported: %q", buf.String())
	}
	if err := natslease.HardenStream(ctx, js, natslease.StreamName); err != nil {
		t.Fatal(err)
	}
	// A handle bound now reads without direct gets.
	if kv, err = js.KeyValue(ctx, "hvguard-leases"); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if natslease.WarnStream(ctx, js, log) || buf.Len() != 0 {
		t.Fatalf("after HardenStream still reported: %q", buf.String())
	}
	if _, err := kv.Put(ctx, "h0", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "h0"); err != nil || string(e.Value()) != "x" {
		t.Fatalf("get without direct gets: %v %v", e, err)
	}
	if err := kv.Delete(ctx, "h0"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "h0"); err == nil || !strings.Contains(err.Error(), "10111") {
		t.Fatalf("purge (a rollup) after HardenStream: %v, want refused (10111)", err)
	}

	deliverytest.PinStreamsDir(ctx, t, js)
	if err := js.DeleteKeyValue(ctx, "hvguard-leases"); err != nil {
		t.Fatal(err)
	}
	if _, err := natslease.EnsureBucket(ctx, js, true); err != nil {
		t.Fatal(err)
	}
	if why, err := natslease.StreamInsecure(ctx, js); err != nil || why != "" {
		t.Fatalf("bucket created by EnsureBucket: %q (%v)", why, err)
	}
	// Purges and message deletes are refused (a PubAck aimed at them by
	// an agent on a non-strict server: reviewer X17).
	st, err := js.Stream(ctx, natslease.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err == nil {
		t.Error("the lease stream purged after EnsureBucket")
	}
	if _, err := kv.Put(ctx, "h1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, 1); err == nil {
		t.Error("a lease stream message deleted after EnsureBucket")
	}
}

// oldBucket starts an embedded JetStream and creates the lease bucket the
// old way (`nats kv add` alone: rollups and direct gets allowed).
func oldBucket(t *testing.T) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, err := nats.Connect(deliverytest.StartJetStream(t, t.TempDir(), -1).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(context.Background(), natslease.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, kv
}

// TestStrictAPIProbe: StrictAPI tells nats-server's default (strict: an
// unknown field refused) from jetstream { strict: false }, where a PubAck
// an agent aims at $JS.API.STREAM.PURGE decodes as a purge (reviewer
// X17); WarnStream reports the latter even on a hardened bucket.
func TestStrictAPIProbe(t *testing.T) {
	ctx := context.Background()
	for _, nonStrict := range []bool{false, true} {
		s := deliverytest.StartWith(t, &server.Options{Port: -1, JetStream: true, StoreDir: t.TempDir(), NoJetStreamStrict: nonStrict})
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		if _, err := natslease.EnsureBucket(ctx, js, true); err != nil {
			t.Fatal(err)
		}
		strict, err := natslease.StrictAPI(ctx, nc)
		if err != nil || strict == nonStrict {
			t.Fatalf("non-strict server %t: StrictAPI %t (%v)", nonStrict, strict, err)
		}
		var buf bytes.Buffer
		if got := natslease.WarnStream(ctx, js, slog.New(slog.NewTextHandler(&buf, nil))); got != nonStrict || nonStrict && !strings.Contains(buf.String(), "strict: false") {
			t.Fatalf("non-strict server %t: WarnStream %t: %q", nonStrict, got, buf.String())
		}
	}
}
