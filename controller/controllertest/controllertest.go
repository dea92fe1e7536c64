// Package controllertest has the controller tests' shared pieces: an
// embedded JetStream with the lease bucket, host lease records at ×0.1 of
// the default timing and a renewing fleet.
package controllertest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
)

// JetStream starts an embedded JetStream server and connects to it (closed
// when the test ends).
func JetStream(t *testing.T) (url string, nc *nats.Conn, js jetstream.JetStream) {
	t.Helper()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ = jetstream.New(nc)
	return srv.ClientURL(), nc, js
}

// Bucket starts an embedded JetStream and creates the lease bucket; it
// returns the server's client URL and the bucket.
func Bucket(t *testing.T) (url string, kv jetstream.KeyValue) {
	t.Helper()
	url, _, js := JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return url, kv
}

// HostRecord is an active lease of host with a hardware-watchdog backstop
// at ×0.1 of the default timing: declared lease_ttl 1.5 s + grace 1.55 s
// after its last renewal.
func HostRecord(host string) fencing.LeaseRecord {
	timing := fencing.DefaultTiming()
	timing.RenewInterval, timing.RenewTimeout, timing.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	timing.FenceDeadline, timing.LeaseTTL, timing.WatchdogTimeout = 500*time.Millisecond, 1500*time.Millisecond, time.Second
	return fencing.LeaseRecord{Schema: 1, Host: host, State: fencing.LeaseActive, FencingEnabled: true,
		Action: fencing.ActionPause, Backstop: fencing.BackstopWatchdog, Timing: timing}
}

// Renew writes HostRecord for each host every 150 ms until ctx ends.
func Renew(ctx context.Context, st *natslease.Store, hosts ...string) {
	revs := map[string]uint64{}
	for ctx.Err() == nil {
		for _, h := range hosts {
			if n, err := st.Write(ctx, h, revs[h], HostRecord(h), time.Second); err == nil {
				revs[h] = n
			}
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// RenewRecord writes rec to its host's key every 150 ms until the returned
// stop is called (or ctx ends): a host that is healthy until the test makes
// it silent.
func RenewRecord(ctx context.Context, st *natslease.Store, rec fencing.LeaseRecord) (stop func()) {
	ctx, stop = context.WithCancel(ctx)
	go func() {
		var rev uint64
		for ctx.Err() == nil {
			if n, err := st.Write(ctx, rec.Host, rev, rec, time.Second); err == nil {
				rev = n
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	return stop
}

// Records returns every lease record in host's key history, in order
// (the bucket must keep a history for this to show more than the last).
func Records(t testing.TB, kv jetstream.KeyValue, host string) []fencing.LeaseRecord {
	t.Helper()
	h, err := kv.History(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	var out []fencing.LeaseRecord
	for _, e := range h {
		if r, err := fencing.DecodeRecord(e.Value()); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// Declarations returns the reasons of the expired records in host's key
// history (each names the controller and term that wrote it).
func Declarations(t testing.TB, kv jetstream.KeyValue, host string) []string {
	t.Helper()
	var out []string
	for _, r := range Records(t, kv, host) {
		if r.State == fencing.LeaseExpired {
			out = append(out, r.Reason)
		}
	}
	return out
}

// LockHistory returns every landed leader-lock record, in order.
func LockHistory(t testing.TB, kv jetstream.KeyValue) []controller.LockRecord {
	t.Helper()
	h, err := kv.History(context.Background(), controller.LeaderKey)
	if err != nil {
		t.Fatal(err)
	}
	var out []controller.LockRecord
	for _, e := range h {
		if r, err := controller.DecodeLockRecord(e.Value()); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// CheckTakeover fails unless newID held the lock and oldID wrote no lock
// record after newID's first (a deposed leader's late writes changed
// nothing); it returns the history.
func CheckTakeover(t testing.TB, kv jetstream.KeyValue, oldID, newID string) []controller.LockRecord {
	t.Helper()
	locks := LockHistory(t, kv)
	sawNew := false
	for _, r := range locks {
		sawNew = sawNew || r.Holder == newID
		if sawNew && r.Holder == oldID {
			t.Fatalf("%s wrote the lock after %s took it: %+v", oldID, newID, locks)
		}
	}
	if !sawNew {
		t.Fatalf("%s never held the lock: %+v", newID, locks)
	}
	return locks
}

// PeerEndpoint serves host's peer endpoint (fencing/peer) on loopback as a
// healthy peer (a fresh lease: it relays with r) until the test ends, and
// returns its URL.
func PeerEndpoint(t testing.TB, host string, secret []byte, r peer.Relayer) string {
	h := &peer.Handler{Host: host, Secret: secret, Relayer: r, View: func() (fencing.PeerView, time.Time) {
		now := time.Now()
		return fencing.PeerView{Lease: true, LastAck: now, Timing: fencing.DefaultTiming()}, now
	}}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + peer.Path
}
