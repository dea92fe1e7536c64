package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/proto"
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
	// Events is the fleet view from the event stream (nil before start).
	Events *EventsStatus `json:"events,omitempty"`
	// Host is one host's domains and recent events (status HOST).
	Host *HostDetail `json:"host,omitempty"`
	// InstanceRecovery: recent stops and what was done (nil: mode off).
	InstanceRecovery *controller.InstanceRecoveryView `json:"instance_recovery,omitempty"`
	// Recovery is host recovery (nil before start).
	Recovery *RecoveryStatus `json:"recovery,omitempty"`
	// Insecure lists the insecure settings of the configuration
	// (Config.SecurityWarnings).
	Insecure []string `json:"insecure,omitempty"`
}

// RecoveryStatus is host recovery as this controller runs it: the leader
// holds every record of the bucket; a standby holds none (the leader's
// status shows them).
type RecoveryStatus struct {
	Mode     string `json:"mode"`
	Release  string `json:"release"`
	InFlight int    `json:"evacuations_in_flight"`
	// Hosts: each recovery (the durable record) and what it waits for
	// now; hosts refused before any recovery started have no record.
	Hosts []HostRecovery `json:"hosts"`
}

// HostRecovery is one host's recovery.
type HostRecovery struct {
	Host string `json:"host"`
	// Record is the durable record (nil: refused or queued, no record).
	Record *recovery.Record `json:"record,omitempty"`
	// Waiting says why nothing happens now ("" if it proceeds).
	Waiting string `json:"waiting,omitempty"`
}

func (d *Daemon) recoveryStatus() *RecoveryStatus {
	rs := &RecoveryStatus{Mode: d.cfg.Recovery.Mode, Release: d.cfg.Recovery.Release, InFlight: d.rec.InFlight(), Hosts: []HostRecovery{}}
	recs, why := d.rec.Records()
	seen := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		seen[r.Host] = true
		rs.Hosts = append(rs.Hosts, HostRecovery{Host: r.Host, Record: r, Waiting: why[r.Host]})
	}
	for h, w := range why {
		if !seen[h] {
			rs.Hosts = append(rs.Hosts, HostRecovery{Host: h, Waiting: w})
		}
	}
	sort.Slice(rs.Hosts, func(i, j int) bool { return rs.Hosts[i].Host < rs.Hosts[j].Host })
	return rs
}

// EventsStatus summarises the event-stream consumer and the fleet view.
type EventsStatus struct {
	Consumer       string `json:"consumer"`
	Lag            int64  `json:"lag"`
	AckPending     int64  `json:"ack_pending"`
	Applied        uint64 `json:"applied"`
	Duplicates     uint64 `json:"duplicates"`
	OldIncarnation uint64 `json:"old_incarnation"`
	Missing        uint64 `json:"missing"`
	NewIncarnation uint64 `json:"new_incarnation"`
	Poison         uint64 `json:"poison"`
	// Refused: events refused by their signature, by reason.
	Refused    map[string]uint64 `json:"refused,omitempty"`
	StaleHosts int               `json:"stale_hosts"`
	Hosts      []HostEvents      `json:"hosts"`
}

// HostEvents is one host's line of the fleet view.
type HostEvents struct {
	Host        string `json:"host"`
	Incarnation string `json:"incarnation"`
	LastSeq     uint64 `json:"last_seq"`
	Stale       bool   `json:"stale"`
	StaleReason string `json:"stale_reason,omitempty"`
	Domains     int    `json:"domains"`
	Running     int    `json:"running"`
	// LastEventSeconds: since the last event was received.
	LastEventSeconds float64 `json:"last_event_seconds"`
}

// HostDetail is status HOST.
type HostDetail struct {
	HostEvents
	DomainList []controller.DomainView `json:"domain_list"`
	History    []controller.HostEvent  `json:"history"`
}

func (d *Daemon) events(host string) (*EventsStatus, *HostDetail) {
	c := d.cons
	es := &EventsStatus{Consumer: controller.DurableName(d.cfg.ID), Lag: c.Stats.Lag.Load(), AckPending: c.Stats.AckPending.Load(),
		Applied: c.Stats.Applied.Load(), Duplicates: c.Stats.Duplicates.Load(), OldIncarnation: c.Stats.OldIncarnation.Load(),
		Missing: c.Stats.Missing.Load(), NewIncarnation: c.Stats.NewIncarnation.Load(), Poison: c.Stats.Poison.Load(), Hosts: []HostEvents{}}
	for i, r := range controller.RefusedReasons {
		if n := c.Stats.Refused[i].Load(); n > 0 {
			if es.Refused == nil {
				es.Refused = map[string]uint64{}
			}
			es.Refused[r] = n
		}
	}
	var detail *HostDetail
	now := time.Now()
	c.View(func(f *controller.Fleet) {
		es.StaleHosts = f.StaleHosts()
		for _, name := range f.Hosts() {
			h := f.Host(name)
			he := HostEvents{Host: name, Incarnation: proto.Incarnation(h.Incarnation).String(), LastSeq: h.LastSeq, Stale: h.Stale,
				StaleReason: h.StaleReason, Domains: len(h.Domains), LastEventSeconds: now.Sub(h.LastEvent).Seconds()}
			for _, dv := range h.Domains {
				if dv.State == "running" {
					he.Running++
				}
			}
			es.Hosts = append(es.Hosts, he)
			if name == host {
				detail = &HostDetail{HostEvents: he, History: append([]controller.HostEvent(nil), h.History...)}
				for _, dv := range h.Domains {
					detail.DomainList = append(detail.DomainList, *dv)
				}
				sort.Slice(detail.DomainList, func(i, j int) bool { return detail.DomainList[i].Name < detail.DomainList[j].Name })
			}
		}
	})
	return es, detail
}

