//go:build bench

package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/fencing/natslease"
)

// natsCluster is three (or n) nats-server processes — the module's own
// github.com/nats-io/nats-server/v2, built by binaries() — forming one
// cluster with routes on loopback and JetStream (file storage) on each:
// the 3-node cluster of issue 12's benchmarks, on this machine.
type natsCluster struct {
	procs []*exec.Cmd
	urls  []string
}

// freePorts returns n loopback TCP ports the kernel had free just now.
func freePorts(b *testing.B, n int) []int {
	b.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// startCluster starts an n-node cluster and waits until JetStream answers
// on every node (a meta leader is elected).
func startCluster(b *testing.B, n int) *natsCluster {
	b.Helper()
	bin := filepath.Join(binaries(b), "nats-server")
	dir := b.TempDir()
	ports := freePorts(b, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	c := &natsCluster{}
	for i := range n {
		name := fmt.Sprintf("hvg-bench-%d", i+1)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q, max_memory_store: 268435456, max_file_store: 8589934592 }
cluster { name: hvg-bench, listen: 127.0.0.1:%d, routes: [%s] }
`, name, ports[i], filepath.Join(dir, name), ports[n+i], strings.Join(routes, ", "))
		cf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
			b.Fatal(err)
		}
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "-c", cf)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			_ = logf.Close()
		})
		c.procs = append(c.procs, cmd)
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	for _, u := range c.urls {
		nc := c.connect(b, u)
		js, _ := jetstream.New(nc)
		end := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.AccountInfo(ctx)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(end) {
				b.Fatalf("JetStream on %s not ready after 60 s: %v (logs in %s)", u, err, dir)
			}
			time.Sleep(200 * time.Millisecond)
		}
		nc.Close()
	}
	return c
}

// connect connects to url (closed when the benchmark ends).
func (c *natsCluster) connect(b *testing.B, url string, opts ...nats.Option) *nats.Conn {
	b.Helper()
	var nc *nats.Conn
	var err error
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if nc, err = nats.Connect(url, opts...); err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		b.Fatalf("connect %s: %v", url, err)
	}
	b.Cleanup(nc.Close)
	return nc
}

// pids returns the servers' process ids.
func (c *natsCluster) pids() []int {
	var out []int
	for _, p := range c.procs {
		out = append(out, p.Process.Pid)
	}
	return out
}

// provision creates the lease bucket, the controllers' buckets and the
// event stream with three replicas, as an operator provisions them (the agents and the controller
// create one-replica ones only when missing, and never change an existing
// one), then opens them the way they do (natslease.EnsureBucket,
// delivery.EnsureStream) and checks the replicas and that the stream
// differs from the recommended configuration in nothing.
func provision(b *testing.B, js jetstream.JetStream) jetstream.KeyValue {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, natslease.BucketConfig(3)); err != nil {
		b.Fatalf("create the lease bucket: %v", err)
	}
	kv, err := natslease.EnsureBucket(ctx, js, false)
	if err != nil {
		b.Fatal(err)
	}
	// The controllers' buckets (one account here: no nats.control), which
	// a controller with create_bucket: false only opens.
	for _, c := range []jetstream.KeyValueConfig{
		{Bucket: controller.ControlBucket, History: 1}, {Bucket: controller.MemoryBucket, History: 1}, {Bucket: recovery.Bucket, History: 5},
	} {
		c.Storage, c.Replicas = jetstream.FileStorage, 3
		if _, err := natslease.CreateHardened(ctx, js, c); err != nil {
			b.Fatalf("create the controllers' bucket %s: %v", c.Bucket, err)
		}
	}
	if _, err := js.CreateStream(ctx, delivery.StreamConfig(3)); err != nil {
		b.Fatalf("create the event stream: %v", err)
	}
	drift, err := delivery.EnsureStream(ctx, js, false)
	if err != nil {
		b.Fatal(err)
	}
	if len(drift) != 0 {
		b.Fatalf("event stream drift: %+v", drift)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ks, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || ks.StreamInfo().Config.Replicas != 3 {
		b.Fatalf("lease bucket status %+v: want 3 replicas", st)
	}
	s, err := js.Stream(ctx, delivery.StreamConfig(3).Name)
	if err != nil {
		b.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		b.Fatalf("event stream has %d replicas, want 3", r)
	}
	return kv
}
