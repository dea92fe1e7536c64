package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller"

	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// Reviewer X12: beacons are authenticated only by NATS permissions ("only
// the host's own user may publish its beacon subject"). But NATS checks a
// publisher's permission on the SUBJECT it publishes to, never on the
// REPLY subject it names: a responder then publishes its answer to that
// reply subject with its own rights. The JetStream direct get every agent
// may call ($JS.API.DIRECT.GET.KV_hvguard-leases.>, kvRead) answers with a
// stored message's data verbatim, and every agent may write a lease key
// ($KV.hvguard-leases.*). So compute-1's NATS user writes a beacon of
// compute-2 as the value of a key of its choice and asks for that key by
// direct get with reply subject hvguard.v1.<compute-2>.beacon: the
// stream's leader publishes the forged beacon on compute-2's beacon
// subject, and the controller takes it for compute-2's own.
//
// Fixed: beacons are signed by their host's key and verified
// (fencing.Keyring.VerifyBeacon): a reflected beacon is only ever one the
// attacker could sign, i.e. its own; and a host withdrawn by its own
// beacon only still counts for the guard (Tracker.ObserveWithdrawal,
// counted: reviewer X13).
// Open (branch x12, docs/security.md "What is left"): the same reflection
// writes garbage into _guard and _leader (TestX12ReflectedWriteToDeniedKeysNATS,
// TestX12ReflectedLeaderLockStompNATS).

// reflectKey is the lease key the attacker parks its forged beacon in
// (any key agents may write; one token).
const reflectKey = "x12-reflect"

// reflectBeacon makes the lease stream publish b (a beacon of b.Host,
// forged by the holder of st/nc, an agent's NATS user) on b.Host's beacon
// subject (direct: publish it there itself — what the permissions refuse).
func reflectBeacon(t *testing.T, ctx context.Context, st *natslease.Store, nc *nats.Conn, b fencing.Beacon, direct bool) {
	t.Helper()
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	subj, err := proto.BeaconSubject(b.Host)
	if err != nil {
		t.Fatal(err)
	}
	if direct {
		if err := nc.Publish(subj, data); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		return
	}
	reflectWrites(t, ctx, st, nc, data, subj)
}

// TestX12ReflectedWithdrawalBeaconEndsHoldNATS (S, critical): compute-1..3,
// signing required, shipped permissions, real agents (beaconing) and a
// real runner, threshold 1. compute-2 and compute-3 are cut off (Held,
// guests running); the controller holds (2 silent > 1). compute-1's NATS
// user reflects ONE beacon {host compute-2, revision: its key's revision
// + 1, state withdrawn} onto compute-2's beacon subject by direct get:
// the controller takes compute-2 as withdrawn (ObserveWithdrawal: not
// counted silent), silent 1 = threshold 1, the hold ends and the Held
// compute-3 is declared. Control "direct": the same beacon published by
// compute-1 on compute-2's subject itself is refused by the permissions:
// the controller holds and declares nobody.
func TestX12ReflectedWithdrawalBeaconEndsHoldNATS(t *testing.T) {
	t.Parallel()
	const (
		victim = "compute-2.example.org"
		held   = "compute-3.example.org"
	)
	for _, attack := range []string{"direct", "reflected"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", victim, held}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, natsURL, f, hosts)
			cfg := controllerCfgThreshold1()
			cst, cnc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
			c := startControllerCfg(ctx, t, cst, cnc, cfg, nil)
			attacker, anc := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			time.Sleep(time.Second) // everybody renewing and beaconing, the guard published

			cut[victim]()
			cut[held]() // the rack is cut off: Held, guests running
			deadline := time.Now().Add(5 * time.Second)
			for !c.holding() && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if !c.holding() {
				t.Fatal("the controller is not holding over the cut-off rack: the test shows nothing")
			}
			e, err := attacker.KV.Get(ctx, "compute-2_example_org")
			if err != nil {
				t.Fatal(err)
			}
			reflectBeacon(t, ctx, attacker, anc, fencing.Beacon{Schema: fencing.BeaconSchema, Host: victim,
				Revision: e.Revision() + 1, At: time.Now().UTC(), State: fencing.LeaseWithdrawn}, attack == "direct")
			started := time.Now()
			for time.Since(started) < 7*time.Second {
				for _, h := range hosts[1:] {
					if at, ok := c.declaredAt(h); ok {
						t.Fatalf("declared %s %s after compute-1 %s a withdrawn beacon of compute-2, while compute-2 and compute-3 were cut off (Held, guests running); decisions: %v",
							h, at.Sub(started).Round(100*time.Millisecond), map[bool]string{true: "published", false: "reflected"}[attack == "direct"], lastDecisions(c, 8))
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !c.holding() {
				t.Fatalf("not holding: the test shows nothing; decisions: %v", lastDecisions(c, 8))
			}
		})
	}
}

// TestX12ReflectedBeaconKeepsDeadHostNATS (c, critical): compute-3 dies
// (its agent stops: no withdrawal, no beacon); compute-1's NATS user keeps
// it undeclared by reflected beacons (see above) — "withdrawn": one
// beacon naming a withdrawal at its key's revision + 1 (never declared
// again, for good); "renewal": a beacon naming a new revision every
// 500 ms (each one counts as its renewal, ObserveBeacon). Control
// "none": compute-3 is declared ~3 s (lease_ttl + grace at ×0.1) after
// it died.
func TestX12ReflectedBeaconKeepsDeadHostNATS(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	for _, attack := range []string{"none", "withdrawn", "renewal"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", "compute-2.example.org", dead}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, natsURL, f, hosts)
			die := cut[dead]
			cst, cnc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
			c := startControllerCfg(ctx, t, cst, cnc, controllerCfgThreshold1(), nil)
			attacker, anc := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			time.Sleep(time.Second)
			die()
			time.Sleep(200 * time.Millisecond)
			e, err := attacker.KV.Get(ctx, "compute-3_example_org")
			if err != nil {
				t.Fatal(err)
			}
			rev := e.Revision()
			died := time.Now()
			for time.Since(died) < 8*time.Second {
				switch {
				case attack == "withdrawn" && rev == e.Revision():
					rev++
					reflectBeacon(t, ctx, attacker, anc, fencing.Beacon{Schema: fencing.BeaconSchema, Host: dead,
						Revision: rev, At: time.Now().UTC(), State: fencing.LeaseWithdrawn}, false)
				case attack == "renewal":
					rev++
					reflectBeacon(t, ctx, attacker, anc, fencing.Beacon{Schema: fencing.BeaconSchema, Host: dead,
						Revision: rev, At: time.Now().UTC()}, false)
				}
				if at, ok := c.declaredAt(dead); ok {
					if attack == "none" {
						t.Logf("control: %s declared %s after it died", dead, at.Sub(died).Round(100*time.Millisecond))
						return
					}
					t.Logf("%s declared %s after it died despite the reflected beacons (accepted %v); %s", dead, at.Sub(died).Round(100*time.Millisecond), c.beaconCounts(), lastDecisions(c, 6))
					return
				}
				time.Sleep(500 * time.Millisecond)
			}
			if attack == "none" {
				t.Fatalf("control: %s not declared 8 s after it died: the test shows nothing; decisions: %v", dead, lastDecisions(c, 8))
			}
			t.Fatalf("%s (dead) not declared 8 s after it died: compute-1 kept it undeclared with %s beacons reflected onto its beacon subject by direct get (beacons accepted: %v); decisions: %v",
				dead, attack, c.beaconCounts(), lastDecisions(c, 6))
		})
	}
}

