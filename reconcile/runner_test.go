package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/reconcile"
)

var t0 = time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)

// countingDomains counts the writes the runner makes.
type countingDomains struct {
	*libvirtx.Conn
	destroys, marks atomic.Int32
}

func (c *countingDomains) Destroy(ctx context.Context, uuid string) error {
	c.destroys.Add(1)
	return c.Conn.Destroy(ctx, uuid)
}

func (c *countingDomains) SetMetadata(ctx context.Context, uuid, ns, key, xml string) error {
	c.marks.Add(1)
	return c.Conn.SetMetadata(ctx, uuid, ns, key, xml)
}

// scenario defines six domains on node1 and a Nova that evacuated some:
//
//	1 nova, running, evacuated (done) to node2, server on node2   → destroyed
//	2 nova, running, evacuated, migrated back (server on node1)    → untouched
//	3 nova, running, no evacuation                                 → untouched
//	4 not nova, running (a record names its UUID anyway)           → untouched
//	5 nova, shut off, evacuated (completed), server on node2       → marked, already off
//	6 nova, running, evacuated, server 404                         → untouched
func scenario(t *testing.T) (*countingDomains, *fakeNova) {
	c := privateConn(t)
	define(t, c, "instance-00000001", uuidN(1), true, true)
	define(t, c, "instance-00000002", uuidN(2), true, true)
	define(t, c, "instance-00000003", uuidN(3), true, true)
	define(t, c, "not-nova", uuidN(4), false, true)
	define(t, c, "instance-00000005", uuidN(5), true, false)
	define(t, c, "instance-00000006", uuidN(6), true, true)
	at := t0.Add(-time.Hour)
	nova := &fakeNova{
		evac: map[string][]reconcile.Migration{"node1": {
			evac(11, 1, "done", "node2", at), evac(12, 2, "completed", "node2", at), evac(14, 4, "done", "node2", at),
			evac(15, 5, "completed", "node2", at), evac(16, 6, "done", "node2", at),
		}},
		servers: map[string]reconcile.ServerLookup{
			uuidN(1): {Found: true, Host: "node2", Status: "ACTIVE"},
			uuidN(2): {Found: true, Host: "node1", Status: "ACTIVE"},
			uuidN(4): {Found: true, Host: "node2", Status: "ACTIVE"},
			uuidN(5): {Found: true, Host: "node2", Status: "ACTIVE"},
		},
	}
	return &countingDomains{Conn: c}, nova
}

