package proto

import (
	"strings"
	"testing"
)

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

// TestWithdrawalStreamOf: a host's receipts stream is named after its
// token (no '.', which a stream name may not hold), distinct hosts get
// distinct streams, and a name longer than NATS allows is refused.
func TestWithdrawalStreamOf(t *testing.T) {
	if got, err := WithdrawalStreamOf("compute-2.example.org"); err != nil || got != "hvguard-withdrawals-compute-2_example_org" {
		t.Fatalf("WithdrawalStreamOf = %q, %v", got, err)
	}
	a, _ := WithdrawalStreamOf("compute-2")
	b, _ := WithdrawalStreamOf("compute-20")
	if a == b || a == WithdrawalStream {
		t.Fatalf("streams %q and %q (shared %q)", a, b, WithdrawalStream)
	}
	label := strings.Repeat("a", 63)
	long := label + "." + label + "." + label + "." + label[:43] // 235 bytes: the longest that fits
	if got, err := WithdrawalStreamOf(long); err != nil || len(got) != 255 {
		t.Fatalf("235-byte host: %d bytes, %v", len(got), err)
	}
	if _, err := WithdrawalStreamOf(long + "a"); err == nil || !strings.Contains(err.Error(), "255") {
		t.Fatalf("236-byte host: %v, want refused", err)
	}
	if _, err := WithdrawalStreamOf("a b"); err == nil {
		t.Fatal("invalid host name accepted")
	}
}
