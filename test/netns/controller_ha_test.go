package netns

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing/natslease"
)

// The controller's HA over a real (kernel) network partition (issue 12): a
// 3-node NATS cluster with JetStream (the lease bucket replicated 3 times)
// in the root namespace, two real hvguard-controller processes, each in
// its own network namespace reaching the cluster over its own veth pair.
// Addresses 198.18.10.0/30 and 198.18.11.0/30 (never routed).

// clusterNode is one server of the 3-node cluster.
type clusterNode struct {
	srv        *server.Server
	client     int
	clientURLs []string
}

// startCluster starts three clustered JetStream servers listening on every
// address (the veth pairs reach them) with client ports base, base+1,
// base+2 and route ports base+10...
func startCluster(t *testing.T, base int) []*clusterNode {
	t.Helper()
	var nodes []*clusterNode
	routes := server.RoutesFromStr(fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", base+10, base+11, base+12))
	for i := range 3 {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "0.0.0.0", Port: base + i, NoLog: true, NoSigs: true,
			JetStream: true, StoreDir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i)),
			Cluster: server.ClusterOpts{Name: "hvg", Host: "127.0.0.1", Port: base + 10 + i},
			Routes:  routes,
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		nodes = append(nodes, &clusterNode{srv: s, client: base + i})
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	for _, n := range nodes {
		if !n.srv.ReadyForConnections(20 * time.Second) {
			t.Fatal("cluster node not ready")
		}
	}
	return nodes
}

// vethNS creates namespace ns with a veth pair 198.18.<net>.1 (root side,
// returned: the link the test cuts) / .2 (inside).
func vethNS(t *testing.T, ns string, net int) (rootLink string) {
	t.Helper()
	rootLink, nsLink := fmt.Sprintf("hvgr%s", ns), fmt.Sprintf("hvgn%s", ns)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	_ = exec.Command("ip", "link", "del", rootLink).Run()
	sh(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh(t, "ip", "link", "add", rootLink, "type", "veth", "peer", "name", nsLink)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", rootLink).Run() })
	sh(t, "ip", "link", "set", nsLink, "netns", ns)
	sh(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/30", net), "dev", rootLink)
	sh(t, "ip", "link", "set", rootLink, "up")
	sh(t, "ip", "netns", "exec", ns, "ip", "addr", "add", fmt.Sprintf("198.18.%d.2/30", net), "dev", nsLink)
	sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", nsLink, "up")
	sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	return rootLink
}

// ctlProc is one controller process in its namespace.
type ctlProc struct {
	id  string
	cmd *exec.Cmd
	mu  sync.Mutex
	log strings.Builder
}

func (c *ctlProc) logged(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.log.String(), sub)
}

// startCtl runs the hvguard-controller binary in ns with the cluster's
// three client ports reached through 198.18.<net>.1, at ×0.1 of the lock's
// default timing.
func startCtl(t *testing.T, bin, ns string, net int, id string, nodes []*clusterNode) *ctlProc {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, fmt.Sprintf("%q", fmt.Sprintf("nats://198.18.%d.1:%d", net, n.client)))
	}
	cfg := fmt.Sprintf(`id: %s
log: {level: debug, format: json}
nats: {urls: [%s], ready_timeout: 10s, allow_insecure: true}
leader: {ttl: 1s, renew_interval: 250ms, write_timeout: 200ms, act_margin: 200ms}
guard: {share: 0.5, window: 1s}
metrics: {listen: "127.0.0.1:0"}
`, id, strings.Join(urls, ", "))
	p := filepath.Join(t.TempDir(), id+".yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &ctlProc{id: id}
	c.cmd = exec.Command("ip", "netns", "exec", ns, bin, "--config", p)
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.log.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if os.Getenv("HVGUARD_TEST_LOG") != "" {
				fmt.Fprintln(os.Stderr, id, sc.Text())
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
		<-done
	})
	return c
}

func currentHolder(t *testing.T, kv jetstream.KeyValue) string {
	e, err := kv.Get(context.Background(), controller.LeaderKey)
	if err != nil {
		return ""
	}
	r, err := controller.DecodeLockRecord(e.Value())
	if err != nil || r.Released {
		return ""
	}
	return r.Holder
}

