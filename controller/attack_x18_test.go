package controller

import (
	"sort"
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
	b.stream = "stream-2" // a new creation time (Runner: streamID)
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
	// Fixed twice: a dropped pin is rewritten out of the memory
	// (Observe), and a pin is taken only in the lease stream it was
	// written for (MemoryPin.Stream, Tracker.SetStream). "stale-in-memory"
	// puts the old pin back into the memory (an earlier release's, or a
	// rewrite that failed) so that the stream's identity alone must
	// refuse it.
	for _, c := range []struct {
		name      string
		sawByC2   bool
		offset    uint64
		pinMutate bool
		inject    bool
	}{
		{name: "restart-after-recreate"},
		{name: "c2-saw-withdrawal", sawByC2: true},
		{name: "stale-in-memory", inject: true},
		{name: "stale-in-memory-c2-saw-withdrawal", inject: true, sawByC2: true},
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
			stale := b.mem["h3"]
			if p := stale.Pin; !c.pinMutate && (p == nil || p.KeyRev != g) {
				t.Fatalf("C1 pinned %+v, want KeyRev %d", p, g)
			}
			b.run(at, 3, hosts, nil) // h3 is alive: it renews over the garbage
			if r := b.tr.hosts["h3"]; r.pin != nil || r.trustedRev <= g {
				t.Fatalf("h3 not renewed over the garbage: %+v", r)
			}
			if p := b.mem["h3"].Pin; p != nil {
				t.Fatalf("the memory still holds the dropped pin %+v", p)
			}
			if c.inject {
				b.mem["h3"] = stale
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

// TestX18TakeoverPinEndsHold (S): a standby that takes over restores the
// memory (Runner: restoreMemory at every first acting tick), and a pin
// it takes gives the host lastSeen = now: a Held host that the standby
// counted silent for minutes (no trusted record: counted from
// minSilentAft on, invalid.go) stops counting at once, while the rest of
// its rack has long been due in the standby's tracker.
//
// 60 hosts, threshold 10; the rack h1..h12 is cut off and Held (its
// agents hold by 1 + 11 peers > 10 + lying_peers 1); C1, the leader,
// holds. A compromised node writes garbage into the Held h11's and h12's
// keys: C1 pins both (their last trusted records active, no skip, no
// withdrawal beacon) — a pin of a host that is not dead but Held. The
// standby S is (re)started after the garbage (an upgrade): h11 and h12
// hold only untrusted values for it, counted silent; h1..h10 are due 21 s
// after its start, held back by its guard (12 silent > 10). C1 fails and
// S takes over: RestoreMemory takes both pins — h11 and h12 are no
// longer silent (lastSeen = takeover) — 10 silent, not > 10, and S
// declares the Held h1..h10 at its first acting tick, while their guests
// run. Before the pin (pinMutation) S held. "delete": the same with the
// two keys deleted (S counted the markers silent at once). Controls:
// pinMutation; no garbage (S has trusted records of h11, h12: it holds).
func TestX18TakeoverPinEndsHold(t *testing.T) {
	for _, c := range []struct {
		name              string
		garbage, mutation bool
		del               bool
	}{
		{name: "garbage", garbage: true},
		{name: "delete", garbage: true, del: true},
		{name: "control-pinMutation", garbage: true, mutation: true},
		{name: "control-delete-pinMutation", garbage: true, del: true, mutation: true},
		{name: "control-no-garbage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pinMutation = c.mutation
			defer func() { pinMutation = false }()
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second) // the rack is cut off: Held
			if host, after := b.run(at, 10, live, x10Set(rack)); host != "" {
				t.Fatalf("C1 declared the Held %s %s after the cut (the test shows nothing)", host, after)
			}
			if !b.tr.Holding() {
				t.Fatalf("C1 not holding: silent %d, threshold %d", b.tr.Silent(at.Add(10*time.Second)), b.tr.Threshold())
			}
			at = at.Add(10 * time.Second)
			if c.garbage {
				for _, h := range x10Pair {
					if c.del {
						b.del(at, h)
					} else {
						b.garbage(at, h)
					}
					if p := b.mem[h].Pin; p == nil && !c.mutation {
						t.Fatalf("C1 pinned nothing for the Held %s: %+v", h, b.mem[h])
					}
				}
			}
			b.run(at, 5, live, x10Set(rack))
			at = at.Add(5 * time.Second)
			// The standby S starts: its watch lists the bucket.
			s := x10Tracker(t)
			names := x11Without(hosts) // copy
			sortByRev(names, b)
			for _, h := range names {
				deliver(s, at, h, b.keys[h])
			}
			s.WatchStarted(at)
			for sec := 1; sec <= 60; sec++ { // C1 leads, S watches
				now := at.Add(time.Duration(sec) * time.Second)
				for _, h := range live {
					b.write(now, h, fencing.LeaseActive, b.guard.Ref())
					deliver(s, now, h, b.keys[h])
					s.ObserveBeacon(now, h, b.keys[h].rev)
				}
				b.publish()
				for _, d := range b.tr.Tick(now) {
					if d.Op == OpDeclare && x10Set(rack)[d.Host] {
						t.Fatalf("C1 declared the Held %s", d.Host)
					}
				}
				for _, d := range s.Tick(now) { // a standby: nothing written
					s.NotPerformed(d)
				}
			}
			at = at.Add(60 * time.Second)
			if !s.Holding() {
				t.Fatalf("standby S not holding before the takeover: silent %d, threshold %d (rig)", s.Silent(at), s.Threshold())
			}
			// C1 fails; S takes over: memory, then guard (Runner.Run).
			b.stop()
			for _, h := range s.Hosts() {
				if m, ok := b.mem[h]; ok {
					s.RestoreMemory(at, h, m)
				}
			}
			s.RestoreGuard(b.guard)
			b.tr = s
			b.flush()
			if host, after := b.run(at, 120, live, x10Set(rack)); host != "" {
				if !c.garbage || c.mutation {
					t.Fatalf("control: %s declared %s after the takeover", host, after)
				}
				t.Fatalf("S declared the Held %s %s after its takeover (guests running): the pins of the Held h11, h12 reset their silence (silent %d, threshold %d)",
					host, after, s.Silent(at.Add(after)), s.Threshold())
			}
		})
	}
}

// sortByRev sorts names by their keys' revisions in b (a watch's listing).
func sortByRev(names []string, b *x11Bucket) {
	sort.Slice(names, func(i, j int) bool { return b.keys[names[i]].rev < b.keys[names[j]].rev })
}

// TestX18RestartPinsHeldRackHolds (held; reviewer X18): the fresh-restart
// counterpart of TestX18TakeoverPinEndsHold. 60 hosts, threshold 10, the
// rack h1..h12 cut off and Held, C1 holds; a compromised node writes
// garbage into (or deletes) the keys of h11, h12 — or of the whole rack —
// and C1 pins them. C1 restarts (C2: a new process, every host's clock
// restarts at its watch): the pinned hosts count silent after their own
// suspect time like the rest of the rack, before any is due: C2 holds,
// nobody of the rack is declared (the rig: C1 holds before the restart).
func TestX18RestartPinsHeldRackHolds(t *testing.T) {
	for _, c := range []struct {
		name    string
		targets []string
		del     bool
	}{
		{name: "pair-garbage", targets: x10Pair},
		{name: "pair-delete", targets: x10Pair, del: true},
		{name: "rack-garbage", targets: x10Names(1, 13)},
		{name: "rack-delete", targets: x10Names(1, 13), del: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 60, 5)
			rack := x10Names(1, 13)
			live := x11Without(hosts, rack...)
			at := t0.Add(5 * time.Second)
			if host, _ := b.run(at, 10, live, x10Set(rack)); host != "" || !b.tr.Holding() {
				t.Fatalf("C1 declared %q / not holding (rig)", host)
			}
			at = at.Add(10 * time.Second)
			for _, h := range c.targets {
				if c.del {
					b.del(at, h)
				} else {
					b.garbage(at, h)
				}
				if b.mem[h].Pin == nil {
					t.Fatalf("C1 pinned nothing for %s", h)
				}
			}
			b.stop()
			start := at.Add(2 * time.Second)
			b.start(start)
			if host, after := b.run(start, 120, live, x10Set(rack)); host != "" {
				t.Fatalf("C2 declared the Held %s %s after its start (silent %d, threshold %d)", host, after, b.tr.Silent(start.Add(after)), b.tr.Threshold())
			}
		})
	}
}
