package controller

import (
	"slices"
	"testing"
	"time"

	"hvguard/fencing"
)

// invalidRig: a tracker watching h0..h9 (guard threshold 2), h0 renewed at
// t0 with a signed record (written on revision 10, observed at 11), and
// then silent (dead).
func invalidRig(t *testing.T) *Tracker {
	t.Helper()
	tr, err := NewTracker(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		r := rec(hostName(i), fencing.BackstopWatchdog)
		r.PrevRev, r.Signer, r.Sig = 10, "Kh", "sig"
		tr.Observe(t0, hostName(i), uint64(11+i), r)
	}
	tr.WatchStarted(t0)
	return tr
}

func hostName(i int) string { return string(rune('a'+i)) + "host" }

// due is when h0 (lease_ttl 15 s + grace 15.51 s) is declared if nothing
// restarts its clock at t0.
const due = 30*time.Second + 505050506

// declaredAt ticks tr from t0 every 100 ms until it declares h0 (or until
// limit) and returns when and on which revision.
func declaredAt(tr *Tracker, host string, limit time.Duration, others func(now time.Time)) (time.Duration, uint64) {
	for d := time.Duration(0); d <= limit; d += 100 * time.Millisecond {
		now := t0.Add(d)
		if others != nil {
			others(now)
		}
		for _, dc := range tr.Tick(now) {
			if dc.Op == OpDeclare && dc.Host == host {
				return d, dc.Revision
			}
		}
	}
	return -1, 0
}

// keepAlive renews every host but h0 every 2 s.
func keepAlive(tr *Tracker) func(time.Time) {
	rev := uint64(100)
	last := t0
	// keyRev: each host's key's last revision (invalidRig: 11+i); a
	// renewal is sealed for it.
	var keyRev [10]uint64
	for i := range keyRev {
		keyRev[i] = uint64(11 + i)
	}
	return func(now time.Time) {
		if now.Sub(last) < 2*time.Second {
			return
		}
		last = now
		for i := 1; i < 10; i++ {
			rev++
			r := rec(hostName(i), fencing.BackstopWatchdog)
			r.PrevRev, r.Signer, r.Sig = keyRev[i], "Kh", "sig"
			keyRev[i] = rev
			tr.Observe(now, hostName(i), rev, r)
		}
	}
}

// TestForgedValueDoesNotStopDeclaration (issue 11): a compromised node
// writes into a dead host's key, 20 s after its last renewal, a record
// signed by its own key (forged). The tracker ignores it (invalid-record),
// does not restart the dead host's clock, and declares it on time by CAS
// on the forged value's revision (on the last trusted revision the CAS
// would fail for ever).
func TestForgedValueDoesNotStopDeclaration(t *testing.T) {
	tr := invalidRig(t)
	alive := keepAlive(tr)
	var said []Decision
	at, rev := declaredAt(tr, hostName(0), 2*time.Minute, func(now time.Time) {
		alive(now)
		if now.Equal(t0.Add(20 * time.Second)) {
			said = slices.Clone(tr.ObserveInvalid(now, hostName(0), 500, "active record signed by bhost's key", true))
		}
	})
	if len(said) != 1 || said[0].Op != OpInvalid {
		t.Fatalf("the forged value was not said: %v", said)
	}
	if at < due || at > due+200*time.Millisecond || rev != 500 {
		t.Fatalf("declared at %s on revision %d, want at %s on the forged value's revision 500", at, rev, due)
	}
}

// TestUnverifiableValueCountsAsRenewal: a value that may be the host's own
// genuine renewal that this controller cannot verify (unsigned, unknown
// key, bad signature) restarts the declaration clock — a live agent
// whose key is not provisioned here is never declared (and said at every
// value); a dead host is declared once they stop. It does not end the
// host's silence for the guard.
func TestUnverifiableValueCountsAsRenewal(t *testing.T) {
	tr := invalidRig(t)
	alive := keepAlive(tr)
	at, rev := declaredAt(tr, hostName(0), 2*time.Minute, func(now time.Time) {
		alive(now)
		if now.Equal(t0.Add(20 * time.Second)) {
			tr.ObserveInvalid(now, hostName(0), 500, "unsigned", false)
			if !tr.counted(tr.hosts[hostName(0)], now) {
				t.Error("an unverifiable value ended the host's silence for the guard")
			}
		}
	})
	if want := 20*time.Second + due; at < want || at > want+200*time.Millisecond || rev != 500 {
		t.Fatalf("declared at %s on revision %d, want at %s (clock restarted at 20 s) on revision 500", at, rev, want)
	}
}

// TestForgedValueAfterSkippedRevision: when the watch skipped a revision
// since the host's last one, a genuine renewal may have been overwritten
// by the forged value before it was delivered: the clock restarts.
func TestForgedValueAfterSkippedRevision(t *testing.T) {
	tr := invalidRig(t)
	alive := keepAlive(tr)
	at, _ := declaredAt(tr, hostName(0), 2*time.Minute, func(now time.Time) {
		alive(now)
		if now.Equal(t0.Add(20 * time.Second)) {
			tr.Skipped(500)
			tr.ObserveInvalid(now, hostName(0), 500, "forged", true)
		}
	})
	if want := 20*time.Second + due; at < want {
		t.Fatalf("declared at %s, before %s (a renewal may have been hidden at 20 s)", at, want)
	}
}

// TestReplayedWithdrawalDoesNotStopDeclaration (issue 11): a compromised
// node copies an old, genuine withdrawn record of h0 (from an earlier
// orderly stop, written on revision 3) into h0's key after h0 died. A
// withdrawn host is never declared: taken as h0's record it kept h0
// undeclared for ever (invalidMutation, the behaviour before). It names a
// revision older than h0's last one: a replay, ignored; h0 is declared on
// time.
func TestReplayedWithdrawalDoesNotStopDeclaration(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		invalidMutation = mutated
		tr := invalidRig(t)
		alive := keepAlive(tr)
		old := rec(hostName(0), fencing.BackstopWatchdog)
		old.State, old.Reason, old.PrevRev, old.Signer, old.Sig = fencing.LeaseWithdrawn, "orderly-stop", 3, "Kh", "sig"
		at, _ := declaredAt(tr, hostName(0), 2*time.Minute, func(now time.Time) {
			alive(now)
			if now.Equal(t0.Add(10 * time.Second)) {
				tr.Observe(now, hostName(0), 500, old)
			}
		})
		switch {
		case !mutated && (at < due || at > due+200*time.Millisecond):
			t.Errorf("declared at %s, want %s", at, due)
		case mutated && at >= 0:
			t.Errorf("mutation: the replayed withdrawal did not keep h0 undeclared (declared at %s): the test shows nothing", at)
		}
	}
	invalidMutation = false
}

// TestNoTrustedRecordNeverDeclared: a key that never held a trusted record
// (a host whose key is not provisioned, or garbage) is tracked, said, and
// never declared.
func TestNoTrustedRecordNeverDeclared(t *testing.T) {
	tr := invalidRig(t)
	ds := tr.ObserveInvalid(t0, "ghost", 700, "unsigned", false)
	if len(ds) != 1 || ds[0].Op != OpInvalid {
		t.Fatalf("%v", ds)
	}
	if at, _ := declaredAt(tr, "ghost", 3*time.Minute, nil); at >= 0 {
		t.Fatalf("declared at %s", at)
	}
}