// controllerCfgThreshold1 is the default tracker config over 3 hosts with
// the guard's threshold 1 (two silent hosts hold).
func controllerCfgThreshold1() controller.Config {
	cfg := controller.DefaultConfig()
	cfg.GuardCount, cfg.GuardShare = 1, 0.5
	return cfg
}

// lastDecisions returns c's last n decisions.
func lastDecisions(c *controllerRun, n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.decisions
	if len(d) > n {
		d = d[len(d)-n:]
	}
	return strings.Join(d, "\n")
}

// TestX12OwnFutureWithdrawalBeaconEndsHoldNATS (S, high; no reflection:
// a compromised node's OWN beacon, on the subject its permissions allow).
// compute-1 healthy, compute-2 compromised, compute-3 its rack peer;
// threshold 1. compute-2 publishes ONE beacon of its own naming a
// withdrawal at a revision far ahead ({state withdrawn, revision: its
// key's + 1e9}) and keeps renewing with genuine active records: the
// controller takes it as withdrawn for good (ObserveWithdrawal: no trusted
// record will ever reach that revision; only a beacon beyond it ends it),
// while every agent sees its active record and counts it. The rack
// (compute-2, compute-3) is cut off: compute-3's agent counts 2 silent
// peers' worth (compute-2's record is active) and is Held, guests running;
// the controller counts 1 (compute-2 "withdrawn") = threshold 1: no hold,
// and compute-3 is declared. A genuine withdrawal is not the same lever:
// agents see the withdrawn record and do not count it either. Control
// "none": the controller holds, declares nobody.
func TestX12OwnFutureWithdrawalBeaconEndsHoldNATS(t *testing.T) {
	t.Parallel()
	const (
		attackerHost = "compute-2.example.org"
		held         = "compute-3.example.org"
	)
	for _, attack := range []string{"none", "own-beacon"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", attackerHost, held}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, natsURL, f, hosts)
			cst, cnc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
			c := startControllerCfg(ctx, t, cst, cnc, controllerCfgThreshold1(), nil)
			attacker, anc := permStore(t, natsURL, "agent:"+attackerHost, f, attackerHost)
			time.Sleep(time.Second)
			if attack == "own-beacon" {
				e, err := attacker.KV.Get(ctx, "compute-2_example_org")
				if err != nil {
					t.Fatal(err)
				}
				// Signed by compute-2's own key: it is compromised.
				b, _ := f.signers[attackerHost].SealBeacon(fencing.Beacon{Schema: fencing.BeaconSchema, Host: attackerHost, Revision: e.Revision() + 1e9,
					At: time.Now().UTC(), State: fencing.LeaseWithdrawn}).Encode()
				subj, _ := proto.BeaconSubject(attackerHost)
				if err := anc.Publish(subj, b); err != nil {
					t.Fatal(err)
				}
				_ = anc.Flush()
			}
			time.Sleep(2 * time.Second) // compute-2 renews on, active to every agent
			cut[attackerHost]()
			cut[held]() // the rack is cut off: compute-3 Held, guests running
			started := time.Now()
			for time.Since(started) < 7*time.Second {
				if at, ok := c.declaredAt(held); ok {
					t.Fatalf("declared %s (Held, guests running) %s after its rack was cut off: compute-2's own beacon named a withdrawal far ahead while it renewed active records; %s",
						held, at.Sub(started).Round(100*time.Millisecond), lastDecisions(c, 6))
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !c.holding() {
				t.Fatalf("control: not holding: the test shows nothing; %s", lastDecisions(c, 6))
			}
		})
	}
}
