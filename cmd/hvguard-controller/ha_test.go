package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// mainEnv makes the test binary run main's run() instead of the tests: the
// HA tests start real controller processes (same CLI, same daemon) that
// they can kill -9 and SIGSTOP.
const mainEnv = "HVGUARD_CONTROLLER_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// leaderTiming is the lock's timing of the HA tests: ×0.1 of the defaults,
// or the defaults with HVGUARD_TEST_DEFAULT_TIMING=1 (slow; for the
// figures in docs/controller.md).
func leaderTiming() (ttl, renew, write, margin time.Duration) {
	if os.Getenv("HVGUARD_TEST_DEFAULT_TIMING") != "" {
		return controller.DefaultLeaderTTL, controller.DefaultLeaderRenew, controller.WriteTimeout, controller.DefaultActMargin
	}
	return time.Second, 250 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond
}

// startProc starts the test binary as controller id (main's run(), the
// same CLI and daemon) on url at leaderTiming, with extra YAML appended.
func startProc(t *testing.T, url, id string, extra string) *controllertest.Proc {
	t.Helper()
	ttl, renew, write, margin := leaderTiming()
	cfg := fmt.Sprintf(`id: %s
log: {level: debug, format: json}
nats: {urls: [%q], ready_timeout: 5s}
leader: {ttl: %s, renew_interval: %s, write_timeout: %s, act_margin: %s}
guard: {share: 0.5, window: 1s}
metrics: {listen: "127.0.0.1:0"}
%s`, id, url, ttl, renew, write, margin, extra)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return controllertest.StartProc(t, exe, []string{mainEnv + "=1"}, id, cfg)
}

// haBucket starts an embedded JetStream and creates the lease bucket and
// the control bucket (controller.ControlBucket: the leader lock) with a
// history of 64 values per key (the controllers open them and leave their
// configuration alone), so the tests can read every write. It returns the
// URL, the lease bucket and the control bucket.
func haBucket(t *testing.T) (string, jetstream.KeyValue, jetstream.KeyValue) {
	t.Helper()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	cfg := natslease.BucketConfig(1)
	cfg.History = 64
	kv, err := js.CreateKeyValue(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ckv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: controller.ControlBucket, History: 64})
	if err != nil {
		t.Fatal(err)
	}
	return srv.ClientURL(), kv, ckv
}

// TestKill9Leader: the leader process is killed with SIGKILL (no
// resignation): the standby leads after the lock stood still for
// TakeoverAfter(ttl), not before.
func TestKill9Leader(t *testing.T) {
	url, kv, ckv := haBucket(t)
	a := startProc(t, url, "ctl-a", "")
	controllertest.WaitRole(t, a, "leader", 10*TakeoverWait())
	b := startProc(t, url, "ctl-b", "")
	controllertest.WaitRole(t, b, "standby", 5*time.Second)
	killed := time.Now()
	_ = a.Cmd.Process.Kill()
	<-a.Exited
	d := controllertest.WaitRole(t, b, "leader", 3*TakeoverWait())
	ttl, renew, write, _ := leaderTiming()
	t.Logf("kill -9 of the leader → standby leading after %s (TakeoverAfter(ttl) %s)", time.Since(killed), controller.TakeoverAfter(ttl, controller.DefaultDrift))
	if min := controller.TakeoverAfter(ttl, controller.DefaultDrift) - renew - write; d < min {
		t.Fatalf("took over %s after the kill: before the old lock could have lapsed (%s)", d, min)
	}
	// The controllers opened the existing bucket and left its
	// configuration alone.
	for _, b := range []jetstream.KeyValue{kv, ckv} {
		if st, err := b.Status(context.Background()); err != nil || st.History() != 64 {
			t.Fatalf("the %s bucket's history is %v (err %v), want the 64 it was created with", b.Bucket(), st.History(), err)
		}
	}
}

// notActingHN are the parts of the debug line a controller logs when it
// decided to declare hn and MayAct said no.
var notActingHN = []string{`"msg":"not acting: declare not written"`, `"host":"hn"`}

// TakeoverWait is TakeoverAfter of the tests' TTL.
func TakeoverWait() time.Duration {
	ttl, _, _, _ := leaderTiming()
	return controller.TakeoverAfter(ttl, controller.DefaultDrift)
}

