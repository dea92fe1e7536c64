package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"hvguard/openstack/openstacktest"
)

// Synthetic answers in the shapes of the real services' (field sets as
// Nova 26.2.2 / Cinder 21.3.1 / Masakari 14.0.2 write them; the recorded
// ones are in recovery_contract_test.go).
const (
	synSvc    = "1f0b3c56-5f7e-4b1c-9a53-3f3a6d0e2a11"
	synServer = "0c6a1f55-2a57-4b9b-8d7c-0d4a7b2e9f01"
	synVol    = "5b0e8a7c-31a4-4c52-9a3e-6f0a2d1c7b21"
	synAtt    = "9d2c4e6f-7a1b-4c3d-8e5f-0a1b2c3d4e51"
	synNotif  = "3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a61"
)

func apiHeader(service, mv string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("OpenStack-API-Version", service+" "+mv)
	return h
}

func rec(status int, service, mv, body string) openstacktest.Recorded {
	return openstacktest.Recorded{Status: status, Header: apiHeader(service, mv), Body: []byte(body)}
}

func serviceJSON(forced bool, state string) string {
	f := "false"
	if forced {
		f = "true"
	}
	return `{"id": "` + synSvc + `", "binary": "nova-compute", "disabled_reason": null, "host": "node1", "state": "` + state +
		`", "status": "enabled", "updated_at": "2026-12-01T18:00:00.000000", "forced_down": ` + f + `, "zone": "nova"}`
}

func recovery(t *testing.T) (*openstacktest.Server, *Recovery) {
	t.Helper()
	s, r := recorded(t)
	s.Route("/v2.1/os-services?binary=nova-compute&host=node1", rec(200, "compute", "2.53", `{"services": [`+serviceJSON(false, "up")+`]}`))
	s.Route("/v2.1/", rec(200, "compute", "2.1", `{"version": {"id": "v2.1", "status": "CURRENT", "version": "2.93", "min_version": "2.1", "updated": "2013-07-23T11:33:21Z", "links": [], "media-types": []}}`))
	return s, r
}

// lastRequest returns the last captured request with method m.
func lastRequest(t *testing.T, s *openstacktest.Server, m string) openstacktest.Request {
	t.Helper()
	cs := s.Captured()
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].Method == m {
			return cs[i]
		}
	}
	t.Fatalf("no %s request among %d", m, len(cs))
	return openstacktest.Request{}
}

func TestRecoveryForceDown(t *testing.T) {
	s, r := recovery(t)
	s.RouteMethod("PUT", "/v2.1/os-services/"+synSvc, rec(200, "compute", "2.53", `{"service": `+serviceJSON(true, "down")+`}`))
	if err := r.ForceDown(context.Background(), "node1", true); err != nil {
		t.Fatal(err)
	}
	put := lastRequest(t, s, "PUT")
	if string(put.Body) != `{"forced_down":true}` || put.Header.Get("OpenStack-API-Version") != "compute 2.53" {
		t.Fatalf("PUT %s %q %v", put.Target, put.Body, put.Header)
	}
	// Nova answering that the flag is not what was asked is malformed.
	if err := r.ForceDown(context.Background(), "node1", false); err == nil {
		t.Fatal("answer forced_down=true to a clear accepted")
	}
}

func TestRecoveryForceUpRefusedWhileEvacuationsDone(t *testing.T) {
	s, r := recovery(t)
	s.RouteMethod("PUT", "/v2.1/os-services/"+synSvc, rec(400, "compute", "2.53",
		`{"badRequest": {"code": 400, "message": "Unable to force up host node1 as `+"`done`"+` evacuation migration records remain associated with the host. Ensure the compute service has been restarted, allowing these records to move to `+"`completed`"+` before retrying this request."}}`))
	s.RouteFile(evacQuery+"&limit=500", "migrations-node1-all")
	err := r.ForceDown(context.Background(), "node1", false)
	if !errors.Is(err, ErrDoneEvacuations) {
		t.Fatalf("%v", err)
	}
	wantKind(t, err, KindConflict)
	if !strings.Contains(err.Error(), recEvac1) {
		t.Fatalf("error does not name the evacuated servers: %v", err)
	}
	// Another 400 (no done evacuations) stays a plain rejection.
	s.RouteFile(evacQuery+"&limit=500", "migrations-node2-none")
	err = r.ForceDown(context.Background(), "node1", false)
	if errors.Is(err, ErrDoneEvacuations) {
		t.Fatalf("%v", err)
	}
	wantKind(t, err, KindRejected)
}

