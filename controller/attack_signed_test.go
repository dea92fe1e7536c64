package controller_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/keyfile"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
)

// Issue 11: what a compromised compute node can do with what it holds —
// its own key, NATS credentials that can write every key of the lease
// bucket (relays need that), and the fleet's peer secret — against a real
// embedded NATS, real fencing.Agent cores and a real controller.Runner, at
// timings ×0.1 (controllertest.HostRecord: declared 3.05 s after the last
// renewal). Each attack runs twice: with signing off, where it succeeds
// (the hole the issue describes, asserted so the test shows something),
// and with signing required, where it is refused.

// fleet is the keys of h0..h3, the attacker's node (h1) among them, and the
// controller's.
type fleet struct {
	signers map[string]fencing.Signer
	ring    *fencing.Keyring
}

func newFleet(t *testing.T) fleet {
	t.Helper()
	return newFleetOf(t, []string{"h0", "h1", "h2", "h3"})
}

// newFleetOf is newFleet for the hosts named (and "ctl").
func newFleetOf(t *testing.T, hosts []string) fleet {
	t.Helper()
	f := fleet{signers: map[string]fencing.Signer{}, ring: &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{}}}
	for _, n := range append(append([]string(nil), hosts...), "ctl") {
		path := filepath.Join(t.TempDir(), n+".seed")
		pub, err := keyfile.Generate(path)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := keyfile.Signer(path)
		k, _ := keyfile.Public(pub)
		f.signers[n] = s
		if n == "ctl" {
			f.ring.Controllers = []fencing.PublicKey{k}
		} else {
			f.ring.Hosts[n] = []fencing.PublicKey{k}
		}
	}
	return f
}

// attackRig returns the fleet's keys, the lease bucket on a fresh embedded
// JetStream, a context ending with the test, and the members h0..h3.
func attackRig(t *testing.T) (fleet, *natslease.Store, context.Context, []string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return newFleet(t), newLeaseStore(t), ctx, []string{"h0", "h1", "h2", "h3"}
}

// store returns who's Store on kv (signed unless signed is false).
func (f fleet) store(st *natslease.Store, who string, signed bool, onInvalid func(string, uint64, error)) *natslease.Store {
	if !signed {
		return &natslease.Store{KV: st.KV, NC: st.NC}
	}
	return &natslease.Store{KV: st.KV, NC: st.NC, Signer: f.signers[who], Keys: f.ring, OnInvalid: onInvalid}
}

// agentRun drives a real fencing.Agent for host against st (one running
// domain, d1) until ctx ends; fenced reports whether it ever started to
// fence (or was declared).
type agentRun struct {
	mu      sync.Mutex
	fenced  []string
	alerts  []string
	running bool
	// pausedAt: when its domain was first paused; trans: every transition.
	pausedAt time.Time
	trans    []string
}

func (r *agentRun) fencedWhy() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.fenced...)
}

func startAgent(ctx context.Context, t *testing.T, st *natslease.Store, host string, members []string) *agentRun {
	t.Helper()
	return startAgentPeers(ctx, t, st, host, members, nil)
}

// startAgentPeers is startAgent whose agent asks its peers with a real
// peer.Client (urls: peer → endpoint; a peer without one is unreachable);
// with urls nil it asks nobody (no answer ever comes).
// lyingPeers is fencing.Config.LyingPeers.
func startAgentPeers(ctx context.Context, t *testing.T, st *natslease.Store, host string, members []string, urls map[string]string, lyingPeers ...int) *agentRun {
	t.Helper()
	return startAgentOn(ctx, t, st, nil, host, members, urls, lyingPeers...)
}