// TestSIGSTOPLeaderPastTTL: the leader (configured to accept hosts without
// a backstop) is frozen with SIGSTOP just as such a host stops renewing;
// the standby (which refuses such hosts) takes over and never declares
// it. Resumed after the host became due and its lock lapsed, the old
// leader's tracker decides to declare the host — and writes nothing: the
// host's key history has no expired record and the lock's history has no
// record of the old leader after the new one's first.
func TestSIGSTOPLeaderPastTTL(t *testing.T) {
	url, kv, ckv := haBucket(t)
	st := &natslease.Store{KV: kv}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	hn := controllertest.HostRecord("hn")
	hn.Backstop = fencing.BackstopNone
	stopHN := controllertest.RenewRecord(ctx, st, hn)

	a := startProc(t, url, "ctl-a", "tracker: {accept_no_backstop: true}\n")
	controllertest.WaitRole(t, a, "leader", 10*TakeoverWait())
	b := startProc(t, url, "ctl-b", "")
	controllertest.WaitRole(t, b, "standby", 5*time.Second)
	time.Sleep(500 * time.Millisecond) // b's tracker has seen hn renew

	stopHN()
	_ = a.Cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	d := controllertest.WaitRole(t, b, "leader", 3*TakeoverWait())
	t.Logf("SIGSTOP of the leader → standby leading after %s", d)
	grace, err := controller.Config{Drift: 0.01, MaxHostDrift: 0.05, MaxGrace: time.Minute, AcceptNoBackstop: true, GuardWindow: time.Minute}.Grace(hn)
	if err != nil {
		t.Fatal(err)
	}
	due := hn.Timing.LeaseTTL + grace
	time.Sleep(time.Until(stopped.Add(due + 2*time.Second)))
	_ = a.Cmd.Process.Signal(syscall.SIGCONT)
	resumed := time.Now()
	// The resumed process's tracker finds hn due at its next ticks and
	// may not act; its lock loop learns of the takeover.
	for time.Since(resumed) < 5*time.Second && a.Logged(notActingHN...) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	for _, r := range controllertest.Records(t, kv, "hn") {
		if r.State != fencing.LeaseActive {
			t.Fatalf("hn's history has a %s record: %s", r.State, r.Reason)
		}
	}
	locks := controllertest.CheckTakeover(t, ckv, "ctl-a", "ctl-b")
	if n := a.Logged(notActingHN...); n == 0 {
		t.Fatalf("the resumed leader never decided to declare hn (the test proves nothing)")
	}
	if a.Role() != "standby" {
		t.Fatalf("the resumed old leader reports %s", a.Role())
	}

	t.Logf("resumed leader: %d declarations of hn decided and not written; %d lock records, none of ctl-a after ctl-b's",
		a.Logged(notActingHN...), len(locks))
}

// TestSIGTERMLeaderHandsOver: SIGTERM makes the leader process resign and
// exit 0; the standby leads within TakeoverAfter(act_margin) plus a
// renewal, not a whole TTL.
func TestSIGTERMLeaderHandsOver(t *testing.T) {
	url, _, ckv := haBucket(t)
	a := startProc(t, url, "ctl-a", "")
	controllertest.WaitRole(t, a, "leader", 10*TakeoverWait())
	b := startProc(t, url, "ctl-b", "")
	controllertest.WaitRole(t, b, "standby", 5*time.Second)
	termed := time.Now()
	_ = a.Cmd.Process.Signal(syscall.SIGTERM)
	d := controllertest.WaitRole(t, b, "leader", 3*TakeoverWait())
	<-a.Exited
	if code := a.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the leader exited %d after SIGTERM", code)
	}
	_, renew, _, margin := leaderTiming()
	t.Logf("SIGTERM of the leader → standby leading after %s (TakeoverAfter(act_margin) %s)", d, controller.TakeoverAfter(margin, controller.DefaultDrift))
	if bound := controller.TakeoverAfter(margin, controller.DefaultDrift) + renew + 500*time.Millisecond; time.Since(termed) > bound+time.Second || d > bound {
		t.Fatalf("hand-over after SIGTERM took %s > %s", d, bound)
	}
	locks := controllertest.LockHistory(t, ckv)
	released := false
	for _, r := range locks {
		released = released || (r.Holder == "ctl-a" && r.Released)
	}
	if !released {
		t.Fatalf("ctl-a did not write a released lock record: %+v", locks)
	}
}
