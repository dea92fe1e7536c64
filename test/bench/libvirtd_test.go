//go:build bench

package bench

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"hvguard/libvirtx"
)

// startPrivateLibvirtd starts a libvirtd of the benchmark's own (as user
// nobody, so a session daemon that touches none of the system daemon's
// state; socket in a temp dir — the same scheme as test/realvirt) and
// returns its test-driver URI. It is killed when the benchmark ends. It
// skips the benchmark when libvirtd is not installed or we are not root.
func startPrivateLibvirtd(b *testing.B) string {
	b.Helper()
	if _, err := os.Stat("/usr/sbin/libvirtd"); err != nil {
		b.Skip("libvirtd not installed (test/libvirtd/start.sh installs it)")
	}
	if os.Geteuid() != 0 {
		b.Skip("needs root to run a private libvirtd as user nobody")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		b.Skipf("no user nobody: %v", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	base, err := os.MkdirTemp("", "hvguard-bench-libvirtd-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(base) })
	home := filepath.Join(base, "home")
	if err := os.Chmod(base, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.Chown(home, int(uid), int(gid)); err != nil {
		b.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(base, "libvirtd.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("/usr/sbin/libvirtd")
	cmd.Dir = "/"
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + home,
		"XDG_RUNTIME_DIR=" + filepath.Join(home, "run"),
		"XDG_CONFIG_HOME=" + filepath.Join(home, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, "cache"),
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		b.Skipf("start private libvirtd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	uri := "test+unix:///default?socket=" + filepath.Join(home, "run", "libvirt", "libvirt-sock")
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig(uri), quietLog())
		cancel()
		if err == nil {
			c.Close()
			return uri
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logf.Name())
			b.Skipf("private libvirtd exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("private libvirtd not answering after 20s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
