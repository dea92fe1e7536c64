package openstack

import (
	"strings"
	"testing"

	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

// FuzzDecodeMigrationsPage: whatever bytes Nova (or something pretending to
// be Nova) sends, the decoder never panics, and what it accepts is
// complete: every record has an id, canonical UUIDs, a status, a type and a
// creation time, no more records than the limit, and a next link names a
// marker.
func FuzzDecodeMigrationsPage(f *testing.F) {
	for _, name := range []string{"migrations-node1-all", "migrations-node1-page1", "migrations-node1-page2",
		"migrations-node1-page3", "migrations-mv21", "migrations-host-node2", "migrations-bad-marker", "server-evacuated"} {
		r, err := openstacktest.Load(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(r.Body)
	}
	f.Add([]byte(`{"migrations": null}`))
	f.Add([]byte(`{"migrations": [{}]}`))
	f.Add([]byte(`{"migrations": [], "migrations_links": [{"rel": "next", "href": "x?marker="}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		const limit = 3
		p, err := decodeMigrationsPage(body, limit)
		if err != nil {
			return
		}
		if len(p.Migrations) > limit {
			t.Fatalf("%d records accepted with limit %d", len(p.Migrations), limit)
		}
		if p.Next && p.NextMarker == "" {
			t.Fatal("next link without marker accepted")
		}
		for _, m := range p.Migrations {
			if m.ID <= 0 || !reconcile.ValidUUID(m.UUID) || !reconcile.ValidUUID(m.InstanceUUID) || m.Status == "" ||
				m.CreatedAt.IsZero() || m.Type == "" {
				t.Fatalf("incomplete record accepted: %+v", m)
			}
		}
	})
}

// FuzzDecodeServer: never panics; an accepted answer is about the server
// asked for and says Found.
func FuzzDecodeServer(f *testing.F) {
	for _, name := range []string{"server-evacuated", "server-on-node1", "server-not-found"} {
		r, err := openstacktest.Load(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(r.Body)
	}
	f.Add(openstacktest.ServerBody(recEvac1, "", "SHELVED_OFFLOADED", ""))
	f.Add([]byte(`{"server": {"id": "` + recEvac1 + `", "status": "ACTIVE", "OS-EXT-SRV-ATTR:host": null, "OS-EXT-STS:task_state": null, "OS-EXT-STS:vm_state": null}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := decodeServer(body, recEvac1)
		if err != nil {
			return
		}
		if !s.Found || s.Status == "" {
			t.Fatalf("accepted %+v", s)
		}
		if !strings.Contains(string(body), "OS-EXT-SRV-ATTR:host") {
			t.Fatal("accepted without the host attribute")
		}
		_ = checkNotFound(body) // must not panic either
	})
}
