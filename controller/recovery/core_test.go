package recovery

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The scenario: two BFV servers (volumes not multiattach) and one
// ephemeral on node1; one volume also carries another host's attachment
// and a multiattach data volume is shared with node3.
func scenario(s *sim) {
	c := s.cloud
	c.addServer("a-bfv", "ACTIVE", "vol-a")
	c.addServer("b-bfv", "SHUTOFF", "vol-b", "vol-shared")
	c.addServer("c-eph", "ACTIVE")
	c.volumes["vol-a"].Attachments = append(c.volumes["vol-a"].Attachments, AttachmentInfo{ID: "att-foreign", Server: "x", Host: "node3"})
	c.volumes["vol-shared"].Multiattach = true
	c.volumes["vol-shared"].Attachments = append(c.volumes["vol-shared"].Attachments, AttachmentInfo{ID: "att-shared-node3", Server: "y", Host: "node3"})
}

func TestRecoveryScenario(t *testing.T) {
	s := newSim(t, evacuateConfig())
	scenario(s)
	s.run(200)
	r := s.record("node1")
	if r.Phase != PhaseRecovered {
		t.Fatalf("phase %s (%s), want recovered; events %v", r.Phase, r.Reason, s.ops())
	}
	c := s.cloud
	want := []string{"force-down node1", "remove-attachment att-vol-a", "remove-attachment att-vol-b"}
	if got := c.calls[:3]; !slices.Equal(got, want) {
		t.Fatalf("first calls %v, want %v", got, want)
	}
	for _, id := range []string{"a-bfv", "b-bfv", "c-eph"} {
		if n := c.count("evacuate " + id); n != 1 {
			t.Errorf("%s evacuated %d times", id, n)
		}
		if h := c.servers[id].Host; h != "node2" {
			t.Errorf("%s on %s", id, h)
		}
	}
	// Prior power state kept: the stopped one stays SHUTOFF.
	if st := c.servers["b-bfv"].Status; st != "SHUTOFF" {
		t.Errorf("b-bfv %s", st)
	}
	// Another host's attachment and the multiattach volume: untouched.
	if a := c.volumes["vol-a"].Attachments; len(a) != 1 || a[0].ID != "att-foreign" {
		t.Errorf("vol-a attachments %v", a)
	}
	if a := c.volumes["vol-shared"].Attachments; len(a) != 2 {
		t.Errorf("multiattach vol-shared attachments %v", a)
	}
	if c.count("remove-attachment att-foreign")+c.count("remove-attachment att-shared") != 0 {
		t.Errorf("foreign or multiattach attachment removed: %v", c.calls)
	}
	for _, in := range r.Instances {
		if in.Evac != Completed || in.Dest != "node2" {
			t.Errorf("instance %+v", in)
		}
	}
	// The time split of the recovery: when each phase was entered.
	for _, p := range []Phase{PhaseForceDown, PhaseList, PhaseDetach, PhaseEvacuate, PhaseRecovered} {
		if r.PhaseAt[p].IsZero() {
			t.Errorf("no time for phase %s: %v", p, r.PhaseAt)
		}
	}
	// Kept forced down until the agent is back.
	s.advance(10 * time.Minute)
	s.run(50)
	if !c.forcedDown["node1"] || s.record("node1").Phase != PhaseRecovered {
		t.Fatalf("released before the host came back")
	}
	// Back but not reconciled (agent rejoining): still kept.
	s.leases["node1"].State, s.leases["node1"].Revision, s.leases["node1"].AgentState = LeaseActive, 60, "rejoining"
	s.run(50)
	if !c.forcedDown["node1"] {
		t.Fatalf("forced_down cleared before the agent reconciled")
	}
	// Reconciled, but Nova refuses until node1's nova-compute restarted.
	s.back("node1")
	s.run(50)
	r = s.record("node1")
	if r.Phase != PhaseReleasing || r.ReleaseRefused == "" || !s.hasEvent("release-refused") || !c.forcedDown["node1"] {
		t.Fatalf("after a refused release: %+v; events %v", r, s.ops())
	}
	if !strings.Contains(r.Reason, "restart nova-compute on node1") {
		t.Errorf("the operator is not told what to do: %q", r.Reason)
	}
	c.computeRestarted = true
	s.advance(DefaultReleaseRetry)
	s.run(50)
	if r = s.record("node1"); r.Phase != PhaseDone || c.forcedDown["node1"] {
		t.Fatalf("not released: %+v", r)
	}
	for _, op := range []string{"started", "forced-down", "listed", "attachment-removed", "detached", "evacuate-requested", "evacuated", "recovered", "release-refused", "released"} {
		if !s.hasEvent(op) {
			t.Errorf("no %s event: %v", op, s.ops())
		}
	}
}

