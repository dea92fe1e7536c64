package natslease_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestEnsureBucketKeepsOperatorConfig (issue 10 item 8, the lease bucket's
// side): an operator provisioned the lease bucket with their own settings;
// the agent's EnsureBucket with create (fence.create_bucket: true, the
// default) opens it and changes nothing. Only a missing bucket is created.
func TestEnsureBucketKeepsOperatorConfig(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	deliverytest.PinStreamsDir(ctx, t, js)
	op := natslease.BucketConfig(1)
	op.History = 5
	op.MaxBytes = 64 << 20
	op.Description = "provisioned by the operator"
	if _, err := js.CreateKeyValue(ctx, op); err != nil {
		t.Fatal(err)
	}
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	if st.History() != 5 || info.MaxBytes != 64<<20 || info.Description != op.Description {
		t.Fatalf("EnsureBucket changed the operator's bucket: history %d, max bytes %d, description %q",
			st.History(), info.MaxBytes, info.Description)
	}

	// Missing: created with BucketConfig(1).
	if err := js.DeleteKeyValue(ctx, fencing.Bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := natslease.EnsureBucket(ctx, js, false); err == nil {
		t.Fatal("EnsureBucket(missing, create=false) succeeded")
	}
	kv, err = natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	if st, err = kv.Status(ctx); err != nil || st.History() != 1 {
		t.Fatalf("created bucket: %v, %v", st, err)
	}
}
