package controller_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/proto"
)

// x17Outbox starts host's real outbox (in a new directory) and publisher
// like startOutbox; legacy: the outbox's state.json has no incarnation,
// as an outbox created by an agent of a release before incarnations (kept
// so after the upgrade: its Msg-Ids stay <host>:<seq>).
func x17Outbox(ctx context.Context, t *testing.T, url string, f fleet, host string, legacy bool) *delivery.Outbox {
	t.Helper()
	dir := t.TempDir()
	ob, err := delivery.OpenOutbox(dir, delivery.OutboxConfig{Host: host}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if legacy {
		if err := ob.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "state.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var st map[string]any
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		delete(st, "incarnation")
		if b, err = json.Marshal(st); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if ob, err = delivery.OpenOutbox(dir, delivery.OutboxConfig{Host: host}, nil); err != nil {
			t.Fatal(err)
		}
		// Nothing unacked: the reopened outbox draws an incarnation
		// (agent/delivery, loadIncarnation); before, it kept none.
		t.Logf("legacy outbox reopened with incarnation %v", ob.Stats().Incarnation)
	}
	t.Cleanup(func() { ob.Close() })
	nc := natspermtest.Connect(t, url, "agent:"+host)
	pub, err := delivery.NewPublisher(nc, ob, delivery.PublisherConfig{Signer: f.signers[host]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = pub.Run(ctx) }()
	return ob
}

// TestX17PreemptedLegacyMsgIDNATS (lost event; reviewer X17, closed: a
// legacy outbox draws an incarnation at the first start with nothing
// unacked — before, it kept none and "legacy" failed). X14 pre-empted compute-2's next
// event by its Nats-Msg-Id after reading it through a reflection; the
// reads are closed since. But JetStream deduplicates by Nats-Msg-Id over
// the whole stream, whatever the subject, and an outbox created by an
// agent of a release before incarnations keeps the Msg-Ids <host>:<seq>
// after the upgrade, until it is recreated (agent/delivery, "outbox
// created before incarnations"). Nothing to read then: compute-1
// (shipped permissions) counts compute-2's lifecycle messages with the
// stream info it may ask ($JS.API.STREAM.INFO.HVGUARD_EVENTS,
// subjects_filter: compute-2's subject) and publishes on its OWN
// lifecycle subject — its own right — messages with the Msg-Ids
// compute-2.example.org:<count+1 … count+20>. compute-2's next genuine
// signed stop (seq 2) is acknowledged as a duplicate and never stored:
// its publisher takes it as delivered, the controllers' consumer never
// sees it, instance recovery never acts. The window is 5 minutes; the
// attacker repeats. Controls: "none" (no pre-emption) and "incarnation"
// (the same pre-emption against an outbox with an incarnation: its IDs
// <host>:<incarnation>:<seq> are not guessed) — the stop is applied.
func TestX17PreemptedLegacyMsgIDNATS(t *testing.T) {
	for _, tc := range []struct {
		name            string
		legacy, preempt bool
	}{{"none", true, false}, {"incarnation", false, true}, {"legacy", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := startEventRig(ctx, t)
			attacker, victim := r.hosts[0], r.hosts[1]
			ob := x17Outbox(ctx, t, r.url, r.f, victim, tc.legacy)
			const first = "11111111-2222-4333-8444-555555555555"
			appendStop(t, ob, first, time.Now().UTC())
			if !r.applied(first, 8*time.Second) {
				t.Fatal("compute-2's first event not applied")
			}
			if tc.preempt {
				ajs, _ := jetstream.New(natspermtest.Connect(t, r.url, "agent:"+attacker))
				vsubj, _ := proto.LifecycleSubject(victim)
				s, err := ajs.Stream(ctx, proto.StreamName)
				if err != nil {
					t.Fatal(err)
				}
				info, err := s.Info(ctx, jetstream.WithSubjectFilter(vsubj))
				if err != nil {
					t.Fatal(err)
				}
				count := info.State.Subjects[vsubj]
				t.Logf("compute-1 counts %d of compute-2's lifecycle messages (stream info)", count)
				own, _ := proto.LifecycleSubject(attacker)
				for n := count + 1; n <= count+20; n++ {
					if _, err := ajs.Publish(ctx, own, []byte("x17"), jetstream.WithMsgID(proto.MsgID(victim, 0, n))); err != nil {
						t.Fatal(err)
					}
				}
			}
			appendStop(t, ob, testUUID, time.Now().UTC())
			if !r.applied(testUUID, 8*time.Second) {
				t.Fatalf("%s: compute-2's genuine signed stop (its next event) not applied within 8 s; refused: %v", tc.name, refusedCounts(r.cons))
			}
			t.Logf("%s: compute-2's stop applied", tc.name)
		})
	}
}