func (d *Daemon) status(host string) (Status, error) {
	now := d.now()
	st := Status{ID: d.cfg.ID, Version: Version, Role: "standby", NATSConnected: d.nc.IsConnected(),
		UptimeSeconds: now.Sub(d.start).Seconds(), Health: "ok", Insecure: d.securityWarnings()}
	if err := d.healthy(); err != nil {
		st.Health = err.Error()
	}
	if !d.started.Load() {
		return st, nil
	}
	if d.lr.MayAct(now) {
		st.Role = "leader"
	}
	st.Events, st.Host = d.events(host)
	if d.ir != nil {
		v := d.ir.View()
		st.InstanceRecovery = &v
	}
	st.Recovery = d.recoveryStatus()
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

func (d *Daemon) serveStatus(w http.ResponseWriter, r *http.Request) {
	host := r.URL.Query().Get("host")
	st, err := d.status(host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// FetchStatus asks the controller listening on addr (host:port) for its
// status, with host's detail if host is not empty.
func FetchStatus(ctx context.Context, addr, host string) (Status, error) {
	var st Status
	u := "http://" + addr + StatusPath
	if host != "" {
		u += "?host=" + url.QueryEscape(host)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
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
	printLeases(w, st)
	printRecovery(w, st)
	printEvents(w, st.Events)
	printInstanceRecovery(w, st.InstanceRecovery)
}

// phaseSplit says when each phase of r was entered, after its start
// ("force-down +0s, list +0.4s, ...").
func phaseSplit(r *recovery.Record) string {
	type at struct {
		p recovery.Phase
		t time.Time
	}
	var ps []at
	for p, t := range r.PhaseAt {
		ps = append(ps, at{p, t})
	}
	order := map[recovery.Phase]int{}
	for i, p := range []recovery.Phase{recovery.PhaseNotified, recovery.PhaseForceDown, recovery.PhaseList, recovery.PhaseDetach,
		recovery.PhaseEvacuate, recovery.PhaseMasakari, recovery.PhaseRecovered, recovery.PhaseStopped, recovery.PhaseReleasing, recovery.PhaseDone} {
		order[p] = i
	}
	sort.Slice(ps, func(i, j int) bool {
		return ps[i].t.Before(ps[j].t) || ps[i].t.Equal(ps[j].t) && order[ps[i].p] < order[ps[j].p]
	})
	parts := make([]string, len(ps))
	for i, x := range ps {
		parts[i] = fmt.Sprintf("%s +%s", x.p, x.t.Sub(r.StartedAt).Round(100*time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

// printRecovery writes host recovery: per host the phase, the instances
// and why.
func printRecovery(w io.Writer, st Status) {
	rs := st.Recovery
	if rs == nil {
		return
	}
	fmt.Fprintf(w, "recovery:   mode %s, release %s, %d evacuations in flight", rs.Mode, rs.Release, rs.InFlight)
	if st.Role != "leader" {
		fmt.Fprint(w, " (a standby runs none: see the leader's status)")
	}
	fmt.Fprintln(w)
	if len(rs.Hosts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tPHASE\tEPOCH\tFORCED DOWN\tINSTANCES (done/in flight/failed/unrecoverable/total)\tWHY")
	for _, h := range rs.Hosts {
		r := h.Record
		if r == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%s\n", h.Host, h.Waiting)
			continue
		}
		var done, fly, failed, unrec int
		for _, in := range r.Instances {
			switch in.Evac {
			case recovery.Completed, recovery.Skipped:
				done++
			case recovery.Intent, recovery.Requested:
				fly++
			case recovery.Failed:
				failed++
			case recovery.Unrecoverable:
				unrec++
			}
		}
		why := r.Reason
		if h.Waiting != "" {
			why = h.Waiting
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d/%d/%d/%d/%d\t%s\n", r.Host, r.Phase, r.Epoch, orDash(string(r.ForceDown)), done, fly, failed, unrec, len(r.Instances), why)
		for _, u := range r.Unrecoverable() {
			fmt.Fprintf(tw, "\t\t\t\tNOT RECOVERED\t%s\n", u)
		}
		if split := phaseSplit(r); split != "" {
			fmt.Fprintf(tw, "\t\t\t\tTIMES\t%s\n", split)
		}
	}
	_ = tw.Flush()
}

func printLeases(w io.Writer, st Status) {
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
	for _, ins := range st.Insecure {
		fmt.Fprintf(w, "INSECURE:   %s\n", ins)
	}
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
	fmt.Fprintf(w, "guard:      %d silent, threshold %d, %s%s\n", v.Silent, v.Threshold, hold, guardVersions(v.GuardVersions))
	fmt.Fprintf(w, "hosts:      %d\n", len(v.Hosts))
	if len(v.Hosts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tLEASE\tFENCE\tEPOCH\tBACKSTOP\tGRACE\tLAST RENEWAL\tAGENT\tNOTE")
	for _, h := range v.Hosts {
		note := h.Reason
		switch {
		case h.KeyDeleted:
			note = "UNPROTECTED (lease key deleted: never declared; counted silent until its agent re-creates it)"
		case h.State == fencing.LeaseWithdrawn:
			note = "UNPROTECTED (agent withdrew; not declared, not recovered): " + h.Reason
		case h.Refused != "":
			note = "REFUSED: " + h.Refused
		case h.RollbackGated:
			note = "NOT DECLARED (the lease stream rolled back; no beacon of it proved its record since): check the host is down, then hvguard-controller confirm-rollback " + h.Host
		case h.Silent:
			note = strings.TrimSpace("silent " + note)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s ago\t%s\t%s\n", h.Host, h.State, orDash(string(h.FenceState)), h.Epoch, orDash(string(h.Backstop)),
			secs(h.GraceSeconds), secs(h.LastRenewalSeconds), orDash(h.AgentVersion), note)
	}
	_ = tw.Flush()
}

// guardVersions formats the guard versions kept in force ("" if none).
func guardVersions(vs []fencing.GuardVersion) string {
	if len(vs) == 0 {
		return ""
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("v%d:%d", v.Version, v.Threshold)
	}
	return "; versions in force (version:threshold) " + strings.Join(parts, " ")
}

// printEvents writes the fleet view's summary.
func printEvents(w io.Writer, es *EventsStatus) {
	if es == nil {
		return
	}
	fmt.Fprintf(w, "events:     consumer %s, lag %d, in flight %d; applied %d, duplicates %d, old incarnation %d, missing %d, new incarnation %d, POISON %d\n",
		es.Consumer, es.Lag, es.AckPending, es.Applied, es.Duplicates, es.OldIncarnation, es.Missing, es.NewIncarnation, es.Poison)
	if len(es.Refused) > 0 {
		fmt.Fprintf(w, "events REFUSED (signature; never applied): %v\n", es.Refused)
	}
	fmt.Fprintf(w, "fleet view: %d hosts, %d stale\n", len(es.Hosts), es.StaleHosts)
	if len(es.Hosts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tDOMAINS\tRUNNING\tSEQ\tINCARNATION\tLAST EVENT\tVIEW")
	for _, h := range es.Hosts {
		view := "complete"
		if h.Stale {
			view = "STALE: " + h.StaleReason
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s ago\t%s\n", h.Host, h.Domains, h.Running, h.LastSeq, h.Incarnation, secs(h.LastEventSeconds), view)
	}
	_ = tw.Flush()
}

// PrintHost writes status HOST: the host's domains and recent events.
func PrintHost(w io.Writer, host string, st Status) {
	h := st.Host
	if h == nil {
		fmt.Fprintf(w, "host %s: no event seen from it (controller %s)\n", host, st.ID)
		return
	}
	view := "complete"
	if h.Stale {
		view = "STALE: " + h.StaleReason
	}
	fmt.Fprintf(w, "host %s: incarnation %s, seq %d, %d domains (%d running), view %s\n", h.Host, h.Incarnation, h.LastSeq, h.Domains, h.Running, view)
	if st.Tracker != nil {
		for _, l := range st.Tracker.Hosts {
			if l.Host == host {
				fmt.Fprintf(w, "lease:  %s, epoch %d, backstop %s, last renewal %s ago %s\n", l.State, l.Epoch, orDash(string(l.Backstop)), secs(l.LastRenewalSeconds), l.Reason)
			}
		}
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tUUID\tSTATE\tLAST\tREASON\tCLASSIFICATION")
	for _, dv := range h.DomainList {
		cl := "-"
		if dv.Classification != "" {
			cl = dv.Classification + "/" + dv.ClassificationReason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", orDash(dv.Name), dv.UUID, dv.State, dv.Transition, orDash(dv.Reason), cl)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "recent events (oldest first):")
	tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RECEIVED\tSEQ\tDOMAIN\tTRANSITION\tVERDICT\tNOTE")
	for _, e := range h.History {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", e.ReceivedAt.Local().Format("15:04:05.000"), e.Seq, orDash(e.Domain), e.Transition, e.Verdict, e.Note)
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
