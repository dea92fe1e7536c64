// Boot-from-volume evacuation on the harness (issue 13's setting, without
// hvguard): two servers booted from volumes made from the image
// (multiattach=False) and one ephemeral server on node1; node1's
// nova-compute stopped and forced down; one BFV volume's node1 attachment
// removed beforehand with the service user's token (what hvguard's
// controller does), the other left to Nova; all three evacuated by plain API
// calls. Proves the harness's service-token configuration: without
// [service_user] in nova.conf and cinder.conf the BFV evacuations fail (409
// ConflictNovaUsingAttachment, server ERROR). Skipped unless
// HVG_E2E_OPENSTACK=1.
package openstack

import (
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"hvguard/test/e2e/openstack/osharness"
)

func TestBFVEvacuation(t *testing.T) {
	h, ctx := connect(t)
	lockScenario(t, ctx, h)
	prefix := fmt.Sprintf("hvg-bfv-%d", time.Now().Unix())
	var bfv, vols, eph []string
	t.Cleanup(func() {
		// servers first (their volumes stay: delete_on_termination false)
		_ = h.DeleteServers(ctx, append(slices.Clone(bfv), eph...)...)
		_ = h.DeleteVolumes(ctx, vols...)
		if _, fd, err := h.ComputeState(ctx, "node1"); err == nil && fd {
			_ = h.RestoreHost(ctx, "node1")
		}
	})
	step(t, "boot 2 BFV servers on node1", func() (err error) {
		bfv, vols, err = h.BootBFV(ctx, 2, "node1", prefix)
		return err
	})
	step(t, "boot 1 ephemeral server on node1", func() (err error) {
		eph, err = h.BootServers(ctx, 1, "node1", prefix+"-eph")
		return err
	})
	before := map[string]string{} // volume -> node1 attachment id
	for i, v := range vols {
		vol, err := h.GetVolume(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if vol.Multiattach || vol.Status != "in-use" || len(vol.Attachments) != 1 ||
			vol.Attachments[0].HostName != "node1" || vol.Attachments[0].ServerID != bfv[i] {
			t.Fatalf("volume %s before: %+v (want in-use, multiattach false, one attachment of %s on node1)", v, vol, bfv[i])
		}
		before[v] = vol.Attachments[0].AttachmentID
	}

	step(t, "stop nova-compute on node1, force it down", func() error {
		if err := h.StopCompute(ctx, "node1"); err != nil {
			return err
		}
		return h.ForceDown(ctx, "node1", true)
	})

	// The dead host's attachment of the first volume: the admin token alone
	// may not delete it (OSSA-2023-003), the service user's token may.
	att := before[vols[0]]
	r, err := h.VolumeRaw(ctx, "DELETE", osharness.MVVolume, "/attachments/"+att, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DELETE /attachments/%s, admin token only: HTTP %d %s", att, r.Status, r.Body)
	if r.Status != 409 {
		t.Errorf("attachment delete without a service token: HTTP %d, want 409 (is the OSSA-2023-003 fix in?)", r.Status)
	}
	tok, err := h.ServiceToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err = h.VolumeRaw(ctx, "DELETE", osharness.MVVolume, "/attachments/"+att, nil, map[string]string{"X-Service-Token": tok})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DELETE /attachments/%s with X-Service-Token of %s: HTTP %d %s", att, osharness.ServiceCloudName, r.Status, r.Body)
	if r.Status != 200 {
		t.Fatalf("attachment delete with the service token: HTTP %d, want 200", r.Status)
	}
	if v, err := h.WaitVolume(ctx, vols[0], "available"); err != nil {
		t.Fatal(err)
	} else if len(v.Attachments) != 0 {
		t.Fatalf("volume %s after the delete: %+v", vols[0], v)
	}

	all := append(slices.Clone(bfv), eph...)
	t0 := time.Now()
	step(t, "evacuate all three (2.93), wait ACTIVE on node2 + migration done", func() error {
		return h.EvacuateAndWait(ctx, "node2", all...)
	})
	t.Logf("evacuate call -> last ACTIVE on node2: %.1fs", time.Since(t0).Seconds())
	for i, v := range vols {
		vol, err := h.GetVolume(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if vol.Status != "in-use" || len(vol.Attachments) != 1 || vol.Attachments[0].HostName != "node2" ||
			vol.Attachments[0].ServerID != bfv[i] || vol.Attachments[0].AttachmentID == before[v] {
			t.Errorf("volume %s after evacuation: %+v (want one new attachment of %s on node2)", v, vol, bfv[i])
		}
		nv, err := h.ServerVolumes(ctx, bfv[i])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(nv, []string{v}) {
			t.Errorf("Nova lists volumes %v on server %s, want [%s]", nv, bfv[i], v)
		}
		t.Logf("volume %s: attachment %s (node1) -> %s (node2)", v, before[v], vol.Attachments[0].AttachmentID)
	}
	ms, err := h.Migrations(ctx, osharness.MVPaging, url.Values{"source_compute": {"node1"}, "migration_type": {"evacuation"}, "status": {"done"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range all {
		if findMigration(ms, id) == nil {
			t.Errorf("no done evacuation of %s from node1", id)
		}
	}
	step(t, "restore node1 (start compute, unforce)", func() error { return h.RestoreHost(ctx, "node1") })
}
