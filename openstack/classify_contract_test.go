package openstack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"hvguard/classify"
	"hvguard/openstack"
	"hvguard/openstack/openstacktest"
)

// TestRecordedThroughClassifier feeds Nova's real answers (libvirt-driver
// compute, Nova 26.2.2) through the client and the mapping the agent uses
// (ClassifyServers, ClassifyActions) into the classifier: a soft and
// a hard reboot in flight are held; the stop API is stopped-by-nova;
// virsh destroy after Nova's own sync stopped it is stopped-unexpectedly.
func TestRecordedThroughClassifier(t *testing.T) {
	type rec struct {
		Request string `json:"request"`
		Body    struct {
			Actions []struct {
				UUID  string `json:"instance_uuid"`
				Start string `json:"start_time"`
			} `json:"instanceActions"`
		} `json:"body"`
	}
	load := func(name string) rec {
		r := openstacktest.MustLoad(t, name)
		var x rec
		json.Unmarshal(r.Body, &x.Body)
		return x
	}
	start := func(s string) time.Time {
		tm, err := time.Parse("2006-01-02T15:04:05.999999", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	user := load("e2e-lv-actions-user-stop.mv2.59")
	nova := load("e2e-lv-actions-nova-sync-stop.mv2.59")
	// Began: the guest went down ~2.3 s after the user's stop request
	// (measured: STOPPED/SHUTDOWN at +2.27 s); Nova's own stop came ~16 s
	// after the destroy.
	userBegan := start(user.Body.Actions[0].Start).Add(2 * time.Second)
	novaBegan := start(nova.Body.Actions[0].Start).Add(-16 * time.Second)

	for _, c := range []struct {
		listing, actions string
		uuid             string
		began            time.Time
		want             string
	}{
		{"e2e-lv-servers-node3-soft-rebooting.mv2.59", "", "", time.Time{}, "hold operation-in-flight detail=shutdown-by-guest task=reboot_started vm=active"},
		{"e2e-lv-servers-node3-hard-rebooting.mv2.59", "", "", time.Time{}, "hold operation-in-flight detail=shutdown-by-guest task=reboot_started_hard vm=active"},
		{"e2e-lv-servers-node3-stopped.mv2.59", "e2e-lv-actions-user-stop.mv2.59", user.Body.Actions[0].UUID, userBegan,
			"report stopped-by-nova stop-requested detail=shutdown-by-guest vm=stopped"},
	} {
		t.Run(c.listing, func(t *testing.T) {
			s := openstacktest.New(t)
			s.RouteFile("/v2.1/servers/detail?all_tenants=1&host=node3&limit=500", c.listing)
			if c.actions != "" {
				s.RouteFile(fmt.Sprintf("/v2.1/servers/%s/os-instance-actions?limit=%d", c.uuid, openstack.MaxActions), c.actions)
			}
			cl, err := openstack.New(openstack.Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			ss, err := cl.ServersOnHost(ctx, "node3")
			if err != nil {
				t.Fatal(err)
			}
			uuid, began := c.uuid, c.began
			if uuid == "" { // the server with the reboot task
				for _, x := range ss {
					if x.TaskState != "" {
						uuid = x.ID
					}
				}
				began = time.Now().Add(-time.Hour)
			}
			k, _ := classify.New(classify.Config{})
			now := began.Add(15 * time.Second)
			ds := k.Add(classify.Stop{UUID: uuid, Detail: classify.DetailShutdown, Began: began}, now)
			ds = k.ServersResult(ds[0].Token, openstack.ClassifyServers(ss), nil, now)
			if len(ds) == 1 && ds[0].Op == classify.OpQueryActions {
				as, err := cl.InstanceActions(ctx, uuid)
				if err != nil {
					t.Fatal(err)
				}
				ds = k.ActionsResult(ds[0].Token, uuid, openstack.ClassifyActions(as), nil, now)
			}
			if len(ds) != 1 || ds[0].String() != c.want {
				t.Fatalf("got %v, want %s", ds, c.want)
			}
		})
	}

	// Nova's own stop (vm_state stopped, stop action without a user) of
	// the virsh-destroyed guest.
	t.Run("nova-sync-stop", func(t *testing.T) {
		s := openstacktest.New(t)
		uuid := nova.Body.Actions[0].UUID
		s.RouteFile(fmt.Sprintf("/v2.1/servers/%s/os-instance-actions?limit=%d", uuid, openstack.MaxActions), "e2e-lv-actions-nova-sync-stop.mv2.59")
		cl, _ := openstack.New(openstack.Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}, nil)
		as, err := cl.InstanceActions(context.Background(), uuid)
		if err != nil {
			t.Fatal(err)
		}
		k, _ := classify.New(classify.Config{})
		now := novaBegan.Add(17 * time.Second)
		ds := k.Add(classify.Stop{UUID: uuid, Detail: classify.DetailDestroyed, Began: novaBegan}, now)
		ds = k.ServersResult(ds[0].Token, []classify.Server{{UUID: uuid, VMState: classify.VMStopped, PowerState: classify.PowerShutdown}}, nil, now)
		ds = k.ActionsResult(ds[0].Token, uuid, openstack.ClassifyActions(as), nil, now)
		if len(ds) != 1 || ds[0].String() != "report stopped-unexpectedly nova-synced-stop detail=destroyed vm=stopped" {
			t.Fatalf("got %v", ds)
		}
	})
}
