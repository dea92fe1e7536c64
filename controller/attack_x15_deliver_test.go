package controller_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// Reviewer X15: X14's reflection without a direct get. An agent could
// create consumers on the lease bucket's stream ($JS.API.CONSUMER.CREATE.
// KV_hvguard-leases.>, for nats.go's ordered consumers: watch, keys;
// refused since, natsperm.kvGet — the tests below keep the attack steps,
// logged when refused), and a push consumer's config names its
// deliver_subject — any literal subject (the server refuses only
// wildcards and a cycle into the stream's own subjects). The consumer
// delivers each stored message (data and stored headers), published by
// the stream's JetStream client in the agents' account. What that reaches
// (nats-server v2.15.2, measured here):
//   - a delivery keeps the message's stored subject ($KV.hvguard-leases.
//     <key>) for everybody it reaches: the $JS.API.> service import then
//     forwards it under that subject, and the JetStream API ignores it —
//     unlike a direct get's answer, a delivery onto $JS.API.STREAM.DELETE
//     executes nothing (TestX15DeliveredLeaseStreamAPINATS,
//     both held);
//   - but the server's own internal subscriptions whose handlers ignore
//     the subject take it: every consumer of HVGUARD has literal ones on
//     $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> (a pull request) and
//     $JS.API.CONSUMER.RESET.<stream>.<consumer> (a reset to any
//     sequence), and a push consumer is active (delivers) exactly when its
//     deliver subject has a literal subscription. The controllers'
//     durable on HVGUARD_EVENTS has a public name
//     (controller.DurableName): TestX15DeliveredConsumerResetNATS.

// reflectByDelivery stores body in the attacker's reflection key and
// creates an ephemeral push consumer on the lease stream, filtered on
// that key, delivering its last message to subj (a subject the agent may
// not publish to). The request itself is one the shipped permissions
// allow every agent.
func reflectByDelivery(t *testing.T, ctx context.Context, st *natslease.Store, nc *nats.Conn, subj, body string) {
	t.Helper()
	if _, err := st.KV.Put(ctx, reflectKey, []byte(body)); err != nil {
		t.Logf("the attacker's put refused (nothing reflected): %v", err)
		return
	}
	name := nats.NewInbox()[len("_INBOX."):]
	req, _ := json.Marshal(map[string]any{
		"stream_name": natslease.StreamName,
		"config": map[string]any{
			"name":               name,
			"deliver_subject":    subj,
			"deliver_policy":     "last_per_subject",
			"ack_policy":         "none",
			"filter_subject":     "$KV." + fencing.Bucket + "." + reflectKey,
			"inactive_threshold": int64(2 * time.Second),
		},
	})
	m, err := nc.Request("$JS.API.CONSUMER.CREATE."+natslease.StreamName+"."+name, req, 2*time.Second)
	if err != nil {
		t.Logf("compute-1's consumer create refused (nothing reflected): %v", err)
		return
	}
	t.Logf("consumer create delivering to %s: %s", subj, firstN(string(m.Data), 160))
}

func firstN(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// TestX15DeliveredLeaseStreamAPINATS (a) and (c), held: X14's
// TestX14ReflectedLeaseStreamAPINATS with a push consumer's delivery as
// the reflector (direct gets now denied): compute-1..3 renew (signing
// required, shipped permissions, real agent cores and controller runner);
// compute-1 has "{}" delivered to $JS.API.STREAM.DELETE.KV_hvguard-leases
// and compute-3 dies:
//   - "delivery" (reflectByDelivery): nothing has a literal subscription
//     there, the consumer never delivers;
//   - "retarget" (reflectByRetarget): delivered, but under its stored
//     $KV subject, which the JetStream API ignores.
//
// The bucket stays, compute-2 does not fence, compute-3 is declared.
// Control "own-inbox": reflectByDelivery to compute-1's own inbox.
func TestX15DeliveredLeaseStreamAPINATS(t *testing.T) {
	t.Parallel()
	const (
		live = "compute-2.example.org"
		dead = "compute-3.example.org"
	)
	del := "$JS.API.STREAM.DELETE." + natslease.StreamName
	for _, tc := range []struct {
		name, subj string
		reflect    func(*testing.T, context.Context, *natslease.Store, *nats.Conn, string, string)
	}{
		{"own-inbox", "", reflectByDelivery},
		{"delivery", del, reflectByDelivery},
		{"retarget", del, reflectByRetarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx, _, agents, ctl, attacker, anc, die := permRig(t, dead)
			subj := tc.subj
			if subj == "" {
				subj = anc.NewInbox()
			}
			tc.reflect(t, ctx, attacker, anc, subj, `{}`)
			die()
			died := time.Now()
			time.Sleep(1500 * time.Millisecond) // the retargeted delivery lands 1.2 s after the update
			_, err := attacker.KV.Status(ctx)
			t.Logf("%s: the lease bucket after compute-1's consumer delivering to %s: %v", tc.name, subj, err)
			for time.Since(died) < 6*time.Second {
				time.Sleep(200 * time.Millisecond)
			}
			if why := agents[live].fencedWhy(); len(why) > 0 {
				t.Errorf("%s: the live %s fenced (a): %v", tc.name, live, why)
			}
			if at, ok := ctl.declaredAt(dead); !ok {
				t.Errorf("%s: the dead %s not declared within 6 s of its death (c); %s", tc.name, dead, lastDecisions(ctl, 4))
			} else {
				t.Logf("%s: %s declared %.1f s after its death", tc.name, dead, at.Sub(died).Seconds())
			}
		})
	}
}

