//go:build e2e

// Package recoverye2e runs issue 13's host recovery end to end: node1's
// whole agent (agent.Run on the libvirt test driver, fencing on) and the
// real hvguard-controller binary (built from cmd/hvguard-controller, mode
// evacuate or masakari) over an embedded JetStream, against the real Nova,
// Cinder and Masakari of test/e2e/openstack (make e2e brings them up, with
// HVG_OS_MASAKARI=1). Three servers on node1 — two booted from volumes
// made from the image with multiattach=False, one ephemeral — and a BFV
// server on node2 whose attachment must never be touched. node1 "powers
// off": its agent is cut from NATS (it fences, then stops) and its
// nova-compute stops; the controller declares the lease, forces node1
// down, removes node1's attachments with the service token, evacuates; all
// three run on node2 with their volumes attached there. Then node1 comes
// back: its agent starts (the start reconciliation destroys the stale
// copies), an operator releases the declaration (agent.Unfence, what
// `hvguard-agent unfence` runs), the agent rejoins healthy, the controller
// clears forced_down once node1's nova-compute has restarted (Nova refuses
// it until then).
package recoverye2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/test/e2e/e2ekit"
	"hvguard/test/e2e/openstack/osharness"
	"hvguard/test/netcut"
)

const (
	// recoverBound fails a scenario whose servers are not back on node2
	// this long after the partition: far beyond the 60 s target,
	// so only a broken recovery (not a loaded machine) trips it.
	recoverBound = 4 * time.Minute
	// cinderOutage is how long cinder-api stays stopped after the
	// recovery started (fault: Cinder unreachable mid-recovery): the first
	// attachment removals fail; cinder-api is back (its start takes ~5 s)
	// before the second attempt, 10 s (retry_base) later.
	cinderOutage = 2 * time.Second
)

// rig is one scenario's cloud, NATS, node1's agent and controllers.
type rig struct {
	t      *testing.T
	ctx    context.Context
	h      *osharness.Harness
	clouds string
	nsURL  string
	link   *netcut.Proxy
	nc     *nats.Conn
	js     jetstream.JetStream
	evs    *events
	state  string
	fence  *e2ekit.FenceLog
	agent  func() error
	cfg    agent.Config
	// node1's servers: bfv (with vols), eph; foreign: a BFV server on node2.
	bfv, vols, eph         []string
	foreign, foreignVol    string
	foreignAtt             string
	attBefore              map[string]string // volume -> node1 attachment
	defaultTiming, noFault bool
}

func harnessClouds(t *testing.T) string {
	p := osharness.WorkDir() + "/clouds.yaml"
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("HVG_E2E_REQUIRE") == "1" {
			t.Fatalf("harness clouds.yaml %s: %v (make e2e brings the harness up first)", p, err)
		}
		t.Skipf("the OpenStack e2e harness is not up (%s: %v); run make e2e", p, err)
	}
	return p
}

func (r *rig) step(what string, f func() error) {
	r.t.Helper()
	start := time.Now()
	if err := f(); err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	r.t.Logf("%-58s %6.1f s", what, time.Since(start).Seconds())
}