// startAgentOn is startAgentPeers whose agent, when nc is set, publishes
// a beacon on nc after each renewal it wrote (as agent/fence.go does).
func startAgentOn(ctx context.Context, t *testing.T, st *natslease.Store, nc *nats.Conn, host string, members []string, urls map[string]string, lyingPeers ...int) *agentRun {
	t.Helper()
	cfg := fencing.DefaultConfig(host, "boot-"+host)
	cfg.Enabled, cfg.HardwareWatchdog = true, true
	cfg.Timing = controllertest.HostRecord(host).Timing
	cfg.HeldRecheck = 500 * time.Millisecond
	for _, n := range lyingPeers {
		cfg.LyingPeers = n
	}
	a, rd, err := fencing.NewAgent(cfg, nil, nil, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	run := &agentRun{running: true}
	results := make(chan func(time.Time) fencing.Ready, 64)
	var beaconMu sync.Mutex // lastBeacon: the revision the last beacon published named
	var lastBeacon uint64
	var apply func(fencing.Ready)
	apply = func(rd fencing.Ready) {
		for _, tr := range rd.Transitions {
			run.mu.Lock()
			run.trans = append(run.trans, fmt.Sprintf("%s %s->%s %s", time.Now().Format("05.000"), tr.From, tr.To, tr.Reason))
			run.mu.Unlock()
			switch tr.To {
			case fencing.StateFencing, fencing.StateFenced, fencing.StateAwaitingRelease:
				run.mu.Lock()
				run.fenced = append(run.fenced, fmt.Sprintf("%s: %s", tr.Reason, tr.Detail))
				run.mu.Unlock()
			}
		}
		for _, al := range rd.Alerts {
			run.mu.Lock()
			run.alerts = append(run.alerts, string(al.Reason))
			run.mu.Unlock()
		}
		for _, u := range rd.Pause {
			run.mu.Lock()
			run.running = false
			if run.pausedAt.IsZero() {
				run.pausedAt = time.Now()
			}
			run.mu.Unlock()
			apply(a.FenceDone(time.Now(), u, nil))
		}
		if rq := rd.Renew; rq != nil {
			req := *rq
			go func() {
				res := st.Renew(ctx, req, cfg.Timing.RenewTimeout)
				if nc != nil && res.Outcome == fencing.RenewAcked {
					// Chained as agent/fence.go's publishBeacon does: each
					// names the last one published (Prev), a new chain
					// (Prev 0) when not after it.
					beaconMu.Lock()
					prev := lastBeacon
					if res.Revision <= prev {
						prev = 0
					}
					if m, err := natslease.BeaconMsg(st.Signer, req.Record, res.Revision, prev, time.Now()); err == nil && nc.PublishMsg(m) == nil {
						lastBeacon = res.Revision
					}
					beaconMu.Unlock()
				}
				select {
				case results <- func(n time.Time) fencing.Ready { return a.Renewed(n, req.Seq, res) }:
				case <-ctx.Done():
				}
			}()
		}
		if r := rd.AskPeers; r != nil && urls != nil {
			round := *r
			cl := &peer.Client{Host: host, Secret: fleetSecret, URL: func(p string) string {
				if u, ok := urls[p]; ok {
					return u
				}
				return "http://127.0.0.1:9" + peer.Path // nothing listens: unreachable
			}}
			for _, p := range round.Peers {
				go func() {
					actx, cancel := context.WithDeadline(ctx, round.Deadline)
					ans, _ := cl.Ask(actx, p, round)
					cancel()
					select {
					case results <- func(n time.Time) fencing.Ready { return a.PeerAnswered(n, round.ID, p, ans) }:
					case <-ctx.Done():
					}
				}()
			}
		}
	}
	apply(rd)
	g := fencing.DefaultGuard(len(members))
	g.Share = 0.5 // as the controller's (threshold 2)
	a.SetMembers(members, g)
	apply(a.Domains(time.Now(), []fencing.Domain{{UUID: "d1", Running: true}}))
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case f := <-results:
				apply(f(time.Now()))
			case <-tick.C:
				apply(a.Tick(time.Now()))
			}
		}
	}()
	return run
}

// controllerRun runs a controller.Runner on st and records its decisions.
type controllerRun struct {
	mu        sync.Mutex
	declared  map[string]time.Time // written declarations
	invalid   map[string]int
	beacons   map[string]int // accepted, by host
	decisions []string
}

func startController(ctx context.Context, t *testing.T, st *natslease.Store) *controllerRun {
	t.Helper()
	return startControllerOn(ctx, t, st, nil)
}

// startControllerOn is startController receiving the agents' beacons on
// nc (nil: none).
func startControllerOn(ctx context.Context, t *testing.T, st *natslease.Store, nc *nats.Conn) *controllerRun {
	t.Helper()
	return startControllerMem(ctx, t, st, nc, nil)
}

// startControllerMem is startControllerOn with the controllers' memory
// bucket mem (nil: none).
func startControllerMem(ctx context.Context, t *testing.T, st *natslease.Store, nc *nats.Conn, mem jetstream.KeyValue) *controllerRun {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5 // 4 hosts: threshold 2 (one dead host is not a mass failure)
	return startControllerCfg(ctx, t, st, nc, cfg, mem)
}

