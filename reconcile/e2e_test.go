//go:build e2e

package reconcile_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/migrations"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"hvguard/libvirtx"
	"hvguard/openstack"
	"hvguard/reconcile"
)

func harnessClouds(t *testing.T) string {
	t.Helper()
	path := os.Getenv("HVG_OS_CLOUDS")
	if path == "" {
		path = "/var/tmp/hvguard-e2e/clouds.yaml"
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no harness clouds.yaml at %s (run test/e2e/openstack/up.sh or set HVG_OS_CLOUDS): %v", path, err)
	}
	return path
}

// truth reads, with gophercloud's own stock types (not hvguard's decoder),
// every server and node1's evacuations, and says which servers a correct
// reconciliation on node1 destroys.
func truth(t *testing.T, cloudsPath string) (all []servers.Server, stale map[string]bool) {
	t.Helper()
	ctx := context.Background()
	ao, eo, _, err := clouds.Parse(clouds.WithCloudName("hvguard-e2e"), clouds.WithLocations(cloudsPath))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := gopenstack.AuthenticatedClient(ctx, ao)
	if err != nil {
		t.Skipf("harness not reachable: %v", err)
	}
	sc, err := gopenstack.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	sc.Microversion = "2.59"
	pages, err := servers.List(sc, servers.ListOpts{AllTenants: true}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, err = servers.ExtractServers(pages)
	if err != nil {
		t.Fatal(err)
	}
	src, typ := "node1", "evacuation"
	mp, err := migrations.List(sc, migrations.ListOpts{SourceCompute: &src, MigrationType: &typ, Limit: gophercloud.IntToPointer(1000)}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations.ExtractMigrations(mp)
	if err != nil {
		t.Fatal(err)
	}
	host := map[string]string{}
	task := map[string]string{}
	for _, s := range all {
		host[s.ID], task[s.ID] = s.Host, s.TaskState
	}
	stale = map[string]bool{}
	newest := map[string]migrations.Migration{}
	for _, m := range ms {
		if o, ok := newest[m.InstanceID]; !ok || m.ID > o.ID {
			newest[m.InstanceID] = m
		}
	}
	for id, m := range newest {
		switch m.Status {
		case "accepted", "pre-migrating", "done", "completed":
			if h := host[id]; h != "" && !strings.EqualFold(h, "node1") && task[id] == "" && m.DestCompute != "" {
				stale[id] = true
			}
		}
	}
	return all, stale
}

// TestE2EReconcileAgainstRealNova: a libvirt domain (test driver) for
// every server Nova has, as if all of them were on node1; one
// reconciliation as node1 destroys exactly the servers Nova evacuated from
// node1 and now runs elsewhere, within seconds, and leaves the others.
func TestE2EReconcileAgainstRealNova(t *testing.T) {
	path := harnessClouds(t)
	all, stale := truth(t, path)
	if len(all) == 0 {
		t.Skip("the harness has no servers (boot some on node1 and evacuate a few to node2)")
	}
	c := privateConn(t)
	for i, s := range all {
		define(t, c, "instance-e2e-"+s.ID[:8], s.ID, true, true)
		_ = i
	}
	client, err := openstack.New(openstack.Config{Cloud: "hvguard-e2e", CloudsFile: path}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"},
		ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, client, c, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep := r.Run(context.Background(), reconcile.TriggerStart)
	took := time.Since(start)
	t.Log(rep.Summary())
	if !rep.OK() {
		t.Fatalf("not OK: %s: %s", rep.Global, rep.GlobalDetail)
	}
	for _, s := range all {
		d := result(t, rep, s.ID)
		st := stateOf(t, c, s.ID)
		t.Logf("server %s %-16s host %-6s → %s/%s/%s, domain %s", s.ID, s.Name, s.Host, d.Decision, d.Reason, d.Outcome, st)
		if stale[s.ID] != (st == "shutoff") {
			t.Errorf("server %s (host %s): domain %s, stale=%v", s.ID, s.Host, st, stale[s.ID])
		}
	}
	if rep.Destroyed != len(stale) {
		t.Errorf("destroyed %d, want %d", rep.Destroyed, len(stale))
	}
	if took > 5*time.Second {
		t.Errorf("reconciliation took %v (target ≤ 5 s)", took)
	}
	t.Logf("%d servers, %d destroyed in %v with %d API calls (auth included)", len(all), rep.Destroyed, took, rep.APICalls)
}
