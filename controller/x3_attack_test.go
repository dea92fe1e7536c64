package controller

import (
	"testing"
	"time"
)

// TestLiveHostRenewingUnverifiablyIsNotDeclared (X3; beacons since, see
// beacon_test.go — this is the case without any beacon of h0, where the
// tracker stays lenient): with signatures
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
			tr, rev := pinnedFleet(t, false)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
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
