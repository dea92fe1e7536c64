package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

// Real UUIDs of the recorded responses (Nova 26.2.2, fake driver): two
// servers evacuated node1 → node2 (status done), one left on node1.
const (
	recEvac1   = "d3fe1837-1656-48ea-8337-667709b89817" // migration 1
	recEvac2   = "57a7da7d-2a0e-4df8-9f76-cc82fae3ff85" // migration 2
	recOnNode1 = "7957de7b-13d7-491d-b919-f56b3617fe5b"
	recMissing = "6f1c2a9e-0000-4000-8000-000000000003"
	recMig2    = "c8d1a087-d60b-4a3d-b2e5-4c193cfbb154"
	recMig1    = "ccaebfa1-92b9-437c-9c63-e8e712193dd7"
	evacQuery  = "/v2.1/os-migrations?source_compute=node1&migration_type=evacuation"
)

func replay(t *testing.T) (*openstacktest.Server, *Client) {
	t.Helper()
	s := openstacktest.New(t)
	s.RouteFile(evacQuery+"&limit=500", "migrations-node1-all")
	s.RouteFile(evacQuery+"&limit=1", "migrations-node1-page1")
	s.RouteFile(evacQuery+"&limit=1&marker="+recMig2, "migrations-node1-page2")
	s.RouteFile(evacQuery+"&limit=1&marker="+recMig1, "migrations-node1-page3")
	s.RouteFile("/v2.1/os-migrations?source_compute=node2&migration_type=evacuation&limit=500", "migrations-node2-none")
	s.RouteFile("/v2.1/servers/"+recEvac1, "server-evacuated")
	s.RouteFile("/v2.1/servers/"+recOnNode1, "server-on-node1")
	s.RouteFile("/v2.1/servers/"+recMissing, "server-not-found")
	c, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), RequestTimeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func wantKind(t *testing.T, err error, k Kind) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error of kind %s, got %T %v", k, err, err)
	}
	if e.Kind != k {
		t.Fatalf("want kind %s, got %s: %v", k, e.Kind, err)
	}
	return e
}

func TestContractListEvacuations(t *testing.T) {
	_, c := replay(t)
	ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d migrations", len(ms))
	}
	m := ms[1]
	want := reconcile.Migration{ID: 1, UUID: recMig1, InstanceUUID: recEvac1, SourceCompute: "node1", DestCompute: "node2",
		DestHost: "192.168.0.1", SourceNode: "node1", DestNode: "node2", Status: "done", Type: "evacuation",
		CreatedAt: time.Date(2026, 11, 29, 19, 14, 53, 0, time.UTC), UpdatedAt: time.Date(2026, 11, 29, 19, 14, 56, 0, time.UTC)}
	if m != want {
		t.Fatalf("decoded\n %+v\nwant\n %+v", m, want)
	}
	// 2 requests: keystone is not counted by the replay server's Nova
	// counter, the client counts both.
	if c.Calls() != 2 {
		t.Fatalf("calls = %d, want 2 (token + one page)", c.Calls())
	}
	none, err := c.ListEvacuationsFrom(context.Background(), "node2")
	if err != nil || len(none) != 0 {
		t.Fatalf("node2: %v %v", none, err)
	}
}

func TestContractPaging(t *testing.T) {
	s, c := replay(t)
	c.pageSize = 1
	ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].ID != 2 || ms[1].ID != 1 {
		t.Fatalf("paged: %+v", ms)
	}
	// Nova gives a next link on every full page; the last page is empty.
	if s.NovaRequests() != 3 {
		t.Fatalf("%d requests: %v", s.NovaRequests(), s.Requests())
	}
}

func TestContractPagingFailuresAreNeverPartial(t *testing.T) {
	for _, c := range []struct {
		fault openstacktest.Fault
		kind  Kind
	}{
		{openstacktest.Fault500, KindServer},
		{openstacktest.Fault503, KindServer},
		{openstacktest.FaultDrop, KindUnreachable},
		{openstacktest.FaultHang, KindTimeout},
	} {
		t.Run(fmt.Sprint(c.kind), func(t *testing.T) {
			s, cl := replay(t)
			cl.pageSize = 1
			cl.cfg.RequestTimeout = 300 * time.Millisecond
			s.FailFrom(2, c.fault) // from the second page on
			ms, err := cl.ListEvacuationsFrom(context.Background(), "node1")
			if ms != nil {
				t.Fatalf("partial result returned: %+v", ms)
			}
			e := wantKind(t, err, c.kind)
			if !IsUnavailable(err) || e.ReconcileReason() != reconcile.ReasonNovaUnavailable {
				t.Fatalf("%v not unavailable", err)
			}
		})
	}
}

