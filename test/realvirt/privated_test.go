//go:build realvirt

package realvirt

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// privateDaemon is a libvirtd of the test's own: unprivileged (run as user
// nobody, so it is a "session" daemon that touches none of the system
// daemon's state), with its socket in a temporary directory. Tests may kill,
// restart and stop it freely. Its test driver (test+unix:///default) starts
// with the driver's default domain set: one running domain named "test".
type privateDaemon struct {
	t    *testing.T
	dir  string // HOME of the daemon
	sock string
	log  string
	uid  uint32
	gid  uint32

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	runs int
}

// startPrivateDaemon starts a private libvirtd and stops it (SIGCONT +
// SIGKILL) and removes its directory in t.Cleanup. It skips the test if
// libvirtd is not installed or the test does not run as root.
func startPrivateDaemon(t *testing.T) *privateDaemon {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/libvirtd"); err != nil {
		t.Skip("libvirtd not installed: run test/libvirtd/start.sh first")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a private libvirtd as user nobody")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	// Not t.TempDir: that is 0700 root, and nobody must reach its HOME.
	base, err := os.MkdirTemp("", "hvguard-realvirt-libvirtd-")
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	d := &privateDaemon{
		t:    t,
		dir:  home,
		sock: filepath.Join(home, "run", "libvirt", "libvirt-sock"),
		log:  filepath.Join(base, "libvirtd.log"),
		uid:  uint32(uid),
		gid:  uint32(gid),
	}
	t.Cleanup(func() {
		d.kill(syscall.SIGKILL)
		if t.Failed() {
			if b, err := os.ReadFile(d.log); err == nil {
				t.Logf("private libvirtd log:\n%s", b)
			}
		}
		_ = os.RemoveAll(base)
	})
	d.start()
	return d
}

// URI is the test-driver URI served by this daemon.
func (d *privateDaemon) URI() string { return "test+unix:///default?socket=" + d.sock }

// pid is the daemon's process id (0 if not running).
func (d *privateDaemon) pid() int {
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// start launches libvirtd and waits (bounded) until it answers.
func (d *privateDaemon) start() {
	d.t.Helper()
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	begin := time.Now()
	cmd := exec.Command("/usr/sbin/libvirtd")
	cmd.Dir = "/"
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + d.dir,
		"XDG_RUNTIME_DIR=" + filepath.Join(d.dir, "run"),
		"XDG_CONFIG_HOME=" + filepath.Join(d.dir, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(d.dir, "cache"),
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true, // our signals must not reach the test process group
		Credential: &syscall.Credential{Uid: d.uid, Gid: d.gid, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("start private libvirtd: %v", err)
	}
	d.cmd = cmd
	d.done = make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(d.done)
	d.runs++
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := virsh(d.URI(), 5*time.Second, "list", "--all")
		if err == nil {
			break
		}
		select {
		case <-d.done:
			d.t.Fatalf("private libvirtd exited at start: %v (log %s)", cmd.ProcessState, d.log)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("private libvirtd (pid %d) not answering after 20s: %v", d.pid(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.t.Logf("private libvirtd #%d (pid %d) answering after %v", d.runs, d.pid(), time.Since(begin).Round(time.Millisecond))
}

// signal sends sig to the daemon.
func (d *privateDaemon) signal(sig syscall.Signal) {
	d.t.Helper()
	if p := d.pid(); p != 0 {
		if err := syscall.Kill(p, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			d.t.Fatalf("kill -%v %d: %v", sig, p, err)
		}
	}
}

// kill sends sig (plus SIGCONT, in case the daemon is stopped) and waits up
// to 15 s for the daemon to exit; it returns how long the exit took.
func (d *privateDaemon) kill(sig syscall.Signal) time.Duration {
	d.t.Helper()
	if d.cmd == nil {
		return 0
	}
	begin := time.Now()
	d.signal(sig)
	d.signal(syscall.SIGCONT)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		d.signal(syscall.SIGKILL)
		<-d.done
		d.t.Errorf("private libvirtd did not exit within 15s of %v", sig)
	}
	d.cmd = nil
	return time.Since(begin)
}
