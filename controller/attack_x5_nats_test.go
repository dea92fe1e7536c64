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
