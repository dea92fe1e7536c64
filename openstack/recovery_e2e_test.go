//go:build e2e

package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"

	"hvguard/test/e2e/openstack/osharness"
)

// The recovery adapter against the real harness (test/e2e/openstack with
// Cinder, the service user and Masakari). Run under the cloud's lock:
//
//	flock /tmp/hvg-e2e.lock go test -tags e2e -count=1 -v -run TestE2ERecovery ./openstack/
//
// HVG_RECORD=1 rewrites testdata/rec-*.json with the answers seen (the
// contract tests replay them).

// ServiceCloudName is the harness's clouds.yaml entry of the service user.
const serviceCloudName = "hvguard-service"

// recorder captures the exchanges of the adapter's HTTP client, labelled
// by the step the test is in.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	step string
	n    map[string]int
	out  map[string][]byte
}

func (r *recorder) label(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step = s
	r.n[s] = 0 // a label used again (polling) overwrites its recordings
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil || strings.Contains(req.URL.Path, "/auth/tokens") {
		return resp, err
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr != nil {
		return resp, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.step == "" {
		return resp, nil
	}
	r.n[r.step]++
	name := fmt.Sprintf("%s.%d", r.step, r.n[r.step])
	h := map[string]string{}
	for _, k := range []string{"Content-Type", "OpenStack-API-Version", "X-OpenStack-Nova-API-Version", "X-OpenStack-Volume-API-Version", "Vary"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			h[k] = strings.Join(v, ", ")
		}
	}
	var b json.RawMessage = []byte("null")
	if len(bytes.TrimSpace(body)) > 0 {
		if json.Valid(body) {
			b = body
		} else {
			b, _ = json.Marshal(string(body))
		}
	}
	rec, _ := json.MarshalIndent(map[string]any{"request": req.Method + " " + req.URL.Path + "?" + req.URL.RawQuery,
		"status": resp.StatusCode, "headers": h, "body": b}, "", "  ")
	r.out[name] = rec
	return resp, nil
}

func (r *recorder) write(t *testing.T) {
	if os.Getenv("HVG_RECORD") != "1" {
		return
	}
	for name, b := range r.out {
		p := filepath.Join("testdata", "rec-"+name+".json")
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Logf("recorded %d answers into testdata/rec-*.json", len(r.out))
}

type e2eRig struct {
	t   *testing.T
	h   *osharness.Harness
	r   *Recovery
	rec *recorder
	bs  *gophercloud.ServiceClient // Cinder for the test's own calls
}

func e2eRecovery(t *testing.T) *e2eRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wd := osharness.WorkDir()
	clouds := filepath.Join(wd, "clouds.yaml")
	if _, err := os.Stat(clouds); err != nil {
		t.Skipf("no harness at %s: %v", wd, err)
	}
	h, err := osharness.Connect(ctx, wd)
	if err != nil {
		t.Skipf("harness not reachable: %v", err)
	}
	bs, err := gopenstack.NewBlockStorageV3(h.Provider, h.Endpoints)
	if err != nil {
		t.Skipf("no Cinder in the harness: %v", err)
	}
	bs.Microversion = VolumeMicroversion
	r, err := NewRecovery(RecoveryConfig{Config: Config{Cloud: osharness.CloudName, CloudsFile: clouds}, ServiceCloud: serviceCloudName}, nil)
	if err != nil {
		t.Skipf("no service cloud %q in %s: %v", serviceCloudName, clouds, err)
	}
	rec := &recorder{next: r.nova.http.Transport, n: map[string]int{}, out: map[string][]byte{}}
	r.nova.http.Transport = rec
	if err := r.Authenticate(ctx); err != nil {
		t.Fatal(err)
	}
	unlock, err := h.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	t.Cleanup(func() { rec.write(t) })
	return &e2eRig{t: t, h: h, r: r, rec: rec, bs: bs}
}

// cinder sends one raw Cinder request as admin.
func (g *e2eRig) cinder(ctx context.Context, method, path string, body any, ok ...int) ([]byte, int) {
	g.t.Helper()
	opts := &gophercloud.RequestOpts{KeepResponseBody: true, OkCodes: ok}
	if body != nil {
		opts.JSONBody = body
	}
	resp, err := g.bs.Request(ctx, method, g.bs.ServiceURL(strings.TrimPrefix(path, "/")), opts)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b, resp.StatusCode
}

// bootableVolume creates a 1 GiB volume marked bootable and waits for it.
func (g *e2eRig) bootableVolume(ctx context.Context, name string) string {
	b, _ := g.cinder(ctx, "POST", "volumes", map[string]any{"volume": map[string]any{"size": 1, "name": name}}, 202)
	var out struct{ Volume struct{ ID string } }
	if err := json.Unmarshal(b, &out); err != nil {
		g.t.Fatal(err)
	}
	id := out.Volume.ID
	g.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		g.wait(ctx, "volume "+id+" deletable", func() bool {
			v, err := g.r.Volume(ctx, id)
			return err == nil && (v.Status == "available" || v.Status == "error")
		})
		g.cinder(ctx, "DELETE", "volumes/"+id, nil, 202, 404)
	})
	g.wait(ctx, "volume "+id+" available", func() bool {
		v, err := g.r.Volume(ctx, id)
		return err == nil && v.Status == "available"
	})
	g.cinder(ctx, "POST", "volumes/"+id+"/action", map[string]any{"os-set_bootable": map[string]any{"bootable": true}}, 200)
	return id
}