// startControllerCfg is startControllerMem with the tracker's cfg.
func startControllerCfg(ctx context.Context, t *testing.T, st *natslease.Store, nc *nats.Conn, cfg controller.Config, mem jetstream.KeyValue) *controllerRun {
	t.Helper()
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &controllerRun{declared: map[string]time.Time{}, invalid: map[string]int{}, beacons: map[string]int{}}
	r := &controller.Runner{Store: st, Tracker: tr, Memory: mem, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: nc,
		OnBeacon: func(host string, _ fencing.Beacon, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if err != nil {
				c.decisions = append(c.decisions, fmt.Sprintf("beacon of %s refused: %v", host, err))
			} else {
				c.beacons[host]++
			}
		},
		OnDecision: func(d controller.Decision, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.decisions = append(c.decisions, fmt.Sprintf("%s %v", d, err))
			switch {
			case d.Op == controller.OpDeclare && err == nil:
				if _, ok := c.declared[d.Host]; !ok {
					c.declared[d.Host] = time.Now()
				}
			case d.Op == controller.OpInvalid:
				c.invalid[d.Host]++
			}
		}}
	r.Receipts = receiptsOf(ctx, t, st)
	go r.Run(ctx)
	return c
}

// receiptsOf returns st's connection's JetStream, after opening the
// withdrawal receipts stream of each host of st's keyring, created if
// missing and its user may (the shipped permissions: provisioned) — the
// streams a controller needs to declare a dead host whose key a
// compromised node overwrote (controller.ErrReceiptsUnsound). Nil without
// a connection or a keyring.
func receiptsOf(ctx context.Context, t *testing.T, st *natslease.Store) jetstream.JetStream {
	t.Helper()
	if st.NC == nil || st.Keys == nil || len(st.Keys.Hosts) == 0 {
		return nil
	}
	js, err := jetstream.New(st.NC)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range slices.Sorted(maps.Keys(st.Keys.Hosts)) {
		if _, err := natslease.EnsureWithdrawalStream(ctx, js, h); err != nil {
			t.Fatalf("the withdrawal receipts stream of %s: %v", h, err)
		}
	}
	return js
}

func (c *controllerRun) declaredAt(host string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.declared[host]
	return at, ok
}

func (c *controllerRun) beaconCounts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.beacons)
}

func (c *controllerRun) invalidCount(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.invalid[host]
}

// put writes raw bytes to host's key (what NATS credentials allow: no
// CAS, no signature).
func put(t *testing.T, st *natslease.Store, rec fencing.LeaseRecord) {
	t.Helper()
	b, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.KV.Put(context.Background(), rec.Host, b); err != nil {
		t.Fatal(err)
	}
}

// TestCompromisedNodeCannotFenceOrDeclareAnother: h1 (compromised) writes
// into h0's key, while h0 is healthy, an expired record signed by its own
// key (what it can sign), h0's current record turned expired (h0's
// signature, now invalid) and a withdrawn one, and asks h2's peer
// endpoint, claiming to be h0, to relay an expired record. Signing off: h0
// fences and is counted declared. Signing required: h0 rewrites its key
// (the untrusted records are handled like a deleted key while its lease is
// held), never fences, and the controller never declares it; every
// forged value is said (invalid-record).
func TestCompromisedNodeCannotFenceOrDeclareAnother(t *testing.T) {
	t.Parallel()
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%t", signed), func(t *testing.T) {
			f, base, ctx, members := attackRig(t)
			var agents []*agentRun
			for _, h := range members {
				agents = append(agents, startAgent(ctx, t, f.store(base, h, signed, nil), h, members))
			}
			ctl := startController(ctx, t, f.store(base, "ctl", signed, nil))
			attacker := f.store(base, "h1", signed, nil)
			relayer := controllertest.PeerEndpoint(t, "h2", fleetSecret, f.store(base, "h2", signed, nil))
			time.Sleep(time.Second) // everybody renewing

			cur, rev, err := attacker.Read(ctx, "h0")
			if err != nil {
				t.Fatal(err)
			}
			exp := *cur
			exp.State, exp.Epoch, exp.Reason = fencing.LeaseExpired, cur.Epoch+1, "forged by h1"
			withdrawn := *cur
			withdrawn.State, withdrawn.Reason = fencing.LeaseWithdrawn, "forged by h1"
			attacks := []func(){
				func() { put(t, attacker, f.signers["h1"].Seal(exp, rev)) },
				func() { put(t, attacker, exp) }, // h0's record and signature, turned expired
				func() { put(t, attacker, f.signers["h1"].Seal(withdrawn, rev)) },
				func() { forgedRelay(ctx, t, relayer, exp) },
			}
			for _, a := range attacks {
				a()
				time.Sleep(700 * time.Millisecond) // lease_ttl 1.5 s: a fence would start within it
			}
			time.Sleep(3 * time.Second) // > lease_ttl + grace: a declaration would have come
			fenced := agents[0].fencedWhy()
			_, declared := ctl.declaredAt("h0")
			if !signed {
				if len(fenced) == 0 {
					t.Fatalf("signing off: the forged records did not make h0 fence: the test shows nothing")
				}
				t.Logf("signing off (the hole): h0 fenced: %v; declared: %t", fenced, declared)
				return
			}
			if len(fenced) > 0 || declared {
				t.Fatalf("h0 fenced (%v) or declared (%t) by a compromised h1", fenced, declared)
			}
			for i, a := range agents[1:] {
				if w := a.fencedWhy(); len(w) > 0 {
					t.Errorf("h%d fenced: %v", i+1, w)
				}
			}
			if n := ctl.invalidCount("h0"); n < 3 {
				t.Errorf("the controller said %d invalid values of h0's key, want >= 3", n)
			}
			if cur, _, err := f.store(base, "ctl", true, nil).Read(ctx, "h0"); err != nil || cur.State != fencing.LeaseActive || cur.Signer != f.signers["h0"].ID {
				t.Errorf("h0's key now: %+v %v", cur, err)
			}
			agents[0].mu.Lock()
			t.Logf("h0's alerts: %v", agents[0].alerts)
			agents[0].mu.Unlock()
		})
	}
}