// Every refusal of Confirm: no recovery starts, nothing is called.
func TestNeverStartsWithoutConfirmedDeclaration(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Lease)
		why  Why
	}{
		{"not declared (active, renewing)", func(l *Lease) { l.State = LeaseActive }, WhyNotDeclared},
		{"released", func(l *Lease) { l.State = LeaseReleased }, WhyNotDeclared},
		{"withdrawn", func(l *Lease) { l.State = LeaseWithdrawn }, WhyWithdrawn},
		{"key deleted", func(l *Lease) { l.Present = false }, WhyNotConfirmed},
		{"read failed", func(l *Lease) { l.Present, l.ReadErr = false, "nats: timeout" }, WhyNotConfirmed},
		{"backstop not accepted", func(l *Lease) { l.Refused = "backstop reset needs a live agent" }, WhyBackstop},
		{"guard holding", func(l *Lease) { l.Holding = true }, WhyGuardHolding},
		{"agent's own declaration", func(l *Lease) { l.Reason = "" }, WhyNotController},
		{"silence not seen by this controller", func(l *Lease) { l.SilentFor = 3 * time.Second }, WhySilenceNotSeen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, evacuateConfig())
			scenario(s)
			tc.mod(s.leases["node1"])
			// Start is only asked for expired leases by the runner;
			// ask it anyway for every case.
			st := s.core.Start(s.now, s.wall, *s.leases["node1"], "ctl-a term 3")
			if st.Op == OpWrite {
				t.Fatalf("a recovery started: %+v", st.Record)
			}
			if len(st.Events) != 1 || st.Events[0].Why != tc.why || st.Events[0].Op != "refused" {
				t.Fatalf("events %+v, want one refused %s", st.Events, tc.why)
			}
			if !strings.Contains(s.core.Why("node1"), string(tc.why)) {
				t.Errorf("status reason %q", s.core.Why("node1"))
			}
			s.run(100)
			if len(s.cloud.calls) != 0 || len(s.kv) != 0 {
				t.Fatalf("calls %v, records %v", s.cloud.calls, s.kv)
			}
		})
	}
}

