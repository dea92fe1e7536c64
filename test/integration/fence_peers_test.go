package integration

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/lifecycle"
	"hvguard/test/netcut"
)

// peerPair is a fence rig (agent A behind r.prx) plus a second fencing
// agent B on its own proxy to the same NATS server; A and B reach each
// other's peer endpoints on loopback (real HTTP, HMAC-signed), the five
// test-renewed hosts have no endpoint.
type peerPair struct {
	r      *fenceRig
	prxB   *netcut.Proxy
	hostB  string
	mu     sync.Mutex
	transB []fencing.Transition
}

func newPeerPair(t *testing.T) *peerPair {
	r := newFenceRig(t, true, 2)
	p := &peerPair{r: r, prxB: netcut.New(t, r.prx.Target), hostB: "fence-h9.example.org"}
	// ×0.2 instead of ×0.1: a relay is a CAS through a proxy plus HTTP,
	// which 300 ms (peer_timeout at ×0.1) did not always cover with the
	// other fence tests running in parallel on 2 cores.
	f := &r.cfg.Fence
	f.RenewInterval, f.RenewTimeout = agent.Duration(400*time.Millisecond), agent.Duration(400*time.Millisecond)
	f.PeerTimeout, f.FenceDeadline = agent.Duration(600*time.Millisecond), agent.Duration(time.Second)
	f.LeaseTTL, f.HeldRecheck = agent.Duration(3*time.Second), agent.Duration(time.Second)
	portA, portB := deliverytest.FreePort(t), deliverytest.FreePort(t)
	r.cfg.Fence.PeerListen = fmt.Sprintf("127.0.0.1:%d", portA)
	r.cfg.Fence.PeerURLs = map[string]string{p.hostB: fmt.Sprintf("http://127.0.0.1:%d", portB)}
	cfgB := r.cfg
	cfgB.Host = p.hostB
	cfgB.StateDir = t.TempDir()
	cfgB.Fence.RuntimeDir = t.TempDir()
	cfgB.NATS.URLs = []string{"nats://" + p.prxB.Addr()}
	cfgB.Fence.PeerListen = fmt.Sprintf("127.0.0.1:%d", portB)
	cfgB.Fence.PeerURLs = map[string]string{r.host: fmt.Sprintf("http://127.0.0.1:%d", portA)}
	if err := cfgB.Validate(); err != nil {
		t.Fatal(err)
	}
	r.startAgent()
	startAgent(t, cfgB, agent.Options{
		WrapFenceHypervisor: func(h agent.FenceHypervisor) agent.FenceHypervisor { return ownDomains{h, r.domains} },
		ResetHost:           func() error { r.resets.Add(1); return nil },
		OnFenceTransition: func(tr fencing.Transition) {
			p.mu.Lock()
			p.transB = append(p.transB, tr)
			p.mu.Unlock()
		},
	})
	r.waitState(fencing.StateHealthy, 10*time.Second)
	r.waitFor("B healthy", 10*time.Second, func() bool { return p.stateB() == fencing.StateHealthy })
	time.Sleep(1500 * time.Millisecond) // both in the bucket; guard published and read by both
	return p
}

func (p *peerPair) stateB() fencing.State {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.transB) == 0 {
		return ""
	}
	return p.transB[len(p.transB)-1].To
}

func (p *peerPair) historyB() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ""
	for _, tr := range p.transB {
		s += "B " + tr.String() + "\n"
	}
	return s
}

// TestFencePeerRelay: A's NATS link is cut, B's is not: A asks B over the
// peer endpoint, B relays A's renewal into the bucket, A's lease stays
// valid — it does not fence and the controller declares nothing.
func TestFencePeerRelay(t *testing.T) {
	t.Parallel()
	p := newPeerPair(t)
	r := p.r
	r.prx.Blackhole(true)
	r.waitFor("relayed by B", 10*time.Second, func() bool { return slices.Contains(r.reasons(), fencing.ReasonRelayedByPeer) })
	time.Sleep(4 * time.Second) // relayed ~2 s after the cut: > lease_ttl + grace (3 + 2.06 s) by then; A would be declared without the relays
	if slices.ContainsFunc(r.reasons(), func(x fencing.Reason) bool { return x == fencing.ReasonFenceComplete }) ||
		!r.allDomains(lifecycle.StateRunning) {
		t.Fatalf("A fenced although B relays\n%s", r.history())
	}
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("A declared although B relays\n%s", r.history())
	}
	t.Logf("\n%s", r.history())
}

// TestFenceMassOutageHeld: both agents lose NATS but reach each other.
// With 7 hosts in the bucket the guard threshold is min(10, floor(0.2×7))
// = 1: A and B each count themselves plus the other's confirmation, 2 > 1,
// so both are Held and nothing is paused; the controller sees 2 silent
// hosts > 1 and holds too. After the heal both are healthy.
func TestFenceMassOutageHeld(t *testing.T) {
	t.Parallel()
	p := newPeerPair(t)
	r := p.r
	r.prx.Blackhole(true)
	p.prxB.Blackhole(true)
	r.waitFor("A held", 15*time.Second, func() bool { return r.state() == fencing.StateHeld })
	r.waitFor("B held", 15*time.Second, func() bool { return p.stateB() == fencing.StateHeld })
	time.Sleep(4 * time.Second) // past lease_ttl + grace (5.06 s) since the cut
	if !r.allDomains(lifecycle.StateRunning) || r.state() != fencing.StateHeld || p.stateB() != fencing.StateHeld {
		t.Fatalf("A %s, B %s, domains running %v\n%s%s", r.state(), p.stateB(), r.allDomains(lifecycle.StateRunning), r.history(), p.historyB())
	}
	if at, _ := r.declared(); !at.IsZero() {
		t.Fatalf("declared during a mass outage\n%s", r.history())
	}
	r.prx.Blackhole(false)
	p.prxB.Blackhole(false)
	r.waitFor("A healthy", 10*time.Second, func() bool { return r.state() == fencing.StateHealthy })
	r.waitFor("B healthy", 10*time.Second, func() bool { return p.stateB() == fencing.StateHealthy })
	t.Logf("\n%s%s", r.history(), p.historyB())
}
