package controller_test

import (
	"fmt"
	"testing"
	"time"
)

// TestX5FakeDeleteMarkersHoldForeverNATS: TestX5FakeDeleteMarkersHoldForever
// against nats-server with the shipped permissions: compute-1, with its
// own NATS user, deletes two lease keys that never existed ("fake-0",
// "fake-1": KV deletes, i.e. publishes to single-token lease keys, which
// an agent may make for relays); compute-3 dies. The controller counts
// the two made-up hosts silent for ever: 3 > threshold 1, it holds, and
// compute-3 is never declared (c). Control: no deletes, declared within
// 6 s (lease_ttl + grace = 3.05 s at x0.1).
func TestX5FakeDeleteMarkersHoldForeverNATS(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	for _, fakes := range []int{0, 2} {
		t.Run(fmt.Sprintf("fakes=%d", fakes), func(t *testing.T) {
			_, ctx, _, _, ctl, attacker, _, die := permRig(t, dead)
			for i := range fakes {
				if err := attacker.KV.Delete(ctx, fmt.Sprintf("fake-%d", i)); err != nil {
					t.Fatalf("compute-1 deleting a made-up key: %v", err)
				}
			}
			die()
			died := time.Now()
			for time.Since(died) < 6*time.Second {
				if _, ok := ctl.declaredAt(dead); ok {
					t.Logf("declared %s after its death", time.Since(died).Round(100*time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Errorf("dead compute-3 not declared within 6 s (lease_ttl + grace = 3.05 s) after compute-1 deleted %d keys that never existed", fakes)
		})
	}
}

// TestX5DeleteThenReplayedWithdrawalNATS: TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared
// against nats-server with the shipped permissions: compute-3 dies;
// compute-1's own NATS user deletes compute-3's key and puts back a
// withdrawal compute-3 genuinely signed earlier (modelled here by sealing
// it with compute-3's key for an old revision, as its agent did at an
// orderly stop). compute-3 is never declared (c). Control: the delete
// alone, declared (pinned).
func TestX5DeleteThenReplayedWithdrawalNATS(t *testing.T) {
	t.Parallel()
	const dead = "compute-3.example.org"
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replay=%t", replay), func(t *testing.T) {
			f, ctx, _, _, ctl, attacker, _, die := permRig(t, dead)
			last, rev, err := attacker.Read(ctx, dead)
			if err != nil {
				t.Fatal(err)
			}
			old := *last
			old.State, old.Reason = "withdrawn", "orderly-stop"
			saved, err := f.signers[dead].Seal(old, rev-1).Encode() // compute-3's own withdrawal, written long ago
			if err != nil {
				t.Fatal(err)
			}
			die()
			time.Sleep(50 * time.Millisecond)
			died := time.Now()
			if err := attacker.KV.Delete(ctx, "compute-3_example_org"); err != nil {
				t.Fatal(err)
			}
			if replay {
				time.Sleep(100 * time.Millisecond) // the marker delivered first
				if _, err := attacker.KV.Put(ctx, "compute-3_example_org", saved); err != nil {
					t.Fatal(err)
				}
			}
			for time.Since(died) < 10*time.Second {
				if _, ok := ctl.declaredAt(dead); ok {
					t.Logf("declared %s after its death", time.Since(died).Round(100*time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("decisions: %v", ctl.decisions)
			t.Errorf("dead compute-3 not declared within 10 s (lease_ttl + grace = 3.05 s) after compute-1 deleted its key and put back its old withdrawal (prev_rev %d, before the marker)", rev-1)
		})
	}
}
