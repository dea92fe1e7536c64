package openstack

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/openstack/openstacktest"
)

// Recorded from the real Nova 26.2.2 with the libvirt-driver compute node3
// (test/e2e/openstack TestLibvirtNovaReboots, HVG_E2E_RECORD=1).
const (
	lvList   = "/v2.1/servers/detail?all_tenants=1&host=node3&limit=500"
	lvActive = "e2e-lv-servers-node3-active.mv2.59"
)

// lvReplay serves recorded listing file for host node3's full listing.
func lvReplay(t *testing.T, file string) (*openstacktest.Server, *Client) {
	t.Helper()
	s := openstacktest.New(t)
	s.RouteFile(lvList, file)
	c, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), RequestTimeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestContractServersOnHost(t *testing.T) {
	for _, c := range []struct {
		file  string
		check func(t *testing.T, ss []ServerState)
	}{
		{lvActive, func(t *testing.T, ss []ServerState) {
			for _, s := range ss {
				if s.Status != "ACTIVE" || s.VMState != "active" || s.TaskState != "" || s.PowerState != 1 {
					t.Errorf("not active/running/no task: %+v", s)
				}
			}
		}},
		{"e2e-lv-servers-node3-soft-rebooting.mv2.59", func(t *testing.T, ss []ServerState) {
			if !anyServer(ss, func(s ServerState) bool { return s.TaskState == "reboot_started" && s.Status == "REBOOT" }) {
				t.Errorf("no server in reboot_started/REBOOT: %+v", ss)
			}
		}},
		{"e2e-lv-servers-node3-hard-rebooting.mv2.59", func(t *testing.T, ss []ServerState) {
			if !anyServer(ss, func(s ServerState) bool { return s.TaskState == "reboot_started_hard" && s.Status == "HARD_REBOOT" }) {
				t.Errorf("no server in reboot_started_hard/HARD_REBOOT: %+v", ss)
			}
		}},
		{"e2e-lv-servers-node3-stopped.mv2.59", func(t *testing.T, ss []ServerState) {
			if !anyServer(ss, func(s ServerState) bool {
				return s.Status == "SHUTOFF" && s.VMState == "stopped" && s.PowerState == 4 && s.TaskState == ""
			}) {
				t.Errorf("no server SHUTOFF/stopped/shutdown: %+v", ss)
			}
		}},
	} {
		t.Run(c.file, func(t *testing.T) {
			s, cl := lvReplay(t, c.file)
			ss, err := cl.ServersOnHost(context.Background(), "node3")
			if err != nil {
				t.Fatal(err)
			}
			if len(ss) < 2 {
				t.Fatalf("%d servers", len(ss))
			}
			for _, x := range ss {
				if x.Host != "node3" {
					t.Errorf("host %q", x.Host)
				}
			}
			c.check(t, ss)
			if s.NovaRequests() != 1 {
				t.Errorf("%d requests, want 1", s.NovaRequests())
			}
		})
	}
}

func anyServer(ss []ServerState, f func(ServerState) bool) bool {
	for _, s := range ss {
		if f(s) {
			return true
		}
	}
	return false
}

// Paging follows servers_links with marker = the last id; a page of
// limit servers always carries a next link, so the walk ends on a short
// (here empty) page.
func TestContractServersPaging(t *testing.T) {
	s, c := lvReplay(t, lvActive)
	c.pageSize = 1
	p1 := openstacktest.MustLoad(t, "e2e-lv-servers-node3-limit1.mv2.59")
	p2 := openstacktest.MustLoad(t, "e2e-lv-servers-node3-limit1-page2.mv2.59")
	first, _ := decodeServersPage(p1.Body, 1)
	second, _ := decodeServersPage(p2.Body, 1)
	if !first.Next || !second.Next {
		t.Fatalf("recorded pages lack next links: %+v %+v", first, second)
	}
	s.Route("/v2.1/servers/detail?all_tenants=1&host=node3&limit=1", p1)
	s.Route("/v2.1/servers/detail?all_tenants=1&host=node3&limit=1&marker="+first.NextMarker, p2)
	s.Route("/v2.1/servers/detail?all_tenants=1&host=node3&limit=1&marker="+second.NextMarker,
		openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: []byte(`{"servers": []}`)})
	ss, err := c.ServersOnHost(context.Background(), "node3")
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || ss[0].ID != first.Servers[0].ID || ss[1].ID != second.Servers[0].ID {
		t.Fatalf("%+v", ss)
	}
	if s.NovaRequests() != 3 {
		t.Fatalf("%d requests: %v", s.NovaRequests(), s.Requests())
	}
	// the same page twice: paging inconsistent
	s.Route("/v2.1/servers/detail?all_tenants=1&host=node3&limit=1&marker="+first.NextMarker, p1)
	if _, err := c.ServersOnHost(context.Background(), "node3"); err == nil {
		t.Fatal("a server listed twice was accepted")
	}
}