// bootFromVolume boots a server from vol on host and waits until ACTIVE.
func (g *e2eRig) bootFromVolume(ctx context.Context, name, vol, host string) string {
	r, err := g.h.Raw(ctx, "POST", osharness.MVHostBoot, "/servers", map[string]any{"server": map[string]any{
		"name": name, "flavorRef": "tiny", "networks": "none", "host": host,
		"block_device_mapping_v2": []any{map[string]any{"boot_index": 0, "uuid": vol, "source_type": "volume",
			"destination_type": "volume", "delete_on_termination": false}}}})
	if err != nil || r.Status != 202 {
		g.t.Fatalf("boot %s: %v %d %s", name, err, r.Status, r.Body)
	}
	var out struct{ Server struct{ ID string } }
	_ = r.JSON(&out)
	g.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = g.h.DeleteServers(ctx, out.Server.ID)
	})
	if _, err := g.h.WaitServer(ctx, out.Server.ID, "ACTIVE", host); err != nil {
		g.t.Fatal(err)
	}
	return out.Server.ID
}

func (g *e2eRig) wait(ctx context.Context, what string, f func() bool) {
	g.t.Helper()
	for !f() {
		select {
		case <-ctx.Done():
			g.t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// novaAttachments lists the volume ids Nova has as attached to server
// (its BDMs: GET /servers/{id}/os-volume_attachments).
func (g *e2eRig) novaAttachments(ctx context.Context, server string) []string {
	r, err := g.h.Raw(ctx, "GET", "2.89", "/servers/"+server+"/os-volume_attachments", nil)
	if err != nil || r.Status != 200 {
		g.t.Fatalf("os-volume_attachments: %v %+v", err, r)
	}
	var out struct {
		VolumeAttachments []struct {
			VolumeID     string `json:"volumeId"`
			AttachmentID string `json:"attachment_id"`
		} `json:"volumeAttachments"`
	}
	_ = r.JSON(&out)
	var ids []string
	for _, a := range out.VolumeAttachments {
		ids = append(ids, a.VolumeID+"/"+a.AttachmentID)
	}
	return ids
}

// TestE2ERecovery drives the adapter through a host recovery on the real
// cloud: two boot-from-volume servers and one ephemeral server on node1;
// node1's nova-compute stopped; ForceDown; the dead host's attachments
// removed — one with the attachments API (the adapter), one with
// os-force_detach (for comparison) — after checking that another host's
// expectHost is refused and that the admin token alone gets 409; every
// server evacuated; migrations done; volumes attached on node2; forced_down
// refused while evacuations are done; node1 restored.
func TestE2ERecovery(t *testing.T) {
	g := e2eRecovery(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r := g.r
	prefix := fmt.Sprintf("hvg-rec-%d", time.Now().Unix()%100000)

	volA := g.bootableVolume(ctx, prefix+"-a")
	volB := g.bootableVolume(ctx, prefix+"-b")
	srvA := g.bootFromVolume(ctx, prefix+"-bfv-a", volA, "node1")
	srvB := g.bootFromVolume(ctx, prefix+"-bfv-b", volB, "node1")
	eph, err := g.h.BootServers(ctx, 1, "node1", prefix+"-eph")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = g.h.DeleteServers(ctx, eph...)
	})

	g.rec.label("services-node1-up")
	svc, err := r.Service(ctx, "node1")
	if err != nil || !svc.Up() || svc.ForcedDown {
		t.Fatalf("node1 service: %+v %v", svc, err)
	}
	g.rec.label("servers-node1-bfv")
	ss, err := r.HostServers(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]Server{}
	for _, s := range ss {
		byID[s.ID] = s
	}
	for id, vol := range map[string]string{srvA: volA, srvB: volB} {
		if s := byID[id]; !s.BootFromVolume || len(s.Volumes) != 1 || s.Volumes[0] != vol || s.Host != "node1" {
			t.Fatalf("BFV server %s: %+v", id, s)
		}
	}
	if s := byID[eph[0]]; s.BootFromVolume || len(s.Volumes) != 0 {
		t.Fatalf("ephemeral server: %+v", s)
	}
	g.rec.label("server-bfv")
	if s, err := r.Server(ctx, srvA); err != nil || !s.BootFromVolume {
		t.Fatalf("Server: %+v %v", s, err)
	}
	g.rec.label("volume-attached-node1")
	va, err := r.Volume(ctx, volA)
	if err != nil || len(va.Attachments) != 1 || va.Multiattach || va.Status != "in-use" {
		t.Fatalf("volume A: %+v %v", va, err)
	}
	attA := va.Attachments[0]
	if attA.Host != "node1" || attA.ServerID != srvA {
		t.Fatalf("attachment A: %+v", attA)
	}
	g.rec.label("")
	vb, err := r.Volume(ctx, volB)
	if err != nil || len(vb.Attachments) != 1 {
		t.Fatalf("volume B: %+v %v", vb, err)
	}
	attB := vb.Attachments[0]
	t.Logf("before: volume A %s attachment %s on %s; volume B %s attachment %s on %s", volA, attA.ID, attA.Host, volB, attB.ID, attB.Host)

	// node1 "fails": its nova-compute stops; the controller forces it down.
	if err := g.h.StopCompute(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := g.h.RestoreHost(ctx, "node1"); err != nil {
			t.Errorf("restore node1: %v", err)
		}
	})
	g.rec.label("force-down-node1")
	t0 := time.Now()
	if err := r.ForceDown(ctx, "node1", true); err != nil {
		t.Fatal(err)
	}
	t.Logf("ForceDown took %v", time.Since(t0).Round(time.Millisecond))
	g.rec.label("services-node1-forced-down")
	if svc, err := r.Service(ctx, "node1"); err != nil || svc.Up() || !svc.ForcedDown {
		t.Fatalf("after ForceDown: %+v %v", svc, err)
	}

	// Another host's attachment is never touched.
	g.rec.label("")
	if err := r.RemoveAttachment(ctx, volA, attA.ID, "node2"); !errors.Is(err, ErrAttachmentOtherHost) {
		t.Fatalf("expectHost node2: %v", err)
	}
	// The admin token alone: Cinder refuses (OSSA-2023-003).
	b, st := g.cinder(ctx, "DELETE", "attachments/"+attA.ID, nil, 200, 409)
	t.Logf("DELETE attachment without a service token: %d %s", st, b)
	if st != 409 {
		t.Fatalf("DELETE without a service token answered %d %s: the harness does not enforce the service token", st, b)
	}
	sc, _ := r.blockStorage(ctx)
	saveRaw(t, "rec-attachment-delete-no-service-token", "DELETE", st, b, sc)

	// A: the attachments API through the adapter.
	g.rec.label("attachment-delete-service-token")
	t0 = time.Now()
	if err := r.RemoveAttachment(ctx, volA, attA.ID, "NODE1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("RemoveAttachment took %v", time.Since(t0).Round(time.Millisecond))
	g.rec.label("volume-after-attachment-delete")
	va, err = r.Volume(ctx, volA)
	if err != nil || len(va.Attachments) != 0 {
		t.Fatalf("volume A after removal: %+v %v", va, err)
	}
	t.Logf("attachments API: volume A %s, Nova BDMs of server A: %v", va.Status, g.novaAttachments(ctx, srvA))
	g.rec.label("attachment-gone")
	if err := r.RemoveAttachment(ctx, volA, attA.ID, "node1"); err != nil {
		t.Fatalf("second removal (idempotent): %v", err)
	}
	g.rec.label("")

	// B: os-force_detach with the service token, for comparison.
	tok, err := r.service.token(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := g.bs.Request(ctx, "POST", g.bs.ServiceURL("volumes", volB, "action"), &gophercloud.RequestOpts{
		JSONBody: map[string]any{"os-force_detach": map[string]any{"attachment_id": attB.ID}}, OkCodes: []int{202},
		MoreHeaders: map[string]string{"X-Service-Token": tok}, KeepResponseBody: true})
	if err != nil {
		t.Fatalf("os-force_detach: %v", err)
	}
	resp.Body.Close()
	vb, err = r.Volume(ctx, volB)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("os-force_detach: 202, volume B %s with %d attachments, Nova BDMs of server B: %v", vb.Status, len(vb.Attachments), g.novaAttachments(ctx, srvB))

	// Evacuate all three.
	since := time.Now().Add(-2 * time.Second).UTC()
	g.rec.label("evacuate")
	for _, id := range []string{srvA, srvB, eph[0]} {
		if err := r.Evacuate(ctx, id); err != nil {
			t.Fatalf("evacuate %s: %v", id, err)
		}
	}
	g.rec.label("")
	final := map[string]string{}
	g.wait(ctx, "three evacuations finished", func() bool {
		ms, err := r.Migrations(ctx, "node1", since)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			final[m.InstanceUUID] = m.Status
		}
		n := 0
		for _, s := range final {
			if s == "done" || s == "error" || s == "failed" {
				n++
			}
		}
		return n == 3
	})
	g.rec.label("migrations-node1-evacuations-done")
	if _, err := r.Migrations(ctx, "node1", since); err != nil {
		t.Fatal(err)
	}
	g.rec.label("")
	t.Logf("evacuations: A (attachments API) %s, B (os-force_detach) %s, ephemeral %s", final[srvA], final[srvB], final[eph[0]])
	for _, id := range []string{srvA, eph[0]} {
		if final[id] != "done" {
			t.Errorf("evacuation of %s: %s", id, final[id])
		}
	}
	for name, id := range map[string]string{"A": srvA, "B": srvB, "ephemeral": eph[0]} {
		s, err := g.h.WaitServer(ctx, id, "ACTIVE", "node2")
		t.Logf("server %s after evacuation: %+v %v", name, s, err)
	}
	g.rec.label("volume-attached-node2")
	va, err = r.Volume(ctx, volA)
	g.rec.label("")
	if err != nil || len(va.Attachments) != 1 || va.Attachments[0].Host != "node2" || va.Attachments[0].ID == attA.ID {
		t.Errorf("volume A after evacuation: %+v %v", va, err)
	}
	vb, _ = r.Volume(ctx, volB)
	t.Logf("after evacuation: volume A %+v, Nova BDMs A %v; volume B %+v, Nova BDMs B %v", va, g.novaAttachments(ctx, srvA), vb, g.novaAttachments(ctx, srvB))

	// Nova refuses to clear forced_down while the evacuations are done.
	g.rec.label("force-up-refused")
	err = r.ForceDown(ctx, "node1", false)
	g.rec.label("")
	if !errors.Is(err, ErrDoneEvacuations) {
		t.Fatalf("clearing forced_down with done evacuations: %v", err)
	}
	t.Logf("clearing forced_down: %v", err)
}

// saveRaw records an exchange made outside the adapter.
func saveRaw(t *testing.T, name, method string, status int, body []byte, sc *gophercloud.ServiceClient) {
	if os.Getenv("HVG_RECORD") != "1" {
		return
	}
	rec, _ := json.MarshalIndent(map[string]any{"request": method, "status": status,
		"headers": map[string]string{"Content-Type": "application/json", "OpenStack-API-Version": "volume " + sc.Microversion},
		"body":    json.RawMessage(body)}, "", "  ")
	_ = os.WriteFile(filepath.Join("testdata", name+".json"), append(rec, '\n'), 0o644)
}

// TestE2EMasakari sends a VM notification Masakari's engine ignores
// (vir_domain_event STOPPED_DESTROYED: it acts only on STOPPED_FAILED) for
// a host of the harness's segment, and reads it back until it is done.
func TestE2EMasakari(t *testing.T) {
	g := e2eRecovery(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := g.r.instanceHA(ctx); err != nil {
		t.Skipf("no Masakari in the harness: %v", err)
	}
	g.rec.label("masakari-vm-notification")
	n := VMNotification{Host: "node2", ServerID: "6f1c2a9e-0000-4000-8000-00000000beef",
		Event: MasakariEventLifecycle, DomainEvent: MasakariDomainStoppedDestroyed, At: time.Now()}
	id, err := g.r.InstanceNotification(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	// The same notification again (a retry): Masakari's 409, and the
	// adapter finds the first one.
	g.rec.label("masakari-vm-notification-duplicate")
	again, err := g.r.InstanceNotification(ctx, n)
	if err != nil || again != id {
		t.Fatalf("retry: %q %v, want %s", again, err, id)
	}
	var got MasakariNotification
	g.wait(ctx, "notification "+id+" done", func() bool {
		g.rec.label("masakari-notification-get")
		got, err = g.r.Notification(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got.Done()
	})
	t.Logf("notification %s: %+v", id, got)
	if got.Status != NotificationIgnored {
		t.Errorf("status %s, want ignored", got.Status)
	}
	// A host of no segment: Masakari's 400.
	g.rec.label("masakari-host-notification-unknown-host")
	_, err = g.r.HostNotification(ctx, "node9", time.Now())
	g.rec.label("")
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindRejected || e.Status != 400 {
		t.Fatalf("host of no segment: %v", err)
	}
	t.Logf("host of no segment: %v", err)
}
