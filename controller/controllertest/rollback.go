package controllertest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing/natslease"
)

// A lease stream rolled back: its store directory put back to an earlier
// copy while the server is down (a restore from a backup, a replica that
// lost acknowledged writes). The stream keeps its creation time and hands
// the lost revisions out again (reviewers X20, X21).

// RollbackServer starts a JetStream server on a free port that Restart
// starts it on again (clients reconnect); it returns the server, its
// store directory and the port.
func RollbackServer(t testing.TB) (*server.Server, string, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	return deliverytest.StartJetStream(t, dir, port), dir, port
}

// Restart shuts *srv down, puts the lease stream's store directory back to
// the copy at backup (if set: StreamCopy), and starts a server on dir again
// on port (-1: any port).
func Restart(t testing.TB, srv **server.Server, dir, backup string, port int) {
	t.Helper()
	(*srv).Shutdown()
	(*srv).WaitForShutdown()
	if backup != "" {
		live := streamDir(t, dir)
		if err := os.RemoveAll(live); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", backup, live).CombinedOutput(); err != nil {
			t.Fatalf("restore %s: %v: %s", live, err, out)
		}
	}
	*srv = deliverytest.StartJetStream(t, dir, port)
}

// StreamCopy copies the lease stream's store directory (take it right
// after a Restart: the server wrote it out at its shutdown).
func StreamCopy(t testing.TB, dir string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "leases")
	if out, err := exec.Command("cp", "-a", streamDir(t, dir), to).CombinedOutput(); err != nil {
		t.Fatalf("copy the lease stream: %v: %s", err, out)
	}
	return to
}

func streamDir(t testing.TB, dir string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", natslease.StreamName))
	if err != nil || len(m) != 1 {
		t.Fatalf("the lease stream's store directory under %s: %v (%v)", dir, m, err)
	}
	return m[0]
}
