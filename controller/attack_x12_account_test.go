package controller_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// Reviewer X12's reflection against the controllers' own keys: an agent's
// NATS user is denied $KV.hvguard-leases._guard and _leader, but NATS
// checks a publisher's right on the subject it publishes to, not on the
// reply subject it names, and a direct get's answer (the stored value,
// verbatim) is published on that reply subject by the server, in the
// requester's account. So anything an agent stored can be written to any
// subject of the agents' account (HVGUARD), where a stream capturing it
// stores it. The controllers' lock, guard, memory and recovery buckets
// are therefore in their own account (HVGUARD_CONTROL, natsperm.
// ControlAccount; controller.ControlBucket), which no agent can reach.
// On the layout before (one account, lock and guard in the lease bucket)
// both tests below failed: C2 never declared the dead compute-3 (its
// ReadGuard failed on the garbage) and ctl-1 never could act.

// reflectWrites makes the lease stream publish data to each subject of
// subjs (subjects the agent holding st/nc may not publish to) as the
// answer of a direct get.
func reflectWrites(t *testing.T, ctx context.Context, st *natslease.Store, nc *nats.Conn, data []byte, subjs ...string) {
	t.Helper()
	if _, err := st.KV.Put(ctx, reflectKey, data); err != nil {
		t.Fatalf("the attacker's put refused: %v", err)
	}
	// The direct get (its answer: the stored message verbatim) is denied
	// to agents since X14 (natsperm.kvRead); the stream API's message get
	// is not, and its answer (JSON, the value base64'd inside) still lands
	// on any subject of the agents' account.
	get := "$JS.API.DIRECT.GET." + natslease.StreamName + ".$KV." + fencing.Bucket + "." + reflectKey
	msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
	body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
	for _, subj := range subjs {
		if err := nc.PublishRequest(get, subj, nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// reflected reports whether v is a reflected answer: the stored value
// verbatim (a direct get, before X14's fix) or a message get's answer.
func reflected(v []byte) bool {
	return string(v) == "x12-garbage" || strings.Contains(string(v), "stream_msg_get_response")
}

// TestX12ReflectedGuardGarbageNATS (c): compute-3 dies while controller
// C1 runs; C1 stops; compute-1 reflects garbage into the guard's keys —
// the agents' copy ($KV.hvguard-leases._guard: stored, the test checks)
// and the control bucket's subject ($KV.hvguard-control._guard, which in
// the agents' account no stream captures); C2 starts and declares the
// dead compute-3: it reads the guard from the controllers' account.
// Control "none": no garbage, declared as well.
func TestX12ReflectedGuardGarbageNATS(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	for _, attack := range []string{"none", "guard-garbage"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", "compute-2.example.org", dead}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, natsURL, f, hosts)
			startCtl := func() (*controllerRun, context.CancelFunc) {
				cst, cnc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
				cctx, stop := context.WithCancel(ctx)
				return startControllerCfg(cctx, t, cst, cnc, controllerCfgThreshold1(), nil), stop
			}
			attacker, anc := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			if _, err := attacker.KV.Put(ctx, fencing.GuardKey, []byte("direct")); err == nil {
				t.Fatal("control: the agent wrote _guard directly")
			}
			_, stopC1 := startCtl()
			time.Sleep(time.Second) // renewing, the guard published
			cut[dead]()
			stopC1()
			time.Sleep(200 * time.Millisecond)
			if attack == "guard-garbage" {
				reflectWrites(t, ctx, attacker, anc, []byte("x12-garbage"),
					"$KV."+fencing.Bucket+"."+fencing.GuardKey, "$KV."+controller.ControlBucket+"."+fencing.GuardKey)
				time.Sleep(200 * time.Millisecond)
				if e, err := attacker.KV.Get(ctx, fencing.GuardKey); err != nil || !reflected(e.Value()) {
					t.Fatalf("the reflection did not reach the agents' copy of _guard: %v %v", e, err)
				}
			}
			c2, _ := startCtl()
			started := time.Now()
			for time.Since(started) < 8*time.Second {
				if at, ok := c2.declaredAt(dead); ok {
					t.Logf("%s: %s declared %s after C2's start", attack, dead, at.Sub(started).Round(100*time.Millisecond))
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Fatalf("%s (dead) not declared 8 s after C2's start (%s); %s", dead, attack, lastDecisions(c2, 6))
		})
	}
}

// TestX12ReflectedLeaderLockStompNATS (c): compute-1's NATS user reflects
// garbage onto the leader lock's subjects every 300 ms — the old one in
// the lease bucket and the control bucket's, both in the agents' account.
// A LeaderRunner as ctl-1 on the control bucket (its account's user; TTL
// 1 s) may act within 2.5 s regardless. Control "none": the same without
// the stomping.
func TestX12ReflectedLeaderLockStompNATS(t *testing.T) {
	t.Parallel()
	for _, attack := range []string{"none", "stomp"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org"}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			attacker, anc := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			core, err := controller.NewLeader(fastLeader("ctl-1"))
			if err != nil {
				t.Fatal(err)
			}
			cb := controlBuckets(t, natsURL, "controller:ctl-1")
			lr := &controller.LeaderRunner{KV: cb.Control, Core: core, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			go func() { _ = lr.Run(ctx) }()
			start, acted := time.Now(), time.Duration(-1)
			for time.Since(start) < 4*time.Second {
				if attack == "stomp" {
					reflectWrites(t, ctx, attacker, anc, []byte("x12-garbage"),
						"$KV."+fencing.Bucket+"."+controller.LeaderKey, "$KV."+controller.ControlBucket+"."+controller.LeaderKey)
				}
				for range 30 {
					if acted < 0 && lr.MayAct(time.Now()) {
						acted = time.Since(start)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if acted < 0 {
				t.Fatalf("%s: ctl-1 (the only controller) never may act in 4 s", attack)
			}
			if acted > 2500*time.Millisecond {
				t.Fatalf("%s: ctl-1 may act only %s after its start", attack, acted.Round(10*time.Millisecond))
			}
			t.Logf("%s: ctl-1 may act %s after its start", attack, acted.Round(10*time.Millisecond))
			if attack == "stomp" {
				if e, err := attacker.KV.Get(ctx, controller.LeaderKey); err != nil || !reflected(e.Value()) {
					t.Fatalf("the reflection did not reach the lease bucket's _leader: %v %v", e, err)
				}
			}
		})
	}
}
