package agent

import (
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
