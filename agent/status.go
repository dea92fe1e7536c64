package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"hvguard/fencing"
)

// The operator's one-screen status (`hvguard-agent status`): the running
// agent answers GET /status on a unix socket (status.socket, root only);
// when it does not answer, the same Status is assembled from the state
// files (fence.json, reconcile-last.json) and says so.

// DefaultStatusSocket is in systemd's RuntimeDirectory=hvguard (0700,
// root): only root can connect.
const DefaultStatusSocket = "/run/hvguard/agent.sock"

// StatusSocketMode is the socket's permission: the status names domains,
// NATS servers and the fence state — root only, like the state files.
const StatusSocketMode = 0o600

// maxSocketPath is the longest unix socket path Linux accepts
// (sizeof(sun_path) - 1).
const maxSocketPath = 107

// StatusTimeout bounds `hvguard-agent status`'s question to the running
// agent (connect and answer). The answer reads counters only: an agent
// that does not answer within it is wedged, and the state files are used.
const StatusTimeout = 3 * time.Second

// OutboxNearBound is the fill ratio (of outbox.max_events or max_bytes)
// from which status says "degraded" (the alert HvguardOutboxNearBound
// fires at the same ratio): at the bound, events are dropped.
const OutboxNearBound = 0.8

// Health is the verdict of a Status, and its exit code.
type Health string

const (
	// HealthHealthy (exit 0): the agent runs, NATS and libvirt are
	// connected, the lease is held (fencing on), the last reconciliation
	// was OK (reconcile on), the outbox is below OutboxNearBound.
	HealthHealthy Health = "healthy"
	// HealthDegraded (exit 1): the agent runs but something above is not
	// so (the problems say what); the host is not fenced.
	HealthDegraded Health = "degraded"
	// HealthFenced (exit 3): the host is fencing, fenced or declared
	// (awaiting release) — from the agent or, when it is down, from its
	// fence state file.
	HealthFenced Health = "fenced"
	// HealthDown (exit 4): the agent does not answer and its state files
	// do not say the host is fenced.
	HealthDown Health = "down"
)

// Exit codes of `hvguard-agent status` (2 is a bad command line, 78 an
// invalid configuration, as for every command).
const (
	ExitHealthy  = 0
	ExitDegraded = 1
	ExitFenced   = 3
	ExitDown     = 4
)

// ExitCode is h's exit status.
func (h Health) ExitCode() int {
	switch h {
	case HealthHealthy:
		return ExitHealthy
	case HealthDegraded:
		return ExitDegraded
	case HealthFenced:
		return ExitFenced
	}
	return ExitDown
}