func TestContractRejections(t *testing.T) {
	for _, c := range []struct {
		name   string
		file   string
		kind   Kind
		reason reconcile.Reason
	}{
		{"unknown parameter 400", "migrations-unknown-param", KindRejected, reconcile.ReasonNovaRejected},
		{"marker not found 400", "migrations-bad-marker", KindRejected, reconcile.ReasonNovaRejected},
		{"microversion unsupported 406", "microversion-unsupported", KindRejected, reconcile.ReasonNovaRejected},
		// A 2.1 answer (the pin ignored, e.g. by a proxy): no uuid, no paging.
		{"answer at 2.1", "migrations-mv21", KindMalformed, reconcile.ReasonMalformedData},
		// host=node2 matches source OR destination: served for a
		// source_compute=node2 query, its records have source node1.
		{"filter not applied", "migrations-host-node2", KindMalformed, reconcile.ReasonMalformedData},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, cl := replay(t)
			s.RouteFile("/v2.1/os-migrations?source_compute=node2&migration_type=evacuation&limit=500", c.file)
			ms, err := cl.ListEvacuationsFrom(context.Background(), "node2")
			if ms != nil {
				t.Fatalf("result despite %s: %+v", c.name, ms)
			}
			e := wantKind(t, err, c.kind)
			if e.ReconcileReason() != c.reason || IsUnavailable(err) {
				t.Fatalf("reason %s, unavailable %v", e.ReconcileReason(), IsUnavailable(err))
			}
		})
	}
}

func TestContractShapeFaults(t *testing.T) {
	page1 := openstacktest.MustLoad(t, "migrations-node1-page1")
	for _, c := range []struct {
		name string
		mod  func(r *openstacktest.Recorded)
		kind Kind
	}{
		{"no microversion header", func(r *openstacktest.Recorded) {
			r.Header.Del("OpenStack-API-Version")
			r.Header.Del("X-OpenStack-Nova-API-Version")
		}, KindMalformed},
		{"other microversion", func(r *openstacktest.Recorded) { r.Header.Set("OpenStack-API-Version", "compute 2.93") }, KindMalformed},
		{"html", func(r *openstacktest.Recorded) { r.Header.Set("Content-Type", "text/html") }, KindMalformed},
		{"next marker is not the last record", func(r *openstacktest.Recorded) {
			r.Body = []byte(strings.Replace(string(r.Body), "marker="+recMig2, "marker="+recMig1, 1))
		}, KindMalformed},
		{"more records than the limit", func(r *openstacktest.Recorded) {
			b := string(r.Body)
			i, j := strings.Index(b, "{\"id\""), strings.Index(b, "}], \"migrations_links\"")
			rec := b[i : j+1]
			r.Body = []byte(strings.Replace(b, rec, rec+", "+strings.Replace(rec, recMig2, recMig1, 1), 1))
		}, KindMalformed},
		{"truncated", func(r *openstacktest.Recorded) { r.Body = r.Body[:len(r.Body)/2] }, KindMalformed},
		{"status null", func(r *openstacktest.Recorded) {
			r.Body = []byte(strings.Replace(string(r.Body), `"status": "done"`, `"status": null`, 1))
		}, KindMalformed},
		{"id is a string", func(r *openstacktest.Recorded) {
			r.Body = []byte(strings.Replace(string(r.Body), `"id": 2`, `"id": "2"`, 1))
		}, KindMalformed},
		{"duplicate key", func(r *openstacktest.Recorded) {
			r.Body = []byte(strings.Replace(string(r.Body), `"source_compute": "node1"`, `"source_compute": "node1", "source_compute": "node9"`, 1))
		}, KindMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, cl := replay(t)
			cl.pageSize = 1
			r := page1
			r.Header = page1.Header.Clone()
			r.Body = append([]byte(nil), page1.Body...)
			c.mod(&r)
			s.Route(evacQuery+"&limit=1", r)
			ms, err := cl.ListEvacuationsFrom(context.Background(), "node1")
			if ms != nil {
				t.Fatalf("result despite %s", c.name)
			}
			wantKind(t, err, c.kind)
		})
	}
}

