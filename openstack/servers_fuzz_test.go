package openstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

func addRecorded(f *testing.F, prefix string) {
	ms, _ := filepath.Glob(filepath.Join(openstacktest.TestdataDir(), prefix+"*.json"))
	for _, m := range ms {
		name := strings.TrimSuffix(filepath.Base(m), ".json")
		r, err := openstacktest.Load(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(r.Body)
	}
}

// FuzzDecodeServersPage: never panics; an accepted page has at most limit
// servers, each complete (UUID id, status, vm_state, power state 0..7), and
// a next link names a marker.
func FuzzDecodeServersPage(f *testing.F) {
	addRecorded(f, "e2e-lv-servers")
	f.Add([]byte(`{"servers": null}`))
	f.Add([]byte(`{"servers": [{}]}`))
	f.Add([]byte(`{"servers": [{"id": "` + recEvac1 + `", "status": "ACTIVE", "OS-EXT-SRV-ATTR:host": "node3", "OS-EXT-STS:task_state": null, "OS-EXT-STS:vm_state": "active", "OS-EXT-STS:power_state": 1}], "servers_links": [{"rel": "next", "href": "x?marker=` + recEvac1 + `"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		const limit = 3
		p, err := decodeServersPage(body, limit)
		if err != nil {
			return
		}
		if len(p.Servers) > limit {
			t.Fatalf("%d servers accepted with limit %d", len(p.Servers), limit)
		}
		if p.Next && p.NextMarker == "" {
			t.Fatal("next link without marker accepted")
		}
		for _, s := range p.Servers {
			if !reconcile.ValidUUID(s.ID) || s.Status == "" || s.VMState == "" || s.PowerState < 0 || s.PowerState > 7 {
				t.Fatalf("incomplete server accepted: %+v", s)
			}
		}
	})
}

// FuzzDecodeInstanceActions: never panics; accepted actions are about the
// server asked for, named, with a start time, at most MaxActions.
func FuzzDecodeInstanceActions(f *testing.F) {
	addRecorded(f, "e2e-lv-actions")
	f.Add([]byte(`{"instanceActions": []}`))
	f.Add([]byte(`{"instanceActions": [{"action": "stop", "instance_uuid": "` + recEvac1 + `", "request_id": "req-1", "user_id": null, "project_id": null, "start_time": "2026-11-29T20:00:00.000000", "message": null, "updated_at": null}]}`))
	uuid := recEvac1
	if b, err := os.ReadFile(filepath.Join(openstacktest.TestdataDir(), "e2e-lv-actions-user-stop.mv2.59.json")); err == nil {
		if i := strings.Index(string(b), `"instance_uuid": "`); i >= 0 {
			uuid = string(b[i+18 : i+18+36])
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, u := range []string{uuid, recEvac1} {
			as, err := decodeInstanceActions(body, u)
			if err != nil {
				continue
			}
			if len(as) > MaxActions {
				t.Fatalf("%d actions accepted", len(as))
			}
			for _, a := range as {
				if a.Action == "" || a.RequestID == "" || a.StartTime.IsZero() {
					t.Fatalf("incomplete action accepted: %+v", a)
				}
			}
		}
	})
}
