package fencing

import (
	"slices"
	"testing"
	"time"
)

// TestReleasedWithoutSeeingDeclarationResumesNothing (reviewer R2): the
// host is cut off and fences; the controller declares it (epoch+1,
// expired), its instances are evacuated, and the declaration is released
// (the controller's Release after the evacuation, or an operator's
// --unfence elsewhere) — all while the agent is still cut off, so it never
// sees the expired record. When the link heals its renewal conflicts with
// the RELEASED record of a newer epoch: that proves a declaration happened.
// The agent must take the lease over as after a release and resume
// nothing; treating the released record as "never declared" rejoins
// normally and resumes the paused domains whose instances now run
// elsewhere.
func TestReleasedWithoutSeeingDeclarationResumesNothing(t *testing.T) {
	h := newHarness(t, testConfig(), 50, "d1")
	h.advance(10 * time.Second)
	h.take(h.a.FenceDone(h.now, "d1", nil))
	h.expectState(StateFenced)
	h.advance(60 * time.Second) // declared, evacuated, released meanwhile
	h.log = nil
	if h.renew == nil {
		h.advance(time.Second)
	}
	r := h.renew
	h.renew = nil
	h.rev += 2
	rel := LeaseRecord{Schema: 1, Host: "h0", BootID: "boot-1", Epoch: h.a.Epoch() + 1, State: LeaseReleased}
	h.take(h.a.Renewed(h.now, r.Seq, RenewResult{Outcome: RenewConflict, Revision: h.rev, Current: &rel}))
	for range 30 {
		h.advance(100 * time.Millisecond)
		if h.renew != nil {
			h.ack()
		}
		if h.recID != 0 && h.a.State() == StateRejoining {
			h.take(h.a.Reconciled(h.now, h.recID, nil))
		}
	}
	if slices.Contains(h.log, "resume d1") {
		t.Fatalf("resumed a domain of a host that was declared (a released record of epoch %d): log %v", rel.Epoch, h.log)
	}
}

// TestRestartOnReleasedResumesNothing (reviewer R2): declared and fenced
// (awaiting release), the agent is restarted (upgrade, crash) after the
// operator released the host: the new process reads the released record at
// start. It must take the lease over as after a release and resume
// nothing (the instances were rebuilt elsewhere).
func TestRestartOnReleasedResumesNothing(t *testing.T) {
	for _, knew := range []bool{true, false} {
		h := newHarness(t, testConfig(), 50, "d1")
		h.advance(10 * time.Second)
		h.take(h.a.FenceDone(h.now, "d1", nil))
		h.advance(20 * time.Second)
		if knew {
			h.declare(1)
			h.expectState(StateAwaitingRelease)
		}
		d := h.dur
		h.now = h.now.Add(time.Minute)
		h.rev += 2
		rel := LeaseRecord{Schema: 1, Host: "h0", BootID: "boot-1", Epoch: 1, State: LeaseReleased}
		a, r, err := NewAgent(testConfig(), &d, &rel, h.rev, h.now)
		if err != nil {
			t.Fatal(err)
		}
		h.a, h.renew, h.log, h.recID = a, nil, nil, 0
		h.take(r)
		a.SetMembers(members(50), DefaultGuard(50))
		h.take(a.Domains(h.now, []Domain{{UUID: "d1"}}))
		h.take(a.Tick(h.now))
		for range 30 {
			if h.renew != nil {
				h.ack()
			}
			if h.recID != 0 && a.State() == StateRejoining {
				h.take(a.Reconciled(h.now, h.recID, nil))
			}
			h.advance(100 * time.Millisecond)
		}
		if slices.Contains(h.log, "resume d1") {
			t.Fatalf("knew of the declaration %v: a restart on the released record resumed d1: %v", knew, h.log)
		}
	}
}
