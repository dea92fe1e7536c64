package controller_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
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
	t.Parallel()
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

// TestX14ReflectedEventStreamAPINATS: the same reflection against the
// event stream and the controllers' durable consumer on it — outside
// (a)/(S)/(c), but compute-2's genuine, signed event never reaches the
// fleet view and instance recovery ("never loses an event"). compute-1
// reflects (each request body a value it stored in a lease key):
//   - "none" (control): nothing; compute-2's stop is applied;
//   - "consumer-hijack": $JS.API.CONSUMER.DELETE of the controller's
//     durable (its name is public: controller.DurableName), then
//     $JS.API.CONSUMER.CREATE of a durable of that name with a deliver
//     policy and ack policy the controller's CreateOrUpdateConsumer cannot
//     update: the controller never consumes again;
//   - "stream-delete": $JS.API.STREAM.DELETE.HVGUARD_EVENTS: the agents
//     publish with create_stream false, nothing re-creates it;
//   - "control-account" (holds, the account split of e05abf6):
//     $JS.API.STREAM.DELETE.KV_hvguard-control, reflected in HVGUARD,
//     reaches no stream of HVGUARD_CONTROL (checked with ctl-1's
//     control user), compute-2's stop is applied.
func TestX14ReflectedEventStreamAPINATS(t *testing.T) {
	durable := controller.DurableName("ctl-1")
	hijack := `{"stream_name":"` + proto.StreamName + `","config":{"durable_name":"` + durable +
		`","deliver_policy":"new","ack_policy":"none","filter_subject":"hvguard.v1.nobody.lifecycle"}}`
	type req struct{ api, body string }
	for _, tc := range []struct {
		name string
		reqs []req
	}{
		{"none", nil},
		{"consumer-hijack", []req{{"$JS.API.CONSUMER.DELETE." + proto.StreamName + "." + durable, `{}`},
			{"$JS.API.CONSUMER.CREATE." + proto.StreamName + "." + durable, hijack}}},
		{"stream-delete", []req{{"$JS.API.STREAM.DELETE." + proto.StreamName, `{}`}}},
		{"control-account", []req{{"$JS.API.STREAM.DELETE.KV_" + controller.ControlBucket, `{}`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, attacker, anc := startAttackRig(ctx, t, durable)
			url, victim, f, cjs := r.url, r.hosts[1], r.f, r.cjs
			for _, r := range tc.reqs {
				reflectAPI(t, ctx, attacker, anc, r.api, r.body)
				time.Sleep(100 * time.Millisecond)
			}
			if tc.name == "control-account" {
				if _, err := controlBuckets(t, url, "controller:ctl-1").Control.Status(ctx); err != nil {
					t.Errorf("the control bucket after compute-1's reflection: %v", err)
				}
			}
			// compute-2's genuine stop, through its real outbox and
			// publisher, signed with its host key.
			publishGenuineStop(ctx, t, url, f, victim, time.Now().UTC())
			if r.applied(testUUID, 8*time.Second) {
				t.Logf("%s: compute-2's stop applied", tc.name)
				return
			}
			_, serr := cjs.Stream(ctx, proto.StreamName)
			var cfg any
			if ci, err := cjs.Consumer(ctx, proto.StreamName, durable); err == nil {
				cfg = ci.CachedInfo().Config
			} else {
				cfg = err
			}
			t.Errorf("%s: compute-2's genuine signed stop not applied within 8 s (event stream: %v; the controller's durable: %+v)", tc.name, serr, cfg)
		})
	}
}

// publishGenuineStop has host's real outbox and publisher (its NATS user,
// signed with its host key) send a stop of instance testUUID that
// instance recovery would act on; the publisher runs until ctx ends.
func publishGenuineStop(ctx context.Context, t *testing.T, url string, f fleet, host string, now time.Time) {
	t.Helper()
	appendStop(t, startOutbox(ctx, t, url, f, host), testUUID, now)
}

// startOutbox starts host's real outbox and publisher (its NATS user,
// signed with its host key); the publisher runs until ctx ends.
func startOutbox(ctx context.Context, t *testing.T, url string, f fleet, host string) *delivery.Outbox {
	t.Helper()
	nc := natspermtest.Connect(t, url, "agent:"+host)
	ob, err := delivery.OpenOutbox(t.TempDir(), delivery.OutboxConfig{Host: host}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	pub, err := delivery.NewPublisher(nc, ob, delivery.PublisherConfig{Signer: f.signers[host]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = pub.Run(ctx) }()
	return ob
}

// appendStop appends an unexpected stop of instance uuid (one instance
// recovery acts on) to ob.
func appendStop(t *testing.T, ob *delivery.Outbox, uuid string, now time.Time) {
	t.Helper()
	if err := ob.Append(&proto.LifecycleEvent{DomainUUID: uuid, DomainName: "instance-00000001", Transition: proto.TransitionStopped,
		State: "shutoff", LibvirtEvent: "STOPPED", LibvirtDetail: "FAILED", OccurredAt: now, ObservedAt: now,
		Classification: proto.ClassificationStoppedUnexpectedly, ClassificationReason: "no-operation"}); err != nil {
		t.Fatal(err)
	}
}

// TestX14ReflectedMsgIDSuppressesEventNATS: JetStream drops a message
// whose Nats-Msg-Id it stored within the stream's duplicate window (5
// min), and the agents' IDs are predictable (proto.MsgID: host,
// incarnation, seq). compute-1 learns compute-2's incarnation and seq by
// reading the event stream — through the same reflection: a
// $JS.API.CONSUMER.CREATE.HVGUARD_EVENTS request delivering compute-2's
// events to compute-1's own inbox. It then stores compute-2's last
// genuine event (its payload and signature headers, verbatim) with the
// Nats-Msg-Id of compute-2's NEXT event in a lease key and reflects it onto
// compute-2's lifecycle subject: stored, and applied by the controller as a
// duplicate (signed, same seq) — nothing refused, nothing logged. compute-2's
// next genuine event — an unexpected stop instance recovery would act on —
// is then acknowledged as a duplicate and never stored: its publisher
// considers it delivered. Outside (a)/(S)/(c) ("never loses an event").
// Control "none": the stop is applied.
func TestX14ReflectedMsgIDSuppressesEventNATS(t *testing.T) {
	t.Parallel()
	for _, attack := range []bool{false, true} {
		t.Run(map[bool]string{false: "none", true: "preempt"}[attack], func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := startEventRig(ctx, t)
			url, hosts, victim, f, cons := r.url, r.hosts, r.hosts[1], r.f, r.cons
			wait := r.applied
			ob := startOutbox(ctx, t, url, f, victim)
			const first = "11111111-2222-4333-8444-555555555555"
			appendStop(t, ob, first, time.Now().UTC())
			if !wait(first, 8*time.Second) {
				t.Fatal("compute-2's first event not applied")
			}
			if attack {
				attacker, anc := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
				subj, _ := proto.LifecycleSubject(victim)
				spy := proto.AgentInboxPrefix(hosts[0]) + ".x14spy"
				sub, err := anc.SubscribeSync(spy)
				if err != nil {
					t.Fatal(err)
				}
				reflectAPI(t, ctx, attacker, anc, "$JS.API.CONSUMER.CREATE."+proto.StreamName+".x14spy",
					`{"stream_name":"`+proto.StreamName+`","config":{"name":"x14spy","deliver_subject":"`+spy+
						`","deliver_policy":"last","ack_policy":"none","filter_subject":"`+subj+`"}}`)
				m, err := sub.NextMsg(5 * time.Second)
				if err != nil {
					// Agents may make no direct gets (natsperm.kvRead),
					// the lease stream allows none (natslease.
					// HardenStream): nothing to reflect.
					t.Logf("compute-1 read none of compute-2's events (%v): the reflection is closed", err)
					m = nil
				}
				preempt := func() {
					id := m.Header.Get(jetstream.MsgIDHeader)
					i := strings.LastIndex(id, ":")
					seq, err := strconv.ParseUint(id[i+1:], 10, 64)
					if err != nil {
						t.Fatalf("Nats-Msg-Id %q: %v", id, err)
					}
					next := id[:i+1] + strconv.FormatUint(seq+1, 10)
					t.Logf("compute-1 read compute-2's event %s; pre-empting %s", id, next)
					fake := nats.NewMsg("$KV." + fencing.Bucket + ".x14-preempt")
					fake.Data = m.Data
					for _, h := range []string{proto.EventSignerHeader, proto.EventSigHeader} {
						fake.Header.Set(h, m.Header.Get(h))
					}
					fake.Header.Set(jetstream.MsgIDHeader, next)
					ajs, _ := jetstream.New(anc)
					if _, err := ajs.PublishMsg(ctx, fake); err != nil {
						t.Fatal(err)
					}
					if err := anc.PublishRequest("$JS.API.DIRECT.GET."+natslease.StreamName+".$KV."+fencing.Bucket+".x14-preempt", subj, nil); err != nil {
						t.Fatal(err)
					}
					anc.Flush()
				}
				if m != nil {
					preempt()
				}
				time.Sleep(300 * time.Millisecond)
			}
			appendStop(t, ob, testUUID, time.Now().UTC())
			if !wait(testUUID, 8*time.Second) {
				t.Errorf("compute-2's genuine signed stop (its next event) not applied within 8 s; refused: %v", refusedCounts(cons))
			} else {
				t.Log("compute-2's stop applied")
			}
		})
	}
}

// eventRig: nats-server with the shipped permissions and ctl-1's event
// consumer (signing required: the fleet's keys of compute-1 and
// compute-2), recording the instances its fleet view applied.
type eventRig struct {
	url   string
	hosts []string
	f     fleet
	cjs   jetstream.JetStream
	cons  *controller.Consumer
	mu    sync.Mutex
	seen  []string
}

func startEventRig(ctx context.Context, t *testing.T) *eventRig {
	t.Helper()
	r := &eventRig{url: natspermtest.StartServer(t), hosts: []string{"compute-1.example.org", "compute-2.example.org"}}
	r.f = newFleetOf(t, r.hosts)
	r.cjs, _ = jetstream.New(natspermtest.Connect(t, r.url, "controller:ctl-1"))
	r.cons = &controller.Consumer{JS: r.cjs, ID: "ctl-1", Keys: r.f.ring, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnApplied: func(fe controller.FleetEvent, _ controller.Verdict) {
			r.mu.Lock()
			r.seen = append(r.seen, fe.DomainUUID)
			r.mu.Unlock()
		}}
	go func() { _ = r.cons.Run(ctx) }()
	return r
}

// startAttackRig is startEventRig once the controller's durable exists,
// with compute-1's store and connection (its agent user: the attacker).
func startAttackRig(ctx context.Context, t *testing.T, durable string) (*eventRig, *natslease.Store, *nats.Conn) {
	t.Helper()
	r := startEventRig(ctx, t)
	waitForDurable(ctx, t, r.cjs, durable)
	attacker, anc := permStore(t, r.url, "agent:"+r.hosts[0], r.f, r.hosts[0])
	return r, attacker, anc
}

// applied reports whether the fleet view applied an event of instance
// uuid within d.
func (r *eventRig) applied(uuid string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r.mu.Lock()
		ok := slices.Contains(r.seen, uuid)
		r.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}
