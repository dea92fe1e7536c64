package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/libvirtx"
	"hvguard/proto"
)

// The child process: this test binary re-executed with childEnv set to a
// scenario runs the agent (test driver + the parent's NATS) with a workload,
// printing "REPORTED <seq>" for every event the agent has durably appended
// to its outbox. The parent kills it with SIGKILL. libvirt's test driver
// lives in the child's process, so the domains a restarted child must find
// are given to it (childDomainsEnv) and defined before its agent starts.
const (
	childEnv      = "HVGUARD_IT_CHILD" // scenario: childFlap, childClassify
	childNATSEnv  = "HVGUARD_IT_NATS"
	childStateEnv = "HVGUARD_IT_STATE"
	childHost     = "it-sigkill"

	// childFlap flaps one domain forever (TestSIGKILLLosesNothing).
	childFlap = "flap"
	// childClassify runs the agent with classification on against the
	// clouds file in childCloudsEnv, defines childDomainsEnv's domains
	// ("uuid,name,running|shutoff" separated by spaces) before the agent
	// starts, then destroys the domains named on stdin ("destroy <uuid>").
	childClassify   = "classify"
	childCloudsEnv  = "HVGUARD_IT_CLOUDS"
	childDomainsEnv = "HVGUARD_IT_DOMAINS"
	childClsHost    = "it-sigkill-cls"
	// childPlain runs the agent without classification, defines
	// childDomainsEnv's domains and destroys the domains named on stdin.
	childPlain     = "plain"
	childPlainHost = "it-sigkill-plain"
)

func childMain() int {
	scenario := os.Getenv(childEnv)
	cfg := agent.DefaultConfig()
	cfg.Host = childHost
	cfg.StateDir = os.Getenv(childStateEnv)
	cfg.Libvirt.URI = "test:///default"
	cfg.Lifecycle.Window = agent.Duration(testWindow)
	cfg.NATS.URLs = []string{os.Getenv(childNATSEnv)}
	cfg.Metrics.Listen = ""
	cfg.Status.Socket = ""
	if scenario == childClassify {
		cfg.Host = childClsHost
		cfg.Lifecycle.RecheckInterval = agent.Duration(100 * time.Millisecond)
		cfg.Classification.Enabled = true
		cfg.OpenStack.Cloud = "test"
		cfg.OpenStack.CloudsFile = os.Getenv(childCloudsEnv)
		cfg.OpenStack.RequestTimeout = agent.Duration(2 * time.Second)
		cfg.Classification.QueryTimeout = agent.Duration(agent.MinQueryTimeout)
	}
	if scenario == childPlain {
		cfg.Host = childPlainHost
		cfg.Lifecycle.RecheckInterval = agent.Duration(100 * time.Millisecond)
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	wl, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("test:///default"), quietLog())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child workload:", err)
		return 2
	}
	if err := childDefine(ctx, wl, os.Getenv(childDomainsEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "child define:", err)
		return 2
	}
	out := bufio.NewWriter(os.Stdout)
	reported := make(chan uint64, 1<<16)
	ready := make(chan struct{})
	done := make(chan error, 1)
	opts := agent.Options{
		Ready:    ready,
		OnReport: func(ev proto.LifecycleEvent) { reported <- ev.Seq },
	}
	listed := firstListing(&opts)
	go func() { done <- agent.Run(ctx, cfg, quietLog(), opts) }()
	go func() {
		for seq := range reported {
			fmt.Fprintf(out, "REPORTED %d\n", seq)
			if len(reported) == 0 {
				out.Flush()
			}
		}
	}()
	<-ready
	<-listed // the workload acts on domains: not before the agent knows them
	switch scenario {
	case childFlap:
		err = childFlapVictim(ctx, wl)
	case childClassify, childPlain:
		err = childObey(ctx, wl)
	default:
		err = fmt.Errorf("unknown scenario %q", scenario)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child workload:", err)
		return 2
	}
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "child agent:", err)
		return 1
	}
	return 0
}

// childDefine defines the domains of spec ("uuid,name,running|shutoff"
// separated by spaces) and starts the running ones.
func childDefine(ctx context.Context, wl *libvirtx.Conn, spec string) error {
	for _, d := range strings.Fields(spec) {
		f := strings.Split(d, ",")
		if len(f) != 3 {
			return fmt.Errorf("domain %q: want uuid,name,state", d)
		}
		if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(f[1], f[0])); err != nil {
			return err
		}
		if f[2] == "running" {
			if err := wl.Start(ctx, f[0]); err != nil {
				return err
			}
		}
	}
	return nil
}

