package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/proto"
)

// TestPublishBeaconChain: each beacon names the one published before it
// (fencing.Beacon.Prev); a beacon not after the last one — overtaken by
// the withdrawal's, or after a lease stream rolled back and revisions are
// handed out again — is still published, starting a new chain (Prev 0).
// Before, it was dropped: after a rollback every beacon, the withdrawal's
// among them, until the stream passed the old revision (reviewer X31).
func TestPublishBeaconChain(t *testing.T) {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const host = "h0.example.org"
	subj, _ := proto.BeaconSubject(host)
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	f := &fencer{nc: nc, host: host}
	rec := fencing.LeaseRecord{Host: host}
	for _, rev := range []uint64{10, 12, 5, 7} { // 5: the stream rolled back
		if err := f.publishBeacon(pendingBeacon{rec: rec, rev: rev, at: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	want := [][2]uint64{{10, 0}, {12, 10}, {5, 0}, {7, 5}}
	for _, w := range want {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("beacon of revision %d not published: %v", w[0], err)
		}
		b, err := fencing.DecodeBeacon(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if b.Revision != w[0] || b.Prev != w[1] {
			t.Fatalf("beacon revision %d prev %d, want %d prev %d", b.Revision, b.Prev, w[0], w[1])
		}
	}
}

// TestPublisherStoppingKeepsBeacon: the publisher goroutine that takes a
// beacon off the queue as its context ends (the agent stopping) puts it
// back for flushBeacon — the orderly stop's withdrawal beacon may be that
// one (reviewer X31). Before, it was dropped whenever the select took the
// beacon rather than the context's end: about half the runs here.
func TestPublisherStoppingKeepsBeacon(t *testing.T) {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const host = "h0.example.org"
	subj, _ := proto.BeaconSubject(host)
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	f := &fencer{nc: nc, host: host, beacons: make(chan pendingBeacon, 1), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 40 {
		rev := uint64(100 + i)
		f.beacons <- pendingBeacon{rec: fencing.LeaseRecord{Host: host, State: fencing.LeaseWithdrawn}, rev: rev, at: time.Now()}
		f.wg.Add(1)
		f.publishEvents(ctx) // returns at once: its context is done
		f.flushBeacon()
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("run %d: the withdrawal beacon (revision %d) was not published: %v", i, rev, err)
		}
		if b, err := fencing.DecodeBeacon(m.Data); err != nil || b.Revision != rev {
			t.Fatalf("run %d: got %+v (%v), want revision %d", i, b, err, rev)
		}
	}
}
