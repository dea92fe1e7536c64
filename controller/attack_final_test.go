package controller_test

import (
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
)

// TestFinalLiveHostUpgradeAfterKeyDelete: a live host renewing every
// second; its key is deleted (membership tooling) and its agent restarts
// (upgrade: new incarnation; or new boot with lost state, seq restarts);
// its create is "unverifiable" (otherBootCreate), its renewals must count.
// Variant churn: the key is deleted again right after the create.
func TestFinalLiveHostUpgradeAfterKeyDelete(t *testing.T) {
	for _, v := range []string{"upgrade", "lostboot", "churn", "idle-gap"} {
		t.Run(v, func(t *testing.T) {
			const host = "compute-9.example.org"
			tr := guardlessTracker(t, true)
			t0 := time.Now()
			now := t0
			tr.WatchStarted(now)
			rev := uint64(10)
			r := controllertest.HostRecord(host)
			r.Incarnation, r.Seq, r.PrevRev, r.Sig, r.BootID = 3, 50, 9, "signed", "boot-1"
			put := func() {
				tr.Stored(host, rev, now)
				tr.Observe(now, host, rev, &r)
			}
			tick := func() {
				for _, d := range tr.Tick(now) {
					if d.Op == controller.OpDeclare {
						t.Fatalf("%s: live host declared at +%s: %s", v, now.Sub(t0), d.Reason)
					}
				}
			}
			put()
			for i := 0; i < 20; i++ {
				now = now.Add(time.Second)
				rev++
				r.Seq++
				r.PrevRev = rev - 1
				put()
				tick()
			}
			now = now.Add(time.Second)
			rev++
			tr.Stored(host, rev, now)
			tr.Observe(now, host, rev, nil) // key delete
			tick()
			if v == "idle-gap" {
				for i := 0; i < 5; i++ {
					now = now.Add(time.Second)
					tick()
				}
			}
			r.Incarnation, r.PrevRev = 4, 0
			if v == "lostboot" {
				r.BootID, r.Incarnation, r.Seq = "boot-2", 1, 1
			}
			now = now.Add(time.Second)
			rev++
			put() // the create
			tick()
			if v == "churn" {
				now = now.Add(100 * time.Millisecond)
				rev++
				tr.Stored(host, rev, now)
				tr.Observe(now, host, rev, nil)
				now = now.Add(100 * time.Millisecond)
				rev++
				r.Seq++
				put()
			}
			for i := 0; i < 120; i++ {
				now = now.Add(time.Second)
				rev++
				r.Seq++
				r.PrevRev = rev - 1
				put()
				tick()
			}
			t.Logf("%s: not declared over 120 s of renewals after the create", v)
		})
	}
}

// TestFinalLiveHostAcrossBucketRecreate: a live host's key in a re-created
// bucket (revisions restart, interleaved with other keys' writes): its
// renewals above the old last revision must count (unseenPrevRev).
func TestFinalLiveHostAcrossBucketRecreate(t *testing.T) {
	const host = "compute-9.example.org"
	tr := guardlessTracker(t, true)
	t0 := time.Now()
	now := t0
	tr.WatchStarted(now)
	r := controllertest.HostRecord(host)
	r.Incarnation, r.Seq, r.Sig, r.BootID = 3, 50, "signed", "boot-1"
	tick := func() {
		for _, d := range tr.Tick(now) {
			if d.Op == controller.OpDeclare {
				t.Fatalf("live host declared at +%s: %s", now.Sub(t0), d.Reason)
			}
		}
	}
	prev := uint64(0)
	for rev := uint64(10); rev <= 30; rev += 2 {
		now = now.Add(time.Second)
		r.Seq++
		r.PrevRev = prev
		prev = rev
		tr.Stored(host, rev, now)
		tr.Observe(now, host, rev, &r)
		tick()
	}
	// new life: the watch re-lists (skipped) then runs on; the host writes
	// every 3rd revision
	prev = 0
	first := true
	for rev := uint64(1); rev <= 300; rev += 3 {
		now = now.Add(time.Second)
		r.Seq++
		r.PrevRev = prev
		prev = rev
		if first {
			tr.Skipped(rev)
			first = false
		}
		tr.Stored(host, rev, now)
		tr.Observe(now, host, rev, &r)
		tick()
	}
}
