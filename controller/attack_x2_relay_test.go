package controller_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
)

// lyingRelayer is a compromised node's relay: it says "relayed" and
// writes nothing (it holds the fleet's peer secret, so its answers are
// authentic peer answers).
type lyingRelayer struct{}

func (lyingRelayer) Relay(_ context.Context, req fencing.RenewRequest, _ time.Duration) fencing.RenewResult {
	return fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: req.Revision + 1}
}

// relayRig returns h0..h3's keys, a context ending with the test and the
// URL of a fresh embedded JetStream.
func relayRig(t *testing.T) (fleet, context.Context, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return newFleet(t), ctx, deliverytest.StartJetStream(t, t.TempDir(), -1).ClientURL()
}

// leaseBucket opens the lease bucket at url over a new connection.
func leaseBucket(ctx context.Context, t *testing.T, url string) (*natslease.Store, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return &natslease.Store{KV: kv, NC: nc}, nc
}

// TestLyingRelayCannotKeepDeclaredHostRunning: h0 is cut off from NATS
// (its connection closed) and from its honest peers; it still reaches
// h1's peer endpoint. h1 is compromised: with the fleet's peer secret it
// answers every relay question "relayed" and writes nothing. Nothing
// lands in h0's key, so the controller declares h0 after lease_ttl +
// grace — while h0, taking every such answer for a landed renewal
// (Agent.PeerAnswered: PeerRelayed is RenewAcked), never fences: its
// domain runs while the controller has declared it and recovery would
// rebuild it elsewhere. The fencing guarantee (docs/fencing.md) broken by
// one compromised node. Control: h1 unreachable too — h0 fences before
// it is declared. With fence.signing.lying_peers 1 (main's 483b395) one
// claim no longer counts and h0 fences; 1 is the default with signing
// required (the mode this fleet runs: fencing.DefaultLyingPeers), so the
// lying case runs at that default. lying_peers 0 with required is an
// explicit opt-out into this hole (docs/security.md, "Lying peers").
func TestLyingRelayCannotKeepDeclaredHostRunning(t *testing.T) {
	t.Parallel()
	def := fencing.DefaultLyingPeers(fencing.SigningRequired)
	for _, tc := range []struct {
		lying      bool
		lyingPeers int
	}{{false, 0}, {true, def}, {true, 1}} {
		lying := tc.lying
		t.Run(fmt.Sprintf("lying=%t/lying_peers=%d", lying, tc.lyingPeers), func(t *testing.T) {
			f, ctx, url := relayRig(t)
			base, _ := leaseBucket(ctx, t, url)
			members := []string{"h0", "h1", "h2", "h3"}
			for _, h := range members[1:] {
				startAgent(ctx, t, f.store(base, h, true, nil), h, members)
			}
			h0st, h0nc := leaseBucket(ctx, t, url)
			urls := map[string]string{}
			if lying {
				urls["h1"] = controllertest.PeerEndpoint(t, "h1", fleetSecret, lyingRelayer{})
			}
			victim := startAgentPeers(ctx, t, f.store(h0st, "h0", true, nil), "h0", members, urls, tc.lyingPeers)
			ctl := startController(ctx, t, f.store(base, "ctl", true, nil))
			time.Sleep(time.Second) // everybody renewing
			h0nc.Close()            // h0 cut off from NATS
			cut := time.Now()
			time.Sleep(5 * time.Second) // > lease_ttl + grace (3.05 s at x0.1)
			at, declared := ctl.declaredAt("h0")
			victim.mu.Lock()
			pausedAt, trans := victim.pausedAt, victim.trans
			victim.mu.Unlock()
			if !declared {
				t.Fatalf("h0 not declared within 5 s of its cut: the test shows nothing; h0: %v", trans)
			}
			t.Logf("h0 declared %.2f s after the cut; paused at %v", at.Sub(cut).Seconds(), pausedAt.Sub(cut))
			if pausedAt.IsZero() || pausedAt.After(at) {
				t.Errorf("h0 declared %.2f s after its cut while its domain ran (paused: %v): h1's 'relayed' answers kept it from fencing; h0's transitions: %v",
					at.Sub(cut).Seconds(), !pausedAt.IsZero(), trans)
			}
		})
	}
}

