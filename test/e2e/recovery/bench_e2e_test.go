//go:build e2e

package recoverye2e

import (
	"os"
	"testing"
	"time"

	"hvguard/controller/recovery"
)

// The issue 13 benchmark (make bench-recovery, docs/BENCHMARKS.md), run
// only with HVG_RECOVERY_BENCH=1: the same three servers on node1 (two BFV
// with multiattach=False, one ephemeral), recovered once by hvguard and
// once by Masakari, on the same harness.

func benchOnly(t *testing.T) {
	if os.Getenv("HVG_RECOVERY_BENCH") != "1" {
		t.Skip("benchmark: HVG_RECOVERY_BENCH=1 (make bench-recovery)")
	}
}

// TestHostRecoveryBench: partition (power-off) → every server ACTIVE on
// node2, hvguard with default settings (the agent's fencing at its defaults
// with HVG_RECOVERY_TIMING=default; the controller at its defaults but for
// the rig's guard.share and backstop acceptance, see startController),
// split by phase.
func TestHostRecoveryBench(t *testing.T) {
	benchOnly(t)
	r := newRig(t, false)
	startController(t, "ctl-bench", r.nsURL, r.clouds, ctlOpts{mode: recovery.ModeEvacuate})
	time.Sleep(2 * time.Second)
	cut := r.powerOff()
	at := r.waitOnNode2(r.node1(), recoverBound)
	rec := waitPhase(t, r.ctx, r.js, "node1", time.Minute, recovery.PhaseRecovered)
	r.checkVolumesOnNode2()
	started := r.evs.ops("node1", "started")[0].At
	phases(t, rec, cut, started)
	last, lastBFV := cut, cut
	for _, id := range r.node1() {
		last = later(last, at[id])
	}
	for _, id := range r.bfv {
		lastBFV = later(lastBFV, at[id])
	}
	t.Logf("BENCH-RESULT hvguard timing=%s: partition → recovery started %.1f s, force-down done %.1f s, detach %.1f s, evacuate %.1f s, last BFV ACTIVE on node2 %.1f s, ephemeral %.1f s, all %.1f s",
		os.Getenv("HVG_RECOVERY_TIMING"), started.Sub(cut).Seconds(), rec.PhaseAt[recovery.PhaseList].Sub(cut).Seconds(),
		rec.PhaseAt[recovery.PhaseDetach].Sub(cut).Seconds(), rec.PhaseAt[recovery.PhaseEvacuate].Sub(cut).Seconds(),
		lastBFV.Sub(cut).Seconds(), at[r.eph[0]].Sub(cut).Seconds(), last.Sub(cut).Seconds())
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestMasakariBench: Masakari alone at its engine defaults: node1's
// nova-compute stopped, the COMPUTE_HOST notification masakari-hostmonitor
// would send POSTed at t=0 (hostmonitor's own detection time is not
// included), every server ACTIVE on node2.
func TestMasakariBench(t *testing.T) {
	benchOnly(t)
	r := newRig(t, false)
	if _, err := r.h.Masakari(); err != nil {
		t.Fatalf("Masakari: %v", err)
	}
	t.Cleanup(r.undoMasakari)
	if err := r.h.MasakariMaintenance(r.ctx, "node1", false); err != nil {
		t.Fatal(err)
	}
	r.step("stop nova-compute on node1 (power-off)", func() error { return r.h.StopCompute(r.ctx, "node1") })
	t0 := time.Now()
	id, err := r.h.MasakariHostNotification(r.ctx, "node1", t0.UTC().Format("2006-01-02T15:04:05"))
	if err != nil {
		t.Fatal(err)
	}
	at := r.waitOnNode2(r.node1(), 10*time.Minute)
	st, _ := r.h.MasakariNotificationStatus(r.ctx, id)
	r.checkVolumesOnNode2()
	lastBFV := t0
	for _, id := range r.bfv {
		lastBFV = later(lastBFV, at[id])
	}
	t.Logf("BENCH-RESULT masakari: notification → last BFV ACTIVE on node2 %.1f s, ephemeral %.1f s (notification %s %s)",
		lastBFV.Sub(t0).Seconds(), at[r.eph[0]].Sub(t0).Seconds(), id, st)
}