// TestX15DeliveredConsumerResetNATS: a push consumer is active only
// while its deliver subject has a literal subscription in the account —
// and every consumer of HVGUARD has two: the server's own internal
// subscriptions to $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> and
// $JS.API.CONSUMER.RESET.<stream>.<consumer>. compute-1 stores
// {"seq":1000000} in a lease key and creates a push consumer on the lease
// stream delivering it to $JS.API.CONSUMER.RESET.HVGUARD_EVENTS.<the
// controllers' durable> (its name is public: controller.DurableName).
// The server takes the delivery as a consumer reset (the durable's
// deliver policy is all: any sequence allowed): the durable now starts at
// stream sequence 1000000 and the controller is delivered nothing below
// it — compute-2's genuine, signed stop is never applied (outside a/S/c:
// "never loses an event"; the fleet view and instance recovery starve,
// as with X14's consumer hijack). Closed: agents may create no consumer
// (natsperm.kvGet; the consumer create is refused and logged above), so
// the stop is applied; with the agents' former CONSUMER.CREATE.
// KV_hvguard-leases.> this failed (durable delivered stream seq 999999).
//
// Control "own-inbox": the same consumer delivering to compute-1's own
// inbox (subscribed): compute-2's stop is applied.
func TestX15DeliveredConsumerResetNATS(t *testing.T) {
	t.Parallel()
	durable := controller.DurableName("ctl-1")
	for _, tc := range []struct{ name, subj string }{
		{"own-inbox", ""},
		{"consumer-reset", "$JS.API.CONSUMER.RESET." + proto.StreamName + "." + durable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, attacker, anc := startAttackRig(ctx, t, durable)
			url, victim, f, cjs := r.url, r.hosts[1], r.f, r.cjs
			subj := tc.subj
			if subj == "" {
				sub, err := anc.SubscribeSync(anc.NewRespInbox())
				if err != nil {
					t.Fatal(err)
				}
				subj = sub.Subject
			}
			reflectByDelivery(t, ctx, attacker, anc, subj, `{"seq":1000000}`)
			time.Sleep(200 * time.Millisecond)
			publishGenuineStop(ctx, t, url, f, victim, time.Now().UTC())
			if r.applied(testUUID, 8*time.Second) {
				t.Logf("%s: compute-2's stop applied", tc.name)
				return
			}
			var state any
			if ci, err := cjs.Consumer(ctx, proto.StreamName, durable); err == nil {
				state = ci.CachedInfo().Delivered
			} else {
				state = err
			}
			t.Errorf("%s: compute-2's genuine signed stop not applied within 8 s (the controller's durable delivered: %+v)", tc.name, state)
		})
	}
}

// waitForDurable waits (5 s at most) until the controllers' durable
// consumer durable exists on the event stream.
func waitForDurable(ctx context.Context, t *testing.T, cjs jetstream.JetStream, durable string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := cjs.Consumer(ctx, proto.StreamName, durable); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the controller's durable never created: %v", err)
		}
	}
}

// reflectByRetarget makes a push consumer on the lease stream deliver a
// value compute-1 stored to subj although subj has no subscriber: a
// consumer checks its deliver subject's interest only when it waits for
// messages, and with replay policy "original" it sleeps, between two
// deliveries, as long as the stored messages' timestamps lie apart —
// without waiting for messages. compute-1 stores three values under its
// made-up keys x15r-1..3, the first two 1 s apart; creates a push
// consumer delivering them to its own inbox (subscribed: interest, the
// consumer is active); takes the first, unsubscribes and — during the
// replay sleep — updates the consumer's deliver subject to subj (allowed:
// the old subject has no interest any more). The loop delivers the
// second (its subject taken before the sleep) to the inbox and the third
// to subj: the server never looked at subj's interest in between.
func reflectByRetarget(t *testing.T, ctx context.Context, st *natslease.Store, nc *nats.Conn, subj, body string) {
	t.Helper()
	for i, gap := range []time.Duration{time.Second, 200 * time.Millisecond, 0} {
		if _, err := st.KV.Put(ctx, "x15r-"+strconv.Itoa(i+1), []byte(body)); err != nil {
			t.Logf("the attacker's put refused (nothing reflected): %v", err)
			return
		}
		time.Sleep(gap)
	}
	inbox, err := nc.SubscribeSync(nc.NewInbox()) // a literal subject
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	name := nats.NewInbox()[len("_INBOX."):]
	cfg := map[string]any{
		"name":               name,
		"deliver_subject":    inbox.Subject,
		"deliver_policy":     "all",
		"replay_policy":      "original",
		"ack_policy":         "none",
		"filter_subjects":    []string{"$KV." + fencing.Bucket + ".x15r-1", "$KV." + fencing.Bucket + ".x15r-2", "$KV." + fencing.Bucket + ".x15r-3"},
		"inactive_threshold": int64(5 * time.Second),
	}
	create := func(action string) bool {
		req, _ := json.Marshal(map[string]any{"stream_name": natslease.StreamName, "config": cfg, "action": action})
		m, err := nc.Request("$JS.API.CONSUMER.CREATE."+natslease.StreamName+"."+name, req, 2*time.Second)
		if err != nil {
			t.Logf("compute-1's consumer %s refused (nothing reflected): %v", action, err)
			return false
		}
		t.Logf("consumer %s delivering to %s: %s", action, cfg["deliver_subject"], firstN(string(m.Data), 200))
		return true
	}
	if !create("create") {
		return
	}
	if _, err := inbox.NextMsg(2 * time.Second); err != nil {
		t.Logf("no first delivery (nothing reflected): %v", err)
		return
	}
	if err := inbox.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	cfg["deliver_subject"] = subj
	create("update")
}
