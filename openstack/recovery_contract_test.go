package openstack

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"hvguard/openstack/openstacktest"
)

// Answers recorded from the real harness (Nova 26.2.2, Cinder 21.3.1,
// Masakari 14.0.2) by TestE2ERecovery / TestE2EMasakari with HVG_RECORD=1
// (testdata/rec-*.json; each file names its request). The run: two servers
// booted from volumes (A, B) and an ephemeral one on node1; node1's
// nova-compute stopped and forced down; A's attachment removed with the
// service token; all three evacuated to node2.
const (
	recSvcNode1 = "3dc1fc93-f2c6-46d6-b060-dd6476ed94d7"
	recSrvA     = "cbd002f9-f08a-4730-95c4-8f3f3e5161ae"
	recSrvB     = "7fa9a6a4-cbb0-491d-a5f8-f2c9abe950d5"
	recSrvEph   = "c1d637cd-003e-4636-a482-59427959e735"
	recVolA     = "4147b515-60e7-47ef-a935-e1017e91d0f6"
	recVolB     = "083467d1-5ce5-42ca-bc1a-12de8688effd"
	recAttA     = "29994c83-8d22-4eb8-98c2-3cce5f4bdc7a" // A's attachment on node1
	recAttA2    = "c22766f7-d233-430f-8c6d-aba8e4c0e3b8" // A's attachment on node2 after the evacuation
	servicesQ   = "/v2.1/os-services?binary=nova-compute&host=node1"
)

