package controller_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing/natslease"
	"hvguard/test/netcut"
)

// natsSim is a simulated agent on a nats-server with the shipped
// permissions: its lease store and connection (its own NATS user), the
// revision and seq of its last record, the revision its last beacon named
// (fencing.Beacon.Prev), and whether it stopped renewing.
type natsSim struct {
	st       *natslease.Store
	nc       *nats.Conn
	rev, seq uint64
	prev     uint64
	stop     bool
}

// natsSims connects one simulated agent per host as "agent:HOST".
func natsSims(t *testing.T, srvURL string, f fleet, hosts []string) map[string]*natsSim {
	t.Helper()
	sims := map[string]*natsSim{}
	for _, h := range hosts {
		st, nc := permStore(t, srvURL, "agent:"+h, f, h)
		sims[h] = &natsSim{st: st, nc: nc}
	}
	return sims
}

// renewEvery has every host not stopped renew (renew, under mu) every
// 200 ms until ctx ends.
func renewEvery(ctx context.Context, mu *sync.Mutex, hosts []string, sims map[string]*natsSim, renew func(h string)) {
	go func() {
		for ctx.Err() == nil {
			mu.Lock()
			for _, h := range hosts {
				if !sims[h].stop {
					renew(h)
				}
			}
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	}()
}

// proxiedController is controller ctl-1's lease store with its watch
// through a proxy the test can cut (proxy.Reset), the watch's connection,
// and its beacon connection, direct.
func proxiedController(t *testing.T, srvURL string, f fleet) (cst *natslease.Store, wnc, bnc *nats.Conn, proxy *netcut.Proxy) {
	t.Helper()
	u, err := url.Parse(srvURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy = netcut.New(t, u.Host)
	cst, wnc = permStore(t, "nats://"+proxy.Addr(), "controller:ctl-1", f, "ctl")
	bnc = natspermtest.Connect(t, srvURL, "controller:ctl-1")
	return cst, wnc, bnc, proxy
}