// childFlapVictim suspends and resumes one domain until ctx ends.
func childFlapVictim(ctx context.Context, wl *libvirtx.Conn) error {
	const uuid = "7a3b9c1d-0000-4000-8000-00000000000a"
	if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML("victim", uuid)); err != nil {
		return err
	}
	_ = wl.Start(ctx, uuid)
	for ctx.Err() == nil {
		_ = wl.Suspend(ctx, uuid)
		_ = wl.Resume(ctx, uuid)
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// childObey destroys the domains the parent names on stdin until ctx ends.
func childObey(ctx context.Context, wl *libvirtx.Conn) error {
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case l := <-lines:
			uuid, ok := strings.CutPrefix(l, "destroy ")
			if !ok {
				return fmt.Errorf("unknown command %q", l)
			}
			if err := wl.Destroy(ctx, uuid); err != nil {
				return err
			}
		}
	}
}

type child struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	reported chan uint64
}

// startChild runs the agent of scenario in a child process on NATS at
// natsURL and state directory state; env adds "KEY=value" settings.
func startChild(t *testing.T, scenario, natsURL, state string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+scenario, childNATSEnv+"="+natsURL, childStateEnv+"="+state)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, reported: make(chan uint64, 1<<20)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "REPORTED "); ok {
				if n, err := strconv.ParseUint(s, 10, 64); err == nil {
					c.reported <- n
				}
			}
		}
		close(c.reported)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

// destroy has the child destroy the domain uuid.
func (c *child) destroy(t *testing.T, uuid string) {
	t.Helper()
	if _, err := fmt.Fprintf(c.stdin, "destroy %s\n", uuid); err != nil {
		t.Fatal(err)
	}
}

// kill ends the child with SIGKILL.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// waitReports collects reported seqs until n have arrived.
func (c *child) waitReports(t *testing.T, n int) []uint64 {
	t.Helper()
	var got []uint64
	timeout := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case s, ok := <-c.reported:
			if !ok {
				t.Fatalf("child exited after %d reports", len(got))
			}
			got = append(got, s)
		case <-timeout:
			t.Fatalf("child reported only %d events in 60s", len(got))
		}
	}
	return got
}

// TestSIGKILLLosesNothing: the agent is killed with SIGKILL mid-stream and
// started again on the same state directory. Every event it reported as
// appended before the kill reaches the consumer, exactly once, and the
// sequence continues without a hole.
func TestSIGKILLLosesNothing(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	state := stateDir(t)

	first := startChild(t, childFlap, ns.ClientURL(), state)
	before := first.waitReports(t, 300)
	first.kill(t)
	for s := range first.reported { // lines flushed before the kill
		before = append(before, s)
	}

	second := startChild(t, childFlap, ns.ClientURL(), state)
	after := second.waitReports(t, 100)
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("graceful stop of the second agent: %v", err)
	}
	for s := range second.reported {
		after = append(after, s)
	}
	if after[0] <= before[len(before)-1] {
		t.Fatalf("seq went backwards across the restart: last before kill %d, first after %d", before[len(before)-1], after[0])
	}

	nc := natsConn(t, ns.ClientURL())
	last := after[len(after)-1]
	c := deliverytest.Collect(t, nc, childHost, int(last), 30*time.Second)
	checkContiguous(t, c.Events)
	if c.Duplicates != 0 {
		t.Logf("%d duplicate stream messages (dropped by Msg-Id)", c.Duplicates)
	}
	have := map[uint64]bool{}
	for _, e := range c.Events {
		have[e.Seq] = true
	}
	for _, s := range append(before, after...) {
		if !have[s] {
			t.Fatalf("seq %d was reported appended by the agent but never reached the consumer", s)
		}
	}
	t.Logf("killed after %d reports (last seq %d); restarted, %d more; stream holds seq 1..%d, none missing",
		len(before), before[len(before)-1], len(after), len(c.Events))

	// The controller's fleet view (issue 12) of the stream, redelivering
	// the messages re-sent after the kill: complete, and each domain in the
	// state last reported for it.
	f := controller.NewFleet()
	lastState := map[string]string{}
	for i, e := range c.Events {
		f.Apply(time.Now(), controller.FleetEventOf(uint64(i+1), e))
		if e.DomainUUID != "" {
			lastState[e.DomainUUID] = e.State
		}
		if i%7 == 0 { // a redelivery of an earlier message
			if v := f.Apply(time.Now(), controller.FleetEventOf(uint64(i/2+1), c.Events[i/2])); v != controller.Duplicate {
				t.Fatalf("redelivered seq %d: %s, want duplicate", c.Events[i/2].Seq, v)
			}
		}
	}
	h := f.Host(childHost)
	if h.Stale {
		t.Fatalf("fleet view stale after the kill and restart: %s", h.StaleReason)
	}
	for u, st := range lastState {
		if d := h.Domains[u]; d == nil && st != "" || d != nil && d.State != st {
			t.Fatalf("fleet view of %s: %+v, last reported %q", u, d, st)
		}
	}
}
