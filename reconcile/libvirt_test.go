package reconcile_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/reconcile"
)

// privateConn connects to a libvirt test driver with its own, empty node
// (test:///<file>), so tests do not share test:///default's domains.
func privateConn(t testing.TB) *libvirtx.Conn {
	t.Helper()
	node := filepath.Join(t.TempDir(), "node.xml")
	if err := os.WriteFile(node, []byte("<node>\n</node>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := libvirtx.Dial(context.Background(), libvirtx.DefaultConfig("test://"+node), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	go func() { // nobody else reads the events
		for range c.Events() {
		}
	}()
	return c
}

func quietLog() *slog.Logger {
	if os.Getenv("HVG_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// novaDomainXML is a test-driver domain carrying Nova's metadata element,
// as Nova writes it.
func novaDomainXML(name, uuid string) string {
	meta := fmt.Sprintf(`  <metadata>
    <nova:instance xmlns:nova=%q>
      <nova:package version="26.2.2"/>
      <nova:name>%s</nova:name>
      <nova:creationTime>2026-11-29 17:00:00</nova:creationTime>
      <nova:owner><nova:user uuid="u">admin</nova:user><nova:project uuid="p">admin</nova:project></nova:owner>
    </nova:instance>
  </metadata>
</domain>`, reconcile.NovaNamespace, name)
	return strings.Replace(libvirtx.TestDomainXML(name, uuid), "</domain>", meta, 1)
}

// define defines a domain (a Nova instance if nova) and starts it if run.
func define(t testing.TB, c *libvirtx.Conn, name, uuid string, nova, run bool) {
	t.Helper()
	ctx := context.Background()
	x := libvirtx.TestDomainXML(name, uuid)
	if nova {
		x = novaDomainXML(name, uuid)
	}
	if _, err := c.DefineXML(ctx, x); err != nil {
		t.Fatal(err)
	}
	if run {
		if err := c.Start(ctx, uuid); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeNova answers from memory; it counts calls like the real client.
type fakeNova struct {
	mu      sync.Mutex
	evac    map[string][]reconcile.Migration // by source host (lower case)
	servers map[string]reconcile.ServerLookup
	listErr error
	getErr  error
	onErr   error // ServersOn fails with it
	calls   uint64
	asked   [][]string
	listed  []string // hosts ServersOn listed
}

func (f *fakeNova) ListEvacuationsFrom(_ context.Context, host string) ([]reconcile.Migration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.listErr != nil {
		return nil, f.listErr
	}
	return f.evac[strings.ToLower(host)], nil
}

func (f *fakeNova) ServerHosts(_ context.Context, uuids []string) (map[string]reconcile.ServerLookup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls += uint64(len(uuids))
	f.asked = append(f.asked, uuids)
	if f.getErr != nil {
		return nil, f.getErr
	}
	out := map[string]reconcile.ServerLookup{}
	for _, u := range uuids {
		out[u] = f.servers[u] // zero value: Found=false (404)
	}
	return out, nil
}

// ServersOn lists the servers whose host is host (one call, as one page).
func (f *fakeNova) ServersOn(_ context.Context, host string) (map[string]reconcile.ServerLookup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.listed = append(f.listed, host)
	if f.onErr != nil {
		return nil, f.onErr
	}
	out := map[string]reconcile.ServerLookup{}
	for u, s := range f.servers {
		if s.Found && strings.EqualFold(s.Host, host) {
			out[u] = s
		}
	}
	return out, nil
}

func (f *fakeNova) Calls() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func uuidN(n int) string { return fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", n) }

func evac(id, inst int, status, dest string, at time.Time) reconcile.Migration {
	return reconcile.Migration{
		ID: int64(id), UUID: fmt.Sprintf("aaaaaaaa-0000-4000-8000-%012d", id), InstanceUUID: uuidN(inst),
		SourceCompute: "node1", DestCompute: dest, DestHost: "192.168.0.1", Status: status, Type: "evacuation",
		CreatedAt: at, UpdatedAt: at,
	}
}

func newRunner(t testing.TB, c *libvirtx.Conn, nova reconcile.Nova, mode reconcile.Mode, now func() time.Time) *reconcile.Runner {
	t.Helper()
	r, err := reconcile.NewRunner(reconcile.RunnerConfig{
		Hosts: []string{"node1"}, Mode: mode, Now: now,
		ErrNoMetadata: libvirtx.ErrNoMetadata, ErrNotRunning: libvirtx.ErrInvalidState,
	}, nova, c, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func stateOf(t testing.TB, c *libvirtx.Conn, uuid string) string {
	t.Helper()
	st, err := c.State(context.Background(), uuid)
	if err != nil {
		t.Fatal(err)
	}
	return st.String()
}

func result(t testing.TB, rep reconcile.Report, uuid string) reconcile.DomainReport {
	t.Helper()
	for _, d := range rep.Results {
		if d.UUID == uuid {
			return d
		}
	}
	t.Fatalf("no result for %s in %+v", uuid, rep)
	return reconcile.DomainReport{}
}
