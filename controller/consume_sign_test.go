package controller_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/proto"
)

// TestConsumerEventSigningModes: the consumer verifies each event against
// the key of the host its subject names before the fleet view (and
// OnApplied: instance recovery) sees it. h0's subject gets an unsigned
// event (seq 1), one signed by h1's key (seq 2) and a genuine one signed
// by h0's key (seq 3). Required: only seq 3 is applied; optional: the
// unsigned one too (a signed event must verify); off: all three. Refused
// events are counted by reason and terminated (nothing left pending, no
// redelivery).
func TestConsumerEventSigningModes(t *testing.T) {
	f := newFleetOf(t, []string{"h0", "h1"})
	for _, c := range []struct {
		mode    fencing.SigningMode
		applied []uint64
		refused map[string]uint64
	}{
		{fencing.SigningRequired, []uint64{3}, map[string]uint64{fencing.EventUnsigned: 1, fencing.EventForeignKey: 1}},
		{fencing.SigningOptional, []uint64{1, 3}, map[string]uint64{fencing.EventForeignKey: 1}},
		{fencing.SigningOff, []uint64{1, 2, 3}, map[string]uint64{}},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			r := newConsRig(t)
			ring := *f.ring
			ring.Mode = c.mode
			var mu sync.Mutex
			var applied []uint64
			cons := &controller.Consumer{JS: r.js, ID: "c1", Keys: &ring, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				OnApplied: func(fe controller.FleetEvent, _ controller.Verdict) {
					mu.Lock()
					applied = append(applied, fe.Seq)
					mu.Unlock()
				}}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = cons.Run(ctx) }()
			defer func() { cancel(); <-done }()

			subj, _ := proto.LifecycleSubject("h0")
			for _, e := range []struct {
				seq uint64
				by  string
			}{{1, ""}, {2, "h1"}, {3, "h0"}} {
				ev := proto.LifecycleEvent{Schema: 1, Host: "h0", Incarnation: r.inc, Seq: e.seq, DomainUUID: dom(1), Transition: proto.TransitionStarted,
					State: "running", OccurredAt: r.at, ObservedAt: r.at}
				b, err := ev.Encode()
				if err != nil {
					t.Fatal(err)
				}
				m := delivery.EventMsg(subj, b, f.signers[e.by]) // "": the zero Signer
				m.Header.Set(jetstream.MsgIDHeader, proto.MsgID("h0", r.inc, e.seq))
				if _, err := r.js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			waitView(t, cons, "h0", func(h *controller.HostView) bool { return h.LastSeq == 3 })
			mu.Lock()
			got := slices.Clone(applied)
			mu.Unlock()
			if !slices.Equal(got, c.applied) {
				t.Errorf("applied seqs %v, want %v", got, c.applied)
			}
			if r := refusedCounts(cons); !maps.Equal(r, c.refused) {
				t.Errorf("refused %v, want %v", r, c.refused)
			}
			// Terminated, not pending: nothing is redelivered.
			deadline := time.Now().Add(5 * time.Second)
			for {
				cc, err := r.js.Consumer(ctx, proto.StreamName, controller.DurableName("c1"))
				if err != nil {
					t.Fatal(err)
				}
				info, err := cc.Info(ctx)
				if err == nil && info.NumAckPending == 0 && info.NumRedelivered == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("consumer info: %+v %v", info, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
