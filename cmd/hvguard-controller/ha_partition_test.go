package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing/natslease"
	"hvguard/test/netcut"
)

// TestPartitionedLeader: the leader process reaches NATS through a link
// that is cut the way a failed switch port cuts it (bytes held, delivered
// late after the heal). A host falls silent during the cut. The standby
// takes over once the lock stood still for TakeoverAfter(ttl), declares
// the host once; the partitioned leader stops acting on its own clock
// before that, and after the heal its held writes land and change nothing:
// the host's key has one declaration (the standby's), the lock has no
// record of the old leader after the new one's first, and /status never
// showed two leaders (sampled every 10 ms throughout).
func TestPartitionedLeader(t *testing.T) {
	url, kv, ckv := haBucket(t)
	st := &natslease.Store{KV: kv}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	hs := controllertest.HostRecord("hs")
	stopHS := controllertest.RenewRecord(ctx, st, hs)

	link := netcut.New(t, strings.TrimPrefix(url, "nats://"))
	a := startProc(t, "nats://"+link.Addr(), "ctl-a", "")
	controllertest.WaitRole(t, a, "leader", 10*TakeoverWait())
	b := startProc(t, url, "ctl-b", "")
	controllertest.WaitRole(t, b, "standby", 5*time.Second)
	time.Sleep(500 * time.Millisecond) // b's tracker has seen hs renew

	// Sample both roles every 10 ms until the end.
	var both atomic.Int64
	var bothAt atomic.Value
	sctx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sctx.Err() == nil {
			ra, rb := a.Role(), b.Role()
			if ra == "leader" && rb == "leader" {
				both.Add(1)
				bothAt.Store(time.Now().Format("15:04:05.000"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	link.Blackhole(true)
	cut := time.Now()
	stopHS()
	d := controllertest.WaitRole(t, b, "leader", 3*TakeoverWait())
	t.Logf("leader's link cut → standby leading after %s (TakeoverAfter(ttl) %s)", d, TakeoverWait())
	if role := a.Role(); role != "standby" {
		t.Fatalf("the partitioned leader reports %s after the standby took over", role)
	}
	grace, err := controller.Config{Drift: 0.01, MaxHostDrift: 0.05, MaxGrace: time.Minute, GuardWindow: time.Minute}.Grace(hs)
	if err != nil {
		t.Fatal(err)
	}
	// hs is due lease_ttl + grace after its last renewal (the cut); leave
	// the link cut well past that, then heal: a's held bytes land.
	time.Sleep(time.Until(cut.Add(hs.Timing.LeaseTTL + grace + 2*time.Second)))
	link.Blackhole(false)
	time.Sleep(3 * time.Second)
	stopSampling()
	wg.Wait()

	if n := both.Load(); n > 0 {
		t.Fatalf("/status showed two leaders in %d samples (last at %v)", n, bothAt.Load())
	}
	decl := controllertest.Declarations(t, kv, "hs")
	if len(decl) != 1 || !strings.Contains(decl[0], "ctl-b") {
		t.Fatalf("hs declarations: %q, want exactly one, by ctl-b", decl)
	}
	locks := controllertest.CheckTakeover(t, ckv, "ctl-a", "ctl-b")
	if a.Role() != "standby" || b.Role() != "leader" {
		t.Fatalf("after the heal: ctl-a %s, ctl-b %s; want standby, leader", a.Role(), b.Role())
	}
	t.Logf("hs declared once by ctl-b (%s); %d lock records, none of ctl-a after ctl-b's; never two leaders", decl[0], len(locks))
}
