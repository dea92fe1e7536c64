package controller_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/proto"
)

type consRig struct {
	t   *testing.T
	js  jetstream.JetStream
	nc  *nats.Conn
	at  time.Time
	inc proto.Incarnation
}

func newConsRig(t *testing.T) *consRig {
	_, nc, js := controllertest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := delivery.EnsureStream(ctx, js, true); err != nil {
		t.Fatal(err)
	}
	return &consRig{t: t, js: js, nc: nc, at: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), inc: 0xabc}
}

// publish sends ev as the agent would (its subject, Msg-Id).
func (r *consRig) publish(ev proto.LifecycleEvent) {
	r.t.Helper()
	ev.Schema, ev.Incarnation = 1, r.inc
	ev.OccurredAt, ev.ObservedAt = r.at, r.at
	b, err := ev.Encode()
	if err != nil {
		r.t.Fatal(err)
	}
	subj, _ := proto.LifecycleSubject(ev.Host)
	r.raw(subj, b, proto.MsgID(ev.Host, ev.Incarnation, ev.Seq))
}

func (r *consRig) raw(subj string, b []byte, id string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: b, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
		r.t.Fatal(err)
	}
}

func dom(i int) string { return fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i) }

func (r *consRig) run(id string) (*controller.Consumer, context.CancelFunc, chan struct{}) {
	c := &controller.Consumer{JS: r.js, ID: id, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done })
	return c, cancel, done
}

func waitView(t *testing.T, c *controller.Consumer, host string, ok func(*controller.HostView) bool) *controller.HostView {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got *controller.HostView
		c.View(func(f *controller.Fleet) {
			if h := f.Host(host); h != nil && ok(h) {
				cp := *h
				got = &cp
			}
		})
		if got != nil {
			return got
		}
		if time.Now().After(deadline) {
			var h controller.HostView
			c.View(func(f *controller.Fleet) {
				if x := f.Host(host); x != nil {
					h = *x
				}
			})
			t.Fatalf("view of %s never matched: %+v", host, h)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The consumer against a real JetStream: a full report, events, a poison
// message (terminated and counted, the messages behind it applied), a
// duplicate under another Msg-Id (dropped by the view), missing seqs
// (stale until the next full report); a controller restart rebuilds the
// same view from the stream.
func TestConsumerFleetView(t *testing.T) {
	r := newConsRig(t)
	inv := proto.InventoryMessages("node1", "resync", []proto.InventoryDomain{{UUID: dom(1), Name: "i-1", State: "running"}, {UUID: dom(2), Name: "i-2", State: "shutoff"}})
	inv[0].Seq = 1
	r.publish(inv[0])
	r.publish(proto.LifecycleEvent{Host: "node1", Seq: 2, DomainUUID: dom(1), DomainName: "i-1", Transition: proto.TransitionStopped, Reason: "off-at-window-end", State: "shutoff",
		Classification: proto.ClassificationStoppedUnexpectedly, ClassificationReason: "no-operation"})
	r.raw("hvguard.v1.node1.lifecycle", []byte(`{"schema":1,"host":"node1","seq":"x"}`), "poison-1")
	r.publish(proto.LifecycleEvent{Host: "node1", Seq: 3, DomainUUID: dom(2), DomainName: "i-2", Transition: proto.TransitionStarted, Reason: "event", State: "running"})
	// The same event again under another Msg-Id (JetStream cannot dedup it).
	again := proto.LifecycleEvent{Host: "node1", Seq: 3, DomainUUID: dom(2), DomainName: "i-2", Transition: proto.TransitionStarted, Reason: "event", State: "running"}
	ev, _ := func() ([]byte, error) {
		again.Schema, again.Incarnation, again.OccurredAt, again.ObservedAt = 1, r.inc, r.at, r.at
		return again.Encode()
	}()
	r.raw("hvguard.v1.node1.lifecycle", ev, "dup-of-3")
	// A message on another host's subject claiming to be node1: refused.
	r.raw("hvguard.v1.node2.lifecycle", ev, "spoof-1")

	c, cancel, done := r.run("ctl-a")
	h := waitView(t, c, "node1", func(h *controller.HostView) bool { return h.LastSeq == 3 })
	if h.Stale || h.Domains[dom(1)].State != "shutoff" || h.Domains[dom(1)].Classification != "stopped-unexpectedly" || h.Domains[dom(2)].State != "running" {
		t.Fatalf("view: stale=%v %q, domains %+v %+v", h.Stale, h.StaleReason, h.Domains[dom(1)], h.Domains[dom(2)])
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats.Poison.Load() != 2 || c.Stats.Duplicates.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("poison %d (want 2: undecodable, host/subject mismatch), duplicates %d (want 1)", c.Stats.Poison.Load(), c.Stats.Duplicates.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Seqs 4..5 lost: stale, then a full report makes it exact again.
	r.publish(proto.LifecycleEvent{Host: "node1", Seq: 6, DomainUUID: dom(2), DomainName: "i-2", Transition: proto.TransitionSuspended, Reason: "event", State: "paused"})
	h = waitView(t, c, "node1", func(h *controller.HostView) bool { return h.LastSeq == 6 })
	if !h.Stale || h.StaleReason != "seq 4..5 missing" {
		t.Fatalf("after missing seqs: stale=%v %q", h.Stale, h.StaleReason)
	}
	inv = proto.InventoryMessages("node1", "gap", []proto.InventoryDomain{{UUID: dom(2), Name: "i-2", State: "paused"}})
	inv[0].Seq = 7
	r.publish(inv[0])
	h = waitView(t, c, "node1", func(h *controller.HostView) bool { return h.LastSeq == 7 })
	if h.Stale || len(h.Domains) != 1 || h.Domains[dom(2)].State != "paused" {
		t.Fatalf("after the full report: stale=%v domains %+v", h.Stale, h.Domains)
	}

	// The controller restarts: a new process rebuilds the same view.
	cancel()
	<-done
	c2, _, _ := r.run("ctl-a")
	h2 := waitView(t, c2, "node1", func(h *controller.HostView) bool { return h.LastSeq == 7 })
	if h2.Stale || len(h2.Domains) != 1 || h2.Domains[dom(2)].State != "paused" {
		t.Fatalf("rebuilt view: stale=%v domains %+v", h2.Stale, h2.Domains)
	}
	if c2.Stats.Poison.Load() != 2 {
		t.Fatalf("rebuilt: poison %d, want the same 2 (terminated messages stay in the stream; each run terminates them once)", c2.Stats.Poison.Load())
	}
}
