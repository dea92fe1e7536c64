//go:build e2e

// TestLibvirtNovaReboots runs against the optional libvirt-driver compute
// node3 (libvirt-compute.sh up) with real QEMU/TCG guests:
//
//	HVG_E2E_OPENSTACK=1 go test -tags e2e -count=1 -v -run TestLibvirtNovaReboots ./test/e2e/openstack/
//
// It boots two guests, has Nova soft-reboot one and hard-reboot the other
// while hvguard's libvirtx records the events, stops one with the stop API
// and virsh-destroys the other (then waits for Nova's own power sync to stop
// it), and logs every duration. With HVG_E2E_RECORD=1 it writes the real
// servers/detail and os-instance-actions answers (2.59) to
// openstack/testdata/e2e-lv-*.json for the client's contract tests.
package openstack

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/test/e2e/openstack/osharness"
)

type seen struct {
	at time.Time
	ev lifecycle.Event
}

type eventLog struct {
	mu  sync.Mutex
	evs []seen
}

func (l *eventLog) since(uuid string, t0 time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.evs {
		if s.ev.UUID == uuid && !s.at.Before(t0) {
			out = append(out, fmt.Sprintf("+%.2fs %s/%s", s.at.Sub(t0).Seconds(), s.ev.Event, s.ev.Detail))
		}
	}
	return out
}