// A fresh read right before each destructive call: any change of the
// declaration stops the recovery's destructive steps for good; a hold or a
// failed read pauses them.
func TestGateBeforeEveryDestructiveCall(t *testing.T) {
	changes := []struct {
		name      string
		mod       func(*Lease)
		temporary bool
	}{
		{"released by an operator", func(l *Lease) { l.State, l.Revision = LeaseReleased, l.Revision+1 }, false},
		{"renewed (lease back)", func(l *Lease) { l.State, l.Revision, l.AgentState = LeaseActive, l.Revision+2, AgentHealthy }, false},
		{"withdrawn", func(l *Lease) { l.State, l.Revision = LeaseWithdrawn, l.Revision+3 }, false},
		{"key deleted", func(l *Lease) { l.Present = false }, false},
		{"declared again (new epoch)", func(l *Lease) { l.Epoch, l.Revision = l.Epoch+1, l.Revision+9 }, false},
		{"backstop no longer accepted", func(l *Lease) { l.Refused = "backstop reset" }, false},
		{"guard holds", func(l *Lease) { l.Holding = true }, true},
		{"lease bucket unreadable", func(l *Lease) { l.Present, l.ReadErr = false, "timeout" }, true},
	}
	// The destructive calls of a recovery, in order: 1 force-down, 2-3
	// attachment removals, 4-6 evacuations. The change lands right before
	// call number at (after the previous one, or after the start).
	for _, ch := range changes {
		for at := 1; at <= 6; at++ {
			t.Run(ch.name+"/before call "+string(rune('0'+at)), func(t *testing.T) {
				s := newSim(t, evacuateConfig())
				scenario(s)
				saved := *s.leases["node1"]
				change := func() { ch.mod(s.leases["node1"]) }
				if at == 1 {
					s.afterWrite = func(n int) {
						if n == 1 {
							change()
						}
					}
				} else {
					s.afterCall = func(n int) {
						if n == at-1 {
							change()
						}
					}
				}
				s.run(300)
				if ch.temporary {
					if s.callsAt["paused"] != at-1 || s.record("node1").Phase == PhaseStopped {
						t.Fatalf("paused after %d calls (want %d): %v; events %v", s.callsAt["paused"], at-1, s.cloud.calls, s.ops())
					}
					*s.leases["node1"] = saved
					s.run(300)
					if r := s.record("node1"); r.Phase != PhaseRecovered {
						t.Fatalf("after the pause: %s %s", r.Phase, r.Reason)
					}
					return
				}
				n, ok := s.callsAt["stopped"]
				if ch.name == "declared again (new epoch)" {
					// A new declaration supersedes the recovery (a new
					// one starts for it, confirmed like any other).
					n, ok = s.callsAt["superseded"]
				}
				if !ok || n != at-1 {
					t.Fatalf("stopped after %d calls (%v), want %d: %v; events %v", n, ok, at-1, s.cloud.calls, s.ops())
				}
				if r := s.record("node1"); r.Epoch == saved.Epoch && r.Phase != PhaseStopped && r.Phase != PhaseDone && r.Phase != PhaseReleasing {
					t.Fatalf("phase %s (%s)", r.Phase, r.Reason)
				}
			})
		}
	}
}

// A restart (or a new leader) after every mutating call, before its
// outcome was recorded: the recovery completes and no completed step is
// repeated — every server is evacuated exactly once.
func TestResumeAfterCrashAtEveryCall(t *testing.T) {
	for crash := 1; crash <= 6; crash++ {
		t.Run("crash after call "+string(rune('0'+crash)), func(t *testing.T) {
			s := newSim(t, evacuateConfig())
			scenario(s)
			s.crashAfterCall = crash
			if s.run(300) {
				t.Fatalf("never reached call %d: %v", crash, s.cloud.calls)
			}
			s.restart()
			s.crashAfterCall = -1
			s.advance(time.Second)
			s.run(400)
			r := s.record("node1")
			if r.Phase != PhaseRecovered {
				t.Fatalf("phase %s (%s); calls %v", r.Phase, r.Reason, s.cloud.calls)
			}
			for _, id := range []string{"a-bfv", "b-bfv", "c-eph"} {
				// Every evacuate call counts, also one Nova refuses.
				if n := s.cloud.count("evacuate-call " + id); n != 1 {
					t.Errorf("%s: %d evacuate calls: %v", id, n, s.cloud.calls)
				}
			}
			for _, a := range []string{"att-vol-a", "att-vol-b"} {
				if n := s.cloud.count("remove-attachment " + a); n > 2 {
					t.Errorf("%s removed %d times", a, n)
				}
			}
		})
	}
}

