//go:build e2e

package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/openstack"
	"hvguard/reconcile"
	"hvguard/test/e2e/openstack/osharness"
)

// stopAfterListing is a Nova that stops the real nova-api right after the
// evacuation listing: "Nova stopped mid-reconcile", deterministically.
type stopAfterListing struct {
	*openstack.Client
	stop func() error
	t    *testing.T
}

func (s stopAfterListing) ListEvacuationsFrom(ctx context.Context, host string) ([]reconcile.Migration, error) {
	ms, err := s.Client.ListEvacuationsFrom(ctx, host)
	if serr := s.stop(); serr != nil {
		s.t.Errorf("stopping nova-api: %v", serr)
	}
	return ms, err
}

// TestE2EScenario is the e2e on the real harness (holding its
// scenario lock): boot servers on node1; stop node1's nova-compute and
// force it down; evacuate three to node2; run reconciliations as node1 over
// test-driver domains carrying those instance UUIDs:
//
//   - nova-api stopped mid-reconcile → nothing destroyed, not OK;
//   - Nova back → the three evacuated copies destroyed within seconds, the
//     fourth server and a non-Nova domain untouched;
//   - node1 restored, one evacuated server cold-migrated back (its domain
//     running here again) → untouched; the other stale copies stay off and
//     are not looked up again.
func TestE2EScenario(t *testing.T) {
	path := harnessClouds(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h, err := osharness.Connect(ctx, osharness.WorkDir())
	if err != nil {
		t.Skipf("harness not reachable: %v", err)
	}
	unlock, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	step := func(what string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s (%.1f s)", what, time.Since(start).Seconds())
	}
	if _, fd, err := h.ComputeState(ctx, "node1"); err != nil {
		t.Fatal(err)
	} else if fd {
		step("restore node1 left forced down", func() error { return h.RestoreHost(ctx, "node1") })
	}
	var ids []string
	step("boot 4 servers on node1", func() (err error) {
		ids, err = h.BootServers(ctx, 4, "node1", fmt.Sprintf("hvg-reconcile-%d", time.Now().Unix()))
		return err
	})
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		_ = h.StartAPI(cctx)
		if _, fd, err := h.ComputeState(cctx, "node1"); err == nil && fd {
			if err := h.RestoreHost(cctx, "node1"); err != nil {
				t.Errorf("cleanup: restore node1: %v", err)
			}
		}
		for _, id := range ids {
			if err := h.DeleteServer(cctx, id); err != nil {
				t.Errorf("cleanup: delete %s: %v", id, err)
			}
		}
	})
	evacuated, stay := ids[:3], ids[3]
	step("stop nova-compute on node1", func() error { return h.StopCompute(ctx, "node1") })
	step("force node1 down", func() error { return h.ForceDown(ctx, "node1", true) })
	step("evacuate 3 servers to node2", func() error { return h.EvacuateAndWait(ctx, "node2", evacuated...) })

	// node1 comes back: its libvirt still has all four, plus a non-Nova domain.
	c := privateConn(t)
	for _, id := range ids {
		define(t, c, "instance-"+id[:8], id, true, true)
	}
	define(t, c, "not-nova", uuidN(77), false, true)
	client, err := openstack.New(openstack.Config{Cloud: osharness.CloudName, CloudsFile: path}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	newR := func(nova reconcile.Nova) *reconcile.Runner {
		r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"},
			ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, nova, c, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	running := func(want map[string]string) {
		t.Helper()
		for id, st := range want {
			if got := stateOf(t, c, id); got != st {
				t.Errorf("domain %s: %s, want %s", id, got, st)
			}
		}
	}

	// 1. Nova stops mid-reconcile.
	rep := newR(stopAfterListing{Client: client, stop: func() error { return h.StopAPI(ctx) }, t: t}).Run(ctx, reconcile.TriggerRejoin)
	t.Log(rep.Summary())
	if rep.OK() || rep.Global != reconcile.ReasonNovaUnavailable || rep.Destroyed != 0 {
		t.Fatalf("Nova stopped mid-reconcile: %s", rep.Summary())
	}
	running(map[string]string{ids[0]: "running", ids[1]: "running", ids[2]: "running", stay: "running"})
	step("start nova-api", func() error { return h.StartAPI(ctx) })

	// 2. Nova back: the rejoin reconciliation.
	r := newR(client)
	start := time.Now()
	rep = r.Run(ctx, reconcile.TriggerRejoin)
	took := time.Since(start)
	t.Logf("%s (%v)", rep.Summary(), took)
	if !rep.OK() || rep.Destroyed != 3 {
		t.Fatalf("rejoin: %s: %s", rep.Global, rep.GlobalDetail)
	}
	running(map[string]string{ids[0]: "shutoff", ids[1]: "shutoff", ids[2]: "shutoff", stay: "running", uuidN(77): "running"})
	if took > 5*time.Second {
		t.Errorf("rejoin reconciliation took %v (target ≤ 5 s)", took)
	}
	for _, e := range rep.Events() {
		t.Logf("event: %s %s migration %d (%s) %s→%s server on %s", e.Outcome, e.DomainUUID, e.Evidence.MigrationID,
			e.Evidence.MigrationStatus, e.Evidence.SourceCompute, e.Evidence.DestCompute, e.Evidence.ServerHost)
	}

	// 3. node1 restored (its nova-compute turns the evacuations completed);
	// one server migrated back: its domain runs here again.
	step("restore node1 (start nova-compute, clear forced_down)", func() error { return h.RestoreHost(ctx, "node1") })
	step("cold-migrate "+ids[0]+" back to node1", func() error { return h.ColdMigrate(ctx, ids[0], "node1") })
	if err := c.Start(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	rep = r.Run(ctx, reconcile.TriggerPeriodic)
	t.Log(rep.Summary())
	if !rep.OK() || rep.Destroyed != 0 {
		t.Fatalf("after migrate-back: %s", rep.Summary())
	}
	if d := result(t, rep, ids[0]); d.Reason != reconcile.ReasonServerOnThisHost || d.Evidence == nil || d.Evidence.MigrationStatus != "completed" {
		t.Errorf("migrated back: %s evidence %+v", d.Reason, d.Evidence)
	}
	for _, id := range ids[1:3] {
		if d := result(t, rep, id); d.Reason != reconcile.ReasonAlreadyStopped {
			t.Errorf("%s: %s", id, d.Reason)
		}
	}
	running(map[string]string{ids[0]: "running", ids[1]: "shutoff", ids[2]: "shutoff", stay: "running"})
}
