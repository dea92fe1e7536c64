package controller_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	ir "hvguard/controller/instancerecovery"
)

// testCloud is Nova for the runner tests: one server, os-start makes it
// ACTIVE (fakes stay in tests; the e2e runs against the real Nova).
type testCloud struct {
	mu     sync.Mutex
	s      ir.Server
	starts atomic.Int32
	lag    time.Duration
}

func (c *testCloud) Server(ctx context.Context, id string) (ir.Server, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s, nil
}
func (c *testCloud) StopByUser(context.Context, string) (bool, error) { return false, nil }
func (c *testCloud) Start(ctx context.Context, id string) error {
	c.starts.Add(1)
	apply := func() {
		c.mu.Lock()
		c.s.VMState, c.s.PowerState, c.s.Status = "active", ir.PowerRunning, "ACTIVE"
		c.mu.Unlock()
	}
	if c.lag > 0 {
		// accepted, not visible yet (Nova's API answered 202; the
		// compute has not picked it up)
		time.AfterFunc(c.lag, apply)
	} else {
		apply()
	}
	return nil
}
func (c *testCloud) HardReboot(ctx context.Context, id string) error { return c.Start(ctx, id) }
func (c *testCloud) MasakariVM(context.Context, string, string, time.Time) (string, error) {
	return "", errors.New("no Masakari here")
}
func (c *testCloud) Refused(err error) bool { return false }

const testUUID = "8d3b8b7e-0c59-4f1e-9d5b-2f3c1f0a9e11"

func stopEvent(seq uint64, class string) controller.FleetEvent {
	return controller.FleetEvent{Host: "node3", Incarnation: 7, Seq: seq, Transition: "stopped", State: "shutoff", DomainUUID: testUUID,
		DomainName: "instance-00000001", Classification: class, ClassificationReason: "no-operation", LibvirtEvent: "STOPPED",
		LibvirtDetail: "FAILED", ObservedAt: time.Now()}
}

func startedEvent(seq uint64) controller.FleetEvent {
	return controller.FleetEvent{Host: "node3", Incarnation: 7, Seq: seq, Transition: "started", State: "running", DomainUUID: testUUID,
		DomainName: "instance-00000001", ObservedAt: time.Now()}
}

type irHarness struct {
	kv    jetstream.KeyValue
	cloud *testCloud
	leads atomic.Bool
}

func (h *irHarness) start(t *testing.T, ctx context.Context) (*controller.InstanceRecoveryRunner, chan ir.Report, func()) {
	cfg := ir.DefaultConfig()
	cfg.ID = "ctl-test"
	cfg.PollInterval = 100 * time.Millisecond
	core, err := ir.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan ir.Report, 100)
	r := &controller.InstanceRecoveryRunner{Core: core, KV: h.kv, Cloud: h.cloud, CloudTimeout: time.Second,
		MayAct: func(time.Time) bool { return h.leads.Load() }, LeaderNow: time.Now,
		OnReport: func(rep ir.Report) { reports <- rep }}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	return r, reports, func() { cancel(); <-done }
}

func newIRHarness(t *testing.T) (*irHarness, context.Context) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	_, js, ctx := deliverytest.JetStream(t, ns)
	kv, err := controller.EnsureInstanceBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	h := &irHarness{kv: kv, cloud: &testCloud{s: ir.Server{Found: true, Host: "node3", Project: "p", VMState: "stopped", PowerState: 4,
		Status: "SHUTOFF", Metadata: map[string]string{"HA_Enabled": "True"}}}}
	return h, ctx
}

func waitReport(t *testing.T, reports chan ir.Report, step ir.Step) ir.Report {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-reports:
			if r.Step == step {
				return r
			}
		case <-deadline:
			t.Fatalf("no %s report within 10 s", step)
		}
	}
}

// TestInstanceRecoveryRunner: against an embedded JetStream, a crash is
// started once and recorded; a standby writes and starts nothing.
func TestInstanceRecoveryRunner(t *testing.T) {
	h, ctx := newIRHarness(t)
	// standby first
	r, reports, stop := h.start(t, ctx)
	r.Synced()
	r.Observe(stopEvent(1, "stopped-unexpectedly"), controller.Applied)
	time.Sleep(time.Second)
	if n := h.cloud.starts.Load(); n != 0 {
		t.Fatalf("standby started %d times", n)
	}
	if _, err := h.kv.Get(ctx, testUUID); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("standby wrote the record: %v", err)
	}
	// elected
	h.leads.Store(true)
	waitReport(t, reports, ir.StepActing)
	r.Observe(startedEvent(2), controller.Applied)
	rep := waitReport(t, reports, ir.StepRecovered)
	stop()
	if n := h.cloud.starts.Load(); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	e, err := h.kv.Get(ctx, testUUID)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ir.DecodeRecord(e.Value(), testUUID)
	if err != nil || len(rec.Stops) != 1 || rec.Stops[0].Outcome != ir.StepRecovered || rec.Stops[0].Stop != ir.StopKey("node3", 7, 1) {
		t.Fatalf("record %+v %v", rec, err)
	}
	t.Logf("recovered: %+v", rep)
}

// TestInstanceRecoveryRunnerRestartMidRecovery: the controller stops right
// after the start (before verifying) while Nova does not show the start
// yet (SHUTOFF, no task: exactly what the stop looked like); a new runner
// on the same bucket is fed the replayed stream and verifies the recorded
// start instead of starting again.
func TestInstanceRecoveryRunnerRestartMidRecovery(t *testing.T) {
	t.Parallel()
	h, ctx := newIRHarness(t)
	h.leads.Store(true)
	h.cloud.lag = 2 * time.Second
	r, reports, stop := h.start(t, ctx)
	r.Synced()
	r.Observe(stopEvent(1, "stopped-unexpectedly"), controller.Applied)
	waitReport(t, reports, ir.StepActing)
	for h.cloud.starts.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	// restarted: the stream is replayed (the stop, then the start the
	// agent reported meanwhile), then the consumer is synced.
	r2, reports2, stop2 := h.start(t, ctx)
	defer stop2()
	r2.Observe(stopEvent(1, "stopped-unexpectedly"), controller.AppliedNewIncarnation)
	r2.Observe(startedEvent(2), controller.Applied)
	r2.Synced()
	rep := waitReport(t, reports2, ir.StepRecovered)
	if n := h.cloud.starts.Load(); n != 1 {
		t.Fatalf("%d starts after a restart mid-recovery, want 1", n)
	}
	t.Logf("after the restart: %+v", rep)
}
