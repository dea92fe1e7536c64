package integration

import (
	"bufio"
	"context"
	"fmt"
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
	"hvguard/libvirtx"
	"hvguard/proto"
)

// The child process: this test binary re-executed with childEnv set runs the
// agent (test driver + the parent's NATS) and a workload that flaps one
// domain forever, printing "REPORTED <seq>" for every event the agent has
// durably appended to its outbox. The parent kills it with SIGKILL.
const (
	childEnv      = "HVGUARD_IT_CHILD"
	childNATSEnv  = "HVGUARD_IT_NATS"
	childStateEnv = "HVGUARD_IT_STATE"
	childHost     = "it-sigkill"
)

func childMain() int {
	cfg := agent.DefaultConfig()
	cfg.Host = childHost
	cfg.StateDir = os.Getenv(childStateEnv)
	cfg.Libvirt.URI = "test:///default"
	cfg.Lifecycle.Window = agent.Duration(testWindow)
	cfg.NATS.URLs = []string{os.Getenv(childNATSEnv)}
	cfg.Metrics.Listen = ""
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	out := bufio.NewWriter(os.Stdout)
	reported := make(chan uint64, 1<<16)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, cfg, quietLog(), agent.Options{
			Ready:    ready,
			OnReport: func(ev proto.LifecycleEvent) { reported <- ev.Seq },
		})
	}()
	go func() {
		for seq := range reported {
			fmt.Fprintf(out, "REPORTED %d\n", seq)
			if len(reported) == 0 {
				out.Flush()
			}
		}
	}()
	<-ready
	wl, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("test:///default"), quietLog())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child workload:", err)
		return 2
	}
	const uuid = "7a3b9c1d-0000-4000-8000-00000000000a"
	if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML("victim", uuid)); err != nil {
		fmt.Fprintln(os.Stderr, "child define:", err)
		return 2
	}
	_ = wl.Start(ctx, uuid)
	for ctx.Err() == nil {
		_ = wl.Suspend(ctx, uuid)
		_ = wl.Resume(ctx, uuid)
		time.Sleep(2 * time.Millisecond)
	}
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "child agent:", err)
		return 1
	}
	return 0
}

type child struct {
	cmd      *exec.Cmd
	reported chan uint64
}

func startChild(t *testing.T, natsURL, state string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childNATSEnv+"="+natsURL, childStateEnv+"="+state)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, reported: make(chan uint64, 1<<20)}
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

	first := startChild(t, ns.ClientURL(), state)
	before := first.waitReports(t, 300)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	for s := range first.reported { // lines flushed before the kill
		before = append(before, s)
	}

	second := startChild(t, ns.ClientURL(), state)
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
}
