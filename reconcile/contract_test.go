package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/openstack"
	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

// Real UUIDs of openstack/testdata's recorded responses.
const (
	recEvac1   = "d3fe1837-1656-48ea-8337-667709b89817" // evacuated node1 → node2 (done), on node2
	recEvac2   = "57a7da7d-2a0e-4df8-9f76-cc82fae3ff85" // evacuated node1 → node2 (done)
	recOnNode1 = "7957de7b-13d7-491d-b919-f56b3617fe5b" // never moved
)

func realClient(t testing.TB, s *openstacktest.Server, pageSize int) *openstack.Client {
	t.Helper()
	c, err := openstack.New(openstack.Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), RequestTimeout: 2 * time.Second, PageSize: pageSize}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRunnerContract: the runner with the real client against Nova's
// recorded answers and the libvirt test driver. recEvac2's server is
// answered on node1 again (evacuated and migrated back: its old record
// stays); it must survive.
func TestRunnerContract(t *testing.T) {
	setup := func(t *testing.T) (*openstacktest.Server, *libvirtx.Conn, *reconcile.Runner) {
		s := openstacktest.New(t)
		s.RouteFile("/v2.1/os-migrations?source_compute=node1&migration_type=evacuation&limit=500", "migrations-node1-all")
		s.RouteFile("/v2.1/servers/"+recEvac1, "server-evacuated")
		s.Route("/v2.1/servers/"+recEvac2, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(),
			Body: openstacktest.ServerBody(recEvac2, "node1", "ACTIVE", "")})
		c := privateConn(t)
		for _, u := range []string{recEvac1, recEvac2, recOnNode1} {
			define(t, c, "instance-"+u[:8], u, true, true)
		}
		define(t, c, "not-nova", uuidN(99), false, true)
		r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"},
			ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, realClient(t, s, 0), c, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		return s, c, r
	}
	t.Run("destroys the evacuated one", func(t *testing.T) {
		s, c, r := setup(t)
		rep := r.Run(context.Background(), reconcile.TriggerStart)
		if !rep.OK() || rep.Destroyed != 1 {
			t.Fatalf("%s", rep.Summary())
		}
		for u, want := range map[string]string{recEvac1: "shutoff", recEvac2: "running", recOnNode1: "running", uuidN(99): "running"} {
			if st := stateOf(t, c, u); st != want {
				t.Errorf("%s: %s, want %s (%+v)", u, st, want, result(t, rep, u))
			}
		}
		if d := result(t, rep, recEvac2); d.Reason != reconcile.ReasonServerOnThisHost {
			t.Errorf("migrated back: %s", d.Reason)
		}
		ev := result(t, rep, recEvac1).Evidence
		if ev.MigrationID != 1 || ev.MigrationUUID != "ccaebfa1-92b9-437c-9c63-e8e712193dd7" || ev.DestCompute != "node2" || ev.DestHost != "192.168.0.1" || ev.ServerHost != "node2" {
			t.Errorf("evidence %+v", ev)
		}
		// One listing page and two lookups (O(candidates)), plus the token.
		if s.NovaRequests() != 3 || rep.APICalls != 4 {
			t.Errorf("requests: nova %d, api calls %d: %v", s.NovaRequests(), rep.APICalls, s.Requests())
		}
	})
	t.Run("nova stops mid-reconcile", func(t *testing.T) {
		s, c, r := setup(t)
		s.FailFrom(2, openstacktest.FaultDrop) // the listing answers, the lookups do not
		rep := r.Run(context.Background(), reconcile.TriggerRejoin)
		if rep.OK() || rep.Global != reconcile.ReasonNovaUnavailable || rep.Destroyed != 0 {
			t.Fatalf("%s", rep.Summary())
		}
		if st := stateOf(t, c, recEvac1); st != "running" {
			t.Fatalf("destroyed while Nova was down: %s", st)
		}
		// Nova back: the next run (the backoff's retry) destroys it.
		s.FailFrom(1, openstacktest.FaultNone)
		if rep := r.Run(context.Background(), reconcile.TriggerRetry); !rep.OK() || rep.Destroyed != 1 {
			t.Fatalf("retry: %s", rep.Summary())
		}
	})
	t.Run("stale host name: the server back here under its new name", func(t *testing.T) {
		// Issue 10 item 9: nova_hosts still says node1, Nova's service
		// here was renamed node1-new and recEvac1's server came back to
		// it; the evacuation record from node1 (recorded) stays.
		s, c, r := setup(t)
		s.Route("/v2.1/servers/"+recEvac1, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(),
			Body: openstacktest.ServerBody(recEvac1, "node1-new", "ACTIVE", "")})
		rep := r.Run(context.Background(), reconcile.TriggerStart)
		if !rep.OK() || rep.Destroyed != 0 || stateOf(t, c, recEvac1) != "running" {
			t.Fatalf("%s", rep.Summary())
		}
		d := result(t, rep, recEvac1)
		if d.Reason != reconcile.ReasonServerNotOnDestination || d.Evidence.DestCompute != "node2" || d.Evidence.DestNode != "node2" || d.Evidence.ServerHost != "node1-new" {
			t.Fatalf("%+v %+v", d, d.Evidence)
		}
	})
	t.Run("keystone down", func(t *testing.T) {
		s, c, r := setup(t)
		s.KeystoneDown(true)
		rep := r.Run(context.Background(), reconcile.TriggerStart)
		if rep.Global != reconcile.ReasonNovaUnavailable || stateOf(t, c, recEvac1) != "running" {
			t.Fatalf("%s", rep.Summary())
		}
	})
}

