package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/proto"
)

// TestX18PartialListingSkipsMemoryNATS (c, and the ordering the pin
// change relies on): Runner.Run restores the memory (and then the guard)
// at its first acting tick after the watch's synced signal — "after the
// watch's first listing" (RestoreMemory's doc). But Store.Watch closes
// synced as soon as it has PUT the last listed value into the runner's
// buffered updates channel (1024), not when the runner has observed it;
// each first value costs the runner a message get (WrittenOn) while the
// watch goroutine only decodes. With a fleet of a few thousand keys the
// runner takes synced, ticks, and restores the memory with up to 1024
// listed values still queued: restoreMemory iterates Tracker.Hosts(), so
// every host not yet observed gets no memory (no pin, no beacon binding),
// and restored is not reset until the next leadership change.
//
// 2500 enrolled hosts, signed records (written fresh, by create); the
// dead x-dead.example.org's key was written last: its record, then
// garbage (a compromised node). The memory holds what the leader C1 wrote
// for it: beacons bound it, and the pin {its record, KeyRev: the
// garbage's revision} — TestRestartPinNATS's state. A controller starts
// with that memory, twelve times: a run where it never restores the pin
// (no "restored from the controllers' memory" decision once the whole
// listing is observed and three more ticks passed) leaves the dead host undeclared for good — the
// hole the pin closed (reviewer X11's TestX11DeleteAtRestartBypassesMemory),
// reopened at random. RestoreGuard runs on the same partial view (it
// prunes kept versions below the floor of the hosts observed so far: the
// guard-version interplay TestX11RestorePrunesVersionHeldRackActsOn
// needed the memory first for). Control "small-fleet": 5 hosts, the pin
// is restored every time.
func TestX18PartialListingSkipsMemoryNATS(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		n    int
	}{{"fleet-2500", 2500}, {"control-small-fleet", 5}} {
		t.Run(c.name, func(t *testing.T) {
			const dead = "x-dead.example.org"
			hosts := make([]string, 0, c.n)
			for i := range c.n - 1 {
				hosts = append(hosts, fmt.Sprintf("x%04d.example.org", i))
			}
			hosts = append(hosts, dead)
			f := newFleetOf(t, hosts)
			st := newLeaseStore(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			js, _ := jetstream.New(st.NC)
			cb, err := controller.EnsureControlBuckets(ctx, js, true)
			if err != nil {
				t.Fatal(err)
			}
			var deadRec fencing.LeaseRecord
			var trusted uint64
			for _, h := range hosts {
				r := fencing.LeaseRecord{Schema: 1, Host: h, State: fencing.LeaseActive, FencingEnabled: true,
					Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: fencing.DefaultTiming(), Seq: 1}
				res := f.store(st, h, true, nil).Renew(ctx, fencing.RenewRequest{Seq: 1, Record: r}, 5*time.Second)
				if res.Outcome != fencing.RenewAcked {
					t.Fatalf("%s: %+v", h, res)
				}
				if h == dead {
					deadRec, trusted = f.signers[h].Seal(r, 0), res.Revision
				}
			}
			tok, _ := proto.HostToken(dead)
			garbage, err := st.KV.Put(ctx, tok, []byte("garbage")) // the compromised node
			if err != nil {
				t.Fatal(err)
			}
			stream, err := controller.StreamID(ctx, st.KV)
			if err != nil {
				t.Fatal(err)
			}
			e, err := st.KV.Get(ctx, tok)
			if err != nil || e.Revision() != garbage {
				t.Fatalf("read the garbage back: %v (%v)", e, err)
			}
			b, _ := json.Marshal(controller.Memory{Beacons: true, Pin: &controller.MemoryPin{Record: deadRec, TrustedRev: trusted, KeyRev: garbage, Stream: stream, KeyStored: e.Created().UnixNano()}})
			if _, err := cb.Memory.Put(ctx, tok, b); err != nil { // what the leader C1 wrote
				t.Fatal(err)
			}
			cst := f.store(st, "ctl", true, nil)
			missed, runs := 0, 12
			for run := range runs {
				tr, err := controller.NewTracker(controller.DefaultConfig())
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				restored, members := false, 0
				r := &controller.Runner{Store: cst, Tracker: tr, Memory: cb.Memory, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
					OnDecision: func(d controller.Decision, _ error) {
						if d.Op == controller.OpInvalid && d.Host == dead && strings.Contains(d.Reason, "restored from the controllers' memory") {
							mu.Lock()
							restored = true
							mu.Unlock()
						}
					},
					OnSynced: func(n int) { mu.Lock(); members = n; mu.Unlock() },
				}
				v := runUntilListed(t, ctx, r, c.n)
				mu.Lock()
				t.Logf("run %d: members at synced %d of %d; pin of %s restored %t (tracker now knows %d hosts)", run, members, c.n, dead, restored, len(v.Hosts))
				if !restored {
					missed++
				}
				mu.Unlock()
			}
			if missed > 0 {
				t.Fatalf("%d of %d controller starts never restored the memory of the dead %s (its pin, its beacon binding): the memory was restored before the watch's listing was observed; that host stays undeclared for good (invariant c)", missed, runs, dead)
			}
		})
	}
}

// runUntilListed runs r until its tracker knows n hosts (at most 20 s) and
// three more ticks (its first acting tick came), then stops it; it
// returns the tracker's last view.
func runUntilListed(t *testing.T, ctx context.Context, r *controller.Runner, n int) controller.TrackerView {
	t.Helper()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	var v controller.TrackerView
	var err error
	for deadline := time.Now().Add(20 * time.Second); len(v.Hosts) < n && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if v, err = r.View(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * controller.TickInterval) // the first acting tick came by now
	stop()
	<-done
	return v
}
