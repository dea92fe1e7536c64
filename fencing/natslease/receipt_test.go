package natslease_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestWithdrawalReceipts: the receipts a host stored with a publish ack
// are what ReadReceipts reads back, oldest first (verified by the host's
// key); another host has none; a receipt of an active record is refused
// at the source; messages on a host's subject naming another host, a
// state other than withdrawn, or garbage are read with their error (not
// evidence; the caller decides); a flood on fresh subjects is not stored
// (the stream names its hosts' subjects), one on a host's subject keeps
// its last 4 and touches no other host's; the stream vouches for its
// hosts' receipts (ReceiptsUnsound nil) and not for another host's; a
// missing stream is a read error. EnsureWithdrawalStream creates the
// stream once and opens it after; it forbids direct gets, purges and
// deletes.
func TestWithdrawalReceipts(t *testing.T) {
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	signers, ring := fleetKeys(t, "h0", "h1")
	st, err := natslease.EnsureWithdrawalStream(ctx, js, "h0", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.AllowDirect || !c.DenyPurge || !c.DenyDelete || c.MaxMsgsPerSubject != proto.WithdrawalReceiptsKept || c.MaxBytes > 0 || c.MaxMsgs > 0 ||
		!slices.Equal(c.Subjects, []string{"hvguard.v1.h0.withdrawn", "hvguard.v1.h1.withdrawn"}) {
		t.Fatalf("receipts stream settings: direct %t, deny purge %t, deny delete %t, per subject %d, max bytes %d, max msgs %d, subjects %q", c.AllowDirect, c.DenyPurge, c.DenyDelete, c.MaxMsgsPerSubject, c.MaxBytes, c.MaxMsgs, c.Subjects)
	}
	if _, err := natslease.EnsureWithdrawalStream(ctx, js); err != nil {
		t.Fatalf("opening the existing stream: %v", err)
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h0"); err != nil || len(rr.Msgs) != 0 || rr.Unsound != nil {
		t.Fatalf("no receipt yet: %+v, %v", rr, err)
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
	rr, err := natslease.ReadReceipts(ctx, st, "h0")
	if err != nil || len(rr.Msgs) != 2 {
		t.Fatalf("h0's receipts: %+v, %v", rr, err)
	}
	b := rr.Msgs[1].Beacon
	if rr.Msgs[0].Beacon.Revision != 40 || b.Revision != 52 || b.Seq != rec.Seq || b.State != fencing.LeaseWithdrawn || b.Host != "h0" || rr.Msgs[1].Err != nil {
		t.Fatalf("h0's receipts: %+v", rr.Msgs)
	}
	if err := ring.VerifyBeacon(b); err != nil {
		t.Fatalf("the receipt does not verify with h0's key: %v", err)
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h1"); err != nil || len(rr.Msgs) != 0 {
		t.Fatalf("h1 has no receipt: %+v, %v", rr, err)
	}
	// Bad receipts on h1's subject (a reflected answer, or a user allowed
	// to publish there).
	subj, _ := proto.WithdrawnSubject("h1")
	other, _ := natslease.ReceiptMsg(signers["h0"], rec, 60, time.Now()) // h0's, on h1's subject
	active, _ := natslease.BeaconMsg(signers["h1"], fencing.LeaseRecord{Host: "h1", State: fencing.LeaseActive}, 61, 0, time.Now())
	for _, data := range [][]byte{other.Data, active.Data, []byte("not a beacon")} {
		if _, err := js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
	}
	rr, err = natslease.ReadReceipts(ctx, st, "h1")
	if err != nil || len(rr.Msgs) != 3 {
		t.Fatalf("h1's subject: %+v, %v", rr, err)
	}
	for i, m := range rr.Msgs {
		if m.Err == nil {
			t.Fatalf("message %d on h1's subject taken for h1's receipt: %+v", i, m)
		}
	}
	// A flood on fresh subjects: nothing stored. On h1's subject, at the
	// largest size a message may have: h1's last 4 kept, h0's untouched,
	// and a receipt after is stored.
	before, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 { // core publishes, as reflected answers are
		s, _ := proto.WithdrawnSubject(fmt.Sprintf("x%d", i))
		if err := nc.Publish(s, []byte("junk")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	after, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Msgs != before.State.Msgs {
		t.Fatalf("the flood on fresh subjects changed the stream: %d messages, then %d", before.State.Msgs, after.State.Msgs)
	}
	for range 20 {
		if _, err := js.Publish(ctx, subj, make([]byte, natslease.ReceiptMaxBytes)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, subj, make([]byte, natslease.ReceiptMaxBytes+1)); err == nil {
		t.Fatal("a message over ReceiptMaxBytes was stored")
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h1"); err != nil || len(rr.Msgs) != proto.WithdrawalReceiptsKept || rr.Unsound != nil {
		t.Fatalf("h1's subject after the flood: %d messages (want %d), unsound %v, err %v", len(rr.Msgs), proto.WithdrawalReceiptsKept, rr.Unsound, err)
	}
	rec.Seq++
	m, err := natslease.ReceiptMsg(signers["h0"], rec, 70, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(proto.WithdrawalStream)); err != nil {
		t.Fatalf("a receipt after the flood: %v", err)
	}
	if rr, err = natslease.ReadReceipts(ctx, st, "h0"); err != nil || len(rr.Msgs) != 3 || rr.Unsound != nil {
		t.Fatalf("h0's receipts after the flood: %d (%v), unsound %v", len(rr.Msgs), err, rr.Unsound)
	}
	if rr, err = natslease.ReadReceipts(ctx, st, "h2"); err != nil || rr.Unsound == nil {
		t.Fatalf("the stream vouches for h2, which it does not capture: %v", err)
	}
	// The stream gone: a read error (the declaration waits).
	if err := js.DeleteStream(ctx, proto.WithdrawalStream); err != nil {
		t.Fatal(err)
	}
	var re natslease.ReceiptReadError
	if _, err := natslease.ReadReceipts(ctx, st, "h0"); !errors.As(err, &re) {
		t.Fatalf("missing stream: %v (want a read error)", err)
	}
}

// TestReceiptsUnsound: the shipped configuration vouches for its hosts'
// receipts; every setting that lets the stream refuse or drop a receipt
// makes it not vouch, naming the setting; so does a host it does not
// name.
func TestReceiptsUnsound(t *testing.T) {
	shipped, err := natslease.WithdrawalStreamConfig(3, []string{"h1.example.org", "h0.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	if err := natslease.ReceiptsUnsound(shipped, "h0.example.org"); err != nil {
		t.Fatalf("the shipped configuration does not vouch: %v", err)
	}
	if _, err := natslease.WithdrawalStreamConfig(1, nil); err == nil {
		t.Fatal("a stream of no host was made")
	}
	if _, err := natslease.WithdrawalStreamConfig(1, []string{"bad host"}); err == nil {
		t.Fatal("a stream of an invalid host name was made")
	}
	for _, c := range []struct {
		name, want string
		host       string
		mod        func(*jetstream.StreamConfig)
	}{
		{name: "wildcard", want: "wildcard", mod: func(c *jetstream.StreamConfig) { c.Subjects = append(c.Subjects, proto.WithdrawnWildcard) }},
		{name: "full wildcard", want: "wildcard", mod: func(c *jetstream.StreamConfig) { c.Subjects = append(c.Subjects, "hvguard.>") }},
		{name: "host not named", want: "does not capture", host: "h2.example.org"},
		{name: "no per-subject limit", want: "max_msgs_per_subject", mod: func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = -1 }},
		{name: "no size limit", want: "max_msg_size", mod: func(c *jetstream.StreamConfig) { c.MaxMsgSize = 0 }},
		{name: "max bytes", want: "stream-wide limit", mod: func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 40 }},
		{name: "max msgs", want: "stream-wide limit", mod: func(c *jetstream.StreamConfig) { c.MaxMsgs = 1 << 40 }},
		{name: "interest retention", want: "retention", mod: func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }},
		{name: "max age", want: "expire", mod: func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }},
		{name: "ttl", want: "expire", mod: func(c *jetstream.StreamConfig) { c.AllowMsgTTL = true }},
		{name: "sources", want: "did not capture", mod: func(c *jetstream.StreamConfig) {
			c.Sources = []*jetstream.StreamSource{{Name: "other"}}
		}},
		{name: "transform", want: "did not capture", mod: func(c *jetstream.StreamConfig) {
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: ">", Destination: "x.>"}
		}},
		{name: "sealed", want: "refuses", mod: func(c *jetstream.StreamConfig) { c.Sealed = true }},
		{name: "discard new per subject", want: "refuses", mod: func(c *jetstream.StreamConfig) { c.DiscardNewPerSubject = true }},
		{name: "rollups", want: "removed", mod: func(c *jetstream.StreamConfig) { c.AllowRollup = true }},
		{name: "purges", want: "removed", mod: func(c *jetstream.StreamConfig) { c.DenyPurge = false }},
		{name: "deletes", want: "removed", mod: func(c *jetstream.StreamConfig) { c.DenyDelete = false }},
		{name: "direct gets", want: "direct gets", mod: func(c *jetstream.StreamConfig) { c.AllowDirect = true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := shipped
			cfg.Subjects = slices.Clone(shipped.Subjects)
			if c.mod != nil {
				c.mod(&cfg)
			}
			host := "h0.example.org"
			if c.host != "" {
				host = c.host
			}
			err := natslease.ReceiptsUnsound(cfg, host)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), host) {
				t.Fatalf("ReceiptsUnsound = %v, want an error naming %q and the host", err, c.want)
			}
		})
	}
}

