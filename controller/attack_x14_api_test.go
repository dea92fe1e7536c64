package controller_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/fencing/natslease"
)

// Reviewer X14: the reflection of X12 reaches the JetStream API itself.
// A direct get's answer is the stored message verbatim, published by the
// server (its JetStream internal client) in the requester's account on
// the reply subject the requester named. Named "$JS.API.…", that answer
// is a JetStream API request of the agents' account (HVGUARD): the
// service import adds the internal client's own Nats-Request-Info, and
// nothing checks a permission — the agent's NATS user is never asked.
// So any agent can delete, purge or re-configure the lease bucket's
// stream and the event stream, delete the controllers' durable consumer,
// create streams and consumers: everything an administrator of HVGUARD
// may do, with the request body it stored in a lease key it may write.
// The controllers' account (HVGUARD_CONTROL) is not reached: the answer is
// published in the account of the request.

// reflectAPI stores body in the attacker's reflection key and has the
// lease stream publish it on the JetStream API subject api (a request
// without a reply: the answer goes nowhere, the action is taken).
func reflectAPI(t *testing.T, ctx context.Context, st *natslease.Store, nc *nats.Conn, api, body string) {
	t.Helper()
	reflectWrites(t, ctx, st, nc, []byte(body), api)
}

// TestX14ReflectedLeaseStreamAPINATS (a) and (c): compute-1..3 renew
// (signing required, shipped permissions, real agent cores and
// controller runner); compute-3 dies. compute-1 — its own NATS user, its
// own lease key — reflects one JetStream API request:
//   - "stream-delete": $JS.API.STREAM.DELETE.KV_hvguard-leases: the
//     lease bucket is gone. The live compute-2 cannot renew and fences
//     (a); the dead compute-3 is never declared (c) — no bucket to
//     declare it in.
//
// Control "none": compute-2 never fences, compute-3 is declared.
func TestX14ReflectedLeaseStreamAPINATS(t *testing.T) {
	const (
		live = "compute-2.example.org"
		dead = "compute-3.example.org"
	)
	for _, tc := range []struct{ name, api, body string }{
		{"none", "", ""},
		{"stream-delete", "$JS.API.STREAM.DELETE." + natslease.StreamName, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx, _, agents, ctl, attacker, anc, die := permRig(t, dead)
			die()
			died := time.Now()
			if tc.api != "" {
				reflectAPI(t, ctx, attacker, anc, tc.api, tc.body)
				time.Sleep(200 * time.Millisecond)
				_, err := attacker.KV.Status(ctx)
				t.Logf("%s: the lease bucket after compute-1's reflected %s: %v", tc.name, tc.api, err)
			}
			for time.Since(died) < 6*time.Second {
				time.Sleep(200 * time.Millisecond)
			}
			bad := false
			if why := agents[live].fencedWhy(); len(why) > 0 {
				t.Errorf("%s: the live %s fenced (a): %v", tc.name, live, why)
				bad = true
			}
			if at, ok := ctl.declaredAt(dead); !ok {
				t.Errorf("%s: the dead %s not declared within 6 s of its death (c); %s", tc.name, dead, lastDecisions(ctl, 4))
				bad = true
			} else {
				t.Logf("%s: %s declared %.1f s after its death", tc.name, dead, at.Sub(died).Seconds())
			}
			if !bad {
				t.Logf("%s: %s did not fence", tc.name, live)
			}
		})
	}
}
