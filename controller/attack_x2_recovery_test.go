package controller_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// newSignedRecoveryEnv is newRecoveryEnv with signed records (mode as
// given): h0..h3 each write with their own host key, the tracker with the
// controller's key; the recovery runners read from the stream's leader.
func newSignedRecoveryEnv(t *testing.T, mode fencing.SigningMode) *recoveryEnv {
	t.Helper()
	f := newFleet(t)
	f.ring.Mode = mode
	ctx, nc, leases, rkv := recoveryBuckets(t)
	as := func(who string) *natslease.Store {
		return &natslease.Store{KV: leases, NC: nc, Signer: f.signers[who], Keys: f.ring}
	}
	if _, err := as("h0").Write(ctx, "h0", 0, controllertest.HostRecord("h0"), time.Second); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		go controllertest.Renew(ctx, as(h), h)
	}
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := as("ctl")
	r := &controller.Runner{Store: st, Tracker: tr, Log: quiet(),
		Signature: func() string { return "declared by controller ctl-a, term 1" }}
	go r.Run(ctx)
	return &recoveryEnv{ctx: ctx, leases: leases, rkv: rkv, st: st, tracker: r, cloud: controllertest.NewRecoveryCloud(), nc: nc}
}

// TestAgentCannotStopRecoveryOfDeclaredHost: h0 died and is declared; a
// compromised node writes one value into h0's key right after the
// declaration (what its NATS credentials allow for any host key):
// garbage (no signature can make it trusted, so host recovery's gate
// read it as an error and paused, for as long as it stays — the dead
// agent never overwrites it, nor does the controller), or a delete (the
// gate took the key's absence for the declaration gone and stopped the
// recovery for good). Either way the dead host's instances were never
// evacuated: the effect of invariant (c) of issue 11 (a dead host's
// declaration stopped) by one write. The runner is a standby until the
// write is in (the attacker wins the race by watching the key).
//
// With signatures required the gate judges the declaration from the
// tracker's trusted view (LeaseView.DeclarationStands): h0 is recovered.
// Without signatures (mode off) nothing tells a forgery from a genuine
// value: the old behaviour (paused, or stopped) is kept — the control.
func TestAgentCannotStopRecoveryOfDeclaredHost(t *testing.T) {
	t.Parallel()
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
		for _, mode := range []fencing.SigningMode{fencing.SigningRequired, fencing.SigningOff} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				e := newSignedRecoveryEnv(t, mode)
				var acting atomic.Bool
				var mu sync.Mutex
				var events []recovery.Event
				e.runner(t, "ctl-a", &acting, &events, &mu)
				e.waitDeclared(t)
				if err := tc.write(e.ctx, e.leases); err != nil {
					t.Fatal(err)
				}
				acting.Store(true)
				wait := 10 * time.Second
				if mode == fencing.SigningOff {
					wait = 3 * time.Second
				}
				deadline := time.Now().Add(wait)
				for time.Now().Before(deadline) {
					if r, _ := e.record(t); r != nil && (r.Phase == recovery.PhaseRecovered || r.Phase == recovery.PhaseDone) {
						if mode == fencing.SigningOff {
							t.Fatalf("signing off: h0 recovered after a %s write into its key (nothing can tell it from a genuine value: the old pause/stop is the safe side): %+v", tc.name, r)
						}
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				if mode == fencing.SigningRequired {
					r, _ := e.record(t)
					t.Errorf("declared dead h0 not recovered within 10 s after one %s write into its key: %+v; calls %v", tc.name, r, e.cloud.Calls())
				}
			})
		}
	}
}