// newRig boots the servers and starts NATS and node1's agent (healthy).
func newRig(t *testing.T, withForeign bool) *rig {
	clouds := harnessClouds(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	h, err := osharness.Connect(ctx, osharness.WorkDir())
	if err != nil {
		t.Fatalf("harness not reachable: %v", err)
	}
	if _, err := h.Masakari(); err != nil && os.Getenv("HVG_E2E_REQUIRE") == "1" {
		t.Fatalf("%v", err)
	}
	unlock, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock) // registered first: runs last, after the cleanups below
	r := &rig{t: t, ctx: ctx, h: h, clouds: clouds, attBefore: map[string]string{},
		defaultTiming: os.Getenv("HVG_RECOVERY_TIMING") == "default"}
	for _, host := range []string{"node1", "node2"} {
		if _, fd, err := h.ComputeState(ctx, host); err != nil {
			t.Fatal(err)
		} else if fd {
			r.step("restore "+host+" left forced down", func() error { return h.RestoreHost(ctx, host) })
		}
	}
	t.Cleanup(r.cleanup)
	r.parkStoppedComputes(ctx)
	// a host-failure run of Masakari leaves the COMPUTE_STATUS_DISABLED
	// trait on node1 (boots there: NoValidHost) until its service is
	// disabled and enabled again with the compute up
	r.step("re-enable node1's service", func() error { return h.EnableCompute(ctx, "node1") })
	prefix := fmt.Sprintf("hvg-rec-%d", time.Now().Unix())
	r.step("boot 2 BFV servers (multiattach=False) on node1", func() (err error) {
		r.bfv, r.vols, err = h.BootBFV(ctx, 2, "node1", prefix)
		return err
	})
	r.step("boot 1 ephemeral server on node1", func() (err error) {
		r.eph, err = h.BootServers(ctx, 1, "node1", prefix+"-eph")
		return err
	})
	if withForeign {
		r.step("boot 1 BFV server on node2 (its attachment must stay)", func() error {
			s, v, err := h.BootBFV(ctx, 1, "node2", prefix+"-n2")
			r.vols = append(r.vols, v...)
			if len(s) == 1 && len(v) == 1 {
				r.foreign, r.foreignVol = s[0], v[0]
			}
			return err
		})
		vol, err := h.GetVolume(ctx, r.foreignVol)
		if err != nil || len(vol.Attachments) != 1 {
			t.Fatalf("node2's volume: %+v %v", vol, err)
		}
		r.foreignAtt = vol.Attachments[0].AttachmentID
	}
	for i, v := range r.vols[:2] {
		vol, err := h.GetVolume(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if vol.Multiattach || len(vol.Attachments) != 1 || vol.Attachments[0].HostName != "node1" || vol.Attachments[0].ServerID != r.bfv[i] {
			t.Fatalf("volume %s: %+v, want one attachment of %s on node1, multiattach false", v, vol, r.bfv[i])
		}
		r.attBefore[v] = vol.Attachments[0].AttachmentID
	}

	// node1's libvirt (the test driver) runs a domain per server.
	c := e2ekit.LibvirtConn(t)
	for _, id := range r.node1() {
		e2ekit.DefineNova(t, c, "instance-"+id[:8], id)
	}
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	r.nsURL = ns.ClientURL()
	r.link = netcut.New(t, ns.Addr().String())
	if r.nc, err = nats.Connect(r.nsURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.nc.Close)
	if r.js, err = jetstream.New(r.nc); err != nil {
		t.Fatal(err)
	}
	r.evs = subscribeEvents(t, r.nc)
	r.state = t.TempDir()
	r.cfg = e2ekit.AgentConfig(t, "nats://"+r.link.Addr(), r.state, clouds)
	// Only the start and the rejoin reconcile (node1 is off in between).
	r.cfg.Reconcile.Interval = agent.Duration(time.Hour)
	e2ekit.FenceConfig(t, &r.cfg)
	if r.defaultTiming {
		// the benchmark: the agent's fencing at its defaults (lease_ttl
		// 15 s, renew 2 s, ...), not the scenario's x0.1
		d := agent.DefaultConfig().Fence
		f := &r.cfg.Fence
		f.RenewInterval, f.RenewTimeout, f.PeerTimeout, f.FenceDeadline = d.RenewInterval, d.RenewTimeout, d.PeerTimeout, d.FenceDeadline
		f.LeaseTTL, f.HeldRecheck, f.MembersRefresh = d.LeaseTTL, d.HeldRecheck, d.MembersRefresh
		if err := r.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	r.startAgent()
	return r
}

func (r *rig) node1() []string { return append(slices.Clone(r.bfv), r.eph...) }

func (r *rig) startAgent() {
	r.fence = e2ekit.NewFenceLog()
	r.agent = e2ekit.RunAgentOpts(r.t, r.cfg, agent.Options{
		OnFenceTransition: r.fence.Add,
		ResetHost:         func() error { r.t.Error("fencing escalated to a host reset"); return nil },
	})
}

// cleanup deletes the servers and volumes and restores node1.
func (r *rig) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h := r.h
	_, _ = h.Ctl(ctx, "start", "cinder-api")
	// node1's nova-compute must run before the deletes: a just-stopped
	// compute still looks up for 60 s, and Nova would send it the delete
	if err := r.restoreNode1(ctx); err != nil {
		r.t.Errorf("cleanup: restore node1: %v", err)
	}
	ids := append(r.node1(), r.foreign)
	ids = slices.DeleteFunc(ids, func(s string) bool { return s == "" })
	if err := h.DeleteServers(ctx, ids...); err != nil {
		r.t.Errorf("cleanup: %v", err)
	}
	if err := h.DeleteVolumes(ctx, r.vols...); err != nil {
		r.t.Errorf("cleanup: %v", err)
	}
}

// powerOff cuts node1's agent from NATS (it fences: every domain paused)
// and stops node1's nova-compute at the same moment; once fenced, the
// agent process stops too. It returns the moment of the cut.
func (r *rig) powerOff() time.Time {
	t := r.t
	r.link.Blackhole(true)
	cut := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- r.h.StopCompute(r.ctx, "node1") }()
	fenced := r.fence.Wait(t, fencing.StateFenced, cut, time.Minute)
	t.Logf("NATS cut → node1 fenced (domains paused) in %.2f s", fenced.Sub(cut).Seconds())
	e2ekit.ExpectStates(t, e2ekit.LibvirtConn(t), "paused", r.node1()...)
	if err := r.agent(); err != nil {
		t.Logf("agent stopped: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	return cut
}

// waitOnNode2 polls Nova every 250 ms until every id is ACTIVE on node2
// with no task, and returns when each first was.
func (r *rig) waitOnNode2(ids []string, timeout time.Duration) map[string]time.Time {
	t := r.t
	at := map[string]time.Time{}
	deadline := time.Now().Add(timeout)
	for len(at) < len(ids) {
		for _, id := range ids {
			if _, ok := at[id]; ok {
				continue
			}
			s, err := r.h.GetServer(r.ctx, id)
			if err == nil && s.Status == "ACTIVE" && s.Host == "node2" && s.TaskState == "" {
				at[id] = time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d servers ACTIVE on node2 after %v; events:%s", len(at), len(ids), timeout, r.evs)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return at
}

// checkVolumesOnNode2: each BFV volume has exactly one attachment, a new
// one, of its server on node2, and Nova lists it on the server; node2's
// own server's attachment is the one it had.
func (r *rig) checkVolumesOnNode2() {
	t := r.t
	for i, v := range r.vols[:2] {
		vol, err := r.h.GetVolume(r.ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if vol.Status != "in-use" || len(vol.Attachments) != 1 || vol.Attachments[0].HostName != "node2" ||
			vol.Attachments[0].ServerID != r.bfv[i] || vol.Attachments[0].AttachmentID == r.attBefore[v] {
			t.Errorf("volume %s after recovery: %+v (want one new attachment of %s on node2; node1's was %s)", v, vol, r.bfv[i], r.attBefore[v])
		}
		if nv, err := r.h.ServerVolumes(r.ctx, r.bfv[i]); err != nil || !slices.Equal(nv, []string{v}) {
			t.Errorf("Nova lists volumes %v (%v) on %s, want [%s]", nv, err, r.bfv[i], v)
		}
	}
	if r.foreignVol != "" {
		vol, err := r.h.GetVolume(r.ctx, r.foreignVol)
		if err != nil {
			t.Fatal(err)
		}
		if len(vol.Attachments) != 1 || vol.Attachments[0].AttachmentID != r.foreignAtt || vol.Attachments[0].HostName != "node2" {
			t.Errorf("node2's volume %s: %+v, want its attachment %s untouched", r.foreignVol, vol, r.foreignAtt)
		}
	}
}

// evacuations counts each server's evacuation migrations from node1 (Nova:
// one per evacuate call that landed).
func (r *rig) evacuations(ids []string) map[string]int {
	ms, err := r.h.Migrations(r.ctx, osharness.MVPaging, map[string][]string{"source_compute": {"node1"}, "migration_type": {"evacuation"}})
	if err != nil {
		r.t.Fatal(err)
	}
	n := map[string]int{}
	for _, m := range ms {
		if slices.Contains(ids, m.InstanceUUID) {
			n[m.InstanceUUID]++
		}
	}
	return n
}

// comeBack is node1's return: the agent starts (its start reconciliation
// destroys the evacuated copies), the operator releases the declaration,
// the agent rejoins healthy; the controller tries to clear forced_down,
// Nova refuses until node1's nova-compute restarted; then it is cleared.
func (r *rig) comeBack() {
	t, ctx := r.t, r.ctx
	r.link.Blackhole(false)
	start := time.Now()
	r.startAgent()
	c := e2ekit.LibvirtConn(t)
	e2ekit.WaitOff(t, c, r.node1(), time.Minute)
	st := e2ekit.ReportSince(t, r.state, start, time.Minute)
	t.Logf("node1 back: agent start → its reconciliation destroyed the stale copies: %s", st.Report.Summary())
	if !st.Report.OK() || st.Report.Destroyed != len(r.node1()) {
		t.Fatalf("start reconciliation: %s", st.Report.Summary())
	}
	r.fence.Wait(t, fencing.StateAwaitingRelease, start, time.Minute)
	rec, closeRec, err := agent.NewUnfenceReconciler(ctx, r.cfg, e2ekit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := agent.Unfence(ctx, r.cfg, e2ekit.Log(t), rec)
	closeRec()
	if err != nil {
		t.Fatalf("unfence: %v", err)
	}
	t.Logf("operator: %s", msg)
	r.fence.Wait(t, fencing.StateHealthy, start, time.Minute)
	// the controller tries to clear forced_down: Nova refuses (done
	// evacuations) until node1's nova-compute restarted
	r.evs.wait(t, "node1", "release-refused", 1, 2*time.Minute)
	if _, fd, err := r.h.ComputeState(ctx, "node1"); err != nil || !fd {
		t.Fatalf("node1 forced down %v (%v) while Nova refuses to clear it", fd, err)
	}
	r.step("restart nova-compute on node1 (turns done evacuations completed)", func() error { return r.h.StartCompute(ctx, "node1") })
	rel := waitPhase(t, ctx, r.js, "node1", 2*time.Minute, recovery.PhaseDone)
	if _, fd, err := r.h.ComputeState(ctx, "node1"); err != nil || fd {
		t.Fatalf("after the release: node1 forced down %v (%v); record %+v", fd, err, rel)
	}
	r.evs.wait(t, "node1", "released", 1, 10*time.Second)
	e2ekit.ExpectStates(t, c, "shutoff", r.node1()...)
}

// phases logs the record's time split from the cut.
func phases(t *testing.T, rec recovery.Record, cut time.Time, started time.Time) {
	type p struct {
		name string
		at   time.Time
	}
	ps := []p{{"recovery started (declaration confirmed)", started}}
	for ph, at := range rec.PhaseAt {
		ps = append(ps, p{string(ph), at})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].at.Before(ps[j].at) })
	var b strings.Builder
	for _, x := range ps {
		fmt.Fprintf(&b, "\n  +%6.2f s  %s", x.at.Sub(cut).Seconds(), x.name)
	}
	t.Logf("recovery phases from the partition:%s", b.String())
}

// TestHostRecoveryE2E: mode evacuate with the faults — cinder-api down
// when the recovery starts (the first attachment removals fail and are
// retried), two controllers with the leader SIGKILLed right after it asked
// Nova for the first evacuation (the standby finishes without evacuating
// any server twice), a node2 server's attachment never touched — then
// node1's return and release.
func TestHostRecoveryE2E(t *testing.T) {
	r := newRig(t, true)
	a := startController(t, "ctl-a", r.nsURL, r.clouds, ctlOpts{mode: recovery.ModeEvacuate, releaseRetry: 5 * time.Second})
	lead := waitLeader(t, 30*time.Second, a)
	b := startController(t, "ctl-b", r.nsURL, r.clouds, ctlOpts{mode: recovery.ModeEvacuate, releaseRetry: 5 * time.Second})
	time.Sleep(2 * time.Second) // the standby's tracker watches node1 active before the cut

	// Cinder unreachable when the recovery starts (stopped before the
	// cut: the declaration follows it within seconds, the detach phase
	// within a second of that)
	r.step("stop cinder-api (fault: Cinder unreachable mid-recovery)", func() error { _, err := r.h.Ctl(r.ctx, "stop", "cinder-api"); return err })
	cut := r.powerOff()
	r.evs.wait(t, "node1", "started", 1, 2*time.Minute)
	time.Sleep(cinderOutage)
	r.step("start cinder-api", func() error { _, err := r.h.Ctl(r.ctx, "start", "cinder-api"); return err })
	// the leader killed right after its first evacuate call
	r.evs.wait(t, "node1", "evacuate-requested", 1, 3*time.Minute)
	lead.kill()
	killed := time.Now()
	t.Logf("leader %s SIGKILLed after its first evacuation request (+%.1f s)", lead.id, killed.Sub(cut).Seconds())
	all := r.node1()
	at := r.waitOnNode2(all, recoverBound)
	if b.leader() {
		t.Logf("standby %s leads now", b.id)
	}
	rec := waitPhase(t, r.ctx, r.js, "node1", time.Minute, recovery.PhaseRecovered)
	for _, in := range rec.Instances {
		if in.Evac != recovery.Completed || in.Dest != "node2" {
			t.Errorf("instance %s: evac %s dest %q note %q", in.ID, in.Evac, in.Dest, in.Note)
		}
	}
	for id, n := range r.evacuations(all) {
		if n != 1 {
			t.Errorf("server %s evacuated %d times (want once: the standby must not repeat a completed step)", id, n)
		}
	}
	if n := len(r.evacuations(all)); n != len(all) {
		t.Errorf("%d servers with an evacuation from node1, want %d", n, len(all))
	}
	removed := r.evs.ops("node1", "attachment-removed")
	t.Logf("attachment-removed events: %d; controllers that acted: %v; events:%s", len(removed), actors(r.evs), r.evs)
	if len(actors(r.evs)) != 2 {
		t.Errorf("events from %v, want both controllers (the standby took over)", actors(r.evs))
	}
	r.checkVolumesOnNode2()
	started := r.evs.ops("node1", "started")[0].At
	phases(t, rec, cut, started)
	for _, id := range r.bfv {
		t.Logf("BFV %s ACTIVE on node2 at +%.1f s", id, at[id].Sub(cut).Seconds())
	}
	r.comeBack()
}

// actors lists the controllers that published events.
func actors(e *events) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.evs {
		if !slices.Contains(out, ev.Controller) {
			out = append(out, ev.Controller)
		}
	}
	return out
}

// TestHostRecoveryMasakariE2E: mode masakari against the real masakari-api
// and -engine (HVG_OS_MASAKARI=1 up.sh): the controller forces node1 down,
// removes node1's attachments, and hands the host to Masakari as a
// COMPUTE_HOST notification; Masakari's engine evacuates (after its
// wait_period_after_service_update: make e2e sets HVG_OS_MASAKARI_WAIT);
// the controller follows the notification to "finished".
func TestHostRecoveryMasakariE2E(t *testing.T) {
	r := newRig(t, false)
	if _, err := r.h.Masakari(); err != nil {
		t.Skipf("Masakari is not in the harness (HVG_OS_MASAKARI=1 up.sh): %v", err)
	}
	t.Cleanup(r.undoMasakari)
	// a host in maintenance (after an earlier Masakari recovery) has its
	// notifications ignored
	if err := r.h.MasakariMaintenance(r.ctx, "node1", false); err != nil {
		t.Fatal(err)
	}
	startController(t, "ctl-m", r.nsURL, r.clouds, ctlOpts{mode: recovery.ModeMasakari})
	cut := r.powerOff()
	all := r.node1()
	at := r.waitOnNode2(all, recoverBound)
	rec := waitPhase(t, r.ctx, r.js, "node1", 2*time.Minute, recovery.PhaseRecovered)
	if rec.Masakari == nil {
		t.Fatalf("no Masakari notification in the record: %+v", rec)
	}
	t.Logf("Masakari notification %+v; events:%s", *rec.Masakari, r.evs)
	// the controller follows Masakari's outcome: it must know the
	// notification it created and have seen it finished
	if rec.Masakari.ID == "" || rec.Masakari.Status != "finished" {
		t.Errorf("record's notification %+v: want its id and status finished (the one Masakari has: %s)", *rec.Masakari, masakariHostNotifications(t, r))
	}
	if n := len(r.evs.ops("node1", "attachment-removed")); n != 2 {
		t.Errorf("%d attachment-removed events, want 2 (the BFV volumes'):%s", n, r.evs)
	}
	r.checkVolumesOnNode2()
	phases(t, rec, cut, r.evs.ops("node1", "started")[0].At)
	for _, id := range all {
		t.Logf("%s ACTIVE on node2 at +%.1f s", id, at[id].Sub(cut).Seconds())
	}
}

// TestHostRecoveryLeaseBackE2E: the lease comes back during the recovery.
// cinder-api is down from the partition on, so the recovery waits in its
// attachment removals' backoff; meanwhile node1 returns, the operator
// releases the declaration and the agent renews. The controller stops the
// recovery (declaration-changed) and evacuates nothing.
func TestHostRecoveryLeaseBackE2E(t *testing.T) {
	r := newRig(t, false)
	startController(t, "ctl-l", r.nsURL, r.clouds, ctlOpts{mode: recovery.ModeEvacuate, releaseRetry: 5 * time.Second})
	r.step("stop cinder-api (the recovery stalls in its attachment removals)", func() error {
		_, err := r.h.Ctl(r.ctx, "stop", "cinder-api")
		return err
	})
	r.powerOff()
	r.evs.wait(t, "node1", "started", 1, 2*time.Minute)
	waitPhase(t, r.ctx, r.js, "node1", time.Minute, recovery.PhaseDetach)
	// node1 back and released while the recovery is in its detach phase
	r.link.Blackhole(false)
	start := time.Now()
	r.startAgent()
	r.fence.Wait(t, fencing.StateAwaitingRelease, start, time.Minute)
	rec, closeRec, err := agent.NewUnfenceReconciler(r.ctx, r.cfg, e2ekit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Unfence(r.ctx, r.cfg, e2ekit.Log(t), rec); err != nil {
		t.Fatalf("unfence: %v", err)
	}
	closeRec()
	r.fence.Wait(t, fencing.StateHealthy, start, time.Minute)
	stopped := r.evs.wait(t, "node1", "stopped", 1, time.Minute)
	t.Logf("recovery stopped: why %s: %s", stopped[0].Why, stopped[0].Reason)
	r.step("start cinder-api", func() error { _, err := r.h.Ctl(r.ctx, "start", "cinder-api"); return err })
	time.Sleep(5 * time.Second) // what a recovery that went on would do now
	if n := r.evacuations(r.node1()); len(n) != 0 {
		t.Errorf("evacuations after the lease came back: %v", n)
	}
	if evs := r.evs.ops("node1", "evacuate-requested"); len(evs) != 0 {
		t.Errorf("evacuate-requested events: %s", r.evs)
	}
	for _, v := range r.vols[:2] {
		vol, err := r.h.GetVolume(r.ctx, v)
		if err != nil || len(vol.Attachments) != 1 || vol.Attachments[0].AttachmentID != r.attBefore[v] {
			t.Errorf("volume %s: %+v (%v), want node1's attachment %s untouched", v, vol, err, r.attBefore[v])
		}
	}
}

// undoMasakari undoes what Masakari's engine leaves after a host recovery:
// the host in maintenance in its segment, node1's service disabled (with
// the COMPUTE_STATUS_DISABLED trait in placement).
func (r *rig) undoMasakari() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 409 "in-use to process notifications" until the engine finished
	// (its own waits after the evacuations)
	var err error
	for range 60 {
		if err = r.h.MasakariMaintenance(ctx, "node1", false); err == nil || !strings.Contains(err.Error(), "in-use") {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		r.t.Errorf("cleanup: %v", err)
	}
	// re-enabled only with node1 up and not forced down: Nova updates the
	// trait over RPC and skips a compute that is down
	if err := r.restoreNode1(ctx); err != nil {
		r.t.Errorf("cleanup: %v", err)
	} else if err := r.h.EnableCompute(ctx, "node1"); err != nil {
		r.t.Errorf("cleanup: %v", err)
	}
}

// restoreNode1 starts node1's nova-compute and clears forced_down.
func (r *rig) restoreNode1(ctx context.Context) error {
	if _, fd, err := r.h.ComputeState(ctx, "node1"); err == nil && fd {
		return r.h.RestoreHost(ctx, "node1")
	}
	return r.h.StartCompute(ctx, "node1")
}

// masakariHostNotifications lists Masakari's COMPUTE_HOST notifications of
// node1 (uuid, status, created_at) for a failure message.
func masakariHostNotifications(t *testing.T, r *rig) string {
	resp, err := r.h.MasakariRaw(r.ctx, "GET", "/notifications?sort_key=created_at&sort_dir=desc&limit=5", nil)
	if err != nil {
		return err.Error()
	}
	return string(resp.Body)
}

// parkStoppedComputes forces down, for this test, every other compute whose
// nova-compute the harness is not running (node3, the libvirt-driver compute
// the reboot storm of make e2e starts and stops just before this test). A
// just-stopped compute still looks up to Nova for service_down_time (60 s),
// so the scheduler may choose it as an evacuation's destination and the
// rebuild then waits on a queue nobody reads: seen in the final CI run of
// 2026-12-01 (the ephemeral server scheduled to node3 48 s after the storm
// stopped it, never ACTIVE on node2). Restored (forced_down cleared) when
// the test ends, so a later storm can use node3 again.
func (r *rig) parkStoppedComputes(ctx context.Context) {
	for _, host := range []string{"node3"} {
		if _, err := os.Stat(osharness.WorkDir() + "/run/nova-compute-" + host + ".pid"); err == nil {
			continue // running: a real destination
		}
		if _, _, err := r.h.ComputeState(ctx, host); err != nil {
			continue // no such compute in this cloud
		}
		r.step("force down "+host+" (stopped, may still look up)", func() error { return r.h.ForceDown(ctx, host, true) })
		r.t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := r.h.ForceDown(cctx, host, false); err != nil {
				r.t.Logf("clear forced_down of %s: %v", host, err)
			}
		})
	}
}
