package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing/natslease"
)

// TestRestartMemoryNATS: TestRestartMemoryBindsDeadHost with real agents,
// real controller runners and nats-server with the shipped permissions.
// compute-3 dies; the controller restarts (C1 stops, C2 starts on the
// same user) and lists compute-3's last genuine record; then compute-1's
// NATS user writes garbage into compute-3's key every 300 ms. Without the
// controllers' memory bucket C2 (no beacon of compute-3 ever received) is
// lenient and never declares it; with it (C1 remembered that compute-3's
// beacons bound it) C2 declares it by CAS over the garbage, and declares
// none of the live hosts.
func TestRestartMemoryNATS(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	for _, memory := range []bool{true, false} {
		t.Run(fmt.Sprintf("memory=%t", memory), func(t *testing.T) {
			r := memoryRig(t, dead, memory)
			url, hosts, f, ctx, open := r.url, r.hosts, r.f, r.ctx, r.open
			die := r.cut[dead]
			c1, stopC1 := open()
			attacker, _ := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
			time.Sleep(1500 * time.Millisecond) // renewing, beaconing, the guard published, remembered
			if c1.beaconCounts()[dead] == 0 {
				t.Fatalf("no beacon of %s reached C1", dead)
			}
			die()
			time.Sleep(600 * time.Millisecond)
			stopC1()
			time.Sleep(200 * time.Millisecond)
			c2, _ := open()
			started := time.Now()
			time.Sleep(500 * time.Millisecond) // C2 listed compute-3's last genuine record
			go func() {
				for ctx.Err() == nil {
					attacker.KV.Put(ctx, "compute-3_example_org", []byte("garbage")) //nolint:errcheck // the attack; refused writes are fine
					time.Sleep(300 * time.Millisecond)
				}
			}()
			// HiddenWriteWait: garbage after the listing's skips waits for
			// beacons a loss may have dropped with it (beaconloss.go).
			for time.Since(started) < 10*time.Second+controller.HiddenWriteWait {
				for _, h := range hosts[:2] {
					if _, ok := c2.declaredAt(h); ok {
						t.Fatalf("C2 declared the live %s", h)
					}
				}
				if at, ok := c2.declaredAt(dead); ok {
					if !memory {
						t.Fatalf("declared %s without the memory bucket: the test shows nothing", dead)
					}
					t.Logf("dead %s declared %s after C2 started (lease_ttl + grace 3.05 s)", dead, at.Sub(started).Round(100*time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			if memory {
				t.Errorf("dead %s not declared within 10 s + HiddenWriteWait of C2's start with garbage in its key every 300 ms (%d invalid values seen)", dead, c2.invalidCount(dead))
			}
		})
	}
}

// TestRestartPinNATS (c; reviewer X11's TestX11DeleteAtRestartBypassesMemory
// on nats-server with the shipped permissions and real agents and
// runners): compute-3 dies and compute-1 deletes its key (or writes
// garbage into it once) while C1 runs; C1 stops before it declares; C2
// starts and finds the key still at that revision: it takes compute-3's
// last trusted record from the memory's pin and declares it. Control
// pinMutation (TestRestartPinMutationNATS, sequential: the mutation is a
// package variable): not declared within 8 s.
func TestRestartPinNATS(t *testing.T) {
	t.Parallel()
	restartPinNATS(t, false)
}

func TestRestartPinMutationNATS(t *testing.T) { restartPinNATS(t, true) }

func restartPinNATS(t *testing.T, mutation bool) {
	const dead = "compute-3.example.org"
	for _, c := range []struct {
		attack   string
		mutation bool
	}{{"delete", false}, {"garbage", false}, {"delete", true}} {
		if c.mutation != mutation {
			continue
		}
		t.Run(fmt.Sprintf("%s/pinMutation=%t", c.attack, c.mutation), func(t *testing.T) {
			r := memoryRig(t, dead, true)
			url, hosts, f, ctx, cut, open := r.url, r.hosts, r.f, r.ctx, r.cut, r.open
			c1, stopC1 := open()
			attacker, _ := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
			time.Sleep(1500 * time.Millisecond) // renewing, beaconing, the guard published, remembered
			if c1.beaconCounts()[dead] == 0 {
				t.Fatalf("no beacon of %s reached C1", dead)
			}
			cut[dead]()
			var err error
			if c.attack == "delete" {
				err = attacker.KV.Delete(ctx, "compute-3_example_org")
			} else {
				_, err = attacker.KV.Put(ctx, "compute-3_example_org", []byte("garbage"))
			}
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(600 * time.Millisecond) // C1 saw it and wrote its memory
			stopC1()
			time.Sleep(200 * time.Millisecond)
			if c.mutation { // only then: parallel tests read it
				defer controller.SetPinMutation(true)()
			}
			c2, _ := open()
			started := time.Now()
			for time.Since(started) < 8*time.Second {
				for _, h := range hosts[:2] {
					if _, ok := c2.declaredAt(h); ok {
						t.Fatalf("C2 declared the live %s", h)
					}
				}
				if at, ok := c2.declaredAt(dead); ok {
					if c.mutation {
						t.Fatalf("declared %s with pinMutation: the test shows nothing", dead)
					}
					t.Logf("%s: dead %s declared %s after C2 started (lease_ttl + grace 3.05 s)", c.attack, dead, at.Sub(started).Round(100*time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !c.mutation {
				t.Errorf("%s: dead %s not declared within 8 s of C2's start", c.attack, dead)
			}
		})
	}
}

// memRig is memoryRig's: nats-server with the shipped permissions, the
// agents of hosts (cut: each agent's cut-off; stores: its lease store),
// and open, which starts controller ctl-1 (with the memory bucket if the
// rig has it) and returns its stop.
type memRig struct {
	url    string
	hosts  []string
	f      fleet
	ctx    context.Context
	cut    map[string]context.CancelFunc
	stores map[string]*natslease.Store
	open   func() (*controllerRun, context.CancelFunc)
}

// memoryRig starts a memRig of compute-1, compute-2 and last.
func memoryRig(t *testing.T, last string, memory bool) *memRig {
	t.Helper()
	r := &memRig{url: natspermtest.StartServer(t), hosts: []string{"compute-1.example.org", "compute-2.example.org", last}}
	r.f = newFleetOf(t, r.hosts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.ctx = ctx
	r.cut, r.stores = startPermAgents(ctx, t, r.url, r.f, r.hosts)
	r.open = func() (*controllerRun, context.CancelFunc) {
		cst, cnc := permStore(t, r.url, "controller:ctl-1", r.f, "ctl")
		var mem jetstream.KeyValue
		if memory {
			mem = controlBuckets(t, r.url, "controller:ctl-1").Memory
		}
		cctx, stop := context.WithCancel(ctx)
		return startControllerMem(cctx, t, cst, cnc, mem), stop
	}
	return r
}
