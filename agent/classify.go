package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"hvguard/classify"
	"hvguard/lifecycle"
	"hvguard/openstack"
	"hvguard/proto"
)

// Nova-aware stop classification in the event loop (issue 6,
// docs/classification.md "Agent wiring"). The Loop owns a classify.Classifier
// like it owns the debouncer: only the loop goroutine touches it; its Nova
// queries run on goroutines bounded by QueryTimeout and answer through
// clsResults into the loop's select. Nothing here blocks the loop.
//
// A stop the debouncer reports is held (not published) while it is
// classified; later reports of that domain wait behind it, so per-domain
// order is kept. A start, resume or reboot of the domain ends the
// classification as rebooted (the start is folded into that report).

// Nova is what classification asks Nova; *openstack.Client implements it.
type Nova interface {
	ServersOnHost(ctx context.Context, host string) ([]openstack.ServerState, error)
	InstanceActions(ctx context.Context, uuid string) ([]openstack.InstanceAction, error)
}

// ClassifyConfig turns classification on in a Loop (LoopConfig.Classify).
type ClassifyConfig struct {
	Core     classify.Config // the classifier's bounds (zero fields: defaults)
	Nova     Nova
	NovaHost string // this node's name in Nova (the servers listing's host filter)
}

// clsResult is a Nova answer for the classifier.
type clsResult struct {
	token   uint64
	uuid    string // actions only
	servers []classify.Server
	actions []classify.Action
	err     error
}

// classifying is the loop's classification state (nil: classification off).
type classifying struct {
	cls      *classify.Classifier
	nova     Nova
	novaHost string
	timeout  time.Duration
	results  chan clsResult
	// held are the debouncer's stop reports being classified; after the
	// later reports of those domains, in order, published after the
	// classified stop. alive is the start/resume/reboot report folded into
	// a rebooted classification (its state is the report's).
	held  map[string]lifecycle.Decision
	after map[string][]lifecycle.Decision
	alive map[string]lifecycle.Decision
	// draining: the loop is shutting down (drainCls); a stop reported now
	// (one that was queued behind a drained stop) is published at once as
	// unknown/agent-stopping instead of starting a classification that
	// could never end.
	draining bool
}

// clsResultBuffer bounds the Nova answers waiting for the loop: at most one
// servers listing is in flight, plus one actions query per stop whose view
// needs it; a goroutine whose answer does not fit waits (it never blocks
// the loop).
const clsResultBuffer = 16

func newClassifying(cfg *ClassifyConfig) (*classifying, error) {
	if cfg.Nova == nil {
		return nil, errors.New("classification: no Nova client")
	}
	cls, err := classify.New(cfg.Core)
	if err != nil {
		return nil, err
	}
	return &classifying{
		cls: cls, nova: cfg.Nova, novaHost: cfg.NovaHost, timeout: cls.Config().QueryTimeout,
		results: make(chan clsResult, clsResultBuffer),
		held:    map[string]lifecycle.Decision{}, after: map[string][]lifecycle.Decision{},
		alive: map[string]lifecycle.Decision{},
	}, nil
}

// ClassifyStats are classification's counters for the metrics.
type ClassifyStats struct {
	Classifications sync.Map // "classification/reason" -> *atomic.Uint64
	Holds           sync.Map // Nova task -> *atomic.Uint64
	NovaQueries     sync.Map // "kind/result" -> *atomic.Uint64
	Classifying     atomic.Int64
	// Queued: reports of domains whose stop is being classified, waiting
	// to be published after it (in order).
	Queued atomic.Int64
}

// queued counts the reports waiting behind stops being classified.
func (c *classifying) queued() int {
	n := 0
	for _, q := range c.after {
		n += len(q)
	}
	return n
}

