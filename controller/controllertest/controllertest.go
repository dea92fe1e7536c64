// Package controllertest has the controller tests' shared pieces: an
// embedded JetStream with the lease bucket, host lease records at ×0.1 of
// the default timing and a renewing fleet.
package controllertest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
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
