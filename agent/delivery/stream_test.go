package delivery

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/proto"
)

// TestStreamOperatorChangesSurviveAgentStart (issue 10 item 8): an
// operator provisioned the stream with bigger limits and an extra subject;
// an agent with create_stream: true (the default) starts and publishes. The
// stream must be left exactly as the operator made it, the events stored.
func TestStreamOperatorChangesSurviveAgentStart(t *testing.T) {
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	op := StreamConfig(1)
	op.Subjects = append(op.Subjects, "ops.audit.>")
	op.MaxAge = 30 * 24 * time.Hour
	op.MaxBytes = 4 << 30
	op.Duplicates = 10 * time.Minute
	op.Description = "provisioned by the operator"
	st, err := js.CreateStream(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	before := st.CachedInfo().Config

	o := openTest(t, t.TempDir(), OutboxConfig{})
	t.Cleanup(func() { o.Close() })
	p := runPublisher(t, nc, o, PublisherConfig{CreateStream: true})
	appendN(t, o, 0, 5)
	flush(t, p)
	checkInOrder(t, deliverytest.Collect(t, nc, testHost, 5, testTimeout), 1, 5)

	st, err = js.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	after := st.CachedInfo().Config
	if !slices.Equal(after.Subjects, before.Subjects) || after.MaxAge != before.MaxAge ||
		after.MaxBytes != before.MaxBytes || after.Duplicates != before.Duplicates ||
		after.Description != before.Description {
		t.Fatalf("the agent's start changed the operator's stream:\nbefore %+v\nafter  %+v", before, after)
	}
	// The differences were reported (subjects, max_age, max_bytes,
	// duplicate_window), none of them a risk.
	if st := p.Stats(); st.StreamDrift != 4 || st.StreamDriftRisky != 0 {
		t.Fatalf("stats: drift %d (risky %d), want 4 (0)", st.StreamDrift, st.StreamDriftRisky)
	}
}

func TestStreamDrift(t *testing.T) {
	rec := StreamConfig(3)
	if d := streamDrift(rec); len(d) != 0 {
		t.Fatalf("recommended config: drift %+v", d)
	}
	tests := []struct {
		name    string
		change  func(*jetstream.StreamConfig)
		setting string
		risky   bool
	}{
		{"bigger max_age", func(c *jetstream.StreamConfig) { c.MaxAge *= 4 }, "max_age", false},
		{"unlimited max_age", func(c *jetstream.StreamConfig) { c.MaxAge = 0 }, "max_age", false},
		{"smaller max_age", func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }, "max_age", true},
		{"unlimited max_bytes", func(c *jetstream.StreamConfig) { c.MaxBytes = -1 }, "max_bytes", false},
		{"smaller max_bytes", func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 20 }, "max_bytes", true},
		{"longer dupe window", func(c *jetstream.StreamConfig) { c.Duplicates = time.Hour }, "duplicate_window", false},
		{"shorter dupe window", func(c *jetstream.StreamConfig) { c.Duplicates = time.Second }, "duplicate_window", true},
		{"memory storage", func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, "storage", true},
		{"work queue", func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }, "retention", true},
		{"discard new", func(c *jetstream.StreamConfig) { c.Discard = jetstream.DiscardNew }, "discard", true},
		{"per-subject limit", func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 100 }, "max_msgs_per_subject", true},
		{"max msgs", func(c *jetstream.StreamConfig) { c.MaxMsgs = 1000 }, "max_msgs", true},
		{"small max msg size", func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 }, "max_msg_size", true},
		{"extra subject", func(c *jetstream.StreamConfig) { c.Subjects = append(c.Subjects, "ops.>") }, "subjects", false},
		{"wider subject", func(c *jetstream.StreamConfig) { c.Subjects = []string{"hvguard.>"} }, "subjects", false},
		{"no reconcile", func(c *jetstream.StreamConfig) { c.Subjects = []string{proto.LifecycleWildcard} }, "subjects", true},
		// Attack (issue 10 item 8): settings that make an operator's stream
		// lose or hide events while every publish looks fine (or never
		// acks), reported by nothing before.
		{"subject transform", func(c *jetstream.StreamConfig) {
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: "hvguard.v1.*.lifecycle", Destination: "archive.{{wildcard(1)}}"}
		}, "subject_transform", true},
		{"no ack", func(c *jetstream.StreamConfig) { c.NoAck = true }, "no_ack", true},
		{"sealed", func(c *jetstream.StreamConfig) { c.Sealed = true }, "sealed", true},
		// Reviewer X17: purges and message deletes allowed (a PubAck an
		// agent aims at the purge API on a non-strict server).
		{"purge allowed", func(c *jetstream.StreamConfig) { c.DenyPurge = false }, "deny_purge,deny_delete", true},
		{"delete allowed", func(c *jetstream.StreamConfig) { c.DenyDelete = false }, "deny_purge,deny_delete", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := StreamConfig(3)
			tt.change(&c)
			d := streamDrift(c)
			if len(d) != 1 || d[0].Setting != tt.setting || (d[0].Risk != "") != tt.risky || (d[0].Fix != "") != tt.risky {
				t.Fatalf("drift %+v, want one %s risky=%v", d, tt.setting, tt.risky)
			}
		})
	}
}

// TestStreamConcurrentCreate: many agents start at once on a NATS without
// the stream, while an operator creates it with other limits: every
// EnsureStream succeeds, and the stream is one of the two configs, never
// rewritten afterwards.
func TestStreamConcurrentCreate(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	op := StreamConfig(1)
	op.MaxAge = 30 * 24 * time.Hour
	errs := make(chan error, 9)
	for i := 0; i < 8; i++ {
		go func() { _, err := EnsureStream(ctx, js, true); errs <- err }()
	}
	go func() { _, err := js.CreateStream(ctx, op); errs <- err }()
	for i := 0; i < 9; i++ {
		if err := <-errs; err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			t.Fatalf("concurrent start: %v", err)
		}
	}
	st, err := js.Stream(ctx, proto.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if a := st.CachedInfo().Config.MaxAge; a != op.MaxAge && a != StreamConfig(1).MaxAge {
		t.Fatalf("max_age %s", a)
	}
}
