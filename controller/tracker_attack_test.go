package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Attack (reviewer X1): a host first observed already declared (this
// controller started, or its tracker was rebuilt, after the declaration)
// is judged on the constants its declaration carries: the refusal of a
// backstop this controller does not accept, and the grace it grants
// (host recovery confirms with Refused and with SilentFor >= Due, Due =
// lease_ttl + grace). Before: both were computed from active records
// only, so such a host read Refused "" and Due = lease_ttl.
func TestAttackFirstSeenDeclaredJudged(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backstop fencing.Backstop
		refused  bool
	}{
		{"watchdog accepted", fencing.BackstopWatchdog, false},
		{"reset refused", fencing.BackstopReset, true},
		{"none refused", fencing.BackstopNone, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tr, err := NewTracker(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := rec("h0", tc.backstop)
			g, gerr := cfg.Grace(*r)
			if (gerr != nil) != tc.refused {
				t.Fatalf("grace %s, %v", g, gerr)
			}
			r.State, r.Epoch, r.Reason = fencing.LeaseExpired, 3, "no renewal (declared by controller ctl-old, term 2)"
			tr.Observe(t0, "h0", 7, r)
			v := tr.View(t0.Add(time.Second))
			h := v.Hosts[0]
			if tc.refused && h.Refused == "" {
				t.Errorf("a declared host with backstop %q reads accepted (Refused empty); this controller refuses it: %v", tc.backstop, gerr)
			}
			if !tc.refused && h.Due != r.Timing.LeaseTTL+g {
				t.Errorf("Due %s, want lease_ttl %s + grace %s", h.Due, r.Timing.LeaseTTL, g)
			}
		})
	}
}