// A restart at every write: the records alone carry the recovery.
func TestResumeAfterRestartAtEveryWrite(t *testing.T) {
	ref := newSim(t, evacuateConfig())
	scenario(ref)
	ref.run(300)
	total := ref.writes
	for k := 1; k < total; k++ {
		s := newSim(t, evacuateConfig())
		scenario(s)
		for s.writes < k {
			s.run(1)
		}
		s.restart()
		s.run(400)
		if r := s.record("node1"); r.Phase != PhaseRecovered {
			t.Fatalf("restart after write %d: phase %s (%s)", k, r.Phase, r.Reason)
		}
		for _, id := range []string{"a-bfv", "b-bfv", "c-eph"} {
			if n := s.cloud.count("evacuate " + id); n != 1 {
				t.Errorf("restart after write %d: %s evacuated %d times", k, id, n)
			}
		}
	}
}

// An evacuation call that timed out (outcome unknown, here lost): it is
// issued again only after IntentSettle with no migration; one that landed
// is followed, never repeated.
func TestEvacuationUnknownOutcome(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "ACTIVE")
	s.cloud.fail[OpEvacuate] = []ErrKind{ErrOther}
	s.run(300)
	if n := s.cloud.count("evacuate a"); n != 1 {
		t.Fatalf("evacuated %d times: %v", n, s.cloud.calls)
	}
	if !s.hasEvent("evacuate-unknown") {
		t.Errorf("events %v", s.ops())
	}
	if r := s.record("node1"); r.Phase != PhaseRecovered || r.Instances[0].Attempts != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestConcurrencyCaps(t *testing.T) {
	cfg := evacuateConfig()
	cfg.MaxEvacuations, cfg.MaxHosts = 3, 1
	s := newSim(t, cfg)
	for i := 0; i < 10; i++ {
		s.cloud.addServer(string(rune('a'+i)), "ACTIVE")
	}
	s.cloud.slow = 3
	s.leases["node9"] = declaredLease("node9")
	s.cloud.servers["z"] = &Server{ID: "z", Status: "ACTIVE", Host: "node9"}
	startedNode9 := false
	s.beforeCall = func(st Step) {
		if r, ok := s.kv["node1"]; ok && r.Phase.active() && st.Host == "node9" {
			startedNode9 = true
		}
	}
	s.run(500)
	if s.maxInFlight > 3 || s.maxInFlight < 2 {
		t.Fatalf("max in flight %d, want ≤ 3 (and the cap used)", s.maxInFlight)
	}
	if startedNode9 {
		t.Fatalf("node9 recovered while node1 was (max_hosts 1)")
	}
	if !s.hasEvent("queued") {
		t.Errorf("no queued event: %v", s.ops())
	}
	for _, h := range []string{"node1", "node9"} {
		if r := s.record(h); r.Phase != PhaseRecovered {
			t.Errorf("%s %s", h, r.Phase)
		}
	}
}

// NoValidHost: the migration ends in error with no destination, the server
// stays on the source; retried with backoff, then reported unrecoverable.
func TestNoValidHostRetriedThenReported(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "ACTIVE")
	s.cloud.noValidHost = true
	var evacAt []time.Time
	s.beforeCall = func(st Step) {
		if st.Op == OpEvacuate {
			evacAt = append(evacAt, s.now)
		}
	}
	s.run(500)
	r := s.record("node1")
	in := r.Instances[0]
	if r.Phase != PhaseRecovered || in.Evac != Unrecoverable || in.Attempts != DefaultMaxAttempts {
		t.Fatalf("%+v", r)
	}
	if !strings.Contains(in.Note, "NoValidHost") || !strings.Contains(r.Reason, "NOT RECOVERED") {
		t.Errorf("note %q reason %q", in.Note, r.Reason)
	}
	if s.cloud.servers["a"].Host != "node1" {
		t.Errorf("moved")
	}
	if len(evacAt) != 3 {
		t.Fatalf("%d evacuations", len(evacAt))
	}
	if g1, g2 := evacAt[1].Sub(evacAt[0]), evacAt[2].Sub(evacAt[1]); g1 < DefaultRetryBase || g2 < 2*DefaultRetryBase {
		t.Errorf("backoff %s, %s; want ≥ %s, ≥ %s", g1, g2, DefaultRetryBase, 2*DefaultRetryBase)
	}
	if !s.hasEvent("unrecoverable") || !s.hasEvent("evacuation-failed") {
		t.Errorf("events %v", s.ops())
	}
}

