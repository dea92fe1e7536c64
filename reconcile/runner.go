package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"hvguard/lifecycle"
)

// Nova is what the runner asks Nova. openstack.Client implements it.
type Nova interface {
	// ListEvacuationsFrom returns every evacuation migration whose
	// source_compute is host, all pages, or an error: never a partial list.
	ListEvacuationsFrom(ctx context.Context, host string) ([]Migration, error)
	// ServerHosts looks up each server: an entry per UUID (Found=false for
	// a 404), or an error if any lookup failed otherwise.
	ServerHosts(ctx context.Context, uuids []string) (map[string]ServerLookup, error)
	// ServersOn lists every server Nova places on host (all pages), keyed
	// by UUID, each with host = that host; or an error: never a partial
	// list.
	ServersOn(ctx context.Context, host string) (map[string]ServerLookup, error)
	// Calls returns the number of API requests made so far (monotonic).
	Calls() uint64
}

// Reasoner is implemented by errors that know which global Reason they
// stand for (openstack.Error does). Other Nova errors count as
// ReasonNovaUnavailable.
type Reasoner interface {
	ReconcileReason() Reason
}

// Domains is the libvirt side. *libvirtx.Conn implements it.
type Domains interface {
	ListDomains(ctx context.Context) ([]lifecycle.DomainSnapshot, error)
	Metadata(ctx context.Context, uuid, namespaceURI string) (string, error)
	SetMetadata(ctx context.Context, uuid, namespaceURI, key, xml string) error
	Destroy(ctx context.Context, uuid string) error
}

// Runner timing and bounds.
const (
	// DefaultTimeout bounds one whole reconciliation. Nova's requests are
	// bounded on their own (openstack.DefaultRequestTimeout); this is the
	// backstop so a rejoin never waits on reconciliation for long.
	DefaultTimeout = 60 * time.Second
	// actionConcurrency bounds libvirt calls in flight (metadata reads,
	// destroys): destroying 200 QEMU processes one at a time takes
	// seconds; 8 at once keeps libvirtd responsive.
	actionConcurrency = 8
	// listingConcurrency bounds destination listings in flight: a
	// servers/detail page is heavier for nova-api than a lookup.
	listingConcurrency = 2
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// Hosts are this node's Nova host names (CONF.host of its
	// nova-compute; usually the agent's `host`). At least one.
	Hosts []string
	// Nodes are this machine's own host names (os.Hostname()); see
	// Input.Nodes. Optional.
	Nodes []string
	// Mode: ModeDestroy (default) or ModeReport.
	Mode Mode
	// Interval is the periodic interval, used for Report.RetryIn; 0 =
	// DefaultInterval.
	Interval time.Duration
	// Timeout bounds one reconciliation; 0 = DefaultTimeout.
	Timeout time.Duration
	// ErrNoMetadata is the sentinel (errors.Is) that Domains.Metadata wraps
	// when a domain has no metadata in a namespace: libvirtx.ErrNoMetadata.
	ErrNoMetadata error
	// ErrNotRunning is the sentinel Domains.Destroy wraps when the domain
	// is not running: libvirtx.ErrInvalidState. May be nil.
	ErrNotRunning error
	// Now is the clock; nil = time.Now.
	Now func() time.Time
}

// Runner performs reconciliations: the I/O around the pure Decide. Run is
// safe for concurrent use; runs are serialised.
type Runner struct {
	cfg  RunnerConfig
	nova Nova
	doms Domains
	log  *slog.Logger

	mu       sync.Mutex // serialises Run
	lastRun  time.Time
	failures int

	lastMu sync.Mutex
	last   *Report
}

// NewRunner checks cfg and returns a Runner.
func NewRunner(cfg RunnerConfig, nova Nova, doms Domains, log *slog.Logger) (*Runner, error) {
	if nova == nil || doms == nil {
		return nil, errors.New("reconcile: NewRunner needs a Nova and a Domains")
	}
	if cfg.ErrNoMetadata == nil {
		return nil, errors.New("reconcile: RunnerConfig.ErrNoMetadata is required (libvirtx.ErrNoMetadata)")
	}
	if len(newHostSet(cfg.Hosts)) == 0 {
		return nil, fmt.Errorf("reconcile: RunnerConfig.Hosts %q has no valid host name", cfg.Hosts)
	}
	if cfg.Mode != ModeDestroy && cfg.Mode != ModeReport {
		return nil, fmt.Errorf("reconcile: RunnerConfig.Mode %d is invalid", cfg.Mode)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, nova: nova, doms: doms, log: log}, nil
}

// Last returns the last Report (for `hvguard status`), false if none.
func (r *Runner) Last() (Report, bool) {
	r.lastMu.Lock()
	defer r.lastMu.Unlock()
	if r.last == nil {
		return Report{}, false
	}
	return *r.last, true
}