func TestRecoveryService(t *testing.T) {
	s, r := recovery(t)
	svc, err := r.Service(context.Background(), "node1")
	if err != nil {
		t.Fatal(err)
	}
	if svc.ID != synSvc || !svc.Up() || svc.ForcedDown || svc.Status != "enabled" || svc.UpdatedAt.IsZero() {
		t.Fatalf("%+v", svc)
	}
	s.Route("/v2.1/os-services?binary=nova-compute&host=node9", rec(200, "compute", "2.53", `{"services": []}`))
	_, err = r.Service(context.Background(), "node9")
	if !errors.Is(err, ErrNoComputeService) {
		t.Fatalf("%v", err)
	}
	// An answer at 2.1 (integer ids) is not accepted.
	s.Route("/v2.1/os-services?binary=nova-compute&host=node1", rec(200, "compute", "2.53",
		`{"services": [`+strings.Replace(serviceJSON(false, "up"), `"`+synSvc+`"`, "7", 1)+`]}`))
	_, err = r.Service(context.Background(), "node1")
	wantKind(t, err, KindMalformed)
}

func TestRecoveryEvacuateMicroversion(t *testing.T) {
	for _, c := range []struct {
		max, want string
	}{{"2.93", "2.93"}, {"2.96", "2.94"}, {"2.20", "2.20"}, {"2.10", ""}} {
		t.Run(c.max, func(t *testing.T) {
			s, r := recovery(t)
			s.Route("/v2.1/", rec(200, "compute", "2.1", `{"version": {"id": "v2.1", "status": "CURRENT", "version": "`+c.max+`", "min_version": "2.1"}}`))
			if c.want != "" {
				s.RouteMethod("POST", "/v2.1/servers/"+synServer+"/action", openstacktest.Recorded{Status: 200, Header: apiHeader("compute", c.want)})
			}
			err := r.Evacuate(context.Background(), synServer)
			if c.want == "" {
				wantKind(t, err, KindRejected)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			post := lastRequest(t, s, "POST")
			if string(post.Body) != `{"evacuate":{}}` || post.Header.Get("OpenStack-API-Version") != "compute "+c.want ||
				post.Header.Get("X-OpenStack-Nova-API-Version") != c.want {
				t.Fatalf("POST %q %v", post.Body, post.Header)
			}
		})
	}
}

func TestRecoveryEvacuateSourceUp(t *testing.T) {
	s, r := recovery(t)
	s.RouteMethod("POST", "/v2.1/servers/"+synServer+"/action", rec(400, "compute", "2.93",
		`{"badRequest": {"code": 400, "message": "Compute service of node1 is still in use."}}`))
	err := r.Evacuate(context.Background(), synServer)
	if !errors.Is(err, ErrSourceHostUp) {
		t.Fatalf("%v", err)
	}
}

func volumeJSON(host string) string {
	h := `null`
	if host != "" {
		h = `"` + host + `"`
	}
	return `{"volume": {"id": "` + synVol + `", "status": "in-use", "size": 1, "multiattach": false, "attachments": [{"id": "` + synVol +
		`", "attachment_id": "` + synAtt + `", "volume_id": "` + synVol + `", "server_id": "` + synServer + `", "host_name": ` + h +
		`, "device": "/dev/vda", "attached_at": "2026-12-01T18:00:00.000000"}]}}`
}

func TestRecoveryRemoveAttachment(t *testing.T) {
	volURL := openstacktest.VolumePath + "/volumes/" + synVol
	attURL := openstacktest.VolumePath + "/attachments/" + synAtt
	t.Run("removed with the service token", func(t *testing.T) {
		s, r := recovery(t)
		s.Route(volURL, rec(200, "volume", "3.44", volumeJSON("node1")))
		s.RouteMethod("DELETE", attURL, rec(200, "volume", "3.44", `{"attachments": []}`))
		if err := r.RemoveAttachment(context.Background(), synVol, synAtt, "NODE1"); err != nil {
			t.Fatal(err)
		}
		del := lastRequest(t, s, "DELETE")
		if !strings.HasPrefix(del.Header.Get("X-Service-Token"), "svc-token-") || !strings.HasPrefix(del.Header.Get("X-Auth-Token"), "token-") ||
			del.Header.Get("OpenStack-API-Version") != "volume 3.44" {
			t.Fatalf("DELETE headers %v", del.Header)
		}
		// The volume GET carries no service token: only the delete does.
		for _, c := range s.Captured() {
			if c.Method != "DELETE" && c.Header.Get("X-Service-Token") != "" {
				t.Fatalf("service token sent on %s %s", c.Method, c.Target)
			}
		}
	})
	for _, c := range []struct {
		name, host string
		want       error
	}{{"another host", "node2", ErrAttachmentOtherHost}, {"host unknown", "", ErrAttachmentHostUnknown}} {
		t.Run(c.name, func(t *testing.T) {
			s, r := recovery(t)
			s.Route(volURL, rec(200, "volume", "3.44", volumeJSON(c.host)))
			s.RouteMethod("DELETE", attURL, rec(200, "volume", "3.44", `{"attachments": []}`))
			err := r.RemoveAttachment(context.Background(), synVol, synAtt, "node1")
			if !errors.Is(err, c.want) {
				t.Fatalf("%v", err)
			}
			for _, q := range s.Captured() {
				if q.Method == "DELETE" {
					t.Fatalf("DELETE sent for an attachment of %q", c.host)
				}
			}
		})
	}
	t.Run("already gone", func(t *testing.T) {
		s, r := recovery(t)
		s.Route(volURL, rec(200, "volume", "3.44", strings.Replace(volumeJSON("node1"), synAtt, "9d2c4e6f-7a1b-4c3d-8e5f-0a1b2c3d4e59", 1)))
		s.Route(attURL, rec(404, "volume", "3.44", `{"itemNotFound": {"code": 404, "message": "VolumeAttachment `+synAtt+` could not be found."}}`))
		if err := r.RemoveAttachment(context.Background(), synVol, synAtt, "node1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("service token refused", func(t *testing.T) {
		s, r := recovery(t)
		s.Route(volURL, rec(200, "volume", "3.44", volumeJSON("node1")))
		s.RouteMethod("DELETE", attURL, rec(409, "volume", "3.44", `{"conflictingRequest": {"code": 409, "message": "Detach volume from instance `+synServer+` using the Compute API"}}`))
		err := r.RemoveAttachment(context.Background(), synVol, synAtt, "node1")
		if !errors.Is(err, ErrServiceTokenRefused) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("no service cloud", func(t *testing.T) {
		s := openstacktest.New(t)
		r, err := NewRecovery(RecoveryConfig{Config: Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RemoveAttachment(context.Background(), synVol, synAtt, "node1"); !errors.Is(err, ErrNoServiceToken) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("service token renewed before expiry and after a 401", func(t *testing.T) {
		s, r := recovery(t)
		s.SetTokenLife(tokenRenewBefore + time.Minute)
		s.Route(volURL, rec(200, "volume", "3.44", volumeJSON("node1")))
		s.RouteMethod("DELETE", attURL, rec(200, "volume", "3.44", `{"attachments": []}`))
		ctx := context.Background()
		for range 2 {
			if err := r.RemoveAttachment(ctx, synVol, synAtt, "node1"); err != nil {
				t.Fatal(err)
			}
		}
		if s.ServiceTokens() != 1 {
			t.Fatalf("%d service tokens for two calls with a fresh token", s.ServiceTokens())
		}
		s.SetTokenLife(tokenRenewBefore / 2) // tokens issued from now on
		r.service.pc.Reauthenticate(ctx, "") // one such token
		n := s.ServiceTokens()
		if err := r.RemoveAttachment(ctx, synVol, synAtt, "node1"); err != nil {
			t.Fatal(err)
		}
		if s.ServiceTokens() != n+1 {
			t.Fatalf("token within %v of its expiry not renewed (%d → %d)", tokenRenewBefore, n, s.ServiceTokens())
		}
		s.SetTokenLife(time.Hour)
		r.service.pc.Reauthenticate(ctx, "")
		n = s.ServiceTokens()
		s.FailNth(2, openstacktest.Fault401) // the DELETE (after the volume GET)
		s.FailNth(3, openstacktest.Fault401) // and gophercloud's retry with a new admin token
		if err := r.RemoveAttachment(ctx, synVol, synAtt, "node1"); err != nil {
			t.Fatal(err)
		}
		if s.ServiceTokens() != n+1 {
			t.Fatalf("service token not renewed after a 401 (%d → %d)", n, s.ServiceTokens())
		}
	})
}

func TestRecoveryMasakari(t *testing.T) {
	s, r := recovery(t)
	at := time.Date(2026, 12, 1, 18, 0, 0, 123456000, time.UTC)
	notif := `{"notification": {"notification_uuid": "` + synNotif + `", "generated_time": "2026-12-01T18:00:00.000000", "source_host_uuid": "` + synSvc +
		`", "type": "COMPUTE_HOST", "payload": {"event": "STOPPED", "host_status": "NORMAL", "cluster_status": "OFFLINE"}, "status": "new", "id": 1, "created_at": "2026-12-01T18:00:01.000000", "updated_at": null, "deleted_at": null, "deleted": false}}`
	s.RouteMethod("POST", openstacktest.MasakariPath+"/notifications", rec(202, "masakari", "1.0", notif))
	s.Route(openstacktest.MasakariPath+"/notifications/"+synNotif, rec(200, "masakari", "1.0", strings.Replace(notif, `"status": "new"`, `"status": "finished"`, 1)))
	id, err := r.HostNotification(context.Background(), "node1", at)
	if err != nil || id != synNotif {
		t.Fatalf("%q %v", id, err)
	}
	post := lastRequest(t, s, "POST")
	var body map[string]map[string]any
	if err := json.Unmarshal(post.Body, &body); err != nil {
		t.Fatal(err)
	}
	n := body["notification"]
	p, _ := json.Marshal(n["payload"])
	if n["type"] != "COMPUTE_HOST" || n["hostname"] != "node1" || n["generated_time"] != "2026-12-01T18:00:00Z" ||
		string(p) != `{"cluster_status":"OFFLINE","event":"STOPPED","host_status":"NORMAL"}` || post.Header.Get("OpenStack-API-Version") != "instance-ha 1.0" {
		t.Fatalf("POST %s %v", post.Body, post.Header)
	}
	got, err := r.Notification(context.Background(), synNotif)
	if err != nil || got.Status != NotificationFinished || !got.Done() || got.Type != "COMPUTE_HOST" {
		t.Fatalf("%+v %v", got, err)
	}
	// A duplicate (409): the existing notification is looked up (same
	// type, generation second and payload) and its id returned; two alike
	// (two hosts' in the same second) are not guessed between.
	s.RouteMethod("POST", openstacktest.MasakariPath+"/notifications", rec(409, "instance-ha", "1.0",
		`{"conflictingRequest": {"code": 409, "message": "Notification received from host node1 of type COMPUTE_HOST is duplicate."}}`))
	other := strings.Replace(strings.Replace(notif, synNotif, recEvac1, 1), `"host_status": "NORMAL"`, `"host_status": "UNKNOWN"`, 1)
	list := func(items ...string) openstacktest.Recorded {
		for i, it := range items {
			items[i] = strings.TrimSuffix(strings.TrimPrefix(it, `{"notification": `), "}")
		}
		return rec(200, "instance-ha", "1.0", `{"notifications": [`+strings.Join(items, ", ")+`]}`)
	}
	listURL := openstacktest.MasakariPath + "/notifications?generated-since=2026-12-01T18%3A00%3A00Z&type=COMPUTE_HOST"
	s.Route(listURL, list(notif, other))
	if id, err := r.HostNotification(context.Background(), "node1", at); err != nil || id != synNotif {
		t.Fatalf("duplicate: %q %v", id, err)
	}
	s.Route(listURL, list(notif, strings.Replace(notif, synNotif, recEvac1, 1)))
	if id, err := r.HostNotification(context.Background(), "node1", at); !errors.Is(err, ErrDuplicateNotification) || id != "" {
		t.Fatalf("ambiguous duplicate: %q %v", id, err)
	}
	s.RouteMethod("POST", openstacktest.MasakariPath+"/notifications", rec(409, "instance-ha", "1.0",
		`{"conflictingRequest": {"code": 409, "message": "Notification received from host node1 of type 'COMPUTE_HOST' is ignored as the host is already under maintenance."}}`))
	if _, err := r.HostNotification(context.Background(), "node1", at); !errors.Is(err, ErrHostOnMaintenance) {
		t.Fatalf("%v", err)
	}
	// The VM notification's payload is exactly Masakari's three keys.
	s.RouteMethod("POST", openstacktest.MasakariPath+"/notifications", rec(202, "instance-ha", "1.0", strings.Replace(notif, `"type": "COMPUTE_HOST"`, `"type": "VM"`, 1)))
	if _, err := r.InstanceNotification(context.Background(), VMNotification{Host: "node1", ServerID: synServer, Event: MasakariEventLifecycle,
		DomainEvent: MasakariDomainStoppedFailed, At: at}); err != nil {
		t.Fatal(err)
	}
	post = lastRequest(t, s, "POST")
	if !strings.Contains(string(post.Body), `"payload":{"event":"LIFECYCLE","instance_uuid":"`+synServer+`","vir_domain_event":"STOPPED_FAILED"}`) {
		t.Fatalf("VM notification %s", post.Body)
	}
}

// A redirect to another origin never carries the tokens (the service
// token included); one on the same origin keeps them.
func TestRedirectStripsTokens(t *testing.T) {
	got := make(chan http.Header, 2)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer other.Close()
	var first *httptest.Server
	first = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/x", http.StatusTemporaryRedirect)
		case "/here":
			http.Redirect(w, r, first.URL+"/end", http.StatusTemporaryRedirect)
		default:
			got <- r.Header.Clone()
		}
	}))
	defer first.Close()
	s := openstacktest.New(t)
	c, err := New(Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for path, keep := range map[string]bool{"/away": false, "/here": true} {
		req, _ := http.NewRequest(http.MethodDelete, first.URL+path, nil)
		req.Header.Set("X-Auth-Token", "a")
		req.Header.Set("X-Service-Token", "s")
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := <-got
		if (h.Get("X-Auth-Token") != "") != keep || (h.Get("X-Service-Token") != "") != keep {
			t.Fatalf("%s: tokens at the destination: %q %q", path, h.Get("X-Auth-Token"), h.Get("X-Service-Token"))
		}
	}
}

func recoveryServerJSON(id, host, image string, vols ...string) string {
	v := make([]string, len(vols))
	for i, id := range vols {
		v[i] = `{"id": "` + id + `", "delete_on_termination": false}`
	}
	return `{"id": "` + id + `", "name": "vm", "status": "ACTIVE", "tenant_id": "p1", "image": ` + image + `, "metadata": {"HA_Enabled": "True"}, ` +
		`"os-extended-volumes:volumes_attached": [` + strings.Join(v, ", ") + `], "OS-EXT-SRV-ATTR:host": "` + host +
		`", "OS-EXT-STS:task_state": null, "OS-EXT-STS:vm_state": "active", "OS-EXT-STS:power_state": 1}`
}

func TestRecoveryServers(t *testing.T) {
	s, r := recovery(t)
	r.nova.pageSize = 1
	bfv := recoveryServerJSON(synServer, "node1", `""`, synVol)
	eph := recoveryServerJSON(recEvac1, "node1", `{"id": "d9131a11-3c00-420f-b8de-586f872c0786", "links": []}`)
	q := "/v2.1/servers/detail?all_tenants=1&host=node1&limit=1"
	s.Route(q, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: []byte(`{"servers": [` + bfv +
		`], "servers_links": [{"rel": "next", "href": "http://x/v2.1/servers/detail?limit=1&marker=` + synServer + `"}]}`)})
	s.Route(q+"&marker="+synServer, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: []byte(`{"servers": [` + eph + `]}`)})
	ss, err := r.HostServers(context.Background(), "node1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || !ss[0].BootFromVolume || len(ss[0].Volumes) != 1 || ss[0].Volumes[0] != synVol || ss[0].Metadata["HA_Enabled"] != "True" ||
		ss[1].BootFromVolume || len(ss[1].Volumes) != 0 || ss[1].ProjectID != "p1" || ss[1].PowerState != 1 {
		t.Fatalf("%+v", ss)
	}
	s.Route("/v2.1/servers/"+synServer, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: []byte(`{"server": ` + bfv + `}`)})
	if got, err := r.Server(context.Background(), synServer); err != nil || got.ID != synServer || !got.BootFromVolume {
		t.Fatalf("%+v %v", got, err)
	}
	s.RouteFile("/v2.1/servers/"+recMissing, "server-not-found")
	_, err = r.Server(context.Background(), recMissing)
	wantKind(t, err, KindNotFound)
	// A listing whose server is on another host: the filter was not applied.
	s.Route(q+"&marker="+synServer, openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(),
		Body: []byte(`{"servers": [` + strings.Replace(eph, `"node1"`, `"node2"`, 1) + `]}`)})
	if ss, err := r.HostServers(context.Background(), "node1"); ss != nil {
		t.Fatalf("partial or wrong listing accepted: %+v", ss)
	} else {
		wantKind(t, err, KindMalformed)
	}
}

func TestRecoveryStartAndReboot(t *testing.T) {
	s, r := recovery(t)
	action := "/v2.1/servers/" + synServer + "/action"
	s.RouteMethod("POST", action, openstacktest.Recorded{Status: 202, Header: openstacktest.NovaHeader()})
	if err := r.Start(context.Background(), synServer); err != nil {
		t.Fatal(err)
	}
	if b := lastRequest(t, s, "POST").Body; string(b) != `{"os-start":null}` {
		t.Fatalf("start body %s", b)
	}
	if err := r.HardReboot(context.Background(), synServer); err != nil {
		t.Fatal(err)
	}
	if b := lastRequest(t, s, "POST").Body; string(b) != `{"reboot":{"type":"HARD"}}` {
		t.Fatalf("reboot body %s", b)
	}
	s.RouteMethod("POST", action, openstacktest.Recorded{Status: 409, Header: openstacktest.NovaHeader(),
		Body: []byte(`{"conflictingRequest": {"code": 409, "message": "Cannot 'start' instance ` + synServer + ` while it is in vm_state active"}}`)})
	wantKind(t, r.Start(context.Background(), synServer), KindConflict)
}

// A service_cloud user without the `service` role is warned about (Cinder
// would refuse its removals with 409); one with it is not.
func TestServiceTokenRoleWarning(t *testing.T) {
	for cloud, warn := range map[string]bool{"test": true, "service": false} {
		s := openstacktest.New(t)
		var buf bytes.Buffer
		r, err := NewRecovery(RecoveryConfig{Config: Config{Cloud: "test", CloudsFile: s.CloudsYAML(t)}, ServiceCloud: cloud},
			slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Authenticate(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "no `service` role"); got != warn {
			t.Fatalf("service_cloud %s: warned %v: %s", cloud, got, buf.String())
		}
	}
}