func TestContractServersFailures(t *testing.T) {
	active := openstacktest.MustLoad(t, lvActive)
	mutate := func(f func(m map[string]any)) openstacktest.Recorded {
		var doc map[string]any
		if err := json.Unmarshal(active.Body, &doc); err != nil {
			t.Fatal(err)
		}
		f(doc["servers"].([]any)[0].(map[string]any))
		b, _ := json.Marshal(doc)
		return openstacktest.Recorded{Status: 200, Header: active.Header, Body: b}
	}
	for _, c := range []struct {
		name  string
		rec   *openstacktest.Recorded
		fault openstacktest.Fault
		host  string
		kind  Kind
	}{
		// node3's servers served for host=node1: the filter was not applied
		{name: "filter not applied", host: "node1", kind: KindMalformed},
		{name: "500", fault: openstacktest.Fault500, kind: KindServer},
		{name: "drop", fault: openstacktest.FaultDrop, kind: KindUnreachable},
		{name: "hang", fault: openstacktest.FaultHang, kind: KindTimeout},
		{name: "non-admin: no host attribute", rec: ptr(mutate(func(m map[string]any) { delete(m, attrHost) })), kind: KindMalformed},
		{name: "power_state null", rec: ptr(mutate(func(m map[string]any) { m[attrPowerState] = nil })), kind: KindMalformed},
		{name: "power_state out of range", rec: ptr(mutate(func(m map[string]any) { m[attrPowerState] = 9 })), kind: KindMalformed},
		{name: "vm_state null", rec: ptr(mutate(func(m map[string]any) { m[attrVMState] = nil })), kind: KindMalformed},
		{name: "task_state missing", rec: ptr(mutate(func(m map[string]any) { delete(m, attrTaskState) })), kind: KindMalformed},
		{name: "id not a uuid", rec: ptr(mutate(func(m map[string]any) { m["id"] = "42" })), kind: KindMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, cl := lvReplay(t, lvActive)
			cl.cfg.RequestTimeout = 300 * time.Millisecond
			host := "node3"
			if c.host != "" {
				host = c.host
				s.RouteFile(strings.Replace(lvList, "node3", host, 1), lvActive)
			}
			if c.rec != nil {
				s.Route(lvList, *c.rec)
			}
			if c.fault != openstacktest.FaultNone {
				s.FailAll(c.fault)
			}
			ss, err := cl.ServersOnHost(context.Background(), host)
			if ss != nil {
				t.Fatalf("result despite %s: %+v", c.name, ss)
			}
			wantKind(t, err, c.kind)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestContractInstanceActions(t *testing.T) {
	for _, c := range []struct {
		file     string
		wantUser bool
	}{
		{"e2e-lv-actions-user-stop.mv2.59", true},
		{"e2e-lv-actions-nova-sync-stop.mv2.59", false},
	} {
		t.Run(c.file, func(t *testing.T) {
			rec := openstacktest.MustLoad(t, c.file)
			var doc struct {
				Actions []struct {
					UUID string `json:"instance_uuid"`
				} `json:"instanceActions"`
			}
			if err := json.Unmarshal(rec.Body, &doc); err != nil || len(doc.Actions) == 0 {
				t.Fatalf("recording: %v", err)
			}
			uuid := doc.Actions[0].UUID
			s := openstacktest.New(t)
			s.Route(fmt.Sprintf("/v2.1/servers/%s/os-instance-actions?limit=%d", uuid, MaxActions), rec)
			cl, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			as, err := cl.InstanceActions(context.Background(), uuid)
			if err != nil {
				t.Fatal(err)
			}
			// Nova lists newest first; the newest is the stop.
			if as[0].Action != "stop" || as[len(as)-1].Action != "create" {
				t.Fatalf("%+v", as)
			}
			if (as[0].UserID != "") != c.wantUser {
				t.Fatalf("stop action user %q, want a user: %v", as[0].UserID, c.wantUser)
			}
			for i := 1; i < len(as); i++ {
				if as[i].StartTime.After(as[i-1].StartTime) {
					t.Fatalf("not newest first: %+v", as)
				}
			}
			if _, err := cl.InstanceActions(context.Background(), recMissing); err == nil {
				t.Fatal("404 accepted")
			}
			// an answer about another server
			if _, err := decodeInstanceActions(rec.Body, recMissing); err == nil {
				t.Fatal("actions of another server accepted")
			}
		})
	}
}

// TestServersOn: the reconcile runner's destination listing maps every
// server of a recorded real listing (and of generated pages, followed to
// the last) to a lookup with that host; a failing listing is an error,
// never a partial map.
func TestServersOn(t *testing.T) {
	_, c := lvReplay(t, lvActive)
	ss, err := c.ServersOnHost(context.Background(), "node3")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ServersOn(context.Background(), "node3")
	if err != nil || len(got) != len(ss) || len(ss) == 0 {
		t.Fatalf("%d lookups for %d servers: %v", len(got), len(ss), err)
	}
	for _, s := range ss {
		if g := got[s.ID]; !g.Found || g.Host != "node3" || g.TaskState != "" || g.VMState != "active" || g.Status != "ACTIVE" {
			t.Fatalf("%s: %+v", s.ID, g)
		}
	}

	s := openstacktest.New(t)
	uuids := make([]string, 7)
	ev := make([]bool, len(uuids))
	for i := range uuids {
		uuids[i], ev[i] = fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i), i != 3
	}
	s.Scenario(uuids, ev, 2) // 6 on node2: pages of 2, 2, 2, 0
	gc, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), RequestTimeout: 2 * time.Second, PageSize: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, err := gc.ServersOn(context.Background(), "node2")
	if err != nil || len(on) != 6 || on[uuids[3]].Found || s.NovaRequests() != 4 {
		t.Fatalf("%d servers in %d requests (%v): %v", len(on), s.NovaRequests(), err, on)
	}
	s.FailAll(openstacktest.Fault500)
	if on, err := gc.ServersOn(context.Background(), "node2"); err == nil || on != nil {
		t.Fatalf("a failing listing gave %v, %v", on, err)
	}
}
