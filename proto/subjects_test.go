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
