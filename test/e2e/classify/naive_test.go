//go:build e2e

package classifye2e

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hvguard/proto"
)

// What a controller acting on an unclassified stream would have done, from
// what the run collected (issue 14: "count both side by side with what a
// controller acting on the unclassified stream would have done"):
//
//   - raw: every libvirt STOPPED lifecycle event of a protected guest, as
//     received by a `virsh event` listener on node3's libvirtd — the input
//     of Masakari's instance monitor, which registers the same callback and
//     sends a notification for each STOPPED (Destroyed, Shutdown, Failed);
//   - plain: every stop the plain agent (the core debouncer, no Nova
//     classification) published for a protected guest.

// libvirtEvent is one lifecycle event the listener printed.
type libvirtEvent struct {
	at            time.Time // when the listener read it
	domain        string    // libvirt name (instance-…)
	event, detail string    // e.g. Stopped, Destroyed
}

// libvirtEvents is a running `virsh event --all --loop` listener.
type libvirtEvents struct {
	mu      sync.Mutex
	evs     []libvirtEvent
	bad     []string // lifecycle lines that did not parse
	exited  chan struct{}
	exitErr error
}

// virshEventLine matches virsh's lifecycle event line (after the optional
// --timestamp prefix): event 'lifecycle' for domain 'NAME': Stopped Destroyed
var virshEventLine = regexp.MustCompile(`event 'lifecycle' for domain '([^']+)': (\S+)(?: (.+))?$`)

// parseVirshEvent parses one line of `virsh event --event lifecycle`.
func parseVirshEvent(line string) (libvirtEvent, bool) {
	m := virshEventLine.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		return libvirtEvent{}, false
	}
	return libvirtEvent{domain: m[1], event: m[2], detail: strings.TrimSpace(m[3])}, true
}

// startLibvirtEvents starts the listener on qemu:///system (stdout line
// buffered: virsh uses stdio) until the test ends; it is this test's own
// process group, ended by its pid.
func startLibvirtEvents(t *testing.T) *libvirtEvents {
	t.Helper()
	// (--all and --event are mutually exclusive in virsh 9.0: every event
	// type is printed, the lifecycle lines are kept)
	cmd := exec.Command("stdbuf", "-oL", "virsh", "-c", "qemu:///system", "event", "--all", "--loop", "--timestamp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("virsh event listener: %v", err)
	}
	le := &libvirtEvents{exited: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			// EOF: virsh exited (its error is in exitErr)
			err := cmd.Wait()
			le.mu.Lock()
			le.exitErr = fmt.Errorf("virsh event exited: %v: %s", err, strings.TrimSpace(stderr.String()))
			le.mu.Unlock()
			close(le.exited)
		}()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			ev, ok := parseVirshEvent(line)
			le.mu.Lock()
			if ok {
				ev.at = time.Now()
				le.evs = append(le.evs, ev)
			} else if strings.Contains(line, "event 'lifecycle'") {
				le.bad = append(le.bad, line)
			}
			le.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	// virsh refuses bad options or an unreachable libvirtd at once.
	select {
	case <-le.exited:
		t.Fatalf("libvirt event listener: %v", le.exitErr)
	case <-time.After(2 * time.Second):
	}
	return le
}

// alive fails the test if the listener exited before the end (its counts
// would be short).
func (le *libvirtEvents) alive(t *testing.T) {
	t.Helper()
	select {
	case <-le.exited:
		t.Errorf("libvirt event listener: %v (raw counts incomplete)", le.exitErr)
	default:
	}
}

// between returns the events read in [from, to) (to zero: no end).
func (le *libvirtEvents) between(from, to time.Time) []libvirtEvent {
	le.mu.Lock()
	defer le.mu.Unlock()
	var out []libvirtEvent
	for _, ev := range le.evs {
		if !ev.at.Before(from) && (to.IsZero() || ev.at.Before(to)) {
			out = append(out, ev)
		}
	}
	return out
}

// naiveCounts: per role, how many actions each naive consumer would have
// taken; rawDetails splits the raw ones by role/detail.
type naiveCounts struct {
	raw, plain map[string]int
	rawDetails map[string]int
}

