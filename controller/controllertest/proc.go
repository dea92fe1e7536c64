package controllertest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hvguard/controller/daemon"
)

// Proc is one real hvguard-controller process (StartProc): the HA tests
// and the failover and fleet benchmarks kill -9, SIGSTOP and SIGTERM it.
type Proc struct {
	ID, Addr string
	Cmd      *exec.Cmd
	// Exited is closed once the process has exited and its stderr is read.
	Exited chan struct{}

	mu  sync.Mutex
	log []string
}

// endpointRE finds the endpoint's address (metrics.listen port 0: chosen
// by the kernel) in the controller's JSON log.
var endpointRE = regexp.MustCompile(`"msg":"status and metrics endpoint listening".*"addr":"([0-9.:]+)"`)

// StartProc starts exe (env added to the test's environment) with
// `--config` of a file holding cfgYAML, which must set id: id, a JSON log
// and metrics.listen (port 0 is fine). It keeps the process's stderr (its
// log; echoed to the test's stderr with HVGUARD_TEST_LOG set), waits for
// the endpoint's address in it, and kills the process when the test ends.
func StartProc(t testing.TB, exe string, env []string, id, cfgYAML string) *Proc {
	t.Helper()
	p := filepath.Join(t.TempDir(), id+".yaml")
	if err := os.WriteFile(p, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Proc{ID: id, Exited: make(chan struct{})}
	c.Cmd = exec.Command(exe, "--config", p)
	c.Cmd.Env = append(os.Environ(), env...)
	stderr, err := c.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	echo := os.Getenv("HVGUARD_TEST_LOG") != ""
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.log = append(c.log, sc.Text())
			c.mu.Unlock()
			if echo {
				fmt.Fprintln(os.Stderr, id, sc.Text())
			}
		}
		_ = c.Cmd.Wait()
		close(c.Exited)
	}()
	t.Cleanup(func() {
		_ = c.Cmd.Process.Signal(syscall.SIGCONT)
		_ = c.Cmd.Process.Kill()
		<-c.Exited
	})
	for end := time.Now().Add(10 * time.Second); c.Addr == "" && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		for _, l := range c.log {
			if m := endpointRE.FindStringSubmatch(l); m != nil {
				c.Addr = m[1]
			}
		}
		c.mu.Unlock()
	}
	if c.Addr == "" {
		t.Fatalf("%s: no endpoint address in its log", id)
	}
	return c
}

// Status reads the process's /status (500 ms timeout).
func (c *Proc) Status() (daemon.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return daemon.FetchStatus(ctx, c.Addr, "")
}

// Role returns the process's role from its /status ("leader", "standby"),
// or "unreachable".
func (c *Proc) Role() string {
	st, err := c.Status()
	if err != nil {
		return "unreachable"
	}
	return st.Role
}

// Logged counts the process's log lines containing every one of subs.
func (c *Proc) Logged(subs ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
line:
	for _, l := range c.log {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue line
			}
		}
		n++
	}
	return n
}

// WaitRole polls c's /status every 10 ms until it reports role and returns
// how long that took; the test fails after within.
func WaitRole(t testing.TB, c *Proc, role string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if c.Role() == role {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s not %s within %s", c.ID, role, within)
	return 0
}
