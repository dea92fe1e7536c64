package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX20ForgedValueEndsRegression (reviewer X20): a regressed host
// (tracker.go regress: its key's revisions went down — the lease stream
// re-created or rolled back) is "not declared until a revision above
// h.rev arrives". But ANY value above h.rev clears h.regressed — an
// untrusted one included (invalid.go observeInvalid: `h.rev,
// h.regressed = rev, false`; keydelete.go the same for a marker). While
// h0 is regressed its genuine renewals (below h.rev) are dropped, so its
// lastSeen/declaration clock stays at the last pre-regression record.
// A compromised node writes one forged value (or a delete marker) into
// h0's key at the next stream revision (above h0's old one): the forged
// value keeps the clock (restart only when !forged || hidden), the
// regression is cleared, and the very next Tick declares the live h0 by
// CAS on the forged value's revision — its guests running.
//
// Model as TestRevisionRegressedNotDeclared's (h1..h9 keep writing above
// h0's old revision; the guard does not hold for one silent host).
// Control: no forged value — h0 is never declared while regressed.
func TestX20ForgedValueEndsRegression(t *testing.T) {
	for _, c := range []struct {
		name     string
		forge    bool
		wantHole bool
	}{
		{name: "forged-value-clears-regression", forge: true, wantHole: true},
		{name: "control-no-forged-value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := NewTracker(resetConfig())
			if err != nil {
				t.Fatal(err)
			}
			rev := uint64(100)
			tr.Observe(t0, "h0", rev, rec("h0", fencing.BackstopReset))
			for i := 1; i < 10; i++ {
				rev++
				tr.Observe(t0, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))
			}
			tr.WatchStarted(t0)
			low := uint64(0)
			for s := 1; s <= 120; s++ {
				now := t0.Add(time.Duration(s) * time.Second)
				var ds []Decision
				low++ // h0's genuine renewal in the re-created stream: h0 is alive throughout
				ds = append(ds, tr.Observe(now, "h0", low, rec("h0", fencing.BackstopReset))...)
				for i := 1; i < 10; i++ {
					rev++
					ds = append(ds, tr.Observe(now, fmt.Sprintf("h%d", i), rev, rec(fmt.Sprintf("h%d", i), fencing.BackstopReset))...)
				}
				if c.forge && s == 60 {
					rev++ // the compromised node's forged value in h0's key, above h0's old revision 100
					tr.ObserveInvalid(now, "h0", rev, "forged: signed by h9's key", true)
				}
				ds = append(ds, tr.Tick(now)...)
				for _, d := range ds {
					if d.Op != OpDeclare || d.Host != "h0" {
						continue
					}
					if !c.wantHole {
						t.Fatalf("control: the live h0 declared at %ds (revision %d)", s, d.Revision)
					}
					t.Fatalf("the live h0 (renewing every second at its re-created stream's revisions, last %d) declared at %ds by CAS on the forged value's revision %d: one forged value above its old revision ended the regression with its clock stale since t0", low, s, d.Revision)
				}
			}
		})
	}
}

// TestX20PinTakenAfterStreamRollback (OPEN: a rolled-back lease stream
// keeps its creation time, so a pin from before the rollback can match a
// reused revision) is kept on branch open-attack/x20; docs/security.md,
// What is left.
