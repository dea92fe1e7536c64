package controller_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
)

// Reviewer X22: TestX22RollbackCheckBlindedByGarbageNATS (S).
//
// The rollback check (rollback.go) counts a sample revision that no
// longer exists as "superseded by a later value of its key" and passes.
// docs/security.md ("Open: ...") rests the residual on "a compromised
// node can supersede only its own writes, so it needs the 8 values last
// delivered before the rollback to be its own or renewed meanwhile". That
// premise is false in this threat model: an agent's NATS user may write
// ANY host's key of hvguard-leases (docs/security.md, threat table), and
// with history 1 a write to a key deletes the key's previous message. So
// after a rollback the compromised node (which sees the stream's
// sequences in its own acks and may watch the bucket) only has to write
// garbage into the keys whose values now sit at the reused revisions the
// controller had been delivered (at most RollbackSamples keys, or simply
// every key of the bucket, twice) before the next check: every sample is
// "superseded", the stream's last revision is past L, and the check finds
// nothing — ever, since the later deliveries are consistent.
//
// This is exactly X21's TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon
// shape, whose "undetected/*" cases show the withdrawn host declared: the
// victim c renewed at T=6 (delivered), the stream rolls back to 3, c
// renews at the reused 4 and withdraws at the reused 5 (< T: its beacon
// is dropped), the fleet pads 6, the compromised node writes garbage into
// c's key at 7 (L+1: the pin moves along, c is declarable by CAS on 7)
// and into a's key at 8 (superseding the genuine renewal at 6). Samples:
// 1..3 still stored with their stamps, 4 and 5 and 6 gone — passes.
//
// "control-renewals-only" (passes): the same rollback refilled by the
// fleet's renewals alone, the compromised node writing nothing over a:
// revision 6 holds a's renewal at another stamp, the runner stops.
// "attack" failed: the runner ran on. Fixed: a sample that is gone counts
// as superseded only while its key holds a later value (b's revision 5 is
// gone and b's key is back at 2: found). OPEN ("every-key", commented
// out): the compromised node also writes garbage into every sample's key
// (b here) before the runner's next check — each sample is gone with a
// later value of its key, as without a rollback: the runner runs on.
func TestX22RollbackCheckBlindedByGarbageNATS(t *testing.T) {
	// Not parallel: it restarts nats-server on the same port, which a
	// parallel test's socket may take meanwhile (seen under load).
	for _, c := range []struct {
		name   string
		attack bool
	}{{"control-renewals-only", false}, {"attack", true}} { // OPEN: {"every-key", ...}: also put(b, garbage) after a's
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, dir, port := controllertest.RollbackServer(t)
			_, wkv := x21Conn(t, ctx, srv, 50*time.Millisecond) // the agents (and the compromised node)
			put := func(host string, data []byte) uint64 { return x21Put(t, ctx, wkv, host, data) }
			rec := x21Rec
			a, b, v := "x22-a.example.org", "x22-b.example.org", "x22-c.example.org" // v: the victim
			for _, h := range []string{a, b, v} {
				put(h, rec(h, 1, fencing.LeaseActive))
			}
			controllertest.Restart(t, &srv, dir, "", port)
			backup := controllertest.StreamCopy(t, dir) // the stream at revision 3
			controllertest.Restart(t, &srv, dir, "", port)
			rnc, rkv := x21Conn(t, ctx, srv, 2*time.Second) // as "refilled": the writes land before it reconnects
			done := x21Run(t, ctx, rnc, rkv)
			put(a, rec(a, 2, fencing.LeaseActive))         // 4
			put(b, rec(b, 2, fencing.LeaseActive))         // 5
			last := put(v, rec(v, 2, fencing.LeaseActive)) // 6 = T = L: v's renewal, trusted
			time.Sleep(time.Second)
			select {
			case err := <-done:
				t.Fatalf("the runner stopped before the rollback: %v", err)
			default:
			}
			controllertest.Restart(t, &srv, dir, backup, port) // rolled back to revision 3
			put(v, rec(v, 3, fencing.LeaseActive))             // 4: v renews on after the conflict
			w := put(v, rec(v, 4, fencing.LeaseWithdrawn))     // 5: v stops in order (< T: its beacon is dropped)
			pad := put(a, rec(a, 3, fencing.LeaseActive))      // 6: a renewal
			if pad != last {
				t.Fatalf("padding at %d, want L %d (rig)", pad, last)
			}
			g := put(v, []byte("garbage")) // 7 = L+1: the compromised node, over v's withdrawal
			if c.attack {
				put(a, []byte("garbage")) // 8: the compromised node supersedes a's genuine renewal at 6
			}
			t.Logf("rolled back: v withdrew at %d (T %d), garbage over v at %d", w, last, g)
			select {
			case err := <-done:
				if !errors.Is(err, controller.ErrLeaseStreamRolledBack) {
					t.Fatalf("the runner stopped with %v, want ErrLeaseStreamRolledBack", err)
				}
				t.Logf("found: %v", err)
			case <-time.After(8 * time.Second):
				t.Fatalf("the runner ran on 8 s (4 checks, a reconnect among them) after its lease stream rolled back from %d to 3: "+
					"the compromised node wrote garbage into the keys of the reused sample revisions, every sample counts as superseded; "+
					"v's withdrawal at %d is hidden, garbage at %d moves its stale active record along (X21's undetected cases: v declared)", last, w, g)
			}
		})
	}
}