func TestRunnerDestroysOnlyEvacuatedElsewhere(t *testing.T) {
	doms, nova := scenario(t)
	now := t0
	r, err := reconcile.NewRunner(reconcile.RunnerConfig{Hosts: []string{"node1"}, Now: func() time.Time { return now },
		ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState}, nova, doms, quietLog())
	if err != nil {
		t.Fatal(err)
	}

	rep := r.Run(context.Background(), reconcile.TriggerStart)
	if !rep.OK() || rep.Global != reconcile.ReasonNone {
		t.Fatalf("report not OK: %s", rep.Summary())
	}
	want := map[string]struct {
		state   string
		dec     reconcile.Decision
		reason  reconcile.Reason
		outcome reconcile.Outcome
	}{
		uuidN(1): {"shutoff", reconcile.DecisionDestroy, reconcile.ReasonEvacuatedElsewhere, reconcile.OutcomeDestroyed},
		uuidN(2): {"running", reconcile.DecisionKeep, reconcile.ReasonServerOnThisHost, reconcile.OutcomeNone},
		uuidN(3): {"running", reconcile.DecisionKeep, reconcile.ReasonNoEvacuation, reconcile.OutcomeNone},
		uuidN(4): {"running", reconcile.DecisionKeep, reconcile.ReasonNotANovaInstance, reconcile.OutcomeNone},
		uuidN(5): {"shutoff", reconcile.DecisionDestroy, reconcile.ReasonEvacuatedElsewhere, reconcile.OutcomeAlreadyOff},
		uuidN(6): {"running", reconcile.DecisionSkip, reconcile.ReasonServerNotFound, reconcile.OutcomeNone},
	}
	for u, w := range want {
		d := result(t, rep, u)
		if st := stateOf(t, doms.Conn, u); st != w.state || d.Decision != w.dec || d.Reason != w.reason || d.Outcome != w.outcome {
			t.Errorf("%s: state %s %s/%s/%s, want %s %s/%s/%s", u, st, d.Decision, d.Reason, d.Outcome, w.state, w.dec, w.reason, w.outcome)
		}
	}
	if rep.Domains != 6 || rep.NovaInstances != 5 || rep.Evacuations != 5 || rep.Candidates != 4 || rep.Destroyed != 1 || rep.AlreadyOff != 1 || rep.Skipped != 1 {
		t.Fatalf("counts: %s", rep.Summary())
	}
	// Only the Nova instances with an evacuation record were asked about:
	// the four evacuated to node2 by one listing of node2, then the two not
	// found there (migrated back; deleted) one by one.
	if !slices.Equal(nova.listed, []string{"node2"}) || len(nova.asked) != 1 || !slices.Equal(nova.asked[0], []string{uuidN(2), uuidN(6)}) {
		t.Fatalf("listed %v, looked up %v", nova.listed, nova.asked)
	}
	if rep.Listings != 1 || rep.Lookups != 2 || rep.APICalls != 4 {
		t.Fatalf("listings/lookups/calls: %s", rep.Summary())
	}
	// The marks say why.
	for _, u := range []string{uuidN(1), uuidN(5)} {
		x, err := doms.Metadata(context.Background(), u, reconcile.MarkNamespace)
		if err != nil {
			t.Fatalf("%s: no mark: %v", u, err)
		}
		m, err := reconcile.ParseMark(x)
		if err != nil || m.Reason != reconcile.ReasonEvacuatedElsewhere || m.DestCompute != "node2" || m.ServerHost != "node2" || !m.At.Equal(t0) {
			t.Fatalf("%s: mark %+v %v (%s)", u, m, err, x)
		}
	}
	if _, err := doms.Metadata(context.Background(), uuidN(2), reconcile.MarkNamespace); !errors.Is(err, libvirtx.ErrNoMetadata) {
		t.Fatalf("untouched domain marked: %v", err)
	}
	// Events carry the evidence.
	evs := rep.Events()
	if len(evs) != 2 || evs[0].DomainUUID != uuidN(1) || evs[0].Evidence.MigrationID != 11 || evs[0].Evidence.DestCompute != "node2" || evs[0].Host != "node1" {
		t.Fatalf("events: %+v", evs)
	}
	if !rep.MayResume(uuidN(2)) || !rep.MayResume(uuidN(4)) || rep.MayResume(uuidN(1)) || rep.MayResume(uuidN(6)) {
		t.Fatal("MayResume wrong")
	}
	if b, err := json.Marshal(rep); err != nil || len(b) == 0 {
		t.Fatal(err)
	}
	if last, ok := r.Last(); !ok || last.Destroyed != 1 {
		t.Fatal("Last() does not hold the report")
	}
	if doms.destroys.Load() != 1 || doms.marks.Load() != 2 {
		t.Fatalf("destroys %d marks %d", doms.destroys.Load(), doms.marks.Load())
	}

	// The periodic run again: the stale domains are off and marked; they
	// are not looked up again and nothing is written.
	now = t0.Add(time.Minute)
	rep = r.Run(context.Background(), reconcile.TriggerPeriodic)
	if doms.destroys.Load() != 1 || doms.marks.Load() != 2 {
		t.Fatalf("second run wrote: destroys %d marks %d", doms.destroys.Load(), doms.marks.Load())
	}
	if !rep.OK() || rep.Destroyed != 0 || rep.AlreadyOff != 0 || rep.Candidates != 2 {
		t.Fatalf("second run: %s", rep.Summary())
	}
	for _, u := range []string{uuidN(1), uuidN(5)} {
		if d := result(t, rep, u); d.Decision != reconcile.DecisionKeep || d.Reason != reconcile.ReasonAlreadyStopped || rep.MayResume(u) {
			t.Fatalf("%s second run: %s/%s", u, d.Decision, d.Reason)
		}
	}
	// Not looked up again: only the two undecided-by-marks candidates.
	if last := nova.asked[len(nova.asked)-1]; len(last) != 2 {
		t.Fatalf("second run looked up %v", last)
	}
	// Someone starts a stale copy again: it is destroyed again.
	if err := doms.Start(context.Background(), uuidN(1)); err != nil {
		t.Fatal(err)
	}
	now = t0.Add(2 * time.Minute)
	if rep = r.Run(context.Background(), reconcile.TriggerPeriodic); rep.Destroyed != 1 || stateOf(t, doms.Conn, uuidN(1)) != "shutoff" {
		t.Fatalf("restarted stale copy: %s", rep.Summary())
	}

}

func TestRunnerReportMode(t *testing.T) {
	doms, nova := scenario(t)
	r := newRunner(t, doms.Conn, nova, reconcile.ModeReport, func() time.Time { return t0 })
	rep := r.Run(context.Background(), reconcile.TriggerStart)
	if rep.WouldDestroy != 2 || rep.Destroyed != 0 {
		t.Fatalf("report mode: %s", rep.Summary())
	}
	if st := stateOf(t, doms.Conn, uuidN(1)); st != "running" {
		t.Fatalf("report mode destroyed: %s", st)
	}
	if _, err := doms.Metadata(context.Background(), uuidN(1), reconcile.MarkNamespace); !errors.Is(err, libvirtx.ErrNoMetadata) {
		t.Fatalf("report mode marked: %v", err)
	}
	if evs := rep.Events(); len(evs) != 2 || evs[0].Outcome != reconcile.OutcomeWouldDestroy {
		t.Fatalf("events %+v", evs)
	}
}