// TestEnsureWithdrawalStreamAddsHosts: an agent that may change the
// stream (make run) adds its subject to it and nothing else changes;
// a stream capturing a wildcard (an older release's) is left as it is
// and does not vouch.
func TestEnsureWithdrawalStreamAddsHosts(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	if _, err := natslease.EnsureWithdrawalStream(ctx, js); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("no stream, no host: %v (want not found: nothing to create it for)", err)
	}
	if _, err := natslease.EnsureWithdrawalStream(ctx, js, "h0"); err != nil {
		t.Fatal(err)
	}
	st, err := natslease.EnsureWithdrawalStream(ctx, js, "h1", "h0")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := natslease.WithdrawalStreamConfig(1, []string{"h0", "h1"})
	if c := info.Config; !slices.Equal(c.Subjects, want.Subjects) || c.MaxBytes > 0 || c.MaxMsgsPerSubject != want.MaxMsgsPerSubject {
		t.Fatalf("after h1 was added: subjects %q, max bytes %d, per subject %d", c.Subjects, c.MaxBytes, c.MaxMsgsPerSubject)
	}
	for _, h := range []string{"h0", "h1"} {
		if err := natslease.ReceiptsUnsound(info.Config, h); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
	}
	// An older release's stream: a wildcard, a stream-wide limit.
	if err := js.DeleteStream(ctx, proto.WithdrawalStream); err != nil {
		t.Fatal(err)
	}
	old := want
	old.Subjects, old.MaxBytes, old.DenyDelete = []string{proto.WithdrawnWildcard}, 256<<20, false
	// (the deleted stream's store may still be going: retried)
	for try := 0; ; try++ {
		_, err := js.CreateStream(ctx, old)
		if err == nil {
			break
		}
		if try == 20 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, err = natslease.EnsureWithdrawalStream(ctx, js, "h2"); err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; !slices.Equal(c.Subjects, old.Subjects) {
		t.Fatalf("an older release's stream changed: %q", c.Subjects)
	}
	if rr, err := natslease.ReadReceipts(ctx, st, "h2"); err != nil || rr.Unsound == nil || !strings.Contains(rr.Unsound.Error(), "wildcard") {
		t.Fatalf("an older release's stream vouches for h2: %v (%v)", rr.Unsound, err)
	}
}