func TestContractTotalCap(t *testing.T) {
	s := openstacktest.New(t)
	uuids := make([]string, MaxEvacuations+1)
	ev := make([]bool, len(uuids))
	for i := range uuids {
		uuids[i], ev[i] = fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i), true
	}
	s.Scenario(uuids, ev, 1000)
	c, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), PageSize: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
	if ms != nil {
		t.Fatal("result beyond the cap")
	}
	e := wantKind(t, err, KindTooLarge)
	if e.ReconcileReason() != reconcile.ReasonPartialData {
		t.Fatal(e.ReconcileReason())
	}
}

func TestContractServerHosts(t *testing.T) {
	s, c := replay(t)
	got, err := c.ServerHosts(context.Background(), []string{recEvac1, recOnNode1, recMissing})
	if err != nil {
		t.Fatal(err)
	}
	if g := got[recEvac1]; !g.Found || g.Host != "node2" || g.TaskState != "" || g.Status != "ACTIVE" || g.VMState != "active" {
		t.Fatalf("evacuated: %+v", g)
	}
	if g := got[recOnNode1]; !g.Found || g.Host != "node1" {
		t.Fatalf("on node1: %+v", g)
	}
	if g, ok := got[recMissing]; !ok || g.Found {
		t.Fatalf("missing: %+v %v", g, ok)
	}
	if s.NovaRequests() != 3 {
		t.Fatalf("%d requests", s.NovaRequests())
	}
}

func TestContractServerFaults(t *testing.T) {
	ev := openstacktest.MustLoad(t, "server-evacuated")
	for _, c := range []struct {
		name string
		rec  openstacktest.Recorded
		kind Kind
	}{
		{"404 not from Nova", openstacktest.Recorded{Status: 404, Header: openstacktest.NovaHeader(), Body: []byte(`{"error": "not found"}`)}, KindNotFound},
		{"host attribute hidden (non-admin)", openstacktest.Recorded{Status: 200, Header: ev.Header,
			Body: []byte(strings.Replace(string(ev.Body), `"OS-EXT-SRV-ATTR:host": "node2", `, "", 1))}, KindMalformed},
		{"another server", openstacktest.Recorded{Status: 200, Header: ev.Header,
			Body: []byte(strings.Replace(string(ev.Body), `"id": "`+recEvac1, `"id": "`+recOnNode1, 1))}, KindMalformed},
		{"host is a number", openstacktest.Recorded{Status: 200, Header: ev.Header,
			Body: []byte(strings.Replace(string(ev.Body), `"OS-EXT-SRV-ATTR:host": "node2"`, `"OS-EXT-SRV-ATTR:host": 2`, 1))}, KindMalformed},
		{"403", openstacktest.Recorded{Status: 403, Header: openstacktest.NovaHeader(), Body: []byte(`{"forbidden": {"code": 403}}`)}, KindRejected},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, cl := replay(t)
			s.Route("/v2.1/servers/"+recEvac1, c.rec)
			got, err := cl.ServerHosts(context.Background(), []string{recOnNode1, recEvac1})
			if got != nil {
				t.Fatalf("result despite %s: %+v", c.name, got)
			}
			wantKind(t, err, c.kind)
		})
	}
	t.Run("nova down mid-lookup", func(t *testing.T) {
		s, cl := replay(t)
		s.FailFrom(2, openstacktest.FaultDrop)
		got, err := cl.ServerHosts(context.Background(), []string{recOnNode1, recEvac1, recMissing})
		if got != nil || !IsUnavailable(err) {
			t.Fatalf("got %v, %v", got, err)
		}
	})
}

