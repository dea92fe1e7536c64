package recovery

import (
	"testing"
	"time"
)

// Attack (reviewer X1): the core evacuates a server only while it is on
// the declared host. An evacuation's rebuild that fails on the
// destination leaves the server there (host node2, ERROR, migration
// failed); the core counts a failed attempt and, after the backoff,
// evacuates the server again — from node2, whose lease nobody declared.
// Nova accepts it whenever node2's nova-compute looks down (crashed,
// restarting, its service heartbeat late): node2's guests may run, and
// this one gets a second copy. The same happens when the server is found
// in ERROR on another host after a done migration.
func TestAttackNeverEvacuatesFromAnotherHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		// migStatus: the status the evacuation's migration ends in
		// (the server on node2, ERROR).
		migStatus string
	}{
		{"rebuild failed on the destination", "failed"},
		{"migration done, server ERROR on the destination", "done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, evacuateConfig())
			s.cloud.addServer("x", "ACTIVE")
			s.afterCall = func(int) {
				for i := range s.cloud.migrations {
					m := &s.cloud.migrations[i]
					if m.Status != "accepted" {
						continue
					}
					// The rebuild on node2 fails after Nova moved the
					// server there (instance.host = node2).
					m.Status, m.Dest = tc.migStatus, "node2"
					sv := s.cloud.servers[m.Instance]
					sv.Host, sv.Status, sv.TaskState = "node2", "ERROR", ""
				}
			}
			// node2's nova-compute looks down to Nova (its agent is
			// healthy, its lease renewed: nothing declared it).
			s.cloud.forcedDown["node2"] = true
			s.beforeCall = func(st Step) {
				if st.Op != OpEvacuate {
					return
				}
				if h := s.cloud.servers[st.Server].Host; h != "node1" {
					t.Errorf("evacuation of %s called while it is on %s, not the declared node1 (calls %v)", st.Server, h, s.cloud.calls)
				}
			}
			s.run(500)
			if n := s.cloud.count("evacuate x"); n > 1 {
				t.Errorf("x evacuated %d times: %v", n, s.cloud.calls)
			}
		})
	}
}

// Attack (reviewer X1): Nova's and Cinder's host names compare without
// case (MariaDB): nova.conf says host = NODE1, the lease host (and
// nova_hosts) say node1. Nova lists NODE1's servers for node1 (the
// adapter accepts them: EqualFold), but the core drops every server whose
// host is not byte-equal: "0 of 0 instances recovered", the host's
// servers stay on the dead host, and the status says recovered. (The
// same comparison decides, after a done migration, whether the server
// is still on the source: byte-equal there would call a server still on
// NODE1 evacuated.)
func TestAttackHostNameCase(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("x", "ACTIVE", "vol-x")
	s.cloud.addServer("y", "ACTIVE")
	for _, sv := range s.cloud.servers {
		sv.Host = "NODE1"
	}
	s.cloud.volumes["vol-x"].Attachments[0].Host = "NODE1"
	s.run(300)
	r := s.record("node1")
	if len(r.Instances) != 2 {
		t.Fatalf("%d instances listed, want 2 (Nova listed NODE1's for node1): %s", len(r.Instances), r.Reason)
	}
	for _, id := range []string{"x", "y"} {
		if n := s.cloud.count("evacuate " + id); n != 1 {
			t.Errorf("%s evacuated %d times: %v", id, n, s.cloud.calls)
		}
	}
	if s.cloud.count("remove-attachment att-vol-x") != 1 {
		t.Errorf("NODE1's attachment not removed: %v", s.cloud.calls)
	}
}

