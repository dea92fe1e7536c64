//go:build e2e

package openstack

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"hvguard/reconcile"
)

// e2eClient returns a Client for the real harness (test/e2e/openstack,
// cloud hvguard-e2e), or skips with the reason.
func e2eClient(t *testing.T) *Client {
	t.Helper()
	path := os.Getenv("HVG_OS_CLOUDS")
	if path == "" {
		path = "/var/tmp/hvguard-e2e/clouds.yaml"
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no harness clouds.yaml at %s (run test/e2e/openstack/up.sh or set HVG_OS_CLOUDS): %v", path, err)
	}
	c, err := New(Config{Cloud: "hvguard-e2e", CloudsFile: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.compute(ctx); err != nil {
		t.Skipf("harness not reachable: %v", err)
	}
	return c
}

// TestE2EListAndLookup checks the client against the real Nova in whatever
// state the harness is: every record matches the filters, paging one
// record at a time gives the same set as one big page, and each server of
// a record is looked up (found, or a genuine 404), a made-up UUID is 404.
func TestE2EListAndLookup(t *testing.T) {
	c := e2eClient(t)
	ctx := context.Background()
	for _, host := range []string{"node1", "node2", "NODE1"} {
		all, err := c.ListEvacuationsFrom(ctx, host)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		c.pageSize = 1
		calls0 := c.Calls()
		paged, err := c.ListEvacuationsFrom(ctx, host)
		calls := c.Calls() - calls0
		c.pageSize = c.cfg.PageSize
		if err != nil {
			t.Fatalf("%s paged: %v", host, err)
		}
		ids := func(ms []reconcile.Migration) []int64 {
			var out []int64
			for _, m := range ms {
				out = append(out, m.ID)
			}
			slices.Sort(out)
			return out
		}
		if !slices.Equal(ids(all), ids(paged)) {
			t.Fatalf("%s: one page %v, paged %v", host, ids(all), ids(paged))
		}
		t.Logf("%s: %d evacuations; %d requests with page size 1", host, len(all), calls)
		if want := uint64(len(all) + 1); len(all) > 0 && calls != want {
			t.Errorf("paged listing made %d requests, want %d (one per record plus the empty last page)", calls, want)
		}
		var uuids []string
		for _, m := range all {
			t.Logf("  migration %d %s instance %s %s→%s status %s created %s", m.ID, m.UUID, m.InstanceUUID, m.SourceCompute, m.DestCompute, m.Status, m.CreatedAt.Format(time.RFC3339))
			uuids = append(uuids, m.InstanceUUID)
		}
		slices.Sort(uuids)
		uuids = slices.Compact(uuids)
		missing := "6f1c2a9e-0000-4000-8000-00000000dead"
		got, err := c.ServerHosts(ctx, append(uuids, missing))
		if err != nil {
			t.Fatalf("ServerHosts: %v", err)
		}
		if got[missing].Found {
			t.Fatalf("made-up server found: %+v", got[missing])
		}
		for _, u := range uuids {
			t.Logf("  server %s: %+v", u, got[u])
		}
	}
}