// Run performs one reconciliation and returns its report. It destroys
// (ModeDestroy) only what Decide decided, and only when Decide found no
// global problem.
func (r *Runner) Run(ctx context.Context, trigger Trigger) Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()

	now := r.cfg.Now()
	calls0 := r.nova.Calls()
	rep := Report{Hosts: slices.Clone(r.cfg.Hosts), Mode: r.cfg.Mode, Trigger: trigger, StartedAt: now}
	in := Input{Now: now, LastRun: r.lastRun, Hosts: r.cfg.Hosts, Nodes: r.cfg.Nodes}
	r.lastRun = now

	res := r.gather(ctx, &in, &rep)
	rep.Global, rep.GlobalDetail = res.Global, res.GlobalDetail
	rep.Results = make([]DomainReport, len(res.Decisions))
	for i, d := range res.Decisions {
		rep.Results[i] = DomainReport{DomainDecision: d}
	}
	if res.Global == ReasonNone {
		r.act(ctx, now, &rep)
	}
	r.finish(&rep, calls0)
	return rep
}

// gather reads libvirt and Nova into in and decides. A failure to list
// domains yields a Result with ReasonLibvirtUnavailable.
func (r *Runner) gather(ctx context.Context, in *Input, rep *Report) Result {
	snaps, err := r.doms.ListDomains(ctx)
	if err != nil {
		return Result{Global: ReasonLibvirtUnavailable, GlobalDetail: err.Error()}
	}
	in.Domains = make([]Domain, len(snaps))
	forEach(len(snaps), func(i int) {
		s := snaps[i]
		d := Domain{UUID: s.UUID, Name: s.Name, Active: !s.State.Off() && s.State != lifecycle.StateUnknown, State: s.State.String()}
		meta, err := r.doms.Metadata(ctx, s.UUID, NovaNamespace)
		switch {
		case err == nil:
			if _, perr := ParseNovaMetadata(meta); perr == nil {
				d.Nova = NovaInstance
				if !d.Active {
					d.MarkedMigration = r.markedMigration(ctx, s.UUID)
				}
			} else {
				r.log.Warn("domain has unparseable nova metadata", "domain_uuid", s.UUID, "reason", perr.Error())
			}
		case errors.Is(err, r.cfg.ErrNoMetadata):
			d.Nova = NotNova
		default:
			r.log.Warn("cannot read nova metadata", "domain_uuid", s.UUID, "reason", err.Error())
		}
		in.Domains[i] = d
	})
	rep.Domains = len(in.Domains)
	for _, d := range in.Domains {
		if d.Nova == NovaInstance {
			rep.NovaInstances++
		}
	}

	in.EvacuationsComplete = true
	for _, h := range newHostSet(r.cfg.Hosts) {
		ms, err := r.nova.ListEvacuationsFrom(ctx, h)
		if err != nil {
			in.EvacuationsComplete = false
			in.NovaFailure, in.NovaDetail = reasonOf(err), err.Error()
			break
		}
		in.Evacuations = append(in.Evacuations, ms...)
	}
	rep.Evacuations = len(in.Evacuations)

	if plan := PlanLookups(*in); len(plan.ByDest)+len(plan.Single) > 0 {
		servers, err := r.lookUp(ctx, plan, rep)
		if err != nil {
			in.NovaFailure, in.NovaDetail = reasonOf(err), err.Error()
		}
		in.Servers = servers
	}
	return Decide(*in)
}

// lookUp finds the candidates' current hosts: one listing per destination
// that received at least MinListingCandidates of them (O(pages), not one
// request per server), then a lookup for each candidate not found on its
// destination and for the rest. Any failure fails the whole call: the
// caller never decides from a partial set.
func (r *Runner) lookUp(ctx context.Context, plan LookupPlan, rep *Report) (map[string]ServerLookup, error) {
	dests := slices.Sorted(maps.Keys(plan.ByDest))
	single := slices.Clone(plan.Single)
	rep.Candidates, rep.Listings = len(single), len(dests)
	for _, us := range plan.ByDest {
		rep.Candidates += len(us)
	}
	out := make(map[string]ServerLookup)
	var (
		mu       sync.Mutex
		firstErr error
	)
	forEachN(len(dests), listingConcurrency, func(i int) {
		on, err := r.nova.ServersOn(ctx, dests[i])
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			return
		}
		for _, u := range plan.ByDest[dests[i]] {
			if s, ok := on[u]; ok {
				out[u] = s
			} else {
				single = append(single, u) // moved on, back, or deleted: ask Nova about it alone
			}
		}
	})
	if firstErr != nil {
		return nil, firstErr
	}
	if len(single) > 0 {
		slices.Sort(single)
		rep.Lookups = len(single)
		got, err := r.nova.ServerHosts(ctx, single)
		if err != nil {
			return nil, err
		}
		for u, s := range got {
			out[u] = s
		}
	}
	return out, nil
}