// heldEndpoint is a peer endpoint whose agent is Held (cut off from NATS
// too: it cannot renew) — its answer is "cannot renew".
func heldEndpoint(t *testing.T, host string) string {
	t.Helper()
	h := &peer.Handler{Host: host, Secret: fleetSecret, View: func() (fencing.PeerView, time.Time) {
		now := time.Now()
		return fencing.PeerView{Lease: false, Held: true, LastAck: now.Add(-time.Minute), Timing: controllertest.HostRecord(host).Timing}, now
	}}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + peer.Path
}

// absentRelayer is a compromised node's relay answer: "your key holds no
// record" (key_absent), nothing read, nothing written.
type absentRelayer struct{}

func (absentRelayer) Relay(context.Context, fencing.RenewRequest, time.Duration) fencing.RenewResult {
	return fencing.RenewResult{Outcome: fencing.RenewConflict}
}

// TestLyingPeerCannotFenceHeldHost: a NATS outage cuts h0, h2 and h3 off
// (h2 and h3 answer "cannot renew": h0 is Held by the mass-failure guard,
// its lease lapses, its domain keeps running, as designed). h1 is
// compromised: with the fleet's peer secret it answers h0's questions
// "relay failed: your key holds no record" (key_absent), which h0 takes
// for a deleted key while its lease has lapsed: it fences and declares
// itself, and stays fenced until an operator's --unfence. One compromised
// node turns a fleet-wide NATS outage into fencing (every Held host asks
// it), which the guard exists to prevent: invariant (a) of issue 11.
// Control: h1 Held and honest — h0 stays Held. Also with
// fence.signing.lying_peers 1 (six hosts, so that h0 is still Held with
// h1's confirmation discounted): the key_absent claim is not counted as
// a relay landing, it is acted on at once.
func TestLyingPeerCannotFenceHeldHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lying      bool
		lyingPeers int
	}{{false, 0}, {true, 0}, {false, 1}, {true, 1}} {
		lying := tc.lying
		t.Run(fmt.Sprintf("lying=%t/lying_peers=%d", lying, tc.lyingPeers), func(t *testing.T) {
			f, ctx, url := relayRig(t)
			st, nc := leaseBucket(ctx, t, url)
			members := []string{"h0", "h1", "h2", "h3"}
			if tc.lyingPeers > 0 {
				members = append(members, "h4", "h5")
			}
			urls := map[string]string{}
			for _, h := range members[1:] {
				urls[h] = heldEndpoint(t, h)
			}
			if lying {
				urls["h1"] = controllertest.PeerEndpoint(t, "h1", fleetSecret, absentRelayer{})
			}
			victim := startAgentPeers(ctx, t, f.store(st, "h0", true, nil), "h0", members, urls, tc.lyingPeers)
			time.Sleep(time.Second) // renewing
			nc.Close()              // the outage
			cut := time.Now()
			time.Sleep(4 * time.Second) // > lease_ttl (1.5 s at x0.1)
			victim.mu.Lock()
			pausedAt, trans := victim.pausedAt, victim.trans
			victim.mu.Unlock()
			held := false
			for _, tr := range trans {
				held = held || strings.Contains(tr, "->held")
			}
			if !held {
				t.Fatalf("h0 never Held: the test shows nothing; h0: %v", trans)
			}
			if !pausedAt.IsZero() {
				t.Errorf("Held h0 fenced %.2f s after the outage, on h1's 'key absent' answer; h0: %v", pausedAt.Sub(cut).Seconds(), trans)
			}
		})
	}
}
