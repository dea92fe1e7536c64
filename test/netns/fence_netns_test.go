// Package netns runs the real hvguard-agent binary in its own network
// namespace, connected to an embedded NATS server in the root namespace
// over a veth pair, and cuts the link with `ip link set ... down` to
// exercise self-fencing over a real (kernel) network partition.
//
// Needs root (netns, veth). Guarded by HVGUARD_NETNS=1 and
// HVGUARD_AGENT_BIN (the binary to run); test/netns/run.sh sets both.
// Addresses: 198.18.0.0/30 (RFC 2544 benchmarking range, never routed) on
// the veth pair only; nothing outside the pair is touched.
package netns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

const (
	rootAddr = "198.18.0.1"
	nsAddr   = "198.18.0.2"
	host     = "netns-h0.example.org"
)

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// setupNetns creates the namespace and the veth pair; the cleanup removes
// both. It returns the root-side link name (the one the test cuts).
func setupNetns(t *testing.T) (ns, rootLink string) {
	t.Helper()
	id := os.Getpid() % 100000
	ns = fmt.Sprintf("hvgfence%d", id)
	rootLink, nsLink := fmt.Sprintf("hvgr%d", id), fmt.Sprintf("hvgn%d", id)
	removeStaleNetns(t)
	sh(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh(t, "ip", "link", "add", rootLink, "type", "veth", "peer", "name", nsLink)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", rootLink).Run() })
	sh(t, "ip", "link", "set", nsLink, "netns", ns)
	sh(t, "ip", "addr", "add", rootAddr+"/30", "dev", rootLink)
	sh(t, "ip", "link", "set", rootLink, "up")
	sh(t, "ip", "netns", "exec", ns, "ip", "addr", "add", nsAddr+"/30", "dev", nsLink)
	sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", nsLink, "up")
	sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	return ns, rootLink
}

// staleName: this file's namespaces and root-side links (hvgfence<pid>,
// hvgr<pid>), not the controller HA test's (hvgca, hvgrhvgca…).
var staleName = regexp.MustCompile(`^hvg(fence|r)[0-9]+$`)

// removeStaleNetns deletes the namespaces and root-side links an earlier
// run left behind (a test process killed before its cleanup): they hold
// rootAddr, which every run uses, and a stale one made the next run's
// agent unable to reach NATS (seen after a CI run was killed mid-test).
func removeStaleNetns(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && staleName.MatchString(f[0]) {
				t.Logf("removing namespace %s left by an earlier run", f[0])
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if staleName.MatchString(name) {
				t.Logf("removing link %s left by an earlier run", name)
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
}

// agentRun is the agent process with its transitions parsed from its log.
type agentRun struct {
	mu    sync.Mutex
	trans []string // "state/reason"
	at    []time.Time
	log   strings.Builder
}

var transRE = regexp.MustCompile(`msg="fence state transition".* state=(\S+) from=\S+ reason=(\S+)`)

func (a *agentRun) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		a.mu.Lock()
		a.log.WriteString(line + "\n")
		if m := transRE.FindStringSubmatch(line); m != nil {
			a.trans = append(a.trans, m[1]+"/"+m[2])
			a.at = append(a.at, time.Now())
		}
		a.mu.Unlock()
	}
}

// seen returns when a transition to state (with reason, if not "") was
// logged after index from, and its index.
func (a *agentRun) seen(from int, state, reason string) (time.Time, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := from; i < len(a.trans); i++ {
		s, r, _ := strings.Cut(a.trans[i], "/")
		if s == state && (reason == "" || r == reason) {
			return a.at[i], i
		}
	}
	return time.Time{}, -1
}

func (a *agentRun) dump() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

func waitFor(t *testing.T, what string, timeout time.Duration, dump func() string, ok func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s\n%s", what, dump())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// netnsRig is the namespace with its veth pair, an embedded NATS server
// with JetStream in the root namespace, five healthy hosts renewed from
// here (guard threshold 1), and the controller (controller.Runner)
// watching the lease bucket.
type netnsRig struct {
	t      *testing.T
	ns     string
	link   string // the root-side link (the one the test cuts)
	dir    string
	srvURL string
	st     *natslease.Store
	ctx    context.Context
	secret string

	dmu      sync.Mutex
	declared time.Time // first declaration of host
	withdraw int       // withdrawn decisions for host
}

func newNetnsRig(t *testing.T) *netnsRig {
	t.Helper()
	if os.Getenv("HVGUARD_NETNS") != "1" || os.Getenv("HVGUARD_AGENT_BIN") == "" {
		t.Skip("set HVGUARD_NETNS=1 and HVGUARD_AGENT_BIN (test/netns/run.sh does, as root)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	r := &netnsRig{t: t, dir: t.TempDir()}
	r.ns, r.link = setupNetns(t)
	opts := &server.Options{Host: rootAddr, Port: -1, JetStream: true, StoreDir: filepath.Join(r.dir, "js"), NoLog: true, NoSigs: true}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(srv.Shutdown)
	r.srvURL = srv.ClientURL()
	nc, err := nats.Connect(r.srvURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.ctx = ctx
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	r.st = &natslease.Store{KV: kv}

	// Five healthy hosts renewed from here (guard threshold 1).
	timing := netnsTiming()
	go func() {
		revs := map[string]uint64{}
		for ctx.Err() == nil {
			for i := 1; i <= 5; i++ {
				h := fmt.Sprintf("h%d.example.org", i)
				rec := fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: h, BootID: "b", State: fencing.LeaseActive,
					FencingEnabled: true, Action: fencing.ActionPause, Backstop: fencing.BackstopWatchdog, Timing: timing}
				if n, err := r.st.Write(ctx, h, revs[h], rec, time.Second); err == nil {
					revs[h] = n
				}
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	// The controller. The agent has no backstop here (no reset: sysrq is
	// this machine's own; no watchdog), so the controller must accept that.
	ccfg := controller.DefaultConfig()
	ccfg.AcceptNoBackstop = true
	tr, err := controller.NewTracker(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	run := &controller.Runner{Store: r.st, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnDecision: func(d controller.Decision, err error) {
			if err != nil || d.Host != host {
				return
			}
			r.dmu.Lock()
			defer r.dmu.Unlock()
			switch d.Op {
			case controller.OpDeclare:
				if r.declared.IsZero() {
					r.declared = time.Now()
				}
			case controller.OpWithdrawn:
				r.withdraw++
			}
		}}
	go func() { _ = run.Run(ctx) }()

	r.secret = filepath.Join(r.dir, "secret")
	if err := os.WriteFile(r.secret, []byte("netns-test-shared-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// netnsTiming is the agent's timing ×0.1 (as in the config below).
func netnsTiming() fencing.Timing {
	timing := fencing.DefaultTiming()
	timing.RenewInterval, timing.RenewTimeout, timing.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	timing.FenceDeadline, timing.LeaseTTL = 500*time.Millisecond, 1500*time.Millisecond
	return timing
}

func (r *netnsRig) decl() time.Time {
	r.dmu.Lock()
	defer r.dmu.Unlock()
	return r.declared
}

// config writes an agent configuration (libvirt: the URI, "" = the test
// driver inside the agent's process; extra: YAML appended) and returns
// its path.
func (r *netnsRig) config(name, libvirt, extra string) string {
	r.t.Helper()
	if libvirt == "" {
		libvirt = `{uri: "test:///default"}`
	}
	conf := fmt.Sprintf(`host: %s
state_dir: %s
log: {level: info, format: text}
libvirt: %s
lifecycle: {window: 400ms}
nats: {urls: ["%s"], ready_timeout: 2s, allow_insecure: true}
metrics: {listen: "%s:9475"}
status: {socket: %s}
shutdown_timeout: 1s
fence:
  enabled: true
  action: pause
  allow_reset: false
  peer_listen: "%s:9476"
  peer_secret_file: %s
  peer_url: "http://127.0.0.1:9/{host}"
  renew_interval: 200ms
  renew_timeout: 200ms
  peer_timeout: 300ms
  fence_deadline: 500ms
  lease_ttl: 1500ms
  held_recheck: 500ms
  members_refresh: 500ms
  runtime_dir: %s
%s`, host, filepath.Join(r.dir, "state"), libvirt, r.srvURL, nsAddr, filepath.Join(r.dir, "agent.sock"), nsAddr, r.secret, filepath.Join(r.dir, "run"), extra)
	path := filepath.Join(r.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return path
}

// agentProc is one run of the real binary in the namespace.
type agentProc struct {
	*agentRun
	cmd  *exec.Cmd
	done chan struct{}
	err  error // after done
}

// start runs the agent binary with cfgPath in the namespace
// (HVGUARD_FORBID_RESET=1: SysrqReset refuses, on top of allow_reset
// false); the cleanup stops it.
func (r *netnsRig) start(cfgPath string) *agentProc {
	r.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", r.ns, os.Getenv("HVGUARD_AGENT_BIN"), "--config", cfgPath)
	cmd.Env = append(os.Environ(), agent.ForbidResetEnv+"=1")
	stderr, _ := cmd.StderrPipe()
	p := &agentProc{agentRun: &agentRun{}, cmd: cmd, done: make(chan struct{})}
	scanned := make(chan struct{})
	go func() { defer close(scanned); p.scan(stderr) }()
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { <-scanned; p.err = cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() { _ = p.stop(30 * time.Second) })
	return p
}

// stop sends SIGTERM and waits for the exit (its error: nil = status 0).
func (p *agentProc) stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait(timeout)
}

// wait waits for the process to exit by itself.
func (p *agentProc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("agent did not exit in %s (killed)", timeout)
	}
}

// exitCode is the process's exit status (-1: not exited normally).
func (p *agentProc) exitCode() int {
	<-p.done
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// TestFenceNetnsLinkCut: the agent (real binary, own netns, test:///default
// inside its process, fast timing ×0.1) loses its link with `ip link set
// down`: it fences (pauses its running domain); the link comes back before
// the controller may declare: it rejoins and resumes. A second cut lasts
// past the declaration: it stays fenced after the link is back.
func TestFenceNetnsLinkCut(t *testing.T) {
	r := newNetnsRig(t)
	cfgPath := r.config("agent", "", "")
	if _, err := agent.LoadConfig(cfgPath); err != nil {
		t.Fatal(err)
	}
	ar := r.start(cfgPath)
	link, decl := r.link, r.decl

	waitFor(t, "healthy", 20*time.Second, ar.dump, func() bool { at, _ := ar.seen(0, "healthy", ""); return !at.IsZero() })
	time.Sleep(1500 * time.Millisecond)

	// Cut 1, healed right after the fence: resumed, never declared.
	cut1 := time.Now()
	sh(t, "ip", "link", "set", link, "down")
	fenced1 := waitFor(t, "fenced", 10*time.Second, ar.dump, func() bool { at, _ := ar.seen(0, "fenced", ""); return !at.IsZero() })
	sh(t, "ip", "link", "set", link, "up")
	heal1 := time.Now()
	resumed := waitFor(t, "resumed", 30*time.Second, ar.dump, func() bool {
		at, _ := ar.seen(0, "healthy", string(fencing.ReasonResumedAfterReconcile))
		return !at.IsZero()
	})
	if !decl().IsZero() {
		t.Fatalf("declared after a heal before expiry\n%s", ar.dump())
	}
	t.Logf("cut 1: fenced %s after the cut; healed, resumed %s after the heal",
		fenced1.Sub(cut1).Round(time.Millisecond), resumed.Sub(heal1).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	if !decl().IsZero() {
		t.Fatalf("declared after the rejoin\n%s", ar.dump())
	}
	_, idx := ar.seen(0, "healthy", string(fencing.ReasonResumedAfterReconcile))

	// Cut 2, past the declaration: stays fenced after the link is back.
	cut2 := time.Now()
	sh(t, "ip", "link", "set", link, "down")
	fenced2 := waitFor(t, "fenced again", 10*time.Second, ar.dump, func() bool { at, _ := ar.seen(idx+1, "fenced", ""); return !at.IsZero() })
	d := waitFor(t, "declaration", 20*time.Second, ar.dump, func() bool { return !decl().IsZero() })
	if !fenced2.Before(decl()) {
		t.Fatalf("fenced at %s, declared at %s\n%s", fenced2.Sub(cut2), decl().Sub(cut2), ar.dump())
	}
	sh(t, "ip", "link", "set", link, "up")
	waitFor(t, "awaiting-release", 40*time.Second, ar.dump, func() bool { at, _ := ar.seen(idx+1, "awaiting-release", ""); return !at.IsZero() })
	time.Sleep(time.Second)
	if at, _ := ar.seen(idx+1, "healthy", ""); !at.IsZero() {
		t.Fatalf("healthy again after a declaration\n%s", ar.dump())
	}
	body := metrics(t)
	for _, want := range []string{`hvguard_fence_state{state="awaiting-release"} 1`, "hvguard_fence_domains_paused 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	rec, _, err := r.st.Read(r.ctx, host)
	if err != nil || rec.State != fencing.LeaseExpired {
		t.Fatalf("record %+v %v: declaration overwritten", rec, err)
	}
	t.Logf("cut 2: fenced %s after the cut, declared %s after it (margin %s)", fenced2.Sub(cut2).Round(time.Millisecond),
		d.Sub(cut2).Round(time.Millisecond), decl().Sub(fenced2).Round(time.Millisecond))
	if err := ar.stop(30 * time.Second); err != nil {
		t.Errorf("agent exit: %v", err)
	}
}

func metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + nsAddr + ":9475/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
