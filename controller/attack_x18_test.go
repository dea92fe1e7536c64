package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X18: attacks on the restart memory's pin (memory.go,
// Memory.Pin): a controller that (re)starts and finds a host's key at
// the pin's revision takes its record and declares it.

// x18Recreate models the lease stream deleted and re-created (docs:
// security.md "What is left", operations "revision-regressed ... restart
// the controllers"): every key is gone and the stream's sequences start
// again from 1; the controllers' memory bucket (a separate bucket) and
// the published guard (control bucket) stay. No controller runs.
func (b *x11Bucket) x18Recreate() {
	b.stop()
	b.keys = map[string]x11Entry{}
	b.rev = 0
}

// TestX18StalePinTakenAfterStreamRecreated (S): a pin outlives the key
// state it described. Observe drops h.pin when a trusted value arrives
// but never rewrites the memory (rememberHost is not called): the pin
// stays in MemoryBucket for good, "refused by its revision". That holds
// only while revisions never repeat; a lease stream deleted and re-created
// (a documented operation: revision-regressed says "restart the
// controllers") restarts them from 1.
//
// h0..h9, signing required, C1 leader with the memory. A compromised node
// (h9: its own key, the shipped permissions) writes garbage into the live
// h3's key; the PubAck tells it the revision G. C1 pins h3 {active
// record, KeyRev G}. h3 renews at once (alive): C1 forgets its pin, the
// memory keeps it. Later the lease stream is re-created; the agents
// re-create their keys (fresh creates). h3's agent then stops in order:
// its withdrawal lands (guests keep running, unprotected: never to be
// declared). The compromised node renews its own key until the stream's
// sequence is G-1 (it reads each PubAck) and writes garbage into h3's key:
// revision G again. A controller (re)starts (the operator's restart after
// the re-creation, or any later one): h3's key holds only an untrusted
// value at revision G, the stale pin's KeyRev: it takes h3's ACTIVE
// record from the old stream and declares the withdrawn h3 lease_ttl +
// grace after its start, by CAS over the garbage — its guests are
// evacuated while they run. Before the pin (pinMutation) h3 was never
// declared (untrusted value only).
//
// "c2-saw-withdrawal": a controller C2 ran on the new stream and saw
// h3's withdrawal and the garbage over it (no pin: state withdrawn) — it
// does not clear the stale pin either (pin returns without a memory
// write when neither its state nor the new one is a pin); C3 takes it.
// Controls: pinMutation; the garbage at G+1 (the revision matters, the
// rig is sound).
func TestX18StalePinTakenAfterStreamRecreated(t *testing.T) {
	for _, c := range []struct {
		name      string
		sawByC2   bool
		offset    uint64
		pinMutate bool
	}{
		{name: "restart-after-recreate"},
		{name: "c2-saw-withdrawal", sawByC2: true},
		{name: "control-pinMutation", pinMutate: true},
		{name: "control-other-revision", offset: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			pinMutation = c.pinMutate
			defer func() { pinMutation = false }()
			b, hosts := x11Fleet(t, 10, 10)
			at := t0.Add(10 * time.Second)
			b.garbage(at, "h3") // the compromised h9's write; its PubAck says G
			g := b.rev
			if p := b.mem["h3"].Pin; !c.pinMutate && (p == nil || p.KeyRev != g) {
				t.Fatalf("C1 pinned %+v, want KeyRev %d", p, g)
			}
			b.run(at, 3, hosts, nil) // h3 is alive: it renews over the garbage
			if r := b.tr.hosts["h3"]; r.pin != nil || r.trustedRev <= g {
				t.Fatalf("h3 not renewed over the garbage: %+v", r)
			}
			if p := b.mem["h3"].Pin; !c.pinMutate && p == nil {
				t.Fatal("the memory no longer holds the pin (the stale-pin premise is gone)")
			}
			// The lease stream is deleted and re-created.
			b.x18Recreate()
			at = at.Add(time.Minute)
			for _, h := range hosts { // agents re-create their keys
				b.write(at, h, fencing.LeaseActive, b.guard.Ref())
			}
			if c.sawByC2 {
				b.start(at)
				b.run(at, 2, hosts, nil)
			}
			at = at.Add(5 * time.Second)
			b.write(at, "h3", fencing.LeaseWithdrawn, b.guard.Ref()) // h3's orderly stop
			if b.rev >= g {
				t.Fatalf("the new stream passed G=%d already (%d): rig", g, b.rev)
			}
			for b.rev+1 < g+c.offset { // the compromised h9 renews its own key
				b.write(at, "h9", fencing.LeaseActive, b.guard.Ref())
			}
			b.garbage(at, "h3")
			if b.keys["h3"].rev != g+c.offset {
				t.Fatalf("garbage at %d, want %d", b.keys["h3"].rev, g+c.offset)
			}
			b.stop()
			start := at.Add(2 * time.Second)
			b.start(start)
			host, after := b.run(start, 120, x11Without(hosts, "h3"), map[string]bool{"h3": true})
			switch {
			case host != "" && (c.pinMutate || c.offset != 0):
				t.Fatalf("control: %s declared %s after the start", host, after)
			case host != "":
				t.Fatalf("the withdrawn h3 (guests running) declared %s after the controller's start: a pin written in the OLD lease stream (KeyRev %d) taken over a garbage value at the same revision of the re-created one", after, g)
			}
		})
	}
}
