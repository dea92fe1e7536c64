package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rec(host string, backstop fencing.Backstop) *fencing.LeaseRecord {
	return &fencing.LeaseRecord{Schema: 1, Host: host, State: fencing.LeaseActive, FencingEnabled: true,
		Action: fencing.ActionPause, Backstop: backstop, Timing: fencing.DefaultTiming()}
}

// resetConfig is DefaultConfig accepting the agent-dependent reset
// backstop (most tests here are about timing, not backstops).
func resetConfig() Config {
	c := DefaultConfig()
	c.AcceptAgentDependentBackstop = true
	return c
}

func TestGraceAtDefaults(t *testing.T) {
	c := resetConfig()
	for _, tc := range []struct {
		b    fencing.Backstop
		want time.Duration
	}{
		// 5 s fence deadline + 1 s reset + ceil(16 s * (1.01/0.99 - 1)).
		{fencing.BackstopReset, 6*time.Second + 323232324},
		// 5 s + 10 s watchdog + ceil(25 s * 0.0202...).
		{fencing.BackstopWatchdog, 15*time.Second + 505050506},
	} {
		g, err := c.Grace(*rec("h", tc.b))
		if err != nil || g != tc.want {
			t.Errorf("%s: grace %v %v, want %v", tc.b, g, err, tc.want)
		}
	}
}

func TestGraceRefusals(t *testing.T) {
	c := DefaultConfig()
	for name, mut := range map[string]func(r *fencing.LeaseRecord){
		"disabled":    func(r *fencing.LeaseRecord) { r.FencingEnabled = false },
		"monitor":     func(r *fencing.LeaseRecord) { r.Action = fencing.ActionNone },
		"no backstop": func(r *fencing.LeaseRecord) { r.Backstop = fencing.BackstopNone },
		// Issue 10 item 2: a reset needs a live agent; refused by default.
		"reset only": func(r *fencing.LeaseRecord) { r.Backstop = fencing.BackstopReset },
		"drift":      func(r *fencing.LeaseRecord) { r.Timing.MaxClockDrift = 0.08 },
		"ttl":        func(r *fencing.LeaseRecord) { r.Timing.LeaseTTL = 9 * time.Second },
		"grace":      func(r *fencing.LeaseRecord) { r.Timing.WatchdogTimeout = 10 * time.Minute },
	} {
		r := rec("h", fencing.BackstopWatchdog)
		mut(r)
		if _, err := c.Grace(*r); err == nil {
			t.Errorf("%s: honoured", name)
		}
	}
}

func newTracker(t *testing.T, n int) *Tracker {
	tr, err := NewTracker(resetConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		tr.Observe(t0, fmt.Sprintf("h%d", i), 1, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
	}
	tr.GuardPublished(tr.Guard(), nil)
	return tr
}

func ops(ds []Decision) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, "; ")
}

// TestDeclareAfterTTLPlusGrace: one host of 50 goes silent; it is declared
// exactly at lease_ttl + grace after its last observed renewal, by CAS on
// that revision with the next epoch.
func TestDeclareAfterTTLPlusGrace(t *testing.T) {
	tr := newTracker(t, 50)
	grace, _ := resetConfig().Grace(*rec("h", fencing.BackstopReset))
	var rev uint64 = 1
	var declared time.Time
	for now := t0; now.Before(t0.Add(time.Minute)); now = now.Add(100 * time.Millisecond) {
		rev++
		for i := 1; i < 50; i++ {
			tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare {
				if d.Host != "h0" || d.Revision != 1 || d.Record.Epoch != 1 || d.Record.State != fencing.LeaseExpired {
					t.Fatalf("bad declaration %+v", d)
				}
				if declared.IsZero() {
					declared = now
				}
			}
		}
	}
	if want := t0.Add(fencing.DefaultLeaseTTL + grace); declared.Before(want) || declared.Sub(want) > 100*time.Millisecond {
		t.Fatalf("declared at %s, want %s", declared.Sub(t0), want.Sub(t0))
	}
}

