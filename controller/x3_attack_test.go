package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestLiveHostRenewingUnverifiablyIsNotDeclared (X3, OPEN): with signatures
// required, once h0's trusted record signed by its key was seen
// (Tracker.pinned), its LIVE agent's genuine renewals that this controller
// cannot verify — an agent rolled back to a release that does not sign
// (docs/security.md rollout step 4 still says such a host "is never
// declared"), or a host key switched before this controller re-read
// host_keys_file (unknown signer) — count as forged: h0 is declared after
// lease_ttl + grace while it renews every second and its guests run.
// Invariant: never declare a host whose guests can still run.
func TestLiveHostRenewingUnverifiablyIsNotDeclared(t *testing.T) {
	for _, why := range []string{"unsigned (agent rolled back)", "signed by unknown key h0-new (rotated before host_keys_file reload)"} {
		t.Run(why, func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr.SetSigningRequired(true)
			for i := range 10 {
				r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
				r.Signer = fmt.Sprintf("h%d-old", i)
				tr.Observe(t0, r.Host, uint64(1+i), r)
			}
			tr.GuardPublished(tr.Guard(), nil)
			rev := uint64(100)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				for i := 1; i < 10; i++ {
					rev++
					r := rec(fmt.Sprintf("h%d", i), fencing.BackstopReset)
					r.Signer = fmt.Sprintf("h%d-old", i)
					tr.Observe(now, r.Host, rev, r)
				}
				rev++
				tr.ObserveInvalid(now, "h0", rev, why, false) // h0's live agent renews
				for _, d := range tr.Tick(now) {
					if testing.Verbose() {
						t.Log(s, d)
					}
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Fatalf("h0 declared at %s while its agent renewed every second (%s): %s", now.Sub(t0), why, d.Reason)
					}
				}
			}
		})
	}
}