func TestLibvirtNovaReboots(t *testing.T) {
	h, ctx := connect(t)
	if err := h.LibvirtUp(ctx); err != nil {
		t.Skip(err)
	}
	unlock, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	rec := lvRecorder{t: t, on: os.Getenv("HVG_E2E_RECORD") == "1"}

	conn, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("qemu:///system"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var evs eventLog
	go func() {
		for ev := range conn.Events() {
			evs.mu.Lock()
			evs.evs = append(evs.evs, seen{time.Now(), ev})
			evs.mu.Unlock()
		}
	}()

	prefix := fmt.Sprintf("hvg-lv-%d", time.Now().Unix()%100000)
	if n, err := h.ClearLibvirtLeftovers(ctx, "hvg-lv-"); err != nil {
		t.Fatalf("deleting guests an earlier run left on %s: %v", osharness.LibvirtHost, err)
	} else if n > 0 {
		t.Logf("deleted %d hvg-lv-* guests an earlier run left on %s", n, osharness.LibvirtHost)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := h.DeleteLibvirtServers(ctx, prefix+"-"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	boot, err := h.BootLibvirt(ctx, 2, prefix)
	if err != nil {
		t.Fatal(err)
	}
	a, b := boot[0].ID, boot[1].ID
	for _, x := range boot {
		t.Logf("boot %s: accepted %.1fs, ACTIVE %.1fs", x.ID, x.Accepted.Seconds(), x.Done.Seconds())
	}
	time.Sleep(5 * time.Second) // let the guests' /init reach the power-button watcher
	rec.get(ctx, h, "e2e-lv-servers-node3-active", "/servers/detail?all_tenants=1&host=node3&limit=500")
	rec.get(ctx, h, "e2e-lv-servers-node3-limit1", "/servers/detail?all_tenants=1&host=node3&limit=1")
	if rec.last != nil {
		var page struct {
			Links []struct{ Href, Rel string } `json:"servers_links"`
		}
		json.Unmarshal(rec.last.Body, &page)
		for _, l := range page.Links {
			if l.Rel == "next" {
				u, _ := url.Parse(l.Href)
				rec.get(ctx, h, "e2e-lv-servers-node3-limit1-page2", "/servers/detail?"+u.RawQuery)
			}
		}
	}

	for _, c := range []struct {
		name string
		id   string
		hard bool
	}{{"soft", a, false}, {"hard", b, true}} {
		t0 := time.Now()
		done := make(chan struct{})
		var mid *osharness.Response
		go func() { // catch a listing mid-reboot
			defer close(done)
			for time.Since(t0) < 60*time.Second {
				r, err := h.Raw(ctx, "GET", osharness.MVPaging, "/servers/detail?all_tenants=1&host=node3&limit=500", nil)
				if err == nil && strings.Contains(string(r.Body), `"reboot_started`) {
					mid = r
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
		ts, err := h.Reboot(ctx, c.hard, c.id)
		if err != nil {
			t.Fatal(err)
		}
		<-done
		time.Sleep(2 * time.Second)
		t.Logf("%s reboot of %s: accepted %.1fs, ACTIVE/no task %.1fs; libvirt events: %s", c.name, c.id,
			ts[0].Accepted.Seconds(), ts[0].Done.Seconds(), strings.Join(evs.since(c.id, t0), ", "))
		if mid != nil {
			rec.save("e2e-lv-servers-node3-"+c.name+"-rebooting", mid)
		}
		if got := evs.since(c.id, t0); len(got) == 0 {
			t.Errorf("%s reboot: no libvirt events", c.name)
		}
	}

	// The stop API: the action has the user; the guest powers off on ACPI.
	t0 := time.Now()
	ts, err := h.StopServers(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stop API on %s: SHUTOFF %.1fs; libvirt events: %s", a, ts[0].Done.Seconds(), strings.Join(evs.since(a, t0), ", "))
	rec.get(ctx, h, "e2e-lv-servers-node3-stopped", "/servers/detail?all_tenants=1&host=node3&limit=500")
	rec.get(ctx, h, "e2e-lv-actions-user-stop", "/servers/"+a+"/os-instance-actions?limit=50")

	// virsh destroy: Nova's power sync stops it itself, without a user.
	var inst string
	if s, err := h.GetServer(ctx, b); err == nil {
		inst = s.InstanceName
	}
	t0 = time.Now()
	if out, err := exec.CommandContext(ctx, "virsh", "-c", "qemu:///system", "destroy", inst).CombinedOutput(); err != nil {
		t.Fatalf("virsh destroy %s: %v %s", inst, err, out)
	}
	took, err := h.WaitVMState(ctx, b, "stopped")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("virsh destroy %s (%s): Nova's own sync made it vm_state stopped after %.1fs; libvirt events: %s", b, inst,
		took.Seconds(), strings.Join(evs.since(b, t0), ", "))
	r := rec.get(ctx, h, "e2e-lv-actions-nova-sync-stop", "/servers/"+b+"/os-instance-actions?limit=50")
	if r != nil && !strings.Contains(string(r.Body), `"user_id": null`) {
		t.Errorf("Nova's own stop action has a user: %s", r.Body)
	}
}

// lvRecorder writes real answers to openstack/testdata (the client's
// contract tests) in openstacktest's JSON format.
type lvRecorder struct {
	t    *testing.T
	on   bool
	last *osharness.Response
}

func (r *lvRecorder) get(ctx context.Context, h *osharness.Harness, name, path string) *osharness.Response {
	r.t.Helper()
	resp, err := h.Raw(ctx, "GET", osharness.MVPaging, path, nil)
	if err != nil {
		r.t.Fatalf("GET %s: %v", path, err)
	}
	if resp.Status != 200 {
		r.t.Fatalf("GET %s: %d %s", path, resp.Status, resp.Body)
	}
	r.last = resp
	r.save(name, resp)
	return resp
}

func (r *lvRecorder) save(name string, resp *osharness.Response) {
	r.t.Helper()
	if !r.on {
		return
	}
	hdr := map[string]string{}
	for _, k := range []string{"Content-Type", "Openstack-Api-Version", "X-Openstack-Nova-Api-Version", "Vary"} {
		if v := resp.Header.Get(k); v != "" {
			hdr[k] = v
		}
	}
	doc := map[string]any{
		"request":      resp.Method + " /v2.1" + resp.Path,
		"microversion": resp.Microversion,
		"status":       resp.Status,
		"headers":      hdr,
		"body":         json.RawMessage(resp.Body),
		"recorded_by":  "test/e2e/openstack TestLibvirtNovaReboots (HVG_E2E_RECORD=1), Nova 26.2.2 (Zed), libvirt driver node3, MariaDB",
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		r.t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(b)), "x-auth-token") {
		r.t.Fatalf("refusing to save a token in %s", name)
	}
	f := filepath.Join("..", "..", "..", "openstack", "testdata", fmt.Sprintf("%s.mv%s.json", name, resp.Microversion))
	if err := os.WriteFile(f, append(b, '\n'), 0o644); err != nil {
		r.t.Fatal(err)
	}
}
