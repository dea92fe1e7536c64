package recovery

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestPropertyRecovery: random hosts (servers of every status, volumes
// multiattach or not, another host's attachments), random faults of every
// call (errors, timeouts whose call was lost), NoValidHost, slow
// migrations, crashes and restarts at random steps (also between a call
// and the record of its outcome), and the lease changing at random steps
// (released, renewed, withdrawn, deleted, declared again; the guard
// holding, the bucket unreadable, then back). Properties, at every call:
// a destructive call only while the lease is the recovery's declaration
// (expired, same epoch and revision, guard not holding, constants
// accepted); never another host's or a multiattach volume's attachment;
// never an evacuation of a server whose earlier evacuation is accepted or
// done; never more than max_evacuations in flight; forced_down cleared
// only once the host is back. Liveness: with the declaration standing and
// the faults over, every evacuable server ends on another host, in its
// prior status, or reported unrecoverable.
func TestPropertyRecovery(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := DefaultConfig()
		cfg.Mode = rapid.SampledFrom([]Mode{ModeEvacuate, ModeEvacuate, ModeMasakari}).Draw(rt, "mode")
		cfg.MaxEvacuations = rapid.IntRange(1, 4).Draw(rt, "max_evacuations")
		cfg.MaxAttempts = rapid.IntRange(1, 3).Draw(rt, "max_attempts")
		s := newSim(rt, cfg)
		c := s.cloud
		c.slow = rapid.IntRange(0, 3).Draw(rt, "slow")
		nsrv := rapid.IntRange(0, 6).Draw(rt, "servers")
		for i := range nsrv {
			id := fmt.Sprintf("s%d", i)
			st := rapid.SampledFrom([]string{"ACTIVE", "ACTIVE", "SHUTOFF", "ERROR", "PAUSED"}).Draw(rt, "status")
			var vols []string
			for j := range rapid.IntRange(0, 2).Draw(rt, "volumes") {
				vols = append(vols, fmt.Sprintf("v%d-%d", i, j))
			}
			c.addServer(id, st, vols...)
			for _, v := range vols {
				if rapid.Bool().Draw(rt, "multiattach") {
					c.volumes[v].Multiattach = true
				}
				if rapid.Bool().Draw(rt, "foreign") {
					c.volumes[v].Attachments = append(c.volumes[v].Attachments, AttachmentInfo{ID: "foreign-" + v, Server: "other", Host: "node3"})
				}
			}
		}
		for _, op := range []Op{OpForceDown, OpListServers, OpVolume, OpRemoveAttachment, OpEvacuate, OpMigrations, OpServer, OpHostNotification, OpClearForceDown} {
			c.fail[op] = rapid.SliceOfN(rapid.SampledFrom([]ErrKind{ErrOther, ErrRefused, ErrConflict, ErrOther}), 0, 3).Draw(rt, "faults "+string(op))
		}
		c.noValidHost = rapid.Bool().Draw(rt, "no_valid_host")
		initial := *s.leases["node1"]
		everChanged := false

		// The properties, checked right before each mutating call.
		s.beforeCall = func(st Step) {
			l, r := *s.leases["node1"], s.kv["node1"]
			switch st.Op {
			case OpForceDown, OpRemoveAttachment, OpEvacuate, OpHostNotification:
				if !l.Present || l.State != LeaseExpired || l.Epoch != r.Epoch || l.Revision != r.LeaseRevision || l.Holding || l.Refused != "" {
					rt.Fatalf("%s %s while the lease is %+v (recovery of epoch %d revision %d)", st.Op, st.Server+st.Attachment, l, r.Epoch, r.LeaseRevision)
				}
			case OpClearForceDown:
				if !back(&r, l) {
					rt.Fatalf("forced_down cleared while the host is not back: %+v", l)
				}
			}
			switch st.Op {
			case OpRemoveAttachment:
				for _, v := range c.volumes {
					for _, a := range v.Attachments {
						if a.ID == st.Attachment && (a.Host != "node1" || v.Multiattach) {
							rt.Fatalf("removing %s (host %s, multiattach %v)", a.ID, a.Host, v.Multiattach)
						}
					}
				}
			case OpEvacuate:
				for _, m := range c.migrations {
					if m.Instance == st.Server && (m.Status == "accepted" || m.Status == "done") {
						rt.Fatalf("evacuating %s again: migration %d is %s; calls %v; events %v; record %+v", st.Server, m.ID, m.Status, c.calls, s.ops(), s.kv["node1"])
					}
				}
			}
			if n := s.core.InFlight(); n > cfg.MaxEvacuations {
				rt.Fatalf("%d evacuations in flight > %d", n, cfg.MaxEvacuations)
			}
		}

		// Random schedule: steps with crashes, lease changes, time.
		for range rapid.IntRange(0, 12).Draw(rt, "episodes") {
			switch rapid.IntRange(0, 5).Draw(rt, "what") {
			case 0: // a crash after a random number of calls
				s.crashAfterCall = s.mutating + rapid.IntRange(1, 4).Draw(rt, "crash_after")
				if !s.run(rapid.IntRange(1, 40).Draw(rt, "steps")) {
					s.restart()
				}
				s.crashAfterCall = -1
			case 1: // the lease changes for good
				l := s.leases["node1"]
				everChanged = true
				switch rapid.IntRange(0, 4).Draw(rt, "change") {
				case 0:
					l.State, l.Revision = LeaseReleased, l.Revision+1
				case 1:
					l.State, l.Revision, l.AgentState = LeaseActive, l.Revision+2, AgentHealthy
				case 2:
					l.State, l.Revision = LeaseWithdrawn, l.Revision+3
				case 3:
					l.Present = false
				case 4:
					l.Epoch, l.Revision = l.Epoch+1, l.Revision+7
				}
			case 2: // a temporary refusal, lifted after some steps
				l := s.leases["node1"]
				saved := *l
				if rapid.Bool().Draw(rt, "hold") {
					l.Holding = true
				} else {
					l.Present, l.ReadErr = false, "timeout"
				}
				s.run(rapid.IntRange(1, 20).Draw(rt, "steps"))
				*l = saved
			case 3:
				s.advance(time.Duration(rapid.IntRange(0, 120).Draw(rt, "seconds")) * time.Second)
			default:
				s.run(rapid.IntRange(1, 30).Draw(rt, "steps"))
			}
		}
		// Faults over: run to the end.
		for op := range c.fail {
			c.fail[op] = nil
		}
		c.noValidHost = false
		s.run(3000)
		if everChanged {
			return
		}
		r := s.record("node1")
		if *s.leases["node1"] != initial || r.Phase != PhaseRecovered {
			rt.Fatalf("declaration standing, faults over: phase %s (%s); calls %v; events %v; record %+v", r.Phase, r.Reason, c.calls, s.ops(), r)
		}
		if cfg.Mode != ModeEvacuate {
			return
		}
		for _, in := range r.Instances {
			sv := c.servers[in.ID]
			switch in.Evac {
			case Completed:
				if sv.Host == "node1" || in.Status != "ERROR" && sv.Status != in.Status && !strings.Contains(in.Note, "was "+in.Status) {
					rt.Fatalf("%s done but %s on %s (was %s)", in.ID, sv.Status, sv.Host, in.Status)
				}
			case Unrecoverable:
			default:
				rt.Fatalf("%s left %s", in.ID, in.Evac)
			}
		}
	})
}