type reasonErr struct{ r reconcile.Reason }

func (e reasonErr) Error() string                     { return "nova says " + e.r.String() }
func (e reasonErr) ReconcileReason() reconcile.Reason { return e.r }

func TestRunnerNovaFailureDestroysNothing(t *testing.T) {
	for _, c := range []struct {
		name    string
		listErr error
		getErr  error
		want    reconcile.Reason
	}{
		{"listing unreachable", errors.New("dial tcp: connection refused"), nil, reconcile.ReasonNovaUnavailable},
		{"listing partial", reasonErr{reconcile.ReasonPartialData}, nil, reconcile.ReasonPartialData},
		{"lookup fails mid-reconcile", nil, reasonErr{reconcile.ReasonNovaUnavailable}, reconcile.ReasonNovaUnavailable},
		{"lookup malformed", nil, reasonErr{reconcile.ReasonMalformedData}, reconcile.ReasonMalformedData},
		{"destination listing unreachable", nil, nil, reconcile.ReasonNovaUnavailable},
		{"destination listing too large", nil, nil, reconcile.ReasonPartialData},
	} {
		t.Run(c.name, func(t *testing.T) {
			doms, nova := scenario(t)
			nova.listErr, nova.getErr = c.listErr, c.getErr
			if c.listErr == nil && c.getErr == nil {
				nova.onErr = reasonErr{c.want}
			}
			r := newRunner(t, doms.Conn, nova, reconcile.ModeDestroy, func() time.Time { return t0 })
			rep := r.Run(context.Background(), reconcile.TriggerRejoin)
			if rep.OK() || rep.Global != c.want || rep.Destroyed+rep.AlreadyOff != 0 {
				t.Fatalf("got %s", rep.Summary())
			}
			if st := stateOf(t, doms.Conn, uuidN(1)); st != "running" {
				t.Fatalf("destroyed despite %s: %s", c.want, st)
			}
			if rep.MayResume(uuidN(3)) {
				t.Fatal("MayResume after a failed reconciliation")
			}
			if rep.RetryIn != reconcile.RetryMin || rep.ConsecutiveFailures != 1 {
				t.Fatalf("backoff: %v after %d failures", rep.RetryIn, rep.ConsecutiveFailures)
			}
			if (c.listErr != nil || nova.onErr != nil) && len(nova.asked) != 0 {
				t.Fatalf("servers looked up after a listing failed: %v", nova.asked)
			}
		})
	}
}

// TestRunnerListedServerInTransition: a candidate found on its destination
// with a task state is skipped like a looked-up one (a live migration back
// to this host may be under way); the others listed there are destroyed.
func TestRunnerListedServerInTransition(t *testing.T) {
	doms, nova := scenario(t)
	nova.servers[uuidN(1)] = reconcile.ServerLookup{Found: true, Host: "node2", Status: "MIGRATING", TaskState: "migrating"}
	r := newRunner(t, doms.Conn, nova, reconcile.ModeDestroy, func() time.Time { return t0 })
	rep := r.Run(context.Background(), reconcile.TriggerRejoin)
	if d := result(t, rep, uuidN(1)); d.Decision != reconcile.DecisionSkip || d.Reason != reconcile.ReasonServerInTransition || stateOf(t, doms.Conn, uuidN(1)) != "running" {
		t.Fatalf("in transition: %s/%s; %s", d.Decision, d.Reason, rep.Summary())
	}
	if d := result(t, rep, uuidN(5)); d.Outcome != reconcile.OutcomeAlreadyOff || rep.Listings != 1 {
		t.Fatalf("the rest of the listing: %s; %s", d.Outcome, rep.Summary())
	}
}

func TestRunnerClockBackwards(t *testing.T) {
	doms, nova := scenario(t)
	now := t0
	r := newRunner(t, doms.Conn, nova, reconcile.ModeReport, func() time.Time { return now })
	r.Run(context.Background(), reconcile.TriggerStart)
	now = t0.Add(-time.Hour)
	if rep := r.Run(context.Background(), reconcile.TriggerPeriodic); rep.Global != reconcile.ReasonClockOddity || rep.WouldDestroy != 0 {
		t.Fatalf("clock went back: %s", rep.Summary())
	}
}

func TestRunnerLibvirtDown(t *testing.T) {
	c := privateConn(t)
	nova := &fakeNova{}
	r := newRunner(t, c, nova, reconcile.ModeDestroy, func() time.Time { return t0 })
	_ = c.Close()
	rep := r.Run(context.Background(), reconcile.TriggerStart)
	if rep.Global != reconcile.ReasonLibvirtUnavailable || rep.OK() || nova.Calls() != 0 {
		t.Fatalf("libvirt down: %s (nova calls %d)", rep.Summary(), nova.Calls())
	}
}