// Transient Cinder and Nova errors are retried; nothing is skipped.
func TestTransientErrorsRetried(t *testing.T) {
	s := newSim(t, evacuateConfig())
	scenario(s)
	s.cloud.fail[OpForceDown] = []ErrKind{ErrOther}
	s.cloud.fail[OpVolume] = []ErrKind{ErrOther, ErrOther}
	s.cloud.fail[OpRemoveAttachment] = []ErrKind{ErrRefused}
	s.cloud.fail[OpListServers] = []ErrKind{ErrOther}
	s.cloud.fail[OpMigrations] = []ErrKind{ErrOther}
	s.run(500)
	r := s.record("node1")
	if r.Phase != PhaseRecovered || len(r.Unrecoverable()) != 0 {
		t.Fatalf("%s %s", r.Phase, r.Reason)
	}
	if a := s.cloud.volumes["vol-a"].Attachments; len(a) != 1 || a[0].ID != "att-foreign" {
		t.Fatalf("vol-a %v", a)
	}
	if a := s.cloud.volumes["vol-b"].Attachments; len(a) != 0 {
		t.Fatalf("vol-b %v", a)
	}
}

func TestStatusesNovaCannotEvacuate(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("p", "PAUSED")
	s.cloud.addServer("e", "ERROR")
	s.run(300)
	r := s.record("node1")
	got := map[string]Progress{}
	for _, in := range r.Instances {
		got[in.ID] = in.Evac
	}
	if got["p"] != Unrecoverable || got["e"] != Completed || s.cloud.count("evacuate p") != 0 {
		t.Fatalf("%v %v", got, s.cloud.calls)
	}
}

func TestMasakariMode(t *testing.T) {
	cfg := evacuateConfig()
	cfg.Mode = ModeMasakari
	s := newSim(t, cfg)
	scenario(s)
	s.run(300)
	r := s.record("node1")
	if r.Phase != PhaseRecovered || r.Masakari == nil || r.Masakari.Status != "finished" {
		t.Fatalf("%+v", r)
	}
	want := []string{"force-down node1", "remove-attachment att-vol-a", "remove-attachment att-vol-b", "host-notification node1"}
	if !slices.Equal(s.cloud.calls, want) {
		t.Fatalf("calls %v, want %v", s.cloud.calls, want)
	}
	// A restart with the notification's intent recorded: Masakari's
	// duplicate (409) counts as notified.
	s2 := newSim(t, cfg)
	scenario(s2)
	s2.crashAfterCall = 4
	s2.run(300)
	s2.restart()
	s2.crashAfterCall = -1
	s2.run(300)
	if r := s2.record("node1"); r.Phase != PhaseRecovered || s2.cloud.count("host-notification") != 2 {
		t.Fatalf("%+v %v", r, s2.cloud.calls)
	}
}

func TestNotifyModeCallsNothing(t *testing.T) {
	s := newSim(t, DefaultConfig())
	scenario(s)
	s.run(100)
	if r := s.record("node1"); r.Phase != PhaseNotified || len(s.cloud.calls) != 0 || !s.hasEvent("notified") {
		t.Fatalf("%+v %v %v", r, s.cloud.calls, s.ops())
	}
	// A record of another mode (another controller's) is not continued.
	for _, p := range []Phase{PhaseForceDown, PhaseRecovered} {
		s.kv["node1"] = Record{Schema: 1, Host: "node1", NovaHost: "node1", Mode: ModeEvacuate, Epoch: 2, LeaseRevision: 41, Phase: p,
			ForceDown: Completed, StartedBy: "ctl-b"}
		s.restart()
		s.back("node1") // even a host back is not released by it
		s.run(50)
		if len(s.cloud.calls) != 0 || !s.hasEvent("mode-mismatch") {
			t.Fatalf("%s: %v %v", p, s.cloud.calls, s.ops())
		}
	}
}

