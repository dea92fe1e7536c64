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
// (a host's stream captures its subject only), one on a host's subject
// keeps its last 4 and touches no other host's stream; a host's stream
// vouches for its receipts (ReceiptsUnsound nil) and not for another
// host's; a missing stream is a read error. EnsureWithdrawalStream
// creates a host's stream once and opens it after; it forbids direct
// gets, purges and deletes.
func TestWithdrawalReceipts(t *testing.T) {
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	signers, ring := fleetKeys(t, "h0", "h1")
	st, err := natslease.EnsureWithdrawalStream(ctx, js, "h0")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.Name != "hvguard-withdrawals-h0" || c.AllowDirect || !c.DenyPurge || !c.DenyDelete || c.MaxMsgsPerSubject != proto.WithdrawalReceiptsKept || c.MaxBytes > 0 || c.MaxMsgs > 0 ||
		!slices.Equal(c.Subjects, []string{"hvguard.v1.h0.withdrawn"}) {
		t.Fatalf("receipts stream settings: name %s, direct %t, deny purge %t, deny delete %t, per subject %d, max bytes %d, max msgs %d, subjects %q", c.Name, c.AllowDirect, c.DenyPurge, c.DenyDelete, c.MaxMsgsPerSubject, c.MaxBytes, c.MaxMsgs, c.Subjects)
	}
	if again, err := natslease.EnsureWithdrawalStream(ctx, js, "h0"); err != nil || again.CachedInfo().Created != st.CachedInfo().Created {
		t.Fatalf("opening the existing stream: %v", err)
	}
	st1, err := natslease.EnsureWithdrawalStream(ctx, js, "h1")
	if err != nil {
		t.Fatal(err)
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
		if ack, err := js.PublishMsg(ctx, m); err != nil || ack.Stream != "hvguard-withdrawals-h0" {
			t.Fatalf("receipt stored in %v: %v", ack, err)
		}
	}
	rr, err := natslease.ReadHostReceipts(ctx, js, "h0")
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
	if rr, err := natslease.ReadHostReceipts(ctx, js, "h1"); err != nil || len(rr.Msgs) != 0 || rr.Unsound != nil {
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
	rr, err = natslease.ReadReceipts(ctx, st1, "h1")
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
	if rr, err := natslease.ReadReceipts(ctx, st1, "h1"); err != nil || len(rr.Msgs) != proto.WithdrawalReceiptsKept || rr.Unsound != nil {
		t.Fatalf("h1's subject after the flood: %d messages (want %d), unsound %v, err %v", len(rr.Msgs), proto.WithdrawalReceiptsKept, rr.Unsound, err)
	}
	rec.Seq++
	m, err := natslease.ReceiptMsg(signers["h0"], rec, 70, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("a receipt after the flood: %v", err)
	}
	if rr, err = natslease.ReadReceipts(ctx, st, "h0"); err != nil || len(rr.Msgs) != 3 || rr.Unsound != nil {
		t.Fatalf("h0's receipts after the flood: %d (%v), unsound %v", len(rr.Msgs), err, rr.Unsound)
	}
	if rr, err = natslease.ReadReceipts(ctx, st, "h1"); err != nil || rr.Unsound == nil {
		t.Fatalf("h0's stream vouches for h1: %v", err)
	}
	if rr, err = natslease.ReadHostReceipts(ctx, js, "h2"); err != nil || rr.Unsound == nil || !strings.Contains(rr.Unsound.Error(), "no withdrawal receipts stream") || len(rr.Msgs) != 0 {
		t.Fatalf("h2, without a stream: %+v, %v (want unsound: none)", rr, err)
	}
	// The stream gone under a reader: a read error (the declaration waits).
	if err := js.DeleteStream(ctx, "hvguard-withdrawals-h0"); err != nil {
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
// name, and a stream that is not the host's own (shared with other
// hosts, or named otherwise: reviewer X60).
func TestReceiptsUnsound(t *testing.T) {
	shipped, err := natslease.WithdrawalStreamConfig(3, "h0.example.org")
	if err != nil {
		t.Fatal(err)
	}
	if err := natslease.ReceiptsUnsound(shipped, "h0.example.org"); err != nil {
		t.Fatalf("the shipped configuration does not vouch: %v", err)
	}
	if shipped.Name != "hvguard-withdrawals-h0_example_org" || !slices.Equal(shipped.Subjects, []string{"hvguard.v1.h0_example_org.withdrawn"}) || shipped.Replicas != 3 {
		t.Fatalf("shipped: %s %q R%d", shipped.Name, shipped.Subjects, shipped.Replicas)
	}
	if _, err := natslease.WithdrawalStreamConfig(1, "bad host"); err == nil {
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
		{name: "shared (X60)", want: "not the host's own", mod: func(c *jetstream.StreamConfig) {
			c.Name = proto.WithdrawalStream
			c.Subjects = append(c.Subjects, "hvguard.v1.h1_example_org.withdrawn")
		}},
		{name: "another subject", want: "not the host's own", mod: func(c *jetstream.StreamConfig) {
			c.Subjects = append(c.Subjects, "hvguard.v1.h1_example_org.withdrawn")
		}},
		{name: "named otherwise", want: "not the host's own", mod: func(c *jetstream.StreamConfig) { c.Name = "receipts-h0" }},
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

// TestOpenReceiptsSharedStream: a host whose subject the older shared
// stream still captures (a cluster not yet moved to per-host streams)
// has its receipts read there — one stored there is found — but the
// stream vouches for none (not the host's own: X60; a wildcard: X58);
// EnsureWithdrawalStream cannot create the host's own stream while the
// shared one captures its subject (overlap), and can once it does not;
// a shared stream that does not capture the host is no stream for it.
func TestOpenReceiptsSharedStream(t *testing.T) {
	_, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	deliverytest.PinStreamsDir(ctx, t, js)
	signers, _ := fleetKeys(t, "h0", "h1")
	for _, c := range []struct {
		name, want string
		subjects   []string
	}{
		{"named subjects (X60)", "not the host's own", []string{"hvguard.v1.h0.withdrawn", "hvguard.v1.h1.withdrawn"}},
		{"wildcard (X58)", "wildcard", []string{proto.WithdrawnWildcard}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _ := natslease.WithdrawalStreamConfig(1, "h0")
			cfg.Name, cfg.Subjects = proto.WithdrawalStream, c.subjects
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := js.DeleteStream(ctx, proto.WithdrawalStream); err != nil {
					t.Fatal(err)
				}
			}()
			rec := fencing.LeaseRecord{Host: "h1", State: fencing.LeaseWithdrawn, Epoch: 3, Incarnation: 2, Seq: 7, BootID: "b"}
			m, err := natslease.ReceiptMsg(signers["h1"], rec, 40, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if ack, err := js.PublishMsg(ctx, m); err != nil || ack.Stream != proto.WithdrawalStream {
				t.Fatalf("receipt stored in %v: %v", ack, err)
			}
			rr, err := natslease.ReadHostReceipts(ctx, js, "h1")
			if err != nil || len(rr.Msgs) != 1 || rr.Msgs[0].Beacon.Revision != 40 {
				t.Fatalf("h1's receipt in the shared stream not read: %+v, %v", rr, err)
			}
			if rr.Unsound == nil || !strings.Contains(rr.Unsound.Error(), c.want) {
				t.Fatalf("the shared stream vouches for h1: %v (want %q)", rr.Unsound, c.want)
			}
			if err := natslease.StreamOfReceiptsUnsound(ctx, js, "h1"); err == nil {
				t.Fatal("StreamOfReceiptsUnsound vouches for h1 in the shared stream")
			}
			if _, err := natslease.EnsureWithdrawalStream(ctx, js, "h1"); err == nil {
				t.Fatal("h1's own stream created while the shared stream captures its subject")
			}
			if len(c.subjects) == 2 {
				rr, err := natslease.ReadHostReceipts(ctx, js, "h2") // not captured there
				if err != nil || len(rr.Msgs) != 0 || rr.Unsound == nil || !strings.Contains(rr.Unsound.Error(), "no withdrawal receipts stream") {
					t.Fatalf("h2: %+v, %v", rr, err)
				}
			}
		})
	}
	// Moved: h1's own stream, which vouches.
	st, err := natslease.EnsureWithdrawalStream(ctx, js, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if err := natslease.StreamOfReceiptsUnsound(ctx, js, "h1"); err != nil || st.CachedInfo().Config.Name != "hvguard-withdrawals-h1" {
		t.Fatalf("h1's own stream %s does not vouch: %v", st.CachedInfo().Config.Name, err)
	}
	if err := natslease.StreamOfReceiptsUnsound(ctx, js, "h0"); err == nil || !strings.Contains(err.Error(), "no withdrawal receipts stream") {
		t.Fatalf("h0 without a stream: %v", err)
	}
}
