package proto

import (
	"strings"
	"testing"
	"time"
)

func TestReconcileEventRoundTrip(t *testing.T) {
	e := ReconcileEvent{Schema: SchemaVersion, Host: "node1.example.org", DomainUUID: "d3fe1837-1656-48ea-8337-667709b89817",
		DomainName: "instance-d3fe", Outcome: ReconcileDestroyed, Reason: "evacuated-elsewhere", Trigger: "rejoin",
		MigrationID: 1, MigrationUUID: "ccaebfa1-92b9-437c-9c63-e8e712193dd7", MigrationStatus: "done",
		SourceCompute: "node1", DestCompute: "node2", DestHost: "192.168.0.1", ServerHost: "node2",
		ObservedAt: time.Date(2026, 11, 29, 19, 15, 10, 0, time.UTC)}
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReconcile(b)
	if err != nil || got != e {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if id := e.MsgID(); id != "node1.example.org:reconcile:d3fe1837-1656-48ea-8337-667709b89817:ccaebfa1-92b9-437c-9c63-e8e712193dd7:destroyed" {
		t.Errorf("MsgID %s", id)
	}
	for name, mut := range map[string]func(*ReconcileEvent){
		"schema":   func(e *ReconcileEvent) { e.Schema = 2 },
		"host":     func(e *ReconcileEvent) { e.Host = "a b" },
		"uuid":     func(e *ReconcileEvent) { e.DomainUUID = "X" },
		"outcome":  func(e *ReconcileEvent) { e.Outcome = "kept" },
		"reason":   func(e *ReconcileEvent) { e.Reason = "" },
		"trigger":  func(e *ReconcileEvent) { e.Trigger = "" },
		"observed": func(e *ReconcileEvent) { e.ObservedAt = time.Time{} },
		"utf8":     func(e *ReconcileEvent) { e.Error = "\xff" },
	} {
		bad := e
		mut(&bad)
		if _, err := bad.Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	if _, err := DecodeReconcile(append(b, []byte(" {}")...)); err == nil || !strings.Contains(err.Error(), "trailing") {
		t.Errorf("trailing data: %v", err)
	}
	if _, err := DecodeReconcile([]byte(strings.Repeat(" ", MaxMessageSize+1))); err == nil {
		t.Error("oversized accepted")
	}
}

func TestStreamSubjectsCaptureReconcile(t *testing.T) {
	s, err := ReconcileSubject("node1.example.org")
	if err != nil || s != "hvguard.v1.node1_example_org.reconcile" {
		t.Fatalf("%s %v", s, err)
	}
	subs := StreamSubjects()
	if len(subs) != 2 || subs[0] != LifecycleWildcard || subs[1] != ReconcileWildcard {
		t.Errorf("StreamSubjects %v", subs)
	}
}