func TestReleaseManual(t *testing.T) {
	cfg := evacuateConfig()
	cfg.Release = ReleaseManual
	s := newSim(t, cfg)
	s.cloud.addServer("a", "ACTIVE")
	s.run(200)
	s.back("node1")
	s.run(50)
	r := s.record("node1")
	if r.Phase != PhaseDone || !s.cloud.forcedDown["node1"] || !strings.Contains(r.Reason, "openstack compute service set --up node1") {
		t.Fatalf("%+v", r)
	}
}

// The lease comes back in the middle of the evacuations: the evacuations
// not started are not started; the host is released once reconciled.
func TestLeaseBackMidRecovery(t *testing.T) {
	cfg := evacuateConfig()
	cfg.MaxEvacuations = 1
	s := newSim(t, cfg)
	scenario(s)
	s.afterCall = func(n int) {
		if n == 4 { // force-down, two attachments, the first evacuation
			s.back("node1")
		}
	}
	s.run(300)
	r := s.record("node1")
	if s.cloud.count("evacuate-call") != 1 {
		t.Fatalf("calls %v", s.cloud.calls)
	}
	if r.Phase != PhaseReleasing && r.Phase != PhaseDone {
		t.Fatalf("phase %s (%s)", r.Phase, r.Reason)
	}
	if !s.hasEvent("stopped") {
		t.Errorf("events %v", s.ops())
	}
}

func TestDeclaredBy(t *testing.T) {
	for in, want := range map[string]string{
		"no renewal for 31s (lease_ttl 15s + grace 15.5s) (declared by controller ctl-a-1f2e3d, term 12)": "ctl-a-1f2e3d",
		"no renewal for 31s (lease_ttl 15s + grace 15.5s)":                                                "",
		"": "",
		"(declared by controller x, term 1) trailing": "",
	} {
		if got := DeclaredBy(in); got != want {
			t.Errorf("DeclaredBy(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if DefaultConfig().Mode != ModeNotify {
		t.Fatal("default mode must call nothing")
	}
	c := DefaultConfig()
	c.Mode, c.Release, c.MaxEvacuations, c.MaxHosts, c.MaxAttempts, c.RetryBase = "evac", "auto", 0, 0, 0, 0
	err := c.Validate()
	for _, f := range []string{`mode "evac"`, `release "auto"`, "max_evacuations 0", "max_hosts 0", "max_attempts 0", "retry_base"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("%v does not name %s", err, f)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	s := newSim(t, evacuateConfig())
	scenario(s)
	s.run(300)
	r := s.record("node1")
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := got.Encode()
	if string(b) != string(b2) {
		t.Fatalf("round trip differs:\n%s\n%s", b, b2)
	}
	if _, err := DecodeRecord([]byte(`{"schema":2,"host":"x","phase":"done"}`)); err == nil {
		t.Fatal("schema 2 accepted")
	}
}

// A host declared again while its previous recovery waits for the
// release: the new recovery inherits the forced-down service and releases
// it once the host is back, even when it stops before forcing it down.
func TestDeclaredAgainInheritsForcedDown(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "ACTIVE")
	s.run(200)
	l := s.leases["node1"]
	l.Epoch, l.Revision = 3, 77
	s.afterWrite = func(n int) {
		if r := s.kv["node1"]; r.Epoch == 3 && r.Phase == PhaseForceDown {
			s.back("node1") // back before the new force-down call
		}
	}
	s.run(200)
	s.cloud.computeRestarted = true
	s.run(200)
	r := s.record("node1")
	if r.Epoch != 3 || r.Phase != PhaseDone || s.cloud.forcedDown["node1"] || !s.hasEvent("superseded") {
		t.Fatalf("%+v forced down %v events %v", r, s.cloud.forcedDown, s.ops())
	}
}

// Nova answers an evacuation 409 (the server busy with something else) and
// no migration comes of it: after IntentSettle it is a failed attempt,
// retried — not followed forever (found by TestPropertyRecovery).
func TestEvacuationConflictWithoutMigrationRetried(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "ACTIVE")
	s.cloud.fail[OpEvacuate] = []ErrKind{ErrConflict}
	s.run(500)
	r := s.record("node1")
	if r.Phase != PhaseRecovered || r.Instances[0].Evac != Completed || s.cloud.count("evacuate a") != 1 || s.cloud.count("evacuate-call a") != 1 {
		t.Fatalf("%s %+v; calls %v", r.Phase, r.Instances, s.cloud.calls)
	}
}

// A stopped server whose first evacuation failed (NoValidHost: ERROR) comes
// back ACTIVE from the retry: done, and said — not waited for forever
// (found by TestPropertyRecovery).
func TestEvacuatedInAnotherStateSaid(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "SHUTOFF")
	s.cloud.noValidHost = true
	s.beforeCall = func(st Step) {
		if st.Op == OpEvacuate && len(s.cloud.migrations) == 1 {
			s.cloud.noValidHost = false
		}
	}
	s.run(500)
	r := s.record("node1")
	in := r.Instances[0]
	if r.Phase != PhaseRecovered || in.Evac != Completed || !strings.Contains(in.Note, "was SHUTOFF") || !s.hasEvent("state-differs") {
		t.Fatalf("%s %+v; events %v", r.Phase, in, s.ops())
	}
}