// Attack (reviewer X1): nova_hosts mapped node1 to the wrong nova-compute
// host (nodex, alive, its own agent renewing). The recovery forced nodex
// down; the operator sees it, fixes the mapping and restarts the
// controller. The new process resumes from the record, which keeps the
// old NovaHost: it goes on with nodex — lists, detaches and evacuates the
// servers of a host nobody declared. A record whose nova-compute host is
// not the configuration's for its lease host must not be continued.
func TestAttackResumeWithChangedNovaHost(t *testing.T) {
	cfg := evacuateConfig()
	cfg.NovaHosts = map[string]string{"node1": "nodex"} // the typo
	s := newSim(t, cfg)
	s.cloud.addServer("dead-1", "ACTIVE")
	s.cloud.addServer("live-1", "ACTIVE", "vol-live")
	s.cloud.servers["live-1"].Host = "nodex"
	s.cloud.volumes["vol-live"].Attachments[0].Host = "nodex"
	s.crashAfterCall = 1 // forced nodex down, then the controller is stopped
	if s.run(100) {
		t.Fatalf("no call made: %v", s.cloud.calls)
	}
	if s.cloud.calls[0] != "force-down nodex" {
		t.Fatalf("calls %v", s.cloud.calls)
	}
	fixed := evacuateConfig() // node1 is node1 in Nova
	s.cfg = fixed
	s.restart()
	s.crashAfterCall = -1
	before := len(s.cloud.calls)
	s.run(300)
	for _, c := range s.cloud.calls[before:] {
		if c == "evacuate live-1" || c == "remove-attachment att-vol-live" {
			t.Fatalf("after the mapping was fixed, the recovery of node1 went on with nodex: %v", s.cloud.calls)
		}
	}
}

// Attack (reviewer X1): a recovery stopped with evacuations in flight (the
// lease came back) keeps them Requested in its record for ever — Stopped,
// then Done after the release — and InFlight counts every record's, so
// they hold max_evacuations' budget for good: once a stopped recovery
// held max_evacuations of them (they are issued back to back), no other
// host's instance is ever evacuated ("evacuating: 8 in flight").
func TestAttackStoppedRecoveryHoldsEvacuationBudget(t *testing.T) {
	cfg := evacuateConfig()
	cfg.MaxEvacuations = 1
	s := newSim(t, cfg)
	s.cloud.addServer("a", "ACTIVE")
	s.cloud.slow = 1 << 30 // node1's evacuation stays accepted
	s.afterCall = func(int) {
		if s.cloud.count("evacuate a") == 1 && s.leases["node1"].State == LeaseExpired {
			s.back("node1") // the lease comes back mid-recovery
		}
	}
	s.run(200)
	if r := s.record("node1"); r.Phase != PhaseStopped && r.Phase != PhaseReleasing && r.Phase != PhaseDone {
		t.Fatalf("node1 %s: %s", r.Phase, r.Reason)
	}
	// Later, node3 is declared.
	s.cloud.slow = 0
	s.cloud.addServer("b", "ACTIVE")
	s.cloud.servers["b"].Host = "node3"
	l := declaredLease("node3")
	l.Revision = 90
	s.leases["node3"] = l
	s.run(500)
	if n := s.cloud.count("evacuate b"); n != 1 {
		t.Fatalf("node3's server evacuated %d times; node3: %s (in flight %d); calls %v", n, s.record("node3").Reason, s.core.InFlight(), s.cloud.calls)
	}
}

// Attack (reviewer X1): the controller's wall clock runs 3 minutes ahead
// of Nova's (NTP broken on one side). The evacuation's migration is then
// created "before" intent − MigrationClockSkew and never matched; after
// IntentSettle the request counts as failed and is retried — an evacuate
// call for a server that Nova has already rebuilt on node2 (Nova takes
// it from node2 whenever node2's nova-compute looks down). Whatever the
// clocks, a server is evacuated once and never from another host; found
// rebuilt elsewhere, it is done.
func TestAttackClockSkewNeverReEvacuates(t *testing.T) {
	s := newSim(t, evacuateConfig())
	s.cloud.addServer("x", "ACTIVE")
	s.beforeCall = func(st Step) {
		s.cloud.wall = s.wall.Add(-3 * time.Minute) // Nova's clock
		if st.Op == OpEvacuate {
			if h := s.cloud.servers[st.Server].Host; h != "node1" {
				t.Errorf("evacuation of %s called while it is on %s (calls %v)", st.Server, h, s.cloud.calls)
			}
		}
	}
	s.run(500)
	if n := s.cloud.count("evacuate-call x"); n != 1 {
		t.Errorf("x: %d evacuate calls: %v", n, s.cloud.calls)
	}
	r := s.record("node1")
	if in := r.Instances[0]; in.Evac != Completed || in.Dest != "node2" {
		t.Errorf("x %+v, want done on node2 (%s)", in, r.Reason)
	}
}