// TestMassFailureHolds: 11 of 50 hosts go silent together (threshold 10):
// nothing is declared, the hold is said once, and it ends only a guard
// window after they come back.
func TestMassFailureHolds(t *testing.T) {
	tr := newTracker(t, 50)
	var got []string
	var rev uint64 = 1
	for now := t0; now.Before(t0.Add(3 * time.Minute)); now = now.Add(500 * time.Millisecond) {
		rev++
		for i := 0; i < 50; i++ {
			if i > 10 || now.After(t0.Add(90*time.Second)) {
				tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
			}
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare {
				t.Fatalf("declared during a mass failure: %v", d)
			}
			if d.Op == OpHoldStarted || d.Op == OpHoldEnded {
				got = append(got, fmt.Sprintf("%s@%s", d.Op, now.Sub(t0)))
			}
		}
	}
	want := "hold-started@4s hold-ended@2m31s"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}

func TestRefusedHostNeverDeclared(t *testing.T) {
	tr := newTracker(t, 50)
	r := rec("h0", fencing.BackstopNone)
	if ds := tr.Observe(t0, "h0", 2, r); len(ds) != 1 || ds[0].Op != OpRefuse {
		t.Fatalf("no loud refusal: %s", ops(ds))
	}
	var due int
	for now := t0; now.Before(t0.Add(time.Minute)); now = now.Add(time.Second) {
		for i := 1; i < 50; i++ {
			tr.Observe(now, fmt.Sprintf("h%d", i), uint64(now.Sub(t0)/time.Second)+3, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
		}
		for _, d := range tr.Tick(now) {
			switch d.Op {
			case OpDeclare:
				t.Fatalf("declared a refused host")
			case OpRefusedDue:
				due++
			}
		}
	}
	if due != 1 {
		t.Fatalf("refused-due said %d times", due)
	}
}

func TestRelease(t *testing.T) {
	tr := newTracker(t, 3)
	if _, err := tr.Release("h0", "x"); err == nil {
		t.Fatal("released an active host")
	}
	ex := *rec("h0", fencing.BackstopReset)
	ex.State, ex.Epoch = fencing.LeaseExpired, 1
	tr.Observe(t0, "h0", 5, &ex)
	d, err := tr.Release("h0", "evacuated")
	if err != nil || d.Revision != 5 || d.Record.State != fencing.LeaseReleased || d.Record.Epoch != 1 {
		t.Fatalf("%+v %v", d, err)
	}
}

// TestDeletedKeyNeverDeclaredButCounted: a host whose key is deleted is
// never declared (no record to CAS), said once (lease-deleted), no longer
// a member (the threshold shrinks at once), but keeps counting as silent
// for the guard until its key is re-created — then it is tracked again as
// a new observation (its clock restarts) and its silence counts one more
// guard window. A stale delivery of an older record is ignored.
func TestDeletedKeyNeverDeclaredButCounted(t *testing.T) {
	tr := newTracker(t, 50)
	if d := tr.Observe(t0, "h7", 100, nil); len(d) != 1 || d[0].Op != OpLeaseDeleted || d[0].Host != "h7" {
		t.Fatalf("delete: %s", ops(d))
	}
	if tr.Members() != 49 {
		t.Fatalf("members %d, want 49", tr.Members())
	}
	// (A lower revision: said as revision-regressed, TestRevisionRegressedNotDeclared.)
	if d := tr.Observe(t0.Add(time.Second), "h7", 50, rec("h7", fencing.BackstopReset)); len(d) != 1 || d[0].Op != OpRevisionRegressed || tr.Members() != 49 {
		t.Fatalf("stale record re-added the host: %s, %d members", ops(d), tr.Members())
	}
	// Everyone else renews; h7 is silent: counted, never declared.
	for s := 1; s <= 120; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for i := range 50 {
			if i != 7 {
				tr.Observe(now, fmt.Sprintf("h%d", i), uint64(100+s*100+i), rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
			}
		}
		for _, d := range tr.Tick(now) {
			if d.Op == OpDeclare {
				t.Fatalf("%s: declared %s", now.Sub(t0), d.Host)
			}
		}
		if s >= 5 && tr.Silent(now) != 1 {
			t.Fatalf("%s: silent %d, want 1 (the deleted host)", now.Sub(t0), tr.Silent(now))
		}
	}
	if _, err := tr.Release("h7", "x"); err == nil {
		t.Fatal("released a deleted host")
	}
	// Re-created: tracked again from now; its silence counts for one more
	// window.
	now := t0.Add(121 * time.Second)
	tr.Observe(now, "h7", 100000, rec("h7", fencing.BackstopReset))
	if tr.Members() != 50 || tr.Silent(now) != 1 {
		t.Fatalf("re-created: members %d, silent %d (want 50, 1: its silence counts one more window)", tr.Members(), tr.Silent(now))
	}
	if err := tr.Forget(now, "h7"); err == nil {
		t.Fatal("forgot a host whose key exists")
	}
	tr.Observe(now.Add(time.Second), "h7", 100001, nil)
	// Forgotten: it still counts for one guard window, then it is gone.
	counts := func(at time.Time) (present, silent bool) {
		for _, h := range tr.View(at).Hosts {
			if h.Host == "h7" {
				return true, h.Silent
			}
		}
		return false, false
	}
	if err := tr.Forget(now.Add(2*time.Second), "h7"); err != nil {
		t.Fatal(err)
	}
	tr.Tick(now.Add(3 * time.Second))
	if p, s := counts(now.Add(3 * time.Second)); !p || !s {
		t.Fatalf("right after forget: present %v counted %v (want both: it counts one more window)", p, s)
	}
	later := now.Add(3*time.Second + DefaultConfig().GuardWindow)
	tr.Tick(later)
	if p, _ := counts(later); p {
		t.Fatal("a guard window after forget, h7 is still tracked")
	}
}

// TestDeletedHostSurvivesRestart: a deleted host that counts travels in
// the published guard; a new controller (restart, take-over), whose watch
// shows only the delete marker, restores it: counted as silent at once,
// its named guard version in force, never declared; when the key comes
// back it is tracked anew. A deleted host whose last record was withdrawn
// is not published (it counts toward nothing). Before, a restarted
// controller forgot every deleted host.
func TestDeletedHostSurvivesRestart(t *testing.T) {
	tr := newTracker(t, 10)
	named := rec("h3", fencing.BackstopReset)
	named.Guard = &fencing.GuardVersion{Version: 1, Threshold: 0}
	tr.Observe(t0, "h3", 50, named)
	w := rec("h4", fencing.BackstopReset)
	w.State = fencing.LeaseWithdrawn
	tr.Observe(t0, "h4", 51, w)
	tr.Observe(t0, "h3", 60, nil)
	tr.Observe(t0, "h4", 61, nil)
	g := tr.Guard()
	tr.GuardPublished(g, nil)
	if len(g.Deleted) != 1 || g.Deleted[0].Host != "h3" || g.Deleted[0].Guard == nil {
		t.Fatalf("published deleted hosts %+v, want h3 with its guard", g.Deleted)
	}
	b, _ := fencing.EncodeGuard(g)
	published, _ := fencing.DecodeGuard(b)

	nt, _ := NewTracker(DefaultConfig())
	now := t0.Add(time.Minute)
	for i := range 10 {
		if i != 3 && i != 4 {
			nt.Observe(now, fmt.Sprintf("h%d", i), 100, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
		}
	}
	nt.Observe(now, "h3", 60, nil) // the watch shows the marker only
	nt.WatchStarted(now)
	nt.RestoreGuard(published)
	if s := nt.Silent(now); s != 1 {
		t.Fatalf("silent %d after the restore, want 1 (h3)", s)
	}
	if th := nt.Threshold(); th != 0 {
		t.Fatalf("threshold %d, want 0 (h3 names version 1, threshold 0)", th)
	}
	for _, d := range nt.Tick(now.Add(time.Hour)) {
		if d.Op == OpDeclare && d.Host == "h3" {
			t.Fatal("declared a deleted host")
		}
	}
	nt.Observe(now.Add(time.Hour), "h3", 70, rec("h3", fencing.BackstopReset))
	if nt.Members() != 9 {
		t.Fatalf("members %d after h3 came back, want 9", nt.Members())
	}
}
