package proto

import "testing"

func TestSubjectHost(t *testing.T) {
	subj, _ := LifecycleSubject("compute-2.example.org")
	if h, k, err := SubjectHost(subj); err != nil || h != "compute-2.example.org" || k != KindLifecycle {
		t.Fatalf("SubjectHost(%s) = %q %q %v", subj, h, k, err)
	}
	for _, bad := range []string{"", "hvguard.v1", "hvguard.v1.x", "hvguard.v1.x.", "hvguard.v1._controller.decision", "hvguard.v2.x.lifecycle",
		"hvguard.v1.a.b.lifecycle", "hvguard.v1.-x.lifecycle", "$KV.hvguard-leases.x"} {
		if h, k, err := SubjectHost(bad); err == nil {
			t.Errorf("SubjectHost(%q) = %q %q, want an error", bad, h, k)
		}
	}
}

// FuzzSubjectHost: whatever SubjectHost accepts is exactly the subject of
// the host and kind it returns (the controller verifies an event's
// signature against the key of that host).
func FuzzSubjectHost(f *testing.F) {
	f.Add("hvguard.v1.compute-2_example_org.lifecycle")
	f.Add("hvguard.v1._controller.decision")
	f.Add("hvguard.v1.a..lifecycle")
	f.Fuzz(func(t *testing.T, subject string) {
		host, kind, err := SubjectHost(subject)
		if err != nil {
			return
		}
		if s, err := hostSubject(host, kind); err != nil || s != subject {
			t.Fatalf("SubjectHost(%q) = %q %q, whose subject is %q (%v)", subject, host, kind, s, err)
		}
	})
}
