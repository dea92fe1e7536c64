package controller

import (
	"maps"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX31RollbackAgentDropsBeaconsHeld: X21's "detected" case with the
// agent of this change. agent/fence.go publishBeacon drops (returns nil,
// silently) every beacon whose revision is <= the last one its process
// published (lastBeacon, never reset). After a lease-stream rollback the
// agent's writes get reused revisions below lastBeacon: its renewals'
// beacons AND its withdrawal's beacon are never published. The controller
// that found the rollback carries only the withdrawals it saw (beacons):
// none now, so the withdrawn h3 is declared.
func TestX31RollbackAgentDropsBeaconsHeld(t *testing.T) {
	for _, newAgent := range []bool{false, true} {
		name := map[bool]string{false: "old-agent-beacons-sent", true: "new-agent-lastBeacon-drops"}[newAgent]
		t.Run(name, func(t *testing.T) {
			b, hosts := x11Fleet(t, 10, 10)
			live := x11Without(hosts, "h3")
			at := t0.Add(10 * time.Second)
			backup := maps.Clone(b.keys)
			backupRev := b.rev
			b.run(at, 4, hosts, nil)
			at = at.Add(4 * time.Second)
			trusted := b.keys["h3"].rev
			agentLast := trusted // the agent process published its beacon for its last renewal
			last := b.rev
			c1 := b.tr
			now := at.Add(500 * time.Millisecond)
			b.tr = nil
			b.keys, b.rev = backup, backupRev
			publish := func(rev uint64) bool { return !newAgent || rev > agentLast }
			for i := 0; i < 2; i++ {
				b.write(now, "h3", fencing.LeaseActive, b.guard.Ref())
				if r := b.keys["h3"].rev; publish(r) {
					c1.ObserveBeacon(now, "h3", r)
				}
			}
			b.write(now, "h3", fencing.LeaseWithdrawn, b.guard.Ref())
			w := b.keys["h3"].rev
			if publish(w) {
				c1.ObserveWithdrawal(now, "h3", w)
			} else {
				t.Logf("withdrawal at %d <= agent lastBeacon %d: publishBeacon drops its beacon", w, agentLast)
			}
			tr := b.tr
			b.tr = c1
			b.flush()
			b.tr = tr
			for i := 0; b.rev < last; i++ {
				b.write(now, live[i%len(live)], fencing.LeaseActive, b.guard.Ref())
			}
			b.tr = c1
			b.garbage(now, "h3")
			start := now.Add(time.Second)
			host, after := b.x21After(c1, now.Add(500*time.Millisecond), start, true, false, live)
			if host != "" {
				t.Fatalf("withdrawn h3 (withdrawal at %d, agent lastBeacon %d) declared %s after the rollback was detected", w, agentLast, after)
			}
		})
	}
}
