package agent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestPublishBeaconChain: each beacon names the one published before it
// (fencing.Beacon.Prev); a beacon not after the last one — overtaken by
// the withdrawal's, or after a lease stream rolled back and revisions are
// handed out again — is still published, starting a new chain (Prev 0).
// Before, it was dropped: after a rollback every beacon, the withdrawal's
// among them, until the stream passed the old revision (reviewer X31).
func TestPublishBeaconChain(t *testing.T) {
	const host = "h0.example.org"
	nc, sub := beaconSub(t, host)
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
	const host = "h0.example.org"
	nc, sub := beaconSub(t, host)
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

// TestRelayedLandingBeacon: a renewal of ours a peer relayed
// (fencing.Ready.Relayed) gets its beacon, chained after the last one
// published, as a renewal written ourselves does — a relay writes none,
// and the controller takes beacons as this host's signs of life
// (controller/beaconloss.go). A relay landing below the last beacon
// published (late) gets none: its beacon would restart the chain.
func TestRelayedLandingBeacon(t *testing.T) {
	const host = "h0.example.org"
	nc, sub := beaconSub(t, host)
	f := &fencer{nc: nc, host: host, beacons: make(chan pendingBeacon, 1), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rec := fencing.LeaseRecord{Host: host}
	if err := f.publishBeacon(pendingBeacon{rec: rec, rev: 10, at: time.Now()}); err != nil { // a renewal of our own
		t.Fatal(err)
	}
	ctx := context.Background()
	f.perform(ctx, fencing.Ready{Relayed: &fencing.RelayedLanding{Seq: 7, Revision: 14, Record: rec}})
	f.perform(ctx, fencing.Ready{Relayed: &fencing.RelayedLanding{Seq: 6, Revision: 9, Record: rec}}) // late: below 10
	for want := [2]uint64{10, 0}; ; want = [2]uint64{14, 10} {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("beacon of revision %d not published: %v", want[0], err)
		}
		if b, err := fencing.DecodeBeacon(m.Data); err != nil || b.Revision != want[0] || b.Prev != want[1] {
			t.Fatalf("got %+v (%v), want revision %d prev %d", b, err, want[0], want[1])
		}
		if want[0] == 14 {
			break
		}
		select {
		case m := <-f.beacons: // the publisher's part
			if err := f.publishBeacon(m); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the relayed landing queued no beacon")
		}
	}
	if len(f.beacons) != 0 {
		t.Fatalf("the late relay (revision 9, below the last beacon 14) queued a beacon: %+v", <-f.beacons)
	}
}

// beaconSub: a connection to a fresh nats-server and a subscription to
// host's beacon subject.
func beaconSub(t *testing.T, host string) (*nats.Conn, *nats.Subscription) {
	t.Helper()
	_, nc, _ := controllertest.JetStream(t)
	subj, _ := proto.BeaconSubject(host)
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	return nc, sub
}

// TestWithdrawalReceiptStored: the withdrawal that landed (the beacon
// queued for it, fencer.beacon) is stored as a receipt in the receipts
// host's own stream at the orderly stop (publishReceipt), read back by a
// controller's ReadHostReceipts; a later renewal's beacon does not replace it;
// without a withdrawal nothing is stored; with the stream missing the
// stop logs and goes on.
func TestWithdrawalReceiptStored(t *testing.T) {
	const host = "h0.example.org"
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fencer{nc: nc, host: host, beacons: make(chan pendingBeacon, 1), log: log}
	f.publishReceipt() // no withdrawal, no stream: nothing, no panic
	st, err := natslease.EnsureWithdrawalStream(ctx, js, host)
	if err != nil {
		t.Fatal(err)
	}
	f.beacon(fencing.LeaseRecord{Host: host, State: fencing.LeaseActive, Seq: 1}, 30)
	f.publishReceipt()
	if rr, err := natslease.ReadReceipts(ctx, st, host); err != nil || len(rr.Msgs) != 0 {
		t.Fatalf("a receipt stored without a withdrawal: %+v, %v", rr, err)
	}
	f.beacon(fencing.LeaseRecord{Host: host, State: fencing.LeaseWithdrawn, Seq: 2}, 33)
	f.publishReceipt()
	f.waitReceipt()
	rr, err := natslease.ReadHostReceipts(ctx, js, host)
	if err != nil || len(rr.Msgs) != 1 || rr.Unsound != nil || st.CachedInfo().Config.Name != "hvguard-withdrawals-h0_example_org" {
		t.Fatalf("the withdrawal's receipt: %+v, %v", rr, err)
	}
	if b := rr.Msgs[0].Beacon; rr.Msgs[0].Err != nil || b.Revision != 33 || b.Seq != 2 || b.State != fencing.LeaseWithdrawn {
		t.Fatalf("the withdrawal's receipt: %+v", rr.Msgs[0])
	}
}

// TestLeaseStoreCreatesReceiptsStream: agents whose user may create the
// lease bucket (create_bucket: make run) create their own receipts stream
// (proto.WithdrawalStreamOf), which vouches for their receipts
// (natslease.StreamOfReceiptsUnsound); one agent's does not for another.
func TestLeaseStoreCreatesReceiptsStream(t *testing.T) {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, js, ctx := deliverytest.JetStream(t, srv)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hosts := []string{"h0.example.org", "h1.example.org"}
	if err := natslease.StreamOfReceiptsUnsound(ctx, js, hosts[1]); err == nil {
		t.Fatalf("%s's receipts vouched for before its agent ran", hosts[1])
	}
	for _, h := range hosts {
		l := &leaseStore{nc: nc, host: h, create: true, log: log}
		if _, err := l.get(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if err = natslease.StreamOfReceiptsUnsound(ctx, js, h); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("after %s's lease store opened: %v", h, err)
		}
	}
	names := js.StreamNames(ctx)
	var got []string
	for n := range names.Name() {
		if strings.HasPrefix(n, proto.WithdrawalStreamPrefix) {
			got = append(got, n)
		}
	}
	slices.Sort(got)
	if want := []string{"hvguard-withdrawals-h0_example_org", "hvguard-withdrawals-h1_example_org"}; !slices.Equal(got, want) {
		t.Fatalf("receipts streams %q, want %q", got, want)
	}
}