// markedMigration returns the migration id of the domain's hvguard mark,
// 0 if it has none (or it cannot be read: then it is looked up again).
func (r *Runner) markedMigration(ctx context.Context, uuid string) int64 {
	x, err := r.doms.Metadata(ctx, uuid, MarkNamespace)
	if err != nil {
		return 0
	}
	m, err := ParseMark(x)
	if err != nil {
		return 0
	}
	return m.MigrationID
}

func reasonOf(err error) Reason {
	var rs Reasoner
	if errors.As(err, &rs) {
		if r := rs.ReconcileReason(); r.Global() {
			return r
		}
	}
	return ReasonNovaUnavailable
}

// act carries out the Destroy decisions: power off what runs, then mark.
func (r *Runner) act(ctx context.Context, now time.Time, rep *Report) {
	var idx []int
	for i := range rep.Results {
		if rep.Results[i].Decision == DecisionDestroy {
			idx = append(idx, i)
		}
	}
	forEach(len(idx), func(k int) {
		d := &rep.Results[idx[k]]
		log := r.log.With("domain_uuid", d.UUID, "domain_name", d.Name, "reason", d.Reason.String())
		if ev := d.Evidence; ev != nil {
			log = log.With("migration_id", ev.MigrationID, "dest_compute", ev.DestCompute, "server_host", ev.ServerHost)
		}
		if r.cfg.Mode == ModeReport {
			d.Outcome = OutcomeWouldDestroy
			log.Warn("stale copy of an evacuated instance (report mode: not destroyed)")
			return
		}
		d.Outcome = OutcomeAlreadyOff
		if d.Active {
			err := r.doms.Destroy(ctx, d.UUID)
			switch {
			case err == nil:
				d.Outcome = OutcomeDestroyed
			case r.cfg.ErrNotRunning != nil && errors.Is(err, r.cfg.ErrNotRunning):
				// Stopped meanwhile: off is what we want.
			default:
				d.Outcome, d.Error = OutcomeDestroyFailed, err.Error()
				log.Error("destroying stale copy of an evacuated instance failed", "error", err.Error())
				return
			}
		}
		if old, err := r.doms.Metadata(ctx, d.UUID, MarkNamespace); err == nil && d.Outcome == OutcomeAlreadyOff {
			if m, perr := ParseMark(old); perr == nil && d.Evidence != nil && m.MigrationID == d.Evidence.MigrationID {
				d.Marked = true // marked by an earlier run: do not rewrite the definition every period
				return
			}
		}
		x, err := MarkXML(markFrom(d.DomainDecision, d.Outcome, now))
		if err == nil {
			err = r.doms.SetMetadata(ctx, d.UUID, MarkNamespace, MarkKey, x)
		}
		if err != nil {
			d.Error = "mark: " + err.Error()
			log.Error("marking stale domain failed", "error", err.Error())
		} else {
			d.Marked = true
		}
		if d.Outcome == OutcomeDestroyed {
			log.Warn("destroyed stale copy of an instance Nova evacuated elsewhere")
		}
	})
}

// finish fills the counters, the backoff suggestion, logs and stores rep.
func (r *Runner) finish(rep *Report, calls0 uint64) {
	for _, d := range rep.Results {
		switch d.Decision {
		case DecisionKeep:
			rep.Kept++
		case DecisionSkip:
			rep.Skipped++
		}
		switch d.Outcome {
		case OutcomeDestroyed:
			rep.Destroyed++
		case OutcomeAlreadyOff:
			rep.AlreadyOff++
		case OutcomeWouldDestroy:
			rep.WouldDestroy++
		case OutcomeDestroyFailed:
			rep.Failed++
		}
	}
	rep.APICalls = int(r.nova.Calls() - calls0)
	rep.FinishedAt = r.cfg.Now()
	if rep.OK() {
		r.failures = 0
	} else {
		r.failures++
	}
	rep.ConsecutiveFailures = r.failures
	rep.RetryIn = NextDelay(r.cfg.Interval, r.failures)

	lvl := slog.LevelInfo
	if !rep.OK() {
		lvl = slog.LevelWarn
	}
	r.log.Log(context.Background(), lvl, rep.Summary(), "reason", rep.Global.String(), "trigger", string(rep.Trigger),
		"destroyed", rep.Destroyed, "skipped", rep.Skipped, "retry_in", rep.RetryIn.String())

	cp := *rep
	cp.Results = slices.Clone(rep.Results)
	r.lastMu.Lock()
	r.last = &cp
	r.lastMu.Unlock()
}

// forEach runs fn(0..n-1) with at most actionConcurrency in flight.
func forEach(n int, fn func(i int)) { forEachN(n, actionConcurrency, fn) }

// forEachN runs fn(0..n-1) with at most limit in flight.
func forEachN(n, limit int, fn func(i int)) {
	if n == 0 {
		return
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}
