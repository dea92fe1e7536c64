package netns

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// quietFor is how long the netns test waits for a (wrong) declaration:
// more than twice lease_ttl + grace at the ×0.1 timing (1.5 s + 0.53 s).
const quietFor = 5 * time.Second

// record returns the host's lease record.
func (r *netnsRig) record() fencing.LeaseRecord {
	r.t.Helper()
	rec, _, err := r.st.Read(r.ctx, host)
	if err != nil {
		r.t.Fatalf("read lease: %v", err)
	}
	return *rec
}

// expectWithdrawn waits quietFor and fails if the host was declared or its
// record is not withdrawn with a reason starting with reason.
func (r *netnsRig) expectWithdrawn(what, reason string, logs ...func() string) {
	r.t.Helper()
	time.Sleep(quietFor)
	dump := func() string {
		var b strings.Builder
		for _, l := range logs {
			b.WriteString(l())
		}
		return b.String()
	}
	if !r.decl().IsZero() {
		r.t.Fatalf("%s: declared\n%s", what, dump())
	}
	if rec := r.record(); rec.State != fencing.LeaseWithdrawn || !strings.HasPrefix(rec.Reason, reason) {
		r.t.Fatalf("%s: record %s (%q), want withdrawn (%s…)\n%s", what, rec.State, rec.Reason, reason, dump())
	}
}

// TestFenceNetnsStopUpgradeFailedStart (issue 10 item 1): the real binary
// in its namespace, a real NATS and the controller: an orderly stop
// withdraws the lease and nothing is declared; an upgrade (the binary
// started again after longer than lease_ttl) takes the lease back without
// fencing; starts that fail — exit 78 after a config change, a corrupt
// outbox state.json, a libvirtd that accepts and never answers (the lease
// renewed meanwhile, then SIGTERM) — leave the lease withdrawn and nothing
// is declared; a stop while the link is down fences before the agent
// leaves, and only then may the controller declare the host.
func TestFenceNetnsStopUpgradeFailedStart(t *testing.T) {
	r := newNetnsRig(t)
	good := r.config("agent", "", "")

	// 1. Orderly stop.
	a1 := r.start(good)
	waitFor(t, "healthy", 20*time.Second, a1.dump, func() bool { at, _ := a1.seen(0, "healthy", ""); return !at.IsZero() })
	time.Sleep(1500 * time.Millisecond)
	stop := time.Now()
	if err := a1.stop(30 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, a1.dump())
	}
	t.Logf("orderly stop: exit 0 after %s", time.Since(stop).Round(time.Millisecond))
	r.expectWithdrawn("after SIGTERM", "orderly-stop", a1.dump)

	// 2. Upgrade: the binary starts again 5 s later.
	a2 := r.start(good)
	waitFor(t, "healthy after the restart", 20*time.Second, a2.dump, func() bool { at, _ := a2.seen(0, "healthy", ""); return !at.IsZero() })
	time.Sleep(2 * time.Second)
	if at, _ := a2.seen(0, "fencing", ""); !at.IsZero() || !r.decl().IsZero() || r.record().State != fencing.LeaseActive {
		t.Fatalf("upgrade: fencing %v, declared %v, record %s\n%s", at, r.decl(), r.record().State, a2.dump())
	}
	if _, i := a2.seen(0, "starting", string(fencing.ReasonStartedFromWithdrawn)); i < 0 {
		t.Fatalf("upgrade did not start from the withdrawn record\n%s", a2.dump())
	}
	if err := a2.stop(30 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, a2.dump())
	}
	r.expectWithdrawn("after the second stop", "orderly-stop", a2.dump)

	// 3. A config change the new binary refuses: exit 78 before anything
	// runs; the withdrawal of the previous process stands.
	bad := r.config("bad", "", "  max_clock_drift: 0.5\n")
	a3 := r.start(bad)
	if err := a3.wait(30 * time.Second); a3.exitCode() != 78 {
		t.Fatalf("bad config: exit %d (%v), want 78\n%s", a3.exitCode(), err, a3.dump())
	}
	r.expectWithdrawn("after exit 78", "orderly-stop", a3.dump)

	// 4. A corrupt outbox state.json: the start fails after fencing took
	// the lease back, and withdraws it again.
	state := filepath.Join(r.dir, "state", "outbox", "state.json")
	if err := os.WriteFile(state, []byte("{corrupt"), 0o600); err != nil {
		t.Fatal(err)
	}
	a4 := r.start(good)
	if err := a4.wait(30 * time.Second); a4.exitCode() == 0 {
		t.Fatalf("corrupt outbox: exit 0 (%v)\n%s", err, a4.dump())
	}
	r.expectWithdrawn("after the corrupt outbox", "start-failed: outbox", a4.dump)
	if err := os.RemoveAll(filepath.Join(r.dir, "state", "outbox")); err != nil {
		t.Fatal(err)
	}

	// 5. libvirtd not answering (a socket that accepts and never speaks):
	// the lease is renewed while the start waits; SIGTERM withdraws it.
	sock := filepath.Join(r.dir, "libvirt.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // accepted, never answered
		}
	}()
	hung := r.config("hung", `{uri: "qemu+unix:///system?socket=`+sock+`", connect_timeout: 1s}`, "")
	a5 := r.start(hung)
	waitFor(t, "healthy while libvirt hangs", 20*time.Second, a5.dump, func() bool { at, _ := a5.seen(0, "healthy", ""); return !at.IsZero() })
	time.Sleep(quietFor)
	if !r.decl().IsZero() || r.record().State != fencing.LeaseActive {
		t.Fatalf("libvirt hung: declared %v, record %s\n%s", r.decl(), r.record().State, a5.dump())
	}
	if err := a5.stop(30 * time.Second); err == nil {
		t.Fatalf("SIGTERM while waiting for libvirt: exit 0\n%s", a5.dump())
	}
	r.expectWithdrawn("after the hung libvirt", "start-failed: libvirt", a5.dump)

	// 6. A stop while the link is down: the withdrawal cannot land, the
	// agent fences (its domain paused) before it leaves.
	a6 := r.start(good)
	waitFor(t, "healthy", 20*time.Second, a6.dump, func() bool { at, _ := a6.seen(0, "healthy", ""); return !at.IsZero() })
	time.Sleep(1500 * time.Millisecond)
	sh(t, "ip", "link", "set", r.link, "down")
	cut := time.Now()
	err = a6.stop(30 * time.Second)
	fenced, _ := a6.seen(0, "fenced", string(fencing.ReasonFenceComplete))
	if at, _ := a6.seen(0, "fencing", string(fencing.ReasonWithdrawalNotConfirmed)); at.IsZero() || fenced.IsZero() {
		t.Fatalf("stop while cut off (exit %v): not fenced before leaving\n%s", err, a6.dump())
	}
	if !strings.Contains(a6.dump(), "1 running domains") {
		t.Fatalf("the fence at stop did not pause the running domain\n%s", a6.dump())
	}
	d := waitFor(t, "the declaration of the fenced host", 20*time.Second, a6.dump, func() bool { return !r.decl().IsZero() })
	if !fenced.Before(r.decl()) {
		t.Fatalf("fenced at %s, declared at %s after the cut", fenced.Sub(cut), d.Sub(cut))
	}
	sh(t, "ip", "link", "set", r.link, "up")
	t.Logf("stop while cut off: fenced %s after the cut (exit %v), declared %s after it", fenced.Sub(cut).Round(time.Millisecond),
		err, r.decl().Sub(cut).Round(time.Millisecond))
}