// Status is the JSON of `hvguard-agent status --json` (and of GET /status
// on the socket). Times are RFC 3339; durations are seconds.
type Status struct {
	// Source is "agent" (the running agent answered) or "state-files"
	// (it did not: SourceError says why; what only the running agent
	// knows is absent).
	Source      string    `json:"source"`
	SourceError string    `json:"source_error,omitempty"`
	Host        string    `json:"host"`
	Version     string    `json:"version,omitempty"`
	PID         int       `json:"pid,omitempty"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	Now         time.Time `json:"now"`
	Health      Health    `json:"health"`
	// Problems say why Health is not healthy, one line each.
	Problems  []string         `json:"problems"`
	Fence     FenceStatus      `json:"fence"`
	NATS      *ConnStatus      `json:"nats,omitempty"`
	Libvirt   *ConnStatus      `json:"libvirt,omitempty"`
	Outbox    *OutboxStatus    `json:"outbox,omitempty"`
	Stops     *StopsStatus     `json:"stops,omitempty"`
	Reconcile *ReconcileStatus `json:"reconcile,omitempty"`
	// ReconcileEnabled: reconcile.enabled (the report may be absent).
	ReconcileEnabled bool `json:"reconcile_enabled"`
	// Insecure lists the insecure settings of the configuration
	// (Config.SecurityWarnings: plaintext NATS allowed to a remote server,
	// a password in a NATS URL, verify: false in clouds.yaml).
	Insecure []string `json:"insecure,omitempty"`
}

// FenceStatus is the fencing part of a Status.
type FenceStatus struct {
	Enabled bool   `json:"enabled"`
	Action  string `json:"action,omitempty"`
	// State is the fencing state (healthy, suspect, …, fenced,
	// awaiting-release); from the state file when the agent is down:
	// fenced, awaiting-release, held, withdrawn or unknown.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// LeaseHeld: the agent holds its lease now (running agent only).
	LeaseHeld bool `json:"lease_held"`
	// LastRenewal is the send time of the last renewal known to have
	// landed, LeaseAgeSeconds its age (absent: none, or another boot).
	LastRenewal     time.Time `json:"last_renewal,omitzero"`
	LeaseAgeSeconds *float64  `json:"lease_age_seconds,omitempty"`
	// Watchdog: none, disarmed, armed, triggered, malfunction.
	Watchdog      string `json:"watchdog,omitempty"`
	PausedDomains int    `json:"paused_domains"`
}

// ConnStatus is a connection (NATS, libvirt).
type ConnStatus struct {
	Connected bool   `json:"connected"`
	Endpoint  string `json:"endpoint"`
	LastError string `json:"last_error,omitempty"`
}

// OutboxStatus is the outbox of unacknowledged events.
type OutboxStatus struct {
	Depth      int    `json:"depth"`
	Bytes      int64  `json:"bytes"`
	MaxEvents  int    `json:"max_events"`
	MaxBytes   int64  `json:"max_bytes"`
	Dropped    uint64 `json:"dropped"`
	GapMarkers uint64 `json:"gap_markers"`
}

// StopsStatus are the stops the agent holds back now: in their window
// (or waiting for a state check), and — with classification — waiting
// for Nova or held for a Nova operation.
type StopsStatus struct {
	Held        int `json:"held"`
	Classifying int `json:"classifying"`
	Domains     int `json:"domains_tracked"`
}

// status assembles the running agent's Status (any goroutine: it reads
// counters and the state files only).
func (d *Daemon) status() Status {
	st := Status{Source: "agent", Host: d.cfg.Host, Version: Version, PID: os.Getpid(), StartedAt: d.started,
		Now: time.Now(), ReconcileEnabled: d.cfg.Reconcile.Enabled, Insecure: d.securityWarnings()}
	st.NATS = &ConnStatus{Connected: d.nc.IsConnected(), Endpoint: d.cfg.NATS.URL()}
	if u := d.nc.ConnectedUrlRedacted(); u != "" {
		st.NATS.Endpoint = u
	}
	if err := d.nc.LastError(); err != nil {
		st.NATS.LastError = err.Error()
	}
	ls := d.lv.Status()
	st.Libvirt = &ConnStatus{Connected: ls.Connected, Endpoint: ls.URI, LastError: ls.LastLossReason}
	ob := d.outbox.Stats()
	st.Outbox = &OutboxStatus{Depth: ob.Depth, Bytes: ob.Bytes, MaxEvents: d.cfg.Outbox.MaxEvents, MaxBytes: d.cfg.Outbox.MaxBytes,
		Dropped: ob.Dropped, GapMarkers: ob.GapMarkers}
	st.Stops = &StopsStatus{Held: int(d.loop.stats.StopsHeld.Load()), Domains: int(d.loop.stats.Tracked.Load())}
	if d.loop.Classifying() {
		st.Stops.Classifying = int(d.loop.ClassifyStats().Classifying.Load())
	}
	st.Fence.Enabled = d.cfg.Fence.Enabled
	if f := d.fence; f != nil {
		s := &f.stats
		st.Fence.Action = string(f.core.Action)
		if p := s.State.Load(); p != nil {
			st.Fence.State = *p
		}
		if p := s.Reason.Load(); p != nil {
			st.Fence.Reason = *p
		}
		st.Fence.LeaseHeld = s.LeaseHeld.Load()
		if ns := s.LastAck.Load(); ns > 0 {
			age := bootNow().Sub(time.Unix(0, ns))
			st.Fence.LastRenewal = st.Now.Add(-age)
			secs := age.Seconds()
			st.Fence.LeaseAgeSeconds = &secs
		}
		st.Fence.Watchdog = watchdogName(s.Watchdog.Load())
		st.Fence.PausedDomains = int(s.PausedByHV.Load())
	}
	d.readReconcile(&st)
	st.assess(d.cfg)
	return st
}

func (d *Daemon) readReconcile(st *Status) { readReconcileInto(d.cfg, st) }

func readReconcileInto(cfg Config, st *Status) {
	rs, err := ReadReconcileStatus(cfg.StateDir)
	if err == nil {
		st.Reconcile = &rs
	} else if !errors.Is(err, fs.ErrNotExist) {
		st.Problems = append(st.Problems, err.Error())
	}
}

// watchdogNames are the hvguard_fence_watchdog_state label values, by
// FenceStats.Watchdog + 1.
var watchdogNames = []string{"none", "disarmed", "armed", "triggered", "malfunction"}

func watchdogName(v int32) string {
	if i := int(v) + 1; i >= 0 && i < len(watchdogNames) {
		return watchdogNames[i]
	}
	return "unknown"
}

// fencedStates are the fencing states that make a host "fenced".
var fencedStates = map[string]bool{
	string(fencing.StateFencing): true, string(fencing.StateFenced): true, string(fencing.StateAwaitingRelease): true,
}

// assess sets Health and adds the Problems (the reasons, in the order an
// operator should look at them).
func (st *Status) assess(cfg Config) {
	p := st.Problems
	if fencedStates[st.Fence.State] {
		p = append(p, fmt.Sprintf("host is %s (%s)", st.Fence.State, orNone(st.Fence.Reason)))
	}
	if st.Source != "agent" {
		p = append(p, "the agent is not running or does not answer: "+st.SourceError)
	} else {
		if st.Fence.Enabled && !fencedStates[st.Fence.State] && st.Fence.State != string(fencing.StateHealthy) {
			p = append(p, fmt.Sprintf("fencing state %s (%s)", st.Fence.State, orNone(st.Fence.Reason)))
		}
		if st.Fence.Enabled && st.Fence.Action != string(fencing.ActionNone) && !st.Fence.LeaseHeld && !fencedStates[st.Fence.State] {
			p = append(p, "the lease is not held")
		}
		if st.Fence.Enabled && cfg.Fence.WatchdogDevice != "" && st.Fence.Action != string(fencing.ActionNone) && st.Fence.Watchdog != "armed" {
			p = append(p, "hardware watchdog "+st.Fence.Watchdog+" (configured: "+cfg.Fence.WatchdogDevice+")")
		}
		if !st.NATS.Connected {
			p = append(p, "NATS disconnected"+detail(st.NATS.LastError)+": events kept in the outbox")
		}
		if !st.Libvirt.Connected {
			p = append(p, "libvirt disconnected"+detail(st.Libvirt.LastError))
		}
		o := st.Outbox
		if float64(o.Depth) >= OutboxNearBound*float64(o.MaxEvents) || float64(o.Bytes) >= OutboxNearBound*float64(o.MaxBytes) {
			p = append(p, fmt.Sprintf("outbox at %d events / %d bytes of %d / %d", o.Depth, o.Bytes, o.MaxEvents, o.MaxBytes))
		}
	}
	if st.ReconcileEnabled && st.Reconcile != nil && !st.Reconcile.Report.OK() {
		p = append(p, "last reconciliation NOT OK: "+st.Reconcile.Report.Summary())
	}
	switch {
	case fencedStates[st.Fence.State]:
		st.Health = HealthFenced
	case st.Source != "agent":
		st.Health = HealthDown
	case len(p) > 0:
		st.Health = HealthDegraded
	default:
		st.Health = HealthHealthy
	}
	if p == nil {
		p = []string{}
	}
	st.Problems = p
}

// detail is " (s)", or nothing for an empty s.
func detail(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func orNone(s string) string {
	if s == "" {
		return "no detail"
	}
	return s
}

// StatusFromFiles is the Status of an agent that does not answer (why:
// cause), from its state files: the fence state (fence.json, or its
// runtime copy of this boot) and the last reconciliation.
func StatusFromFiles(cfg Config, cause error, now time.Time) Status {
	st := Status{Source: "state-files", SourceError: cause.Error(), Host: cfg.Host, Now: now, ReconcileEnabled: cfg.Reconcile.Enabled,
		Insecure: cfg.SecurityWarnings()}
	st.Fence.Enabled = cfg.Fence.Enabled
	if cfg.Fence.Enabled {
		st.Fence.Action = cfg.Fence.Action
	}
	if pid, alive := lockHolder(cfg.StateDir); alive {
		st.PID = pid
		st.SourceError += fmt.Sprintf(" (pid %d holds %s: the agent runs but does not answer)", pid, StateDirLockFile)
	}
	files := fenceStateFiles{stateDir: cfg.StateDir, statePath: filepath.Join(cfg.StateDir, fenceStateFile),
		runtimePath: filepath.Join(cfg.Fence.RuntimeDir, fenceStateFile)}
	bootID, _ := readBootID()
	if d, _ := files.load(bootID, slog.New(slog.NewTextHandler(io.Discard, nil))); d != nil {
		st.Fence.State, st.Fence.Reason, st.Fence.PausedDomains = durableState(d), string(d.Reason), len(d.Paused)
		if d.HaveLease && !d.LastAck.IsZero() && d.BootID == bootID {
			age := bootNow().Sub(d.LastAck)
			st.Fence.LastRenewal = now.Add(-age)
			secs := age.Seconds()
			st.Fence.LeaseAgeSeconds = &secs
		}
	}
	readReconcileInto(cfg, &st)
	st.assess(cfg)
	return st
}

// durableState names what a fence state file says about the host.
func durableState(d *fencing.Durable) string {
	switch {
	case d.Declared && !d.Released:
		return string(fencing.StateAwaitingRelease)
	case d.Fenced:
		return string(fencing.StateFenced)
	case d.Held:
		return string(fencing.StateHeld)
	case d.Withdrawn || d.KeyWithdrawn:
		return "withdrawn"
	}
	return "unknown"
}

// lockHolder returns the pid holding state_dir's lock (flock) as
// /proc/locks shows it, and whether one does. The lock itself is never
// taken here: an agent starting meanwhile must not find it held.
func lockHolder(stateDir string) (int, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(stateDir, StateDirLockFile), &st); err != nil {
		return 0, false
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0, false
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
	ino := ":" + strconv.FormatUint(st.Ino, 10)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 6 && f[1] == "FLOCK" && strings.HasSuffix(f[5], ino) {
			if pid, err := strconv.Atoi(f[4]); err == nil {
				return pid, true
			}
		}
	}
	return 0, false
}

// serveStatus listens on status.socket (mode StatusSocketMode; a stale
// socket nobody answers on is replaced) and answers GET /status. It
// never fails the agent: a socket it cannot create is logged.
func (d *Daemon) serveStatus() (stop func()) {
	path := d.cfg.Status.Socket
	if path == "" {
		return func() {}
	}
	ln, err := listenUnix(path)
	if err != nil {
		d.log.Warn("status socket not served: `hvguard-agent status` reads the state files only", "socket", path, "err", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.status())
	})
	stopHTTP := serveHTTP(ln, mux, time.Second, d.log, "status socket")
	return func() {
		stopHTTP()
		_ = os.Remove(path)
	}
}

// listenUnix listens on a fresh socket at path, mode StatusSocketMode
// from its creation (no window where others may connect).
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another agent answers on it", path)
		}
		_ = os.Remove(path) // stale: its agent died
	}
	old := syscall.Umask(0o777 &^ StatusSocketMode)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, StatusSocketMode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// QueryStatus asks the agent listening on socket for its Status.
func QueryStatus(ctx context.Context, socket string) (Status, error) {
	var st Status
	c := &http.Client{Timeout: StatusTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return st, fmt.Errorf("status socket %s: %w", socket, unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status socket %s: %s", socket, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status socket %s: %w", socket, err)
	}
	return st, nil
}

func unwrapURLError(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}