// recorded returns a fake cloud and an adapter (service user included).
func recorded(t *testing.T) (*openstacktest.Server, *Recovery) {
	t.Helper()
	s := openstacktest.New(t)
	r, err := NewRecovery(RecoveryConfig{Config: Config{Cloud: "test", CloudsFile: s.CloudsYAML(t), RequestTimeout: 2 * time.Second},
		ServiceCloud: "service"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

func TestContractRecoveryServices(t *testing.T) {
	s, r := recorded(t)
	ctx := context.Background()
	s.RouteFile(servicesQ, "rec-services-node1-up.1")
	svc, err := r.Service(ctx, "node1")
	if err != nil || svc.ID != recSvcNode1 || !svc.Up() || svc.ForcedDown || svc.Status != "enabled" || svc.Zone != "nova" {
		t.Fatalf("up: %+v %v", svc, err)
	}
	s.RouteFile(servicesQ, "rec-force-down-node1.1")
	s.RouteMethod("PUT", "/v2.1/os-services/"+recSvcNode1, openstacktest.MustLoad(t, "rec-force-down-node1.2"))
	if err := r.ForceDown(ctx, "node1", true); err != nil {
		t.Fatal(err)
	}
	s.RouteFile(servicesQ, "rec-services-node1-forced-down.1")
	if svc, err = r.Service(ctx, "node1"); err != nil || svc.Up() || !svc.ForcedDown {
		t.Fatalf("forced down: %+v %v", svc, err)
	}
	// Clearing it while the three evacuations are done: Nova's real 400,
	// confirmed by the real listing.
	s.RouteFile(servicesQ, "rec-force-up-refused.1")
	s.RouteMethod("PUT", "/v2.1/os-services/"+recSvcNode1, openstacktest.MustLoad(t, "rec-force-up-refused.2"))
	s.RouteFile(evacQuery+"&limit=500", "rec-force-up-refused.3")
	err = r.ForceDown(ctx, "node1", false)
	if !errors.Is(err, ErrDoneEvacuations) {
		t.Fatalf("%v", err)
	}
	for _, id := range []string{recSrvA, recSrvB, recSrvEph} {
		if !strings.Contains(err.Error(), id) {
			t.Fatalf("%v does not name %s", err, id)
		}
	}
}

func TestContractRecoveryServers(t *testing.T) {
	s, r := recorded(t)
	ctx := context.Background()
	s.RouteFile("/v2.1/servers/detail?all_tenants=1&host=node1&limit=500", "rec-servers-node1-bfv.1")
	ss, err := r.HostServers(ctx, "node1")
	if err != nil || len(ss) != 3 {
		t.Fatalf("%+v %v", ss, err)
	}
	by := map[string]Server{}
	for _, s := range ss {
		by[s.ID] = s
	}
	if a := by[recSrvA]; !a.BootFromVolume || len(a.Volumes) != 1 || a.Volumes[0] != recVolA || a.Host != "node1" || a.Status != "ACTIVE" || a.PowerState != 1 {
		t.Fatalf("A: %+v", a)
	}
	if b := by[recSrvB]; !b.BootFromVolume || len(b.Volumes) != 1 || b.Volumes[0] != recVolB {
		t.Fatalf("B: %+v", b)
	}
	if e := by[recSrvEph]; e.BootFromVolume || len(e.Volumes) != 0 || e.ProjectID == "" {
		t.Fatalf("ephemeral: %+v", e)
	}
	s.RouteFile("/v2.1/servers/"+recSrvA, "rec-server-bfv.1")
	if a, err := r.Server(ctx, recSrvA); err != nil || !a.BootFromVolume || a.Volumes[0] != recVolA {
		t.Fatalf("Server: %+v %v", a, err)
	}
}

func TestContractRecoveryEvacuate(t *testing.T) {
	s, r := recorded(t)
	ctx := context.Background()
	s.RouteFile("/v2.1/", "rec-evacuate.1") // Nova's version document: 2.1–2.93
	s.RouteMethod("POST", "/v2.1/servers/"+recSrvA+"/action", openstacktest.MustLoad(t, "rec-evacuate.2"))
	if err := r.Evacuate(ctx, recSrvA); err != nil {
		t.Fatal(err)
	}
	if h := lastRequest(t, s, "POST").Header.Get("OpenStack-API-Version"); h != "compute 2.93" {
		t.Fatalf("evacuated at %q", h)
	}
	s.RouteFile(evacQuery+"&limit=500", "rec-migrations-node1-evacuations-done.1")
	ms, err := r.Migrations(ctx, "node1", time.Time{})
	if err != nil || len(ms) != 3 {
		t.Fatalf("%+v %v", ms, err)
	}
	for _, m := range ms {
		if m.Status != "done" || m.DestCompute != "node2" {
			t.Fatalf("%+v", m)
		}
	}
	if ms, err := r.Migrations(ctx, "node1", ms[0].CreatedAt.Add(time.Second)); err != nil || len(ms) != 0 {
		t.Fatalf("since after the newest: %+v %v", ms, err)
	}
}

func TestContractRecoveryAttachments(t *testing.T) {
	vol := openstacktest.VolumePath + "/volumes/" + recVolA
	att := openstacktest.VolumePath + "/attachments/" + recAttA
	ctx := context.Background()
	t.Run("attached on node1, removed with the service token", func(t *testing.T) {
		s, r := recorded(t)
		s.RouteFile(vol, "rec-volume-attached-node1.1")
		v, err := r.Volume(ctx, recVolA)
		if err != nil || v.Multiattach || v.Status != "in-use" || len(v.Attachments) != 1 {
			t.Fatalf("%+v %v", v, err)
		}
		if a := v.Attachments[0]; a.ID != recAttA || a.Host != "node1" || a.ServerID != recSrvA || a.AttachedAt.IsZero() {
			t.Fatalf("%+v", a)
		}
		if err := r.RemoveAttachment(ctx, recVolA, recAttA, "node2"); !errors.Is(err, ErrAttachmentOtherHost) {
			t.Fatalf("expectHost node2: %v", err)
		}
		s.RouteMethod("DELETE", att, openstacktest.MustLoad(t, "rec-attachment-delete-service-token.2"))
		if err := r.RemoveAttachment(ctx, recVolA, recAttA, "node1"); err != nil {
			t.Fatal(err)
		}
		if tok := lastRequest(t, s, "DELETE").Header.Get("X-Service-Token"); !strings.HasPrefix(tok, "svc-token-") {
			t.Fatalf("X-Service-Token %q", tok)
		}
	})
	t.Run("without a service token Cinder answers 409", func(t *testing.T) {
		s, r := recorded(t)
		s.RouteFile(vol, "rec-volume-attached-node1.1")
		s.RouteMethod("DELETE", att, openstacktest.MustLoad(t, "rec-attachment-delete-no-service-token"))
		err := r.RemoveAttachment(ctx, recVolA, recAttA, "node1")
		if !errors.Is(err, ErrServiceTokenRefused) {
			t.Fatalf("%v", err)
		}
		wantKind(t, err, KindConflict)
	})
	t.Run("gone: idempotent", func(t *testing.T) {
		s, r := recorded(t)
		s.RouteFile(vol, "rec-volume-after-attachment-delete.1")
		s.RouteFile(att, "rec-attachment-gone.2")
		if err := r.RemoveAttachment(ctx, recVolA, recAttA, "node1"); err != nil {
			t.Fatal(err)
		}
		for _, q := range s.Captured() {
			if q.Method == "DELETE" {
				t.Fatal("DELETE sent for a gone attachment")
			}
		}
	})
	t.Run("after the evacuation: a new attachment on node2", func(t *testing.T) {
		s, r := recorded(t)
		s.RouteFile(vol, "rec-volume-attached-node2.1")
		v, err := r.Volume(ctx, recVolA)
		if err != nil || len(v.Attachments) != 1 || v.Attachments[0].Host != "node2" || v.Attachments[0].ID != recAttA2 {
			t.Fatalf("%+v %v", v, err)
		}
		// node1's recovery never touches it.
		if err := r.RemoveAttachment(ctx, recVolA, recAttA2, "node1"); !errors.Is(err, ErrAttachmentOtherHost) {
			t.Fatalf("%v", err)
		}
	})
}

// Masakari 14.0.2's answers: a VM notification created (202), the same
// one again refused as a duplicate (409) and found in the listing, read
// back ignored (its engine acts only on STOPPED_FAILED), and a host of no
// segment refused (400).
func TestContractRecoveryMasakari(t *testing.T) {
	const (
		id     = "7c252ced-3353-42e0-a8ca-e921c4243adc"
		server = "6f1c2a9e-0000-4000-8000-00000000beef"
	)
	s, r := recorded(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 19, 44, 35, 600_000_000, time.UTC)
	n := VMNotification{Host: "node2", ServerID: server, Event: MasakariEventLifecycle, DomainEvent: MasakariDomainStoppedDestroyed, At: at}
	post := openstacktest.MasakariPath + "/notifications"
	s.RouteMethod("POST", post, openstacktest.MustLoad(t, "rec-masakari-vm-notification.1"))
	if got, err := r.InstanceNotification(ctx, n); err != nil || got != id {
		t.Fatalf("%q %v", got, err)
	}
	s.RouteMethod("POST", post, openstacktest.MustLoad(t, "rec-masakari-vm-notification-duplicate.1"))
	s.RouteFile(post+"?generated-since=2026-12-01T19%3A44%3A35Z&type=VM", "rec-masakari-vm-notification-duplicate.2")
	if got, err := r.InstanceNotification(ctx, n); err != nil || got != id {
		t.Fatalf("duplicate: %q %v", got, err)
	}
	// Another instance's duplicate does not match the listed one.
	n2 := n
	n2.ServerID = recSrvA
	if got, err := r.InstanceNotification(ctx, n2); !errors.Is(err, ErrDuplicateNotification) || got != "" {
		t.Fatalf("other payload: %q %v", got, err)
	}
	s.RouteFile(post+"/"+id, "rec-masakari-notification-get.1")
	got, err := r.Notification(ctx, id)
	if err != nil || got.Status != NotificationIgnored || !got.Done() || got.Payload["vir_domain_event"] != MasakariDomainStoppedDestroyed {
		t.Fatalf("%+v %v", got, err)
	}
	s.RouteMethod("POST", post, openstacktest.MustLoad(t, "rec-masakari-host-notification-unknown-host.1"))
	_, err = r.HostNotification(ctx, "node9", at)
	if e := wantKind(t, err, KindRejected); e.Status != 400 {
		t.Fatalf("%v", err)
	}
}
