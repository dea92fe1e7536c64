package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"hvguard/controller"
)

// StatusPath is the status endpoint's path on metrics.listen.
const StatusPath = "/status"

// Status is what /status answers (and `hvguard-controller status --json`
// prints).
type Status struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	// Role is "leader" (holds the lock and may act now) or "standby".
	Role string `json:"role"`
	// Leader and LeaderTerm: the lock's holder as this controller's watch
	// shows it ("" if none).
	Leader        string  `json:"leader"`
	LeaderTerm    uint64  `json:"leader_term"`
	NATSConnected bool    `json:"nats_connected"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Health is "ok" or why /healthz fails.
	Health string `json:"health"`
	// Tracker is the lease view (nil while NATS or the bucket is
	// unavailable at start).
	Tracker *controller.TrackerView `json:"tracker,omitempty"`
}

func (d *Daemon) status() (Status, error) {
	now := d.now()
	st := Status{ID: d.cfg.ID, Version: Version, Role: "standby", NATSConnected: d.nc.IsConnected(),
		UptimeSeconds: now.Sub(d.start).Seconds(), Health: "ok"}
	if err := d.healthy(); err != nil {
		st.Health = err.Error()
	}
	if !d.started.Load() {
		return st, nil
	}
	if d.lr.MayAct(now) {
		st.Role = "leader"
	}
	st.Leader, st.LeaderTerm = d.lr.Holder()
	ctx, cancel := context.WithTimeout(context.Background(), ViewTimeout)
	defer cancel()
	v, err := d.run.View(ctx)
	if err != nil {
		return st, err
	}
	st.Tracker = &v
	return st, nil
}

func (d *Daemon) serveStatus(w http.ResponseWriter, _ *http.Request) {
	st, err := d.status()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// FetchStatus asks the controller listening on addr (host:port) for its
// status.
func FetchStatus(ctx context.Context, addr string) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+StatusPath, nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("no controller answers on %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return st, fmt.Errorf("read status from %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("controller on %s: %s: %s", addr, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("status from %s: %w", addr, err)
	}
	return st, nil
}

// PrintStatus writes st for a human.
func PrintStatus(w io.Writer, st Status) {
	leader := "none"
	if st.Leader != "" {
		leader = fmt.Sprintf("%s (term %d)", st.Leader, st.LeaderTerm)
	}
	nats := "connected"
	if !st.NATSConnected {
		nats = "DISCONNECTED"
	}
	fmt.Fprintf(w, "controller %s (%s): %s, up %s, NATS %s, health: %s\n", st.ID, st.Version, st.Role,
		(time.Duration(st.UptimeSeconds) * time.Second).String(), nats, st.Health)
	fmt.Fprintf(w, "leader:     %s\n", leader)
	if st.Tracker == nil {
		fmt.Fprintln(w, "lease view: not available yet (waiting for NATS and the lease bucket)")
		return
	}
	v := st.Tracker
	hold := "not holding"
	if v.Holding {
		hold = "HOLDING: declaring nothing"
	}
	fmt.Fprintf(w, "guard:      %d silent, threshold %d, %s\n", v.Silent, v.Threshold, hold)
	fmt.Fprintf(w, "hosts:      %d\n", len(v.Hosts))
	if len(v.Hosts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tLEASE\tEPOCH\tBACKSTOP\tGRACE\tLAST RENEWAL\tNOTE")
	for _, h := range v.Hosts {
		note := h.Reason
		switch {
		case h.Refused != "":
			note = "REFUSED: " + h.Refused
		case h.Silent:
			note = strings.TrimSpace("silent " + note)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s ago\t%s\n", h.Host, h.State, h.Epoch, orDash(string(h.Backstop)),
			secs(h.GraceSeconds), secs(h.LastRenewalSeconds), note)
	}
	_ = tw.Flush()
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
