package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
)

// holding reports whether the last guard decision c made started a hold.
func (c *controllerRun) holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.decisions) - 1; i >= 0; i-- {
		switch {
		case strings.HasPrefix(c.decisions[i], controller.OpHoldStarted.String()):
			return true
		case strings.HasPrefix(c.decisions[i], controller.OpHoldEnded.String()):
			return false
		}
	}
	return false
}

// TestX6ReplayedWithdrawalAcrossRestartNATS: TestX6ReplayedWithdrawalsAcrossRestartEndHold
// against nats-server with the shipped permissions and real runners.
// compute-1..3 (signing required; the controller's guard threshold 1:
// count 1). compute-2 and compute-3 are cut off (their agents stop
// renewing: Held, guests running); controller C1 holds (2 silent > 1).
// C1 stops. While no controller runs, compute-1's own NATS user writes
// compute-2's old genuine withdrawal (sealed by compute-2's key on an old
// revision, as its agent did at an orderly stop) back into its key — a
// plain put, or a delete then a create. Controller C2 starts: before,
// it took the withdrawal as compute-2's first record (withdrawn, not
// counted silent), silent 1 = threshold 1, and compute-3 — Held — was
// declared ~3 s (lease_ttl + grace at ×0.1) after C2's start. Now the
// runner reads the value's stored message (its
// Nats-Expected-Last-Subject-Sequence is not the record's prev_rev): not
// trusted, compute-2 counts silent, C2 holds and declares nobody for
// 7 s (> 2 × (lease_ttl + grace)). Control: no replay, the same. And a
// genuine first value is still trusted: compute-3 dies while no
// controller runs and all others renew — C2 declares it.
func TestX6ReplayedWithdrawalAcrossRestartNATS(t *testing.T) {
	t.Parallel()
	const (
		replayed = "compute-2.example.org"
		held     = "compute-3.example.org"
		key2     = "compute-2_example_org"
	)
	for _, attack := range []string{"none", "put", "delete-create", "genuine-first-value"} {
		t.Run(attack, func(t *testing.T) {
			url := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", replayed, held}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, url, f, hosts)
			cfg := controller.DefaultConfig()
			cfg.GuardCount, cfg.GuardShare = 1, 0.5 // 3 hosts: threshold 1
			startCtl := func() (*controllerRun, context.CancelFunc) {
				st, nc := permStore(t, url, "controller:ctl-1", f, "ctl")
				cctx, stop := context.WithCancel(ctx)
				return startControllerCfg(cctx, t, st, nc, cfg, nil), stop
			}
			attacker, _ := permStore(t, url, "agent:"+hosts[0], f, hosts[0])
			c1, stopC1 := startCtl()
			time.Sleep(time.Second) // everybody renewing, the guard published

			// compute-2's withdrawal from an earlier orderly stop, sealed
			// by its key on a revision long gone.
			last, rev, err := attacker.Read(ctx, replayed)
			if err != nil {
				t.Fatal(err)
			}
			old := *last
			old.State, old.Reason = fencing.LeaseWithdrawn, "orderly-stop"
			saved, err := f.signers[replayed].Seal(old, rev-1).Encode()
			if err != nil {
				t.Fatal(err)
			}

			if attack == "genuine-first-value" {
				stopC1()
				time.Sleep(100 * time.Millisecond)
				cut[held]() // dies while no controller runs
				c2, _ := startCtl()
				started := time.Now()
				for time.Since(started) < 7*time.Second {
					if at, ok := c2.declaredAt(held); ok {
						t.Logf("dead %s (its last record C2's first value) declared %s after C2's start", held, at.Sub(started).Round(100*time.Millisecond))
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				c2.mu.Lock()
				defer c2.mu.Unlock()
				t.Fatalf("dead %s not declared within 7 s of C2's start (2 × (lease_ttl + grace)): its genuine last record was not trusted as a first value; decisions: %v", held, c2.decisions)
			}

			cut[replayed]()
			cut[held]() // the rack is cut off: Held, guests running
			deadline := time.Now().Add(5 * time.Second)
			for !c1.holding() && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if !c1.holding() {
				t.Fatal("C1 not holding over the cut-off rack: the test shows nothing")
			}
			stopC1()
			time.Sleep(100 * time.Millisecond)
			switch attack { // no controller runs
			case "put":
				if _, err := attacker.KV.Put(ctx, key2, saved); err != nil {
					t.Fatalf("compute-1's put refused: %v", err)
				}
			case "delete-create":
				if err := attacker.KV.Delete(ctx, key2); err != nil {
					t.Fatalf("compute-1's delete refused: %v", err)
				}
				if _, err := attacker.KV.Create(ctx, key2, saved); err != nil {
					t.Fatalf("compute-1's create refused: %v", err)
				}
			}
			c2, _ := startCtl()
			started := time.Now()
			for time.Since(started) < 7*time.Second {
				for _, h := range hosts[1:] {
					if at, ok := c2.declaredAt(h); ok {
						c2.mu.Lock()
						defer c2.mu.Unlock()
						t.Fatalf("C2 declared %s %s after its start while compute-2 and compute-3 were cut off (Held, guests running); decisions: %v",
							h, at.Sub(started).Round(100*time.Millisecond), c2.decisions)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !c2.holding() {
				c2.mu.Lock()
				defer c2.mu.Unlock()
				t.Fatalf("C2 not holding: the test shows nothing; decisions: %v", c2.decisions)
			}
			if attack != "none" && c2.invalidCount(replayed) == 0 {
				t.Errorf("the replay in %s's key was not reported invalid", replayed)
			}
		})
	}
}