func TestContractAuth(t *testing.T) {
	t.Run("token reused", func(t *testing.T) {
		s, c := replay(t)
		for range 3 {
			if _, err := c.ListEvacuationsFrom(context.Background(), "node1"); err != nil {
				t.Fatal(err)
			}
		}
		if s.Tokens() != 1 {
			t.Fatalf("%d tokens for 3 calls", s.Tokens())
		}
	})
	t.Run("expired token re-authenticates", func(t *testing.T) {
		s, c := replay(t)
		if _, err := c.ListEvacuationsFrom(context.Background(), "node1"); err != nil {
			t.Fatal(err)
		}
		s.FailNth(1, openstacktest.Fault401)
		ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
		if err != nil || len(ms) != 2 {
			t.Fatalf("after expiry: %v %v", ms, err)
		}
		if s.Tokens() != 2 {
			t.Fatalf("%d tokens, want 2", s.Tokens())
		}
	})
	t.Run("keystone refuses", func(t *testing.T) {
		s, c := replay(t)
		s.KeystoneDown(true)
		_, err := c.ListEvacuationsFrom(context.Background(), "node1")
		wantKind(t, err, KindAuth)
		if !IsUnavailable(err) {
			t.Fatal("auth failure must count as unavailable")
		}
		// Lazy: keystone back, the next call authenticates.
		s.KeystoneDown(false)
		if _, err := c.ListEvacuationsFrom(context.Background(), "node1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("keystone unreachable", func(t *testing.T) {
		s := openstacktest.New(t)
		path := s.CloudsYAML(t)
		s.Close()
		c, err := New(Config{Cloud: "test", CloudsFile: path, RequestTimeout: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ListEvacuationsFrom(context.Background(), "node1")
		if !IsUnavailable(err) {
			t.Fatalf("%v", err)
		}
	})
}

func TestConfig(t *testing.T) {
	if err := (Config{}).Validate(); err == nil {
		t.Fatal("empty cloud accepted")
	}
	if err := (Config{Cloud: "x", Interface: "privat"}).Validate(); err == nil {
		t.Fatal("bad interface accepted")
	}
	if _, err := New(Config{Cloud: "nope", CloudsFile: "/nonexistent/clouds.yaml"}, nil); err == nil {
		t.Fatal("missing clouds.yaml accepted")
	}
	s := openstacktest.New(t)
	if _, err := New(Config{Cloud: "other", CloudsFile: s.CloudsYAML(t)}, nil); err == nil || !strings.Contains(err.Error(), "other") {
		t.Fatalf("unknown cloud: %v", err)
	}
	if _, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), CACert: "/nonexistent/ca.pem"}, nil); err == nil {
		t.Fatal("missing CA bundle accepted")
	}
	c, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), Region: "RegionTwo", Interface: "internal"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.cloud.endpoint.Region != "RegionTwo" || c.cloud.endpoint.Availability != "internal" || !c.cloud.auth.AllowReauth {
		t.Fatalf("overrides not applied: %+v %+v", c.cloud.endpoint, c.cloud.auth.AllowReauth)
	}
	// No compute endpoint in RegionTwo: a configuration error at the first call.
	_, err = c.ListEvacuationsFrom(context.Background(), "node1")
	wantKind(t, err, KindConfig)
}

func TestMicroversionHeader(t *testing.T) {
	h := http.Header{}
	if checkMicroversion(h) == nil {
		t.Fatal("no header accepted")
	}
	h.Set("OpenStack-API-Version", "compute 2.59")
	if err := checkMicroversion(h); err != nil {
		t.Fatal(err)
	}
	h.Set("X-OpenStack-Nova-API-Version", "2.1")
	if checkMicroversion(h) == nil {
		t.Fatal("contradicting headers accepted")
	}
}

// Responses recorded by test/e2e/openstack's evacuation scenario (copied to
// testdata as e2e-*.json).
func TestContractHarnessRecordings(t *testing.T) {
	t.Run("done and completed records", func(t *testing.T) {
		s, c := replay(t)
		s.RouteFile(evacQuery+"&limit=500", "e2e-migrations-evacuation-node1.mv2.59")
		ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
		if err != nil {
			t.Fatal(err)
		}
		st := map[string]int{}
		for _, m := range ms {
			st[m.Status]++
		}
		if len(ms) != 4 || st["done"] != 2 || st["completed"] != 2 {
			t.Fatalf("%+v", ms)
		}
	})
	t.Run("completed after the source compute restarted", func(t *testing.T) {
		s, c := replay(t)
		s.RouteFile(evacQuery+"&limit=500", "e2e-migrations-evacuation-node1-completed.mv2.59")
		ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
		if err != nil || len(ms) != 1 || ms[0].Status != "completed" {
			t.Fatalf("%+v %v", ms, err)
		}
	})
	for name, file := range map[string]string{
		"answered at 2.80":                        "e2e-migrations-evacuation-node1.mv2.80",
		"host filter answer (migrate-back mixed)": "e2e-migrations-node1-after-migrate-back.mv2.59",
	} {
		t.Run(name, func(t *testing.T) {
			s, c := replay(t)
			s.RouteFile(evacQuery+"&limit=500", file)
			ms, err := c.ListEvacuationsFrom(context.Background(), "node1")
			if ms != nil {
				t.Fatalf("accepted: %+v", ms)
			}
			wantKind(t, err, KindMalformed)
		})
	}
	t.Run("404 at another microversion is not an answer", func(t *testing.T) {
		s, c := replay(t)
		s.RouteFile("/v2.1/servers/"+recEvac1, "e2e-server-deleted-404.mv2.1")
		if got, err := c.ServerHosts(context.Background(), []string{recEvac1}); got != nil || err == nil {
			t.Fatalf("%v %v", got, err)
		}
	})
}