func count(m *sync.Map, key string) {
	v, _ := m.LoadOrStore(key, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// route handles a debouncer report while classification is on. It returns
// true when the report was taken (held, queued or folded), false when it is
// to be published as it is.
func (l *Loop) route(ctx context.Context, d *lifecycle.Decision) bool {
	c := l.cls
	now := l.now()
	if c.cls.Classifying(d.UUID) {
		switch d.Transition {
		case lifecycle.TransitionStarted, lifecycle.TransitionResumed, lifecycle.TransitionRebooted:
			c.alive[d.UUID] = *d
			l.handleCls(ctx, c.cls.Alive(d.UUID, now))
		default:
			c.after[d.UUID] = append(c.after[d.UUID], *d)
		}
		return true
	}
	if d.Transition != lifecycle.TransitionStopped {
		return false
	}
	if c.draining {
		l.publishClassified(d, classify.Unknown, classify.ReasonAgentStopping, "queued", true)
		return true
	}
	c.held[d.UUID] = *d
	l.handleCls(ctx, c.cls.Add(classify.Stop{UUID: d.UUID, Detail: classify.ParseDetail(d.Cause.Detail), Began: d.Cause.At}, now))
	return true
}

// handleCls carries out the classifier's decisions. It works on a copy:
// the classifier reuses its decision slice, and a report may feed queued
// reports back through report (a later stop is classified in turn).
func (l *Loop) handleCls(ctx context.Context, ds []classify.Decision) {
	for _, x := range slices.Clone(ds) {
		switch x.Op {
		case classify.OpQueryServers:
			l.queryServers(ctx, x.Token)
		case classify.OpQueryActions:
			l.queryActions(ctx, x.Token, x.UUID)
		case classify.OpHold:
			task := string(x.Task)
			if !x.Task.Known() {
				task = "other" // a newer Nova's task: keep the label set bounded
			}
			count(&l.clsStats.Holds, task)
			l.log.Info("stop held: Nova operation in flight", "domain_uuid", x.UUID, "nova_task", string(x.Task),
				"nova_vm_state", string(x.VMState), "libvirt_detail", string(x.Detail), "stopped_at", x.Began)
		case classify.OpReport:
			l.reportClassified(ctx, x)
		}
	}
}

// reportClassified publishes a held stop with its classification, then the
// domain's reports that waited behind it.
func (l *Loop) reportClassified(ctx context.Context, x classify.Decision) {
	c := l.cls
	d, ok := c.held[x.UUID]
	alive, folded := c.alive[x.UUID]
	after := c.after[x.UUID]
	delete(c.held, x.UUID)
	delete(c.alive, x.UUID)
	delete(c.after, x.UUID)
	if !ok {
		return // cannot happen: every Add has its held report
	}
	if x.Classification == classify.Rebooted {
		d.Transition = lifecycle.TransitionRebooted
		switch {
		case folded:
			d.State = alive.State
		default: // operation-completed: Nova read power_state running from the hypervisor
			d.State = lifecycle.StateRunning
		}
		// A hard reboot on the libvirt driver undefines and defines the
		// domain again: part of the reboot, not news.
		after = slices.DeleteFunc(after, func(q lifecycle.Decision) bool {
			return q.Transition == lifecycle.TransitionUndefined || q.Transition == lifecycle.TransitionDefined
		})
	}
	l.publishClassified(&d, x.Classification, x.Reason, "held", x.Held, "nova_task", string(x.Task), "nova_vm_state", string(x.VMState))
	for i := range after {
		l.report(ctx, &after[i])
	}
}

// publishClassified counts, logs and publishes a stop (or the rebooted it
// became) with its classification; attrs add to the log line.
func (l *Loop) publishClassified(d *lifecycle.Decision, cl classify.Classification, r classify.Reason, attrs ...any) {
	count(&l.clsStats.Classifications, string(cl)+"/"+string(r))
	l.log.Info("stop classified", append([]any{"domain_uuid", d.UUID, "domain", d.Name,
		"classification", string(cl), "classification_reason", string(r), "libvirt_detail", d.Cause.Detail}, attrs...)...)
	l.publish(d, proto.Classification(cl), string(r))
}

// drainCls publishes every stop still being classified as unknown with
// reason agent-stopping (graceful shutdown: a held stop is never lost),
// each followed by the reports queued behind it, in order; a queued stop
// is published at once as unknown/agent-stopping too (draining), not
// classified again. Queries in flight are abandoned.
func (l *Loop) drainCls(ctx context.Context) {
	if l.cls == nil {
		return
	}
	l.cls.draining = true
	l.handleCls(ctx, l.cls.cls.Drain(l.now()))
}

// novaQuery runs q off the loop with a context bounded by the classifier's
// QueryTimeout, counts it and hands the answer to the loop.
func (l *Loop) novaQuery(ctx context.Context, kind string, q func(ctx context.Context) clsResult) {
	c := l.cls
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		qctx, cancel := context.WithTimeout(ctx, c.timeout)
		r := q(qctx)
		slow := errors.Is(qctx.Err(), context.DeadlineExceeded)
		cancel()
		result := "ok"
		switch {
		case r.err != nil && slow:
			result = "timeout"
			r.err = errors.Join(classify.ErrNovaSlow, r.err)
		case r.err != nil:
			result = "error"
		}
		count(&l.clsStats.NovaQueries, kind+"/"+result)
		if r.err != nil && ctx.Err() == nil {
			l.log.Warn("Nova query for stop classification failed", "query", kind, "uuid", r.uuid, "err", r.err)
		}
		select {
		case c.results <- r:
		case <-ctx.Done():
		}
	}()
}

func (l *Loop) queryServers(ctx context.Context, token uint64) {
	l.novaQuery(ctx, "servers", func(ctx context.Context) clsResult {
		ss, err := l.cls.nova.ServersOnHost(ctx, l.cls.novaHost)
		return clsResult{token: token, servers: openstack.ClassifyServers(ss), err: err}
	})
}

func (l *Loop) queryActions(ctx context.Context, token uint64, uuid string) {
	l.novaQuery(ctx, "actions", func(ctx context.Context) clsResult {
		as, err := l.cls.nova.InstanceActions(ctx, uuid)
		return clsResult{token: token, uuid: uuid, actions: openstack.ClassifyActions(as), err: err}
	})
}

// answer hands a Nova answer to the classifier.
func (l *Loop) answer(ctx context.Context, r clsResult) {
	now := l.now()
	if r.uuid != "" {
		l.handleCls(ctx, l.cls.cls.ActionsResult(r.token, r.uuid, r.actions, r.err, now))
		return
	}
	l.handleCls(ctx, l.cls.cls.ServersResult(r.token, r.servers, r.err, now))
}