// sideBySide sums, per category of stop (rebooted, real-stops, crash-loop,
// stop-api), the classified controller's actions (Nova's start instance
// actions, asserted) beside the naive consumers' over the whole run.
type sideBySide struct {
	order []string
	m     map[string]*[3]int // ours, raw, plain
}

func (sb *sideBySide) add(cat string, ours, raw, plain int) {
	if sb.m == nil {
		sb.m = map[string]*[3]int{}
	}
	c := sb.m[cat]
	if c == nil {
		c = &[3]int{}
		sb.m[cat] = c
		sb.order = append(sb.order, cat)
	}
	c[0], c[1], c[2] = c[0]+ours, c[1]+raw, c[2]+plain
}

// String: category=ours/raw/plain …
func (sb *sideBySide) String() string {
	var out []string
	for _, cat := range sb.order {
		c := sb.m[cat]
		out = append(out, fmt.Sprintf("%s=%d/%d/%d", cat, c[0], c[1], c[2]))
	}
	return strings.Join(out, " ")
}

// naive counts both consumers' actions in [from, to) for the guests role
// names ("" = not protected: left out, as Masakari's engine and our policy
// leave it).
func (s *storm) naive(ctx context.Context, from, to time.Time, role func(id string) string) naiveCounts {
	t := s.t
	n := naiveCounts{raw: map[string]int{}, plain: map[string]int{}, rawDetails: map[string]int{}}
	names := s.instanceNames(ctx)
	s.levents.alive(t)
	for _, ev := range s.levents.between(from, to) {
		if ev.event != "Stopped" {
			continue
		}
		if r := role(names[ev.domain]); r != "" {
			n.raw[r]++
			n.rawDetails[r+"/"+ev.detail]++
		}
	}
	for _, m := range s.plain.messages(t, ctx) {
		if m.ev.Transition != proto.TransitionStopped || m.stored.Before(from) || (!to.IsZero() && !m.stored.Before(to)) {
			continue
		}
		if r := role(m.ev.DomainUUID); r != "" {
			n.plain[r]++
		}
	}
	s.levents.mu.Lock()
	if len(s.levents.bad) > 0 {
		t.Errorf("virsh event listener: %d lines not understood, first %q", len(s.levents.bad), s.levents.bad[0])
	}
	s.levents.mu.Unlock()
	return n
}

// instanceNames maps every guest's libvirt name to its server id (read from
// Nova once; a hard reboot redefines the domain under the same name).
func (s *storm) instanceNames(ctx context.Context) map[string]string {
	if s.names != nil {
		return s.names
	}
	s.names = map[string]string{}
	for _, id := range s.ids {
		srv, err := s.h.GetServer(ctx, id)
		if err != nil {
			s.t.Fatalf("server %s: %v", id, err)
		}
		s.names[srv.InstanceName] = id
	}
	return s.names
}

// fmtCounts prints m in a fixed order: total, then each key.
func fmtCounts(m map[string]int) string {
	var ks []string
	tot := 0
	for k, v := range m {
		ks = append(ks, fmt.Sprintf("%s:%d", k, v))
		tot += v
	}
	sort.Strings(ks)
	return fmt.Sprintf("%d(%s)", tot, strings.Join(ks, ","))
}

func TestParseVirshEvent(t *testing.T) {
	for _, c := range []struct {
		line string
		want libvirtEvent
		ok   bool
	}{
		{"2026-12-01 22:10:00.123+0000: event 'lifecycle' for domain 'instance-0000001a': Stopped Destroyed",
			libvirtEvent{domain: "instance-0000001a", event: "Stopped", detail: "Destroyed"}, true},
		{"event 'lifecycle' for domain 'instance-00000002': Started Booted",
			libvirtEvent{domain: "instance-00000002", event: "Started", detail: "Booted"}, true},
		{"2026-12-01 22:10:00.123+0000: event 'lifecycle' for domain 'x': Stopped Failed\n",
			libvirtEvent{domain: "x", event: "Stopped", detail: "Failed"}, true},
		{"event loop interrupted", libvirtEvent{}, false},
		{"", libvirtEvent{}, false},
	} {
		got, ok := parseVirshEvent(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("parseVirshEvent(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}
