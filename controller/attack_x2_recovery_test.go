package controller_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller/recovery"
)

// TestAgentCannotStopRecoveryOfDeclaredHost: h0 died and is declared; a
// compromised node writes one value into h0's key right after the
// declaration (what its NATS credentials allow for any host key):
// garbage (no signature can make it trusted, so host recovery's gate
// reads it as an error and pauses, for as long as it stays — the dead
// agent never overwrites it, nor does the controller), or a delete (the
// gate takes the key's absence for the declaration gone and stops the
// recovery for good). Either way the dead host's instances are never
// evacuated: the effect of invariant (c) of issue 11 (a dead host's
// declaration stopped) by one write. The runner is a standby until the
// write is in (the attacker wins the race by watching the key).
func TestAgentCannotStopRecoveryOfDeclaredHost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"garbage", func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "h0", []byte("not a record"))
			return err
		}},
		{"delete", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "h0") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRecoveryEnv(t)
			var acting atomic.Bool
			var mu sync.Mutex
			var events []recovery.Event
			e.runner(t, "ctl-a", &acting, &events, &mu)
			e.waitDeclared(t)
			if err := tc.write(e.ctx, e.leases); err != nil {
				t.Fatal(err)
			}
			acting.Store(true)
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if r, _ := e.record(t); r != nil && (r.Phase == recovery.PhaseRecovered || r.Phase == recovery.PhaseDone) {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			r, _ := e.record(t)
			t.Errorf("declared dead h0 not recovered within 10 s after one %s write into its key: %+v; calls %v", tc.name, r, e.cloud.Calls())
		})
	}
}