// A server already being evacuated when the host is listed (an earlier
// recovery's evacuation, older than this one) is followed, never evacuated
// again (found by TestPropertyRecovery).
func TestEvacuationInFlightAtListingFollowed(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("a", "ACTIVE")
	s.cloud.servers["a"].TaskState = "rebuilding"
	s.cloud.migrations = []Migration{{ID: 7, Instance: "a", Source: "node1", Status: "accepted", Type: "evacuation", Created: t0.Add(-time.Hour)}}
	s.run(500)
	r := s.record("node1")
	if r.Phase != PhaseRecovered || r.Instances[0].Evac != Completed || r.Instances[0].Migration != 7 || s.cloud.count("evacuate-call") != 0 {
		t.Fatalf("%s %+v; calls %v", r.Phase, r.Instances, s.cloud.calls)
	}
}

// Cinder unreachable for longer than max_attempts tries: the recovery waits
// (backoff) until it answers and removes the dead host's attachments before
// any evacuation — it never evacuates a volume-backed server with the
// attachment left because Cinder was down.
func TestCinderUnreachableWaitedOut(t *testing.T) {
	s := newSim(t, evacuateConfig())
	scenario(s)
	s.cloud.fail[OpVolume] = []ErrKind{ErrOther, ErrOther, ErrOther, ErrOther, ErrOther}
	s.cloud.fail[OpRemoveAttachment] = []ErrKind{ErrOther, ErrOther, ErrOther, ErrOther}
	var evacuatedWith []string
	s.beforeCall = func(st Step) {
		if st.Op == OpEvacuate && (len(s.cloud.volumes["vol-a"].Attachments) != 1 || len(s.cloud.volumes["vol-b"].Attachments) != 0) {
			evacuatedWith = append(evacuatedWith, st.Server)
		}
	}
	s.run(1000)
	r := s.record("node1")
	if r.Phase != PhaseRecovered || len(evacuatedWith) != 0 {
		t.Fatalf("%s (%s); evacuated with node1's attachments left: %v; calls %v", r.Phase, r.Reason, evacuatedWith, s.cloud.calls)
	}
	if a := s.cloud.volumes["vol-a"].Attachments; len(a) != 1 || a[0].ID != "att-foreign" {
		t.Fatalf("vol-a %v", a)
	}
}
