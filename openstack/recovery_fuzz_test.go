package openstack

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/utils"

	"hvguard/openstack/openstacktest"
	"hvguard/reconcile"
)

// seedRecorded adds the bodies of every recorded answer (testdata/*.json
// and *.http) whose name contains one of the words.
func seedRecorded(f *testing.F, words ...string) {
	for _, pat := range []string{"*.json", "*.http"} {
		files, _ := filepath.Glob(filepath.Join(openstacktest.TestdataDir(), pat))
		for _, p := range files {
			name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(p), ".json"), ".http")
			for _, w := range words {
				if strings.Contains(name, w) {
					if r, err := openstacktest.Load(name); err == nil {
						f.Add(r.Body)
					}
					break
				}
			}
		}
	}
}

// FuzzDecodeServices: never panics; an accepted listing has only
// nova-compute records with a UUID, a known status and state.
func FuzzDecodeServices(f *testing.F) {
	seedRecorded(f, "services", "force")
	f.Add([]byte(`{"services": [` + serviceJSON(false, "up") + `]}`))
	f.Add([]byte(`{"service": ` + serviceJSON(true, "down") + `}`))
	f.Add([]byte(`{"services": [{"id": 7, "binary": "nova-compute"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(s Service) {
			if !reconcile.ValidUUID(s.ID) || s.Host == "" && !strings.Contains(string(body), `"host"`) ||
				(s.Status != "enabled" && s.Status != "disabled") || (s.State != "up" && s.State != "down") {
				t.Fatalf("accepted %+v", s)
			}
		}
		if ss, err := decodeServices(body); err == nil {
			for _, s := range ss {
				check(s)
			}
		}
		if s, err := decodeServiceUpdate(body); err == nil {
			check(s)
		}
	})
}

// FuzzDecodeRecoveryServer: never panics; an accepted server has a UUID,
// a status, a vm_state, volume UUIDs, and a boot-from-volume server has a
// volume.
func FuzzDecodeRecoveryServer(f *testing.F) {
	seedRecorded(f, "server")
	f.Add([]byte(`{"id": "` + recEvac1 + `", "name": "x", "tenant_id": "p", "status": "ACTIVE", "image": "", "metadata": {"HA_Enabled": "True"}, "os-extended-volumes:volumes_attached": [{"id": "` + synVol + `", "delete_on_termination": false}], "OS-EXT-SRV-ATTR:host": "node1", "OS-EXT-STS:task_state": null, "OS-EXT-STS:vm_state": "active", "OS-EXT-STS:power_state": 1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(s Server) {
			if !reconcile.ValidUUID(s.ID) || s.Status == "" || s.VMState == "" || (s.BootFromVolume && len(s.Volumes) == 0) {
				t.Fatalf("accepted %+v", s)
			}
			for _, v := range s.Volumes {
				if !reconcile.ValidUUID(v) {
					t.Fatalf("volume %q accepted", v)
				}
			}
		}
		if s, err := decodeServer2(body); err == nil {
			check(s)
		}
		if items, _, _, err := decodePage(body, "servers", "server", 1000, decodeServer2); err == nil {
			for _, s := range items {
				check(s)
			}
		}
	})
}

// FuzzDecodeVolume: never panics; an accepted volume is the one asked
// for, and every attachment has a UUID and belongs to it.
func FuzzDecodeVolume(f *testing.F) {
	seedRecorded(f, "volume", "attachment")
	f.Add([]byte(volumeJSON("node1")))
	f.Add([]byte(volumeJSON("")))
	f.Fuzz(func(t *testing.T, body []byte) {
		if v, err := decodeVolume(body, synVol); err == nil {
			if v.ID != synVol || v.Status == "" {
				t.Fatalf("accepted %+v", v)
			}
			for _, a := range v.Attachments {
				if !reconcile.ValidUUID(a.ID) {
					t.Fatalf("attachment %+v accepted", a)
				}
			}
		}
		if st, err := decodeAttachmentStatus(body, synAtt); err == nil && st == "" {
			t.Fatal("empty attachment status accepted")
		}
		_ = checkNotFound(body)
	})
}

// FuzzDecodeNotification: never panics; an accepted notification has a
// UUID, a known status, a generation time and a payload.
func FuzzDecodeNotification(f *testing.F) {
	seedRecorded(f, "masakari")
	f.Add([]byte(`{"notification": {"notification_uuid": "` + synNotif + `", "generated_time": "2026-12-01T18:00:00.123456", "type": "VM", "payload": {"event": "LIFECYCLE"}, "status": "ignored"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := decodeNotification(body)
		if err != nil {
			return
		}
		if !reconcile.ValidUUID(n.ID) || n.GeneratedTime.IsZero() || n.Payload == nil || n.Type == "" {
			t.Fatalf("accepted %+v", n)
		}
		switch n.Status {
		case NotificationNew, NotificationRunning, NotificationError, NotificationFailed, NotificationIgnored, NotificationFinished:
		default:
			t.Fatalf("status %q accepted", n.Status)
		}
	})
}

// FuzzDecodeVersionDocument: never panics; an accepted range is ordered.
func FuzzDecodeVersionDocument(f *testing.F) {
	f.Add([]byte(`{"version": {"id": "v2.1", "status": "CURRENT", "version": "2.93", "min_version": "2.1"}}`))
	f.Add([]byte(`{"version": {"id": "v2.0", "status": "SUPPORTED", "version": "", "min_version": ""}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		sup, err := decodeVersionDocument(body)
		if err != nil {
			return
		}
		if sup.MinMajor > sup.MaxMajor || (sup.MinMajor == sup.MaxMajor && sup.MinMinor > sup.MaxMinor) {
			t.Fatalf("accepted %+v", sup)
		}
		if mv, err := chooseEvacuateMicroversion(sup); err == nil {
			maj, minr, perr := utils.ParseMicroversion(mv)
			if perr != nil || maj != 2 || minr < 14 || minr > 94 || maj > sup.MaxMajor || (maj == sup.MaxMajor && minr > sup.MaxMinor) {
				t.Fatalf("chose %s from %+v", mv, sup)
			}
		}
	})
}