// TestCompromisedNodeCannotKeepDeadHostUndeclared: h3 dies (its agent
// stops renewing); h1 (compromised) keeps writing, every 300 ms, active
// records of h3 signed by its own key, alternating with copies of h3's
// last genuine record (a replay). Signing off: h3 is never declared.
// Signing required: h3 is declared on time (lease_ttl + grace after its
// last renewal, 3.05 s at ×0.1), by CAS over the forged values.
func TestCompromisedNodeCannotKeepDeadHostUndeclared(t *testing.T) {
	t.Parallel()
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%t", signed), func(t *testing.T) {
			f, base, ctx, members := attackRig(t)
			for _, h := range members[:3] {
				startAgent(ctx, t, f.store(base, h, signed, nil), h, members)
			}
			dctx, die := context.WithCancel(ctx)
			startAgent(dctx, t, f.store(base, "h3", signed, nil), "h3", members)
			ctl := startController(ctx, t, f.store(base, "ctl", signed, nil))
			attacker := f.store(base, "h1", signed, nil)
			time.Sleep(time.Second)
			die()
			time.Sleep(50 * time.Millisecond) // its last renewal landed or not
			last, _, err := attacker.Read(ctx, "h3")
			if err != nil {
				t.Fatal(err)
			}
			died := time.Now()
			forged := *last
			for i := 0; time.Since(died) < 5*time.Second; i++ {
				if _, ok := ctl.declaredAt("h3"); ok {
					break
				}
				forged.Seq = last.Seq + uint64(i) + 1
				if i%2 == 0 {
					put(t, attacker, f.signers["h1"].Seal(forged, 0))
				} else {
					put(t, attacker, *last) // replay of h3's own record
				}
				time.Sleep(300 * time.Millisecond)
			}
			at, declared := ctl.declaredAt("h3")
			if !signed {
				if declared {
					t.Fatalf("signing off: h3 declared at %s although forged renewals kept coming: the test shows nothing", at.Sub(died))
				}
				t.Logf("signing off (the hole): h3 not declared while the forged renewals came")
				return
			}
			if !declared {
				t.Fatalf("h3 (dead) not declared within 5 s: forged renewals kept it alive; decisions: %v", ctl.decisions)
			}
			t.Logf("h3 declared %.2f s after its death (lease_ttl + grace = 3.05 s); invalid values said: %d", at.Sub(died).Seconds(), ctl.invalidCount("h3"))
			if d := at.Sub(died); d > 3500*time.Millisecond {
				t.Errorf("declared %s after its death: the forged values delayed it", d)
			}
		})
	}
}

// forgedRelay asks the peer endpoint at url, with the fleet secret,
// claiming to be rec.Host, to relay rec (revision 0, as in the issue).
func forgedRelay(ctx context.Context, t *testing.T, url string, rec fencing.LeaseRecord) {
	t.Helper()
	c := &peer.Client{Host: rec.Host, Secret: fleetSecret, URL: func(string) string { return url }}
	ans, err := c.Ask(ctx, "h2", fencing.PeerRound{ID: 1, Peers: []string{"h2"}, Renewal: fencing.RenewRequest{Seq: rec.Seq + 1, Record: rec}})
	t.Logf("forged relay: answer %+v, %v", ans, err)
}

var fleetSecret = []byte("0123456789abcdef-fleet")
