package controller_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// x17Keys is how many keys the attacker writes: 3000 one-message keys
// (~40 bytes each, a few hundred KB in the bucket).
const x17Keys = 3000

// x17Colliding returns the attacker's i-th key: three bytes from
// 0x80–0xBF, which are UTF-8 continuation bytes, so that every such key
// is invalid UTF-8 — distinct subjects for nats-server (it checks no
// encoding outside pedantic mode; the agent's permission $KV.
// hvguard-leases.* matches any token), but encoding/json writes each
// invalid byte as U+FFFD, so that in the stream-info answer all of them
// are the one JSON key "$KV.hvguard-leases.\ufffd\ufffd\ufffd".
func x17Colliding(i int) string {
	return string([]byte{0x80 + byte(i>>12&63), 0x80 + byte(i>>6&63), 0x80 + byte(i&63)})
}

// x17Distinct returns a made-up ASCII key (the control: as many keys,
// no collision).
func x17Distinct(i int) string { return fmt.Sprintf("x17-%05d", i) }

// x17WriteKeys publishes one message on each of the keys, as the agent
// user nc (a KV put without the acknowledgement), and waits until the
// lease stream holds them.
func x17WriteKeys(t *testing.T, nc *nats.Conn, keyOf func(int) string) {
	t.Helper()
	for i := 0; i < x17Keys; i++ {
		if err := nc.Publish("$KV."+fencing.Bucket+"."+keyOf(i), []byte("x17")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // stored (no ack asked)
}

// TestX17CollidingKeysFreezeAgentMembershipNATS (S/a, like X16's; reviewer
// X17, OPEN). Since 97d2a8f every agent lists the membership with
// natslease.Subjects: stream info of KV_hvguard-leases with
// subjects_filter "$KV.hvguard-leases.>", paged by offset, where offset
// advances by the number of keys of the decoded map and the loop ends at
// the answer's total. The server counts and pages raw subjects
// (SubjectsTotals, sorted, JSMaxSubjectDetails per page), but the answer
// is JSON: subjects that are invalid UTF-8 are all written as U+FFFD and
// collide in the map. So compute-1 (compromised, shipped permissions)
// writes 3000 keys of three continuation bytes (x17Colliding) — once; the
// keys stay listed (a delete marker is a message, and the agents count
// deleted keys as members by design) — and every agent's Subjects then
// gets 1 new map key per request: ~3000 requests, each making the server
// total and sort every subject, 13 s on this machine, against
// natslease.ReadTimeout (2 s) for the whole Store.Members. Members fails
// for every agent at every refresh; agent/fence.go readMembers keeps its
// cached membership and retries every second (membersRetry, each retry
// another 2 s of back-to-back stream-info requests per agent): no agent
// learns of a host that joined, and an agent started without a cache
// never gets a guard (it cannot be Held) — the freeze X16 found, for
// good. Here compute-3 joins after the write; compute-2's Members must
// list it. Controls: "none" (no keys) and "distinct" (as many made-up
// ASCII keys: listed in one page, compute-3 listed) — it is the
// collision, not the number of keys.
func TestX17CollidingKeysFreezeAgentMembershipNATS(t *testing.T) {
	t.Parallel()
	const joiner = "compute-3.example.org"
	for _, attack := range []string{"none", "distinct", "colliding"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", "compute-2.example.org", joiner}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			_, stores := startPermAgents(ctx, t, natsURL, f, hosts[:2])
			cst, cnc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
			startControllerCfg(ctx, t, cst, cnc, controllerCfgThreshold1(), nil)
			_, anc := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			switch attack {
			case "distinct":
				x17WriteKeys(t, anc, x17Distinct)
			case "colliding":
				x17WriteKeys(t, anc, x17Colliding)
			}
			startPermAgents(ctx, t, natsURL, f, []string{joiner})
			time.Sleep(time.Second) // compute-3 renewing; the controller publishes a new guard
			started := time.Now()
			m, g, err := stores[hosts[1]].Members(ctx)
			took := time.Since(started).Round(10 * time.Millisecond)
			// The listing without Members' bound: how long one agent's
			// Subjects takes (one stream-info request per colliding key),
			// for the report.
			lctx, lcancel := context.WithTimeout(ctx, 60*time.Second)
			defer lcancel()
			started = time.Now()
			keys, kerr := natslease.Subjects(lctx, stores[hosts[1]].NC)
			t.Logf("%s: Subjects without the 2 s bound: %d keys (with repeats), err %v, %s", attack, len(keys), kerr, time.Since(started).Round(10*time.Millisecond))
			if err != nil || !slices.Contains(m, joiner) || !g.Valid() {
				t.Fatalf("%s: compute-2's membership refresh (Store.Members) failed after %s or misses the joined %s: %d members, guard valid %v, err %v — readMembers keeps its cached membership",
					attack, took, joiner, len(m), g.Valid(), err)
			}
			t.Logf("%s: %d members (%s listed) in %s, guard version %d", attack, len(m), joiner, took, g.Version)
		})
	}
}