// BenchmarkRejoin measures one reconciliation from start to the last
// duplicate destroyed, with n local Nova instances all evacuated elsewhere
// (the worst case: n lookups, n destroys), Nova answering from the replay
// server (pages of 500) and libvirt's test driver. Reported: ms/rejoin and
// API calls per reconciliation.
func BenchmarkRejoin(b *testing.B) {
	for _, n := range []int{10, 200} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := openstacktest.New(b)
			uuids := make([]string, n)
			ev := make([]bool, n)
			for i := range uuids {
				uuids[i], ev[i] = uuidN(1000+i), true
			}
			s.Scenario(uuids, ev, openstack.PageSize)
			c := privateConn(b)
			for _, u := range uuids {
				define(b, c, "instance-"+u[24:], u, true, true)
			}
			r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"},
				ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, realClient(b, s, 0), c, quietLog())
			if err != nil {
				b.Fatal(err)
			}
			calls := 0
			var worst time.Duration
			for b.Loop() {
				b.StopTimer()
				for _, u := range uuids {
					if stateOf(b, c, u) != "running" {
						if err := c.Start(context.Background(), u); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StartTimer()
				start := time.Now()
				rep := r.Run(context.Background(), reconcile.TriggerRejoin)
				worst = max(worst, time.Since(start))
				if rep.Destroyed != n {
					b.Fatalf("%s", rep.Summary())
				}
				calls = rep.APICalls
			}
			b.ReportMetric(float64(calls), "api-calls/op")
			b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
		})
	}
}

// BenchmarkPeriodic measures the periodic reconciliation after a rejoin
// destroyed n stale copies: they are off and marked, so a run is one
// listing page and no lookups.
func BenchmarkPeriodic(b *testing.B) {
	for _, n := range []int{10, 200} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := openstacktest.New(b)
			uuids := make([]string, n)
			ev := make([]bool, n)
			for i := range uuids {
				uuids[i], ev[i] = uuidN(1000+i), true
			}
			s.Scenario(uuids, ev, openstack.PageSize)
			c := privateConn(b)
			for _, u := range uuids {
				define(b, c, "instance-"+u[24:], u, true, true)
			}
			r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"},
				ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, realClient(b, s, 0), c, quietLog())
			if err != nil {
				b.Fatal(err)
			}
			if rep := r.Run(context.Background(), reconcile.TriggerRejoin); rep.Destroyed != n {
				b.Fatalf("%s", rep.Summary())
			}
			calls := 0
			for b.Loop() {
				rep := r.Run(context.Background(), reconcile.TriggerPeriodic)
				if !rep.OK() || rep.Candidates != 0 {
					b.Fatalf("%s", rep.Summary())
				}
				calls = rep.APICalls
			}
			b.ReportMetric(float64(calls), "api-calls/op")
		})
	}
}
