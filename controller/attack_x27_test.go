package controller

import (
	"testing"
	"time"
)

// TestX27MarkerThenGarbage: h3's withdrawal hidden by a skip, the watch
// delivers a delete marker (R+2) then garbage re-creating the key (R+3,
// no skip); beacons lost around. h3 must never be declared.
func TestX27MarkerThenGarbage(t *testing.T) {
	tr, rev := beaconFleet(t)
	at := t0.Add(10 * time.Minute)
	x26LastRenewal(tr, at, &rev)
	rev += 2
	tr.Skipped(rev)
	tr.Stored("h3", rev, at.Add(1500*time.Millisecond))
	tr.Observe(at.Add(2*time.Second), "h3", rev, nil)
	tr.BeaconsLost(at.Add(time.Second), at.Add(2500*time.Millisecond))
	rev++
	tr.Stored("h3", rev, at.Add(3*time.Second))
	tr.ObserveInvalid(at.Add(3*time.Second), "h3", rev, "garbage", false)
	d, _ := x26Run(t, tr, at.Add(3*time.Second), 180, &rev, "h3")
	if d != 0 {
		t.Fatalf("S: withdrawn h3 declared after %s", d)
	}
}
