package controller_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
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

// renewRec writes rec (its Seq s.seq) over s.rev and, acknowledged,
// moves s.rev. A write that timed out (RenewTimedOut: it may still land)
// and landed is adopted at the next conflict showing it — the key holds
// the host's own record —, as an agent takes its own write back: without
// this one slow write on a loaded machine left a live host conflicting,
// silent, for the rest of a test, and the mass-failure guard held the
// declaration the test waited for (seen once, 2026-12-04, in
// TestX63PutBackAfterMoveMakesTrustedStoredLateNATS).
func (s *natsSim) renewRec(ctx context.Context, rec fencing.LeaseRecord) fencing.RenewResult {
	res := s.st.Renew(ctx, fencing.RenewRequest{Seq: s.seq, Revision: s.rev, Record: rec}, time.Second)
	switch {
	case res.Outcome == fencing.RenewAcked:
		s.rev = res.Revision
	case res.Outcome == fencing.RenewConflict && res.Current != nil && res.Current.Host == rec.Host && res.Current.Seq < rec.Seq:
		s.rev = res.Revision // our own late write: the next renewal goes over it
	}
	return res
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

// vouchingController is the controller side of the delete-loop rigs
// (reviewers X65, X70, X75): its watch through a proxy, its beacons and
// receipts on a direct connection (bnc, cjs), victim's own receipts stream
// checked to vouch, and a tracker with guard share 0.5 (the rigs' three
// hosts: one dead host is not a mass failure).
func vouchingController(ctx context.Context, t *testing.T, srvURL string, f fleet, victim string) (*natslease.Store, *nats.Conn, jetstream.JetStream, *controller.Tracker) {
	t.Helper()
	cst, _, bnc, _ := proxiedController(t, srvURL, f)
	cjs, _ := jetstream.New(bnc)
	if u := natslease.StreamOfReceiptsUnsound(ctx, cjs, victim); u != nil {
		t.Fatalf("rig: %s's own receipts stream does not vouch: %v", victim, u)
	}
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cst, bnc, cjs, tr
}

// The delete-loop rigs' hosts (reviewers X65, X70, X75): compute-1 is
// compromised, compute-3 its victim.
const (
	loopAttacker  = "compute-1.example.org"
	loopCompanion = "compute-2.example.org"
	loopVictim    = "compute-3.example.org"
)

// newLoopRig starts a nats-server with the shipped permissions and the
// three hosts' simulated agents; ctx ends with the test. vkey is the
// victim's lease key.
func newLoopRig(t *testing.T) (ctx context.Context, srvURL string, hosts []string, f fleet, sims map[string]*natsSim, vkey string) {
	t.Helper()
	srvURL = natspermtest.StartServer(t)
	hosts = []string{loopAttacker, loopCompanion, loopVictim}
	f = newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, srvURL, hosts, f, natsSims(t, srvURL, f, hosts), strings.ReplaceAll(loopVictim, ".", "_")
}

// loopRenew is the delete-loop rigs' renewal of rec by s: a write over
// s.rev — a create once a conflict showed the key deleted (s.rev 0, as
// fencing/keydelete.go) — and, acknowledged, its beacon published. It
// returns the write's result, whether it was a create, and the beacon.
func loopRenew(ctx context.Context, s *natsSim, f fleet, rec fencing.LeaseRecord) (res fencing.RenewResult, created bool, beacon *nats.Msg) {
	res = s.st.Renew(ctx, fencing.RenewRequest{Seq: s.seq, Revision: s.rev, Record: rec}, time.Second)
	if res.Outcome != fencing.RenewAcked {
		if res.Outcome == fencing.RenewConflict && res.Current == nil {
			s.rev = 0
		}
		return res, false, nil
	}
	created, s.rev = s.rev == 0, res.Revision
	// Chained as an agent's (Beacon.Prev: the last one this process
	// published): without it every watch skip's hidden-write check found
	// no chain and opened a loss window by each host (beaconloss.go).
	if m, err := natslease.BeaconMsg(f.signers[rec.Host], rec, res.Revision, s.prev, time.Now()); err == nil {
		_ = s.nc.PublishMsg(m)
		beacon = m
		s.prev = res.Revision
	}
	return res, created, beacon
}