// TestControllerHANetns: the leader's namespace is cut from the cluster
// (ip link down) while a host falls silent: the other controller takes the
// lock and declares the host once; after the heal the old leader's held
// writes change nothing. Then one of the three NATS servers is shut down:
// the R3 bucket keeps its quorum and the leader keeps its lock.
func TestControllerHANetns(t *testing.T) {
	if os.Getenv("HVGUARD_NETNS") != "1" || os.Getenv("HVGUARD_CONTROLLER_BIN") == "" {
		t.Skip("needs root and HVGUARD_NETNS=1 HVGUARD_CONTROLLER_BIN (test/netns/run.sh)")
	}
	bin := os.Getenv("HVGUARD_CONTROLLER_BIN")
	nodes := startCluster(t, 14322)
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", nodes[0].client, nodes[1].client, nodes[2].client))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cfg := natslease.BucketConfig(3)
	cfg.History = 64
	var kv jetstream.KeyValue
	for end := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kv, err = js.CreateKeyValue(ctx, cfg)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("R3 lease bucket: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The controllers' bucket (the leader lock), R3 too, with a history.
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	ckv, err := js.CreateKeyValue(cctx, jetstream.KeyValueConfig{Bucket: controller.ControlBucket, History: 64, Replicas: 3})
	ccancel()
	if err != nil {
		t.Fatalf("R3 control bucket: %v", err)
	}
	st := &natslease.Store{KV: kv}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	hs := controllertest.HostRecord("hs")
	stopHS := controllertest.RenewRecord(ctx, st, hs)

	linkA := vethNS(t, "hvgca", 10)
	vethNS(t, "hvgcb", 11)
	a := startCtl(t, bin, "hvgca", 10, "ctl-a", nodes)
	waitFor(t, "ctl-a leading", 20*time.Second, func() string { return a.log.String() }, func() bool { return currentHolder(t, ckv) == "ctl-a" })
	b := startCtl(t, bin, "hvgcb", 11, "ctl-b", nodes)
	waitFor(t, "ctl-b synced", 20*time.Second, func() string { return b.log.String() }, func() bool { return b.logged(`"msg":"ready"`) > 0 })
	time.Sleep(500 * time.Millisecond)

	// 1. The leader's link is cut; hs falls silent.
	sh(t, "ip", "link", "set", linkA, "down")
	cut := time.Now()
	stopHS()
	took := waitFor(t, "ctl-b leading", 20*time.Second, func() string { return b.log.String() }, func() bool { return currentHolder(t, ckv) == "ctl-b" })
	t.Logf("ctl-a's link down → ctl-b holds the lock after %s (TakeoverAfter(1 s) = %s)", took.Sub(cut).Round(time.Millisecond), controller.TakeoverAfter(time.Second, controller.DefaultDrift))
	grace, err := controller.Config{Drift: 0.01, MaxHostDrift: 0.05, MaxGrace: time.Minute, GuardWindow: time.Minute}.Grace(hs)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(cut.Add(hs.Timing.LeaseTTL + grace + 3*time.Second)))
	sh(t, "ip", "link", "set", linkA, "up")
	healed := time.Now()
	waitFor(t, "ctl-a deposed after the heal", 30*time.Second, func() string { return a.log.String() }, func() bool {
		return a.logged("this controller is no longer the leader") > 0
	})
	t.Logf("link up → ctl-a logs its deposition after %s", time.Since(healed).Round(time.Millisecond))
	time.Sleep(2 * time.Second)

	decl := controllertest.Declarations(t, kv, "hs")
	if len(decl) != 1 || !strings.Contains(decl[0], "ctl-b") {
		t.Fatalf("hs declarations %q: want exactly one, by ctl-b", decl)
	}
	holders := controllertest.CheckTakeover(t, ckv, "ctl-a", "ctl-b")
	if currentHolder(t, ckv) != "ctl-b" {
		t.Fatalf("after the heal the lock is %q's", currentHolder(t, ckv))
	}

	// 2. One of the three NATS servers goes away: the quorum holds, the
	// leader keeps its lock (no takeover, no deposition).
	deposedBefore := b.logged("this controller is no longer the leader")
	nodes[0].srv.Shutdown()
	time.Sleep(5 * time.Second)
	if got := currentHolder(t, ckv); got != "ctl-b" || b.logged("this controller is no longer the leader") != deposedBefore {
		t.Fatalf("after one NATS server stopped: holder %q, ctl-b deposed %d times (was %d)", got, b.logged("this controller is no longer the leader"), deposedBefore)
	}
	t.Logf("hs declared once, by ctl-b: %s; %d lock records; one NATS server down 5 s: ctl-b still leads", decl[0], len(holders))
}
