//go:build bench

package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hvguard/libvirtx"
)

// binDirEnv names a directory holding prebuilt hvguard-agent, benchagent,
// hvguard-controller and nats-server binaries (scripts/bench.sh builds them); unset, the benchmark
// builds them once into a temp directory.
const binDirEnv = "HVG_BENCH_BIN_DIR"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries returns the directory with hvguard-agent, benchagent,
// hvguard-controller and nats-server.
func binaries(b *testing.B) string {
	b.Helper()
	buildOnce.Do(func() {
		if d := os.Getenv(binDirEnv); d != "" {
			binDir = d
			return
		}
		binDir, buildErr = os.MkdirTemp("", "hvguard-bench-bin-")
		if buildErr != nil {
			return
		}
		for _, args := range [][]string{
			{"build", "-o", filepath.Join(binDir, "hvguard-agent"), "hvguard/cmd/hvguard-agent"},
			{"build", "-tags", "bench", "-o", filepath.Join(binDir, "benchagent"), "hvguard/test/bench/cmd/benchagent"},
			{"build", "-o", filepath.Join(binDir, "hvguard-controller"), "hvguard/cmd/hvguard-controller"},
			{"build", "-o", filepath.Join(binDir, "nats-server"), "github.com/nats-io/nats-server/v2"},
		} {
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return binDir
}

// mem is a process's memory from /proc/<pid>/status, in bytes.
type mem struct {
	rss  float64 // VmRSS: resident now
	hwm  float64 // VmHWM: peak resident
	anon float64 // RssAnon: private memory (Go heap, C heap, stacks)
	file float64 // RssFile: resident pages of the binary and shared libraries
}

func (m *mem) add(o mem) { m.rss += o.rss; m.hwm += o.hwm; m.anon += o.anon; m.file += o.file }

// report reports m/n with the metric names prefix+rss_MB etc.
func (m mem) report(b *testing.B, prefix string, n int) {
	b.ReportMetric(mb(m.rss/float64(n)), prefix+"rss_MB")
	b.ReportMetric(mb(m.hwm/float64(n)), prefix+"hwm_MB")
	b.ReportMetric(mb(m.anon/float64(n)), prefix+"anon_MB")
	b.ReportMetric(mb(m.file/float64(n)), prefix+"file_MB")
}

// procMem reads pid's memory figures.
func procMem(pid int) (m mem, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, fmt.Errorf("proc status: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb * 1024
		case "VmHWM:":
			m.hwm = kb * 1024
		case "RssAnon:":
			m.anon = kb * 1024
		case "RssFile:":
			m.file = kb * 1024
		}
	}
	return m, nil
}

// procCPU returns the user+system CPU time pid has used so far, from
// /proc/<pid>/stat (clock ticks of 1/CLK_TCK s; CLK_TCK is 100 on Linux).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(data, ')')
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(ut+st) * (time.Second / 100), nil
}

// mb converts bytes to MB (10^6 bytes: the larger figure, against a 40 MB
// target).
func mb(x float64) float64 { return x / 1e6 }

// nodeXML writes a libvirt test-driver node file with n running domains
// (type 'test', 64 MiB, 1 vCPU each) and returns its path.
func nodeXML(b *testing.B, n int) string {
	b.Helper()
	var buf bytes.Buffer
	buf.WriteString("<node>\n  <cpu><mhz>2000</mhz><model>hvguard-bench</model><active>64</active><total>64</total>" +
		"<nodes>1</nodes><sockets>1</sockets><cores>64</cores><threads>1</threads></cpu>\n" +
		"  <memory>1073741824</memory>\n")
	for i := range n {
		buf.WriteString(libvirtx.TestDomainXML(fmt.Sprintf("instance-%08x", i), fmt.Sprintf("d0d0cafe-0000-4000-8000-%012d", i)))
	}
	buf.WriteString("</node>\n")
	path := filepath.Join(b.TempDir(), fmt.Sprintf("node-%d.xml", n))
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkAgentRSS measures the agent's resident memory (VmRSS; VmHWM =
// peak; split into RssAnon = private memory and RssFile = binary and shared
// library pages) on a separate process that runs no NATS server and no test
// harness; NATS JetStream and the consumer run in this (the harness)
// process. Sub-benchmarks, all in the same run:
//
//   - binary=hvguard-agent/libvirt=private-libvirtd: the production binary
//     with the production defaults (JSON info log to a file, metrics on)
//     connected like on a real node, over a socket, to a libvirtd of the
//     benchmark's own whose test driver holds 1000 running domains that the
//     harness defined. Measured after the first resync of the 1000 domains
//     reached the consumer (idle_), then after a burst of 40 000
//     suspend/resume events driven by the harness through the daemon has
//     reached the consumer (burst_; burst_hwm is the peak of the whole
//     run). This is the figure for the RSS target. burst_events/s is the
//     end-to-end rate through a real libvirtd (harness → libvirtd → agent
//     process → JetStream → consumer); agent_cpu_µs/event is the agent
//     process's user+system CPU time per burst event (from /proc/<pid>/stat)
//     and agent_events/cpu_s its inverse: what one core fully given to the
//     agent could sustain, a figure that does not depend on the machine's
//     load. Skipped without root or libvirtd.
//   - binary=hvguard-agent/libvirt=testdriver-file/domains=N: the same
//     binary on a test-driver node file (test:///path/node.xml) with N = 0
//     or 1000 running domains, no daemon. The test driver then keeps its
//     copy of the domains inside the agent's process, so this is an upper
//     bound; domains=0 is its baseline. No events can be made (the file's
//     driver is private to the process): idle only.
//   - binary=benchagent/agent=yes|no: test/bench/cmd/benchagent runs the
//     agent and a workload (1000 domains, 20 000 suspend/resume events from
//     4 goroutines) on test:///default in one process; agent=no is the same
//     binary and workload without the agent. burst_rss(yes) − burst_rss(no)
//     is what the agent adds during a burst.
//
// Run with -benchtime=1x.
func BenchmarkAgentRSS(b *testing.B) {
	b.Run("binary=hvguard-agent/libvirt=private-libvirtd", func(b *testing.B) {
		bin := binaries(b)
		uri := startPrivateLibvirtd(b)
		wl := workload(b, uri)
		doms := defineDomains(b, wl, "rss", benchDomains)
		var idle, burst mem
		var rate float64
		var cpu time.Duration
		for i := 0; i < b.N; i++ {
			r, rt, ct := runProductionAgent(b, filepath.Join(bin, "hvguard-agent"), uri, len(doms)+1, func() int {
				flap(b, wl, doms)
				return len(doms) * e2eRounds
			})
			idle.add(r[0])
			burst.add(r[1])
			rate += rt
			cpu += ct
		}
		idle.report(b, "idle_", b.N)
		burst.report(b, "burst_", b.N)
		b.ReportMetric(float64(len(doms)*e2eRounds), "burst_events")
		b.ReportMetric(rate/float64(b.N), "burst_events/s")
		// The agent process's own CPU time per event of the burst: a cost
		// that does not depend on how busy the machine is, unlike events/s.
		perEvent := cpu.Seconds() / float64(b.N*len(doms)*e2eRounds)
		b.ReportMetric(perEvent*1e6, "agent_cpu_µs/event")
		if perEvent > 0 {
			b.ReportMetric(1/perEvent, "agent_events/cpu_s")
		}
	})
	for _, n := range []int{0, benchDomains} {
		b.Run(fmt.Sprintf("binary=hvguard-agent/libvirt=testdriver-file/domains=%d", n), func(b *testing.B) {
			bin := binaries(b)
			uri := "test://" + nodeXML(b, n)
			var idle mem
			for i := 0; i < b.N; i++ {
				r, _, _ := runProductionAgent(b, filepath.Join(bin, "hvguard-agent"), uri, n, nil)
				idle.add(r[0])
			}
			idle.report(b, "idle_", b.N)
		})
	}
	for _, withAgent := range []bool{false, true} {
		name := map[bool]string{false: "no", true: "yes"}[withAgent]
		b.Run("binary=benchagent/agent="+name, func(b *testing.B) {
			bin := binaries(b)
			var idle, burst mem
			for i := 0; i < b.N; i++ {
				r := runBenchAgent(b, filepath.Join(bin, "benchagent"), withAgent)
				idle.add(r[0])
				burst.add(r[1])
			}
			idle.report(b, "idle_", b.N)
			burst.report(b, "burst_", b.N)
		})
	}
}

// runProductionAgent starts hvguard-agent on libvirt uri, waits until the
// consumer has n reports (the first resync), measures (idle), then, if
// burst is set, runs it (it returns how many reports it causes), waits for
// them at the consumer and measures again (burst).
func runProductionAgent(b *testing.B, bin, uri string, n int, burst func() int) (m [2]mem, rate float64, cpu time.Duration) {
	b.Helper()
	ns, nc := startNATS(b)
	dir := b.TempDir()
	host := fmt.Sprintf("bench-rss-%d-%d", os.Getpid(), hostCounter.Add(1))
	cfg := fmt.Sprintf(`host: %s
state_dir: %s
libvirt:
  uri: %q
nats:
  urls: [%q]
metrics:
  listen: 127.0.0.1:0
`, host, filepath.Join(dir, "state"), uri, ns.ClientURL())
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	c := consume(b, nc, host)
	if got := c.waitFor(0, n, nil, 30*time.Second); len(got) < n {
		log, _ := os.ReadFile(logf.Name())
		b.Fatalf("agent reported %d of %d domains; log:\n%s", len(got), n, log)
	}
	time.Sleep(2 * time.Second)
	if m[0], err = procMem(cmd.Process.Pid); err != nil {
		b.Fatal(err)
	}
	if burst == nil {
		return m, 0, 0
	}
	cpu0, err := procCPU(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	from := c.len()
	start := time.Now()
	want := burst()
	got := c.waitFor(from, want, nil, 10*time.Second)
	if len(got) < want {
		b.Errorf("burst: consumer got %d of %d reports", len(got), want)
	}
	if len(got) > 0 {
		rate = float64(len(got)) / got[len(got)-1].at.Sub(start).Seconds()
	}
	if m[1], err = procMem(cmd.Process.Pid); err != nil {
		b.Fatal(err)
	}
	cpu1, err := procCPU(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	return m, rate, cpu1 - cpu0
}

// runBenchAgent runs benchagent (with or without the agent) through its
// idle and burst phases and returns its memory at both.
func runBenchAgent(b *testing.B, bin string, withAgent bool) [2]mem {
	b.Helper()
	ns, nc := startNATS(b)
	host := fmt.Sprintf("bench-rss-%d-%d", os.Getpid(), hostCounter.Add(1))
	const domains, rounds = benchDomains, 20
	cmd := exec.Command(bin, fmt.Sprintf("-agent=%v", withAgent), "-nats", ns.ClientURL(),
		"-state", filepath.Join(b.TempDir(), "state"), "-host", host,
		"-domains", strconv.Itoa(domains), "-rounds", strconv.Itoa(rounds))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	lines := bufio.NewScanner(stdout)
	expect := func(prefix string) int {
		if !lines.Scan() {
			b.Fatalf("benchagent ended before %s", prefix)
		}
		s, ok := strings.CutPrefix(lines.Text(), prefix+" ")
		if !ok {
			b.Fatalf("benchagent said %q, want %s", lines.Text(), prefix)
		}
		n, _ := strconv.Atoi(s)
		return n
	}
	var c *consumer
	if withAgent {
		c = consume(b, nc, host)
	}
	var out [2]mem
	expect("IDLE")
	if out[0], err = procMem(cmd.Process.Pid); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	reports := expect("BURST")
	if withAgent {
		// Measure once what was reported has been published and consumed.
		c.waitFor(0, reports, nil, 10*time.Second)
	}
	if out[1], err = procMem(cmd.Process.Pid); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintln(stdin, "exit")
	return out
}
