package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// Reviewer X2's attacks on issue 11 (signed leases, least-privilege
// NATS), against nats-server started with the shipped permissions
// (natspermtest): the attacker is compute-1.example.org, connected with
// its own NKey, holding its own host key.

// permStore opens the lease bucket as user ("role:name") on url and
// returns who's signing, verifying Store on it.
func permStore(t *testing.T, url, user string, f fleet, who string) (*natslease.Store, *nats.Conn) {
	t.Helper()
	nc := natspermtest.Connect(t, url, user)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := natslease.EnsureBucket(ctx, js, false)
	if err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	st := &natslease.Store{KV: kv, NC: nc, Signer: f.signers[who], Keys: f.ring}
	if strings.HasPrefix(user, "controller:") {
		// A controller keeps the guard in its own account too.
		st.Control = controlBuckets(t, url, user).Control
	}
	return st, nc
}

// controlBuckets connects as user's ("controller:ID") user in the
// controllers' account and opens its buckets there.
func controlBuckets(t *testing.T, url, user string) controller.ControlBuckets {
	t.Helper()
	js, _ := jetstream.New(natspermtest.Connect(t, url, user+":control"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cb, err := controller.EnsureControlBuckets(ctx, js, false)
	if err != nil {
		t.Fatalf("%s in the controllers' account: %v", user, err)
	}
	return cb
}

// TestAgentCannotPurgeLeaseBucket: a compromised compute-1 publishes ONE
// message to a lease key it may write (relays need every host key) with
// the header "Nats-Rollup: all". The lease bucket is a KV stream, which
// allows rollups (KV purge uses them) and so purges every other message of
// the stream: every host's record, the guard and the leader lock vanish,
// with no delete markers. compute-3 is dead at that moment: the controller
// still holds its last record's revision, its declaration (a CAS on it)
// fails for ever, and compute-3 is never declared. Invariant (c) of issue
// 11: a node cannot stop the declaration of a dead host other than itself.
func TestAgentCannotPurgeLeaseBucket(t *testing.T) {
	t.Parallel()
	url := natspermtest.StartServer(t)
	hosts := []string{"compute-1.example.org", "compute-2.example.org", "compute-3.example.org"}
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dctx, die := context.WithCancel(ctx)
	for _, h := range hosts {
		st, _ := permStore(t, url, "agent:"+h, f, h)
		actx := ctx
		if h == hosts[2] {
			actx = dctx
		}
		startAgent(actx, t, st, h, hosts)
	}
	cst, _ := permStore(t, url, "controller:ctl-1", f, "ctl")
	ctl := startController(ctx, t, cst)
	_, anc := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
	ajs, _ := jetstream.New(anc)
	time.Sleep(time.Second) // everybody renewing, the guard published
	if g, err := cst.ReadGuard(ctx); err != nil || g.Version == 0 {
		t.Fatalf("no guard published before the attack: %+v %v", g, err)
	}

	die()
	time.Sleep(50 * time.Millisecond)
	died := time.Now()
	// The attack: one publish to a key of the bucket the agent may write.
	m := nats.NewMsg("$KV." + fencing.Bucket + ".scratch")
	m.Data = []byte("x")
	m.Header.Set("Nats-Rollup", "all")
	if _, err := ajs.PublishMsg(ctx, m); err != nil {
		t.Logf("the rollup publish was refused: %v", err)
	}
	kv := cst.KV
	for _, k := range []string{fencing.GuardKey, "compute-3_example_org"} {
		if _, err := kv.Get(ctx, k); err != nil {
			t.Errorf("after compute-1's rollup, %s: %v", k, err)
		}
	}
	time.Sleep(5 * time.Second) // > lease_ttl + grace (3.05 s at x0.1)
	if at, ok := ctl.declaredAt(hosts[2]); !ok {
		ctl.mu.Lock()
		t.Errorf("dead compute-3 not declared within 5 s of its death after compute-1's rollup; decisions: %v", ctl.decisions)
		ctl.mu.Unlock()
	} else {
		t.Logf("compute-3 declared %.2f s after its death", at.Sub(died).Seconds())
	}
}

// startPermAgents starts a real agent core for each host on the
// nats-server at url, each with its own NATS user and host key; an
// agent runs until ctx ends or its cut func is called. stores are the
// agents' lease stores.
func startPermAgents(ctx context.Context, t *testing.T, url string, f fleet, hosts []string) (cut map[string]context.CancelFunc, stores map[string]*natslease.Store) {
	t.Helper()
	cut, stores = map[string]context.CancelFunc{}, map[string]*natslease.Store{}
	for _, h := range hosts {
		st, nc := permStore(t, url, "agent:"+h, f, h)
		actx, stop := context.WithCancel(ctx)
		cut[h], stores[h] = stop, st
		startAgentOn(actx, t, st, nc, h, hosts, nil)
	}
	return cut, stores
}

// permRig starts nats-server with the shipped permissions, real agent
// cores for hosts (each with its own NKey and host key, signing required,
// publishing beacons) and a controller Runner receiving them; the agent of
// dead (if any; its beacons must have reached the controller) runs until
// the returned die is called. attacker is compute-1's store (its NKey,
// its host key).
func permRig(t *testing.T, dead string) (f fleet, ctx context.Context, hosts []string, agents map[string]*agentRun, ctl *controllerRun, attacker *natslease.Store, anc *nats.Conn, die func()) {
	url := natspermtest.StartServer(t)
	hosts = []string{"compute-1.example.org", "compute-2.example.org", "compute-3.example.org"}
	f = newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dctx, die := context.WithCancel(ctx)
	agents = map[string]*agentRun{}
	for _, h := range hosts {
		st, nc := permStore(t, url, "agent:"+h, f, h)
		actx := ctx
		if h == dead {
			actx = dctx
		}
		agents[h] = startAgentOn(actx, t, st, nc, h, hosts, nil)
	}
	cst, cnc := permStore(t, url, "controller:ctl-1", f, "ctl")
	ctl = startControllerOn(ctx, t, cst, cnc)
	attacker, anc = permStore(t, url, "agent:"+hosts[0], f, hosts[0])
	time.Sleep(time.Second) // everybody renewing, the guard published
	if dead != "" && ctl.beaconCounts()[dead] == 0 {
		t.Fatalf("no beacon of %s received before its death: %v", dead, ctl.beaconCounts())
	}
	return f, ctx, hosts, agents, ctl, attacker, anc, die
}

// TestAgentCannotKeepDeadHostUndeclaredWithUnverifiableValues: compute-3
// dies; compute-1 writes, every second, a value into compute-3's key
// that the controller cannot verify — garbage, compute-3's last record
// without its signature, a record signed by a key nobody knows — or
// deletes the key. Before beacons every such value restarted compute-3's
// declaration clock (it "may be a genuine renewal this controller cannot
// verify") and a delete made it "never declared while the key is
// absent". Now a pinned host is declared over a delete, and an
// unverifiable value counts only when compute-3's own beacon names its
// revision — which compute-1 cannot publish (the shipped permissions).
func TestAgentCannotKeepDeadHostUndeclaredWithUnverifiableValues(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	unknown := newFleetOf(t, []string{dead}).signers[dead]
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, st *natslease.Store, last fencing.LeaseRecord, rev uint64, i int) error
	}{
		{"garbage", func(ctx context.Context, st *natslease.Store, _ fencing.LeaseRecord, _ uint64, _ int) error {
			_, err := st.KV.Put(ctx, "compute-3_example_org", []byte("not a record"))
			return err
		}},
		{"unsigned", func(ctx context.Context, st *natslease.Store, last fencing.LeaseRecord, _ uint64, i int) error {
			r := last
			r.Sig, r.Signer, r.Seq = "", "", last.Seq+uint64(i)+1
			b, _ := r.Encode()
			_, err := st.KV.Put(ctx, "compute-3_example_org", b)
			return err
		}},
		{"unknown-signer", func(ctx context.Context, st *natslease.Store, last fencing.LeaseRecord, rev uint64, i int) error {
			r := last
			r.Seq = last.Seq + uint64(i) + 1
			b, _ := unknown.Seal(r, rev).Encode()
			_, err := st.KV.Put(ctx, "compute-3_example_org", b)
			return err
		}},
		{"delete", func(ctx context.Context, st *natslease.Store, _ fencing.LeaseRecord, _ uint64, _ int) error {
			return st.KV.Delete(ctx, "compute-3_example_org")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx, _, _, ctl, attacker, anc, die := permRig(t, dead)
			die()
			time.Sleep(50 * time.Millisecond)
			last, rev, err := attacker.Read(ctx, dead)
			if err != nil {
				t.Fatal(err)
			}
			before := ctl.beaconCounts()[dead]
			died := time.Now()
			for i := 0; time.Since(died) < 6*time.Second; i++ {
				if _, ok := ctl.declaredAt(dead); ok {
					break
				}
				if err := tc.write(ctx, attacker, *last, rev, i); err != nil {
					t.Fatalf("compute-1's write refused: %v", err)
				}
				// ... and compute-1 publishes compute-3's beacon naming
				// the value it wrote: the server refuses it (compute-1
				// may publish only its own beacon subject).
				if e, err := attacker.KV.Get(ctx, "compute-3_example_org"); err == nil {
					if m, err := natslease.BeaconMsg(attacker.Signer, *last, e.Revision(), 0, time.Now()); err == nil {
						anc.PublishMsg(m)
					}
				}
				time.Sleep(time.Second) // < lease_ttl + grace (3.05 s at x0.1)
			}
			if _, ok := ctl.declaredAt(dead); !ok {
				t.Errorf("dead compute-3 not declared within 6 s (lease_ttl + grace = 3.05 s) while compute-1 wrote %s values into its key every second; invalid values said: %d, beacons received %v", tc.name, ctl.invalidCount(dead), ctl.beaconCounts())
			}
			if n := ctl.beaconCounts()[dead]; n != before {
				t.Errorf("compute-1's beacons for compute-3 reached the controller (%d after the death): the shipped permissions must refuse them", n-before)
			}
		})
	}
}
