package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// Reviewer X5, attacks on issue 11's latest fixes (6c8bc15..acba304).

// TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared: h0 (pinned,
// beaconing) dies at t0. A compromised node deletes h0's key once and
// writes back an old genuine record of h0 that it saved earlier (every
// agent can read every key): h0's withdrawal from an earlier orderly stop
// (an upgrade restart: every host has one), or an old controller
// declaration of h0 released since. replay() recognises no replay after a
// delete ("nothing to compare it with"), so Tracker.recreated takes it as
// h0's current trusted record: withdrawn (never declared, not even
// counted silent) or expired (never declared again). One delete and one
// write, and the dead h0 is never declared — invariant (c); docs/security.md
// "What is left" admits only an active replay "restarting the clock once
// per replay". The replay IS recognisable: its prev_rev (covered by h0's
// signature) is a revision before the delete marker's, while a genuine
// re-creation after a delete is a Create (prev_rev 0) and a rewrite of an
// untrusted value names a revision after the marker. Control: the delete
// alone (pinned: declared on time).
func TestX5DeleteThenReplayedWithdrawalKeepsDeadHostUndeclared(t *testing.T) {
	for _, replay := range []fencing.LeaseState{"", fencing.LeaseWithdrawn, fencing.LeaseExpired} {
		name := string(replay)
		if name == "" {
			name = "control-delete-only"
		}
		t.Run(name, func(t *testing.T) {
			tr, rev := beaconFleet(t)
			old := *rec("h0", fencing.BackstopReset)
			old.Signer, old.Sig, old.PrevRev = "h0-key", "sig", 1 // genuine, written long ago by CAS on revision 1
			old.Reason = "orderly-stop"
			if replay == fencing.LeaseExpired {
				old.Signer, old.Reason = "ctl-key", "no renewal for 31s (declared by controller ctl-a, term 3)"
			}
			old.State = replay
			due := tr.hosts["h0"].rec.Timing.LeaseTTL + tr.hosts["h0"].grace
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				renewOthers(tr, now, &rev)
				if s == 2 {
					rev++
					tr.Observe(now, "h0", rev, nil) // the delete
					if replay != "" {
						rev++
						r := old
						tr.Observe(now.Add(10*time.Millisecond), "h0", rev, &r) // the replay
					}
				}
				for _, d := range tr.Tick(now) {
					if d.Op == OpDeclare && d.Host == "h0" {
						t.Logf("h0 declared at %s", now.Sub(t0))
						return
					}
				}
			}
			h := tr.hosts["h0"]
			t.Errorf("dead h0 never declared in 120 s (lease_ttl + grace %s) after one delete and one replay of its old genuine %s record (prev_rev %d < the marker's revision): the tracker took it as h0's record (state %s)",
				due, replay, old.PrevRev, h.rec.State)
		})
	}
}
