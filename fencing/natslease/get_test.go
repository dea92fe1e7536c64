package natslease_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// With NC set a Store reads keys with the stream API's message get, never
// a direct get (agents may make none: docs/security.md, "No direct
// gets"), and reads what KV.Get reads: a record at its revision, a missing
// or deleted key as jetstream.ErrKeyNotFound, the agents' guard copy.
// The stream still allows direct gets here (an old provisioning), so a
// KV.Get would make one; the test counts the direct-get requests the
// client sent (5 with NC unset).
func TestStoreReadsWithMessageGet(t *testing.T) {
	ctx := context.Background()
	nc, _, kv := oldBucket(t) // allows direct gets
	direct, consumers := 0, 0
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET.>", func(*nats.Msg) { direct++ })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	csub, err := nc.Subscribe("$JS.API.CONSUMER.>", func(*nats.Msg) { consumers++ })
	if err != nil {
		t.Fatal(err)
	}
	defer csub.Unsubscribe()
	st := &natslease.Store{KV: kv, NC: nc}
	const host = "h0.example.org"
	if _, _, err := st.Read(ctx, host); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("missing key: %v, want ErrKeyNotFound", err)
	}
	rec := fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: host, State: fencing.LeaseActive, Epoch: 1}
	rev, err := st.Write(ctx, host, 0, rec, natslease.ReadTimeout)
	if err != nil {
		t.Fatal(err)
	}
	got, grev, err := st.Read(ctx, host)
	if err != nil || got == nil || got.Epoch != 1 || grev != rev {
		t.Fatalf("read %+v at %d (%v), want epoch 1 at %d", got, grev, err, rev)
	}
	if err := kv.Delete(ctx, "h0_example_org"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Read(ctx, host); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("deleted key: %v, want ErrKeyNotFound", err)
	}
	if g, err := st.ReadGuard(ctx); err != nil || g.Version != 0 {
		t.Fatalf("no guard published: %+v %v", g, err)
	}
	if err := st.PublishGuard(ctx, fencing.Guard{Count: 3, Share: 0.5, Window: 1, Members: 4, Version: 7}); err != nil {
		t.Fatal(err)
	}
	if g, err := st.ReadGuard(ctx); err != nil || g.Version != 7 {
		t.Fatalf("guard read back: %+v %v", g, err)
	}
	// The membership from the stream info (natslease.Subjects): the
	// deleted h0 stays a member (its marker is a message), the guard's
	// key is none.
	const h1 = "h1.example.org"
	if _, err := st.Write(ctx, h1, 0, fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: h1, State: fencing.LeaseActive, Epoch: 1}, natslease.ReadTimeout); err != nil {
		t.Fatal(err)
	}
	if m, g, err := st.Members(ctx); err != nil || !slices.Equal(m, []string{host, h1}) || g.Version != 7 {
		t.Fatalf("members %v, guard %+v (%v); want [%s %s], version 7", m, g, err, host, h1)
	}
	// With signatures required, only enrolled hosts (made-up keys are
	// no peers).
	req := &natslease.Store{KV: kv, NC: nc, Keys: &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{h1: {{ID: "U1"}}}}}
	if m, _, err := req.Members(ctx); err != nil || !slices.Equal(m, []string{h1}) {
		t.Fatalf("members with signatures required: %v (%v), want [%s]", m, err, h1)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if direct != 0 || consumers != 0 {
		t.Fatalf("%d direct gets and %d consumer requests sent", direct, consumers)
	}
}
