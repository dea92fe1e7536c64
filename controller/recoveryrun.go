package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// RecoveryCloud is what host recovery calls: the openstack adapter
// (openstack.Recovery) behind a thin conversion to the core's types. Its
// errors may carry the core's classification (RecoveryKind); anything
// else counts as recovery.ErrOther (outcome unknown).
type RecoveryCloud interface {
	ForceDown(ctx context.Context, novaHost string, down bool) error
	HostServers(ctx context.Context, novaHost string) ([]recovery.Server, error)
	Server(ctx context.Context, id string) (recovery.Server, error)
	Volume(ctx context.Context, id string) (recovery.VolumeInfo, error)
	// RemoveAttachment removes attachmentID of volumeID, which must be
	// on host (the adapter refuses another host's).
	RemoveAttachment(ctx context.Context, volumeID, attachmentID, host string) error
	Evacuate(ctx context.Context, serverID string) error
	Migrations(ctx context.Context, novaHost string, since time.Time) ([]recovery.Migration, error)
	HostNotification(ctx context.Context, novaHost string, at time.Time) (string, error)
	Notification(ctx context.Context, id string) (string, error)
}

// RecoveryError is an error classified for the core.
type RecoveryError struct {
	Kind recovery.ErrKind
	Err  error
}

func (e *RecoveryError) Error() string { return e.Err.Error() }
func (e *RecoveryError) Unwrap() error { return e.Err }

// RecoveryKind classifies err for the core (recovery.ErrOther unless it
// wraps a *RecoveryError).
func RecoveryKind(err error) recovery.ErrKind {
	var re *RecoveryError
	switch {
	case err == nil:
		return recovery.ErrNone
	case errors.As(err, &re):
		return re.Kind
	}
	return recovery.ErrOther
}

// Runner constants of host recovery.
const (
	// RecoveryTick is how often the recovery loop looks at the tracker's
	// declarations and its workers: a declared host's recovery starts
	// within it (the 60 s target of issue 13 is far above).
	RecoveryTick = 500 * time.Millisecond
	// RecoveryIdleWait bounds a worker's sleep, so a wait re-reads the
	// lease view at least this often.
	RecoveryIdleWait = time.Second
)

// RecoveryRunner is host recovery's shell: as the leader, it starts a
// recovery for each declaration the tracker shows (recovery.Core.Start),
// runs one worker per host performing the core's steps — every write to
// the recovery bucket by CAS, every gated call after a fresh read of the
// lease key, MayAct asked right before each write and each mutating call —
// and publishes the events. A standby runs nothing and writes nothing.
type RecoveryRunner struct {
	// KV is the recovery bucket; Leases the lease bucket (fresh reads).
	KV     jetstream.KeyValue
	Leases *natslease.Store
	// NC, if set, makes the gate's fresh read a read from the lease
	// stream's leader (natslease.Store.ReadLeader) rather than a KV get
	// that a lagging replica may answer, and gives a delete marker's
	// revision.
	NC   *nats.Conn
	Core *recovery.Core
	// Cloud is nil in mode notify (nothing is called).
	Cloud RecoveryCloud
	// View returns the tracker's view (Runner.View).
	View func(ctx context.Context) (TrackerView, error)
	// MayAct gates every write and every mutating call.
	MayAct func(time.Time) bool
	// Now is the controller's clock (timers); Wall the wall clock
	// (durable stamps, Nova's timestamps). time.Now when nil.
	Now, Wall func() time.Time
	Log       *slog.Logger
	// By names this controller and its term in the records it starts.
	By func() string
	// OnEvent is called with every event of a step carried out (leader
	// only; from the workers' goroutines).
	OnEvent func(recovery.Event)

	mu     sync.Mutex // guards Core, revs, leases, workers, stands
	revs   map[string]uint64
	leases map[string]recovery.Lease
	// stands: the tracker's view of a host whose declaration stands
	// although untrusted values or a delete followed it
	// (LeaseView.DeclarationStands): its latest revision seen.
	stands  map[string]uint64
	workers map[string]context.CancelFunc
	wg      sync.WaitGroup
	loaded  bool
	// unreadable: the keys (host tokens) whose record this controller
	// cannot decode (another version's schema, corrupted), with why: it
	// neither recovers those hosts nor overwrites their records.
	unreadable map[string]string
}

func (r *RecoveryRunner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *RecoveryRunner) wall() time.Time {
	if r.Wall != nil {
		return r.Wall()
	}
	return time.Now()
}

func (r *RecoveryRunner) mayAct() bool { return r.MayAct == nil || r.MayAct(r.now()) }

func (r *RecoveryRunner) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

// Records returns every record the core holds, with what each waits for
// now (status; safe for concurrent use).
func (r *RecoveryRunner) Records() ([]recovery.Record, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recovery.Record
	why := map[string]string{}
	for _, h := range r.Core.Hosts() {
		out = append(out, *r.Core.Record(h))
		if w := r.Core.Why(h); w != "" {
			why[h] = w
		}
	}
	// Hosts refused before any record: their why too.
	for h := range r.leases {
		if w := r.Core.Why(h); w != "" {
			why[h] = w
		}
	}
	for k, err := range r.unreadable {
		if h, terr := proto.TokenToHost(k); terr == nil {
			why[h] = "not recovered: its recovery record is unreadable (another version's, or corrupted; not overwritten — delete the key to recover it afresh): " + err
		}
	}
	return out, why
}

// InFlight returns the evacuations in flight (safe for concurrent use).
func (r *RecoveryRunner) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Core.InFlight()
}

// Run runs until ctx ends.
func (r *RecoveryRunner) Run(ctx context.Context) error {
	r.mu.Lock()
	r.revs, r.leases, r.workers, r.unreadable = map[string]uint64{}, map[string]recovery.Lease{}, map[string]context.CancelFunc{}, map[string]string{}
	r.mu.Unlock()
	defer r.stopWorkers()
	tick := time.NewTicker(RecoveryTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if !r.mayAct() {
			if r.loaded {
				r.log().Warn("not the leader: host recovery stopped (a leader resumes it from the bucket)")
				r.stopWorkers()
				r.mu.Lock()
				r.Core.Forget()
				r.loaded = false
				r.mu.Unlock()
			}
			continue
		}
		if !r.loaded {
			if err := r.load(ctx); err != nil {
				r.log().Error("reading the recovery bucket failed; recovering nothing until it is read", "err", err)
				continue
			}
		}
		vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		v, err := r.View(vctx)
		cancel()
		if err != nil {
			continue
		}
		r.cycle(ctx, v)
	}
}

// load reads every record of the bucket into the core.
func (r *RecoveryRunner) load(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := r.KV.ListKeys(lctx)
	if err != nil {
		return err
	}
	var recs []recovery.Record
	revs := map[string]uint64{}
	unreadable := map[string]string{}
	for k := range keys.Keys() {
		e, err := r.KV.Get(lctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		rec, err := recovery.DecodeRecord(e.Value())
		if err != nil {
			r.log().Error("undecodable recovery record (another version's, or corrupted): that host is not recovered by this controller and its record is not overwritten; delete the key to recover it afresh", "key", k, "err", err)
			unreadable[k] = err.Error()
			continue
		}
		recs = append(recs, rec)
		revs[rec.Host] = e.Revision()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Core.Forget()
	r.revs, r.unreadable = revs, unreadable
	for _, rec := range recs {
		r.Core.Load(rec)
	}
	r.loaded = true
	r.log().Info("host recovery: leading; records loaded", "records", len(recs))
	return nil
}

// leaseOf converts the tracker's view of a host.
// A declaration that stands (h.DeclarationStands) is shown as the trusted
// declaration: present, at its own revision.
func leaseOf(h LeaseView) recovery.Lease {
	l := recovery.Lease{Host: h.Host, Present: !h.KeyDeleted, State: string(h.State), Epoch: h.Epoch, Revision: h.Revision,
		AgentState: string(h.FenceState), Reason: h.Reason, Refused: h.Refused, SilentFor: h.SilentFor, Due: h.Due, Holding: h.GuardHolds}
	if h.DeclarationStands {
		l.Present, l.Revision = true, h.TrustedRevision
	}
	return l
}

// cycle starts the recoveries of new declarations (oldest declaration
// first) and a worker for every host with something to do.
func (r *RecoveryRunner) cycle(ctx context.Context, v TrackerView) {
	hosts := append([]LeaseView(nil), v.Hosts...)
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Revision < hosts[j].Revision })
	names := make([]string, len(hosts))
	for i, h := range hosts {
		names[i] = h.Host
	}
	cfg := r.Core.Config()
	r.mu.Lock()
	for _, h := range hosts {
		l := leaseOf(h)
		l.SharedNovaHost = strings.Join(cfg.SharedNovaHost(h.Host, names), ", ")
		l.AliveAs = strings.Join(aliveAs(h, hosts), ", ")
		r.leases[h.Host] = l
		if r.stands == nil {
			r.stands = map[string]uint64{}
		}
		delete(r.stands, h.Host)
		if h.DeclarationStands {
			r.stands[h.Host] = h.Revision
		}
	}
	r.mu.Unlock()
	for _, h := range hosts {
		if h.State != fencing.LeaseExpired || h.KeyDeleted && !h.DeclarationStands {
			continue
		}
		if k, err := proto.HostToken(h.Host); err == nil && r.isUnreadable(k) {
			r.reload(ctx, h.Host, k) // fixed or deleted meanwhile?
			if r.isUnreadable(k) {
				continue
			}
		}
		r.mu.Lock()
		stop, busy := r.workers[h.Host]
		var st recovery.Step
		if rec := r.Core.Record(h.Host); busy && rec != nil && (rec.Epoch != h.Epoch || rec.LeaseRevision != r.leases[h.Host].Revision) {
			// A new declaration of a host whose earlier recovery has a
			// worker: end that worker first (after its current step);
			// the next cycle starts the new recovery.
			stop()
		} else if !busy {
			st = r.Core.Start(r.now(), r.wall(), r.leases[h.Host], r.by())
		}
		r.mu.Unlock()
		switch {
		case busy:
		case st.Op == recovery.OpWrite:
			r.write(ctx, st)
		default:
			r.say(st.Events) // a refusal, or queued: said once
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.Core.Hosts() {
		if _, ok := r.workers[h]; ok || r.Core.Record(h).Phase.Final() {
			continue
		}
		if k, err := proto.HostToken(h); err == nil && r.unreadable[k] != "" {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		r.workers[h] = cancel
		r.wg.Add(1)
		go r.work(wctx, h)
	}
}

// aliveAs returns the other hosts renewing (active, key present) with h's
// boot id: the same running machine under another lease name.
func aliveAs(h LeaseView, hosts []LeaseView) []string {
	var out []string
	for _, o := range hosts {
		if o.Host != h.Host && h.BootID != "" && o.BootID == h.BootID && o.State == fencing.LeaseActive && !o.KeyDeleted {
			out = append(out, o.Host)
		}
	}
	return out
}

func (r *RecoveryRunner) by() string {
	if r.By != nil {
		return r.By()
	}
	return "controller"
}

func (r *RecoveryRunner) stopWorkers() {
	r.mu.Lock()
	for _, c := range r.workers {
		c()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// work performs host's steps until its record is final or ctx ends.
func (r *RecoveryRunner) work(ctx context.Context, host string) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.workers, host)
		r.mu.Unlock()
	}()
	for ctx.Err() == nil {
		r.mu.Lock()
		rec := r.Core.Record(host)
		if rec == nil || rec.Phase.Final() {
			r.mu.Unlock()
			return
		}
		st := r.Core.Next(r.now(), r.wall(), host, r.leases[host])
		r.mu.Unlock()
		if !r.perform(ctx, st) {
			return
		}
	}
}

// perform carries out st and what follows from it; false when the worker
// must end (not acting any more).
func (r *RecoveryRunner) perform(ctx context.Context, st recovery.Step) bool {
	for ctx.Err() == nil {
		switch st.Op {
		case recovery.OpIdle, recovery.OpWait:
			r.say(st.Events)
			d := RecoveryIdleWait
			if st.Op == recovery.OpWait {
				d = min(d, max(st.Until.Sub(r.now()), time.Millisecond))
			}
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			return true
		case recovery.OpWrite:
			return r.write(ctx, st)
		}
		if st.Gate != recovery.GateNone {
			fresh := r.freshLease(ctx, st.Host)
			r.mu.Lock()
			ok, alt := r.Core.Gate(r.now(), r.wall(), st, fresh)
			r.mu.Unlock()
			if !ok {
				st = alt
				continue
			}
		}
		if st.Mutating && !r.mayAct() {
			r.log().Info("not acting: recovery call not made", "host", st.Host, "op", st.Op)
			return false
		}
		res := r.call(ctx, st)
		if st.Mutating {
			r.log().Info("recovery call", "host", st.Host, "op", st.Op, "server", st.Server, "volume", st.Volume,
				"attachment", st.Attachment, "err", res.Err)
		}
		r.mu.Lock()
		st = r.Core.Done(r.now(), r.wall(), st, res)
		r.mu.Unlock()
		if st.Op == recovery.OpIdle {
			// The outcome changed nothing durable: go on with the next
			// step at once (Next waits if there is nothing to do).
			r.say(st.Events)
			return true
		}
	}
	return false
}

func (r *RecoveryRunner) say(evs []recovery.Event) {
	if len(evs) == 0 || !r.mayAct() {
		return
	}
	for _, e := range evs {
		r.log().Info("host recovery: "+e.Op, "host", e.Host, "phase", e.Phase, "instance", e.Instance, "why", e.Why, "reason", e.Reason, "err", e.Error)
		if r.OnEvent != nil {
			r.OnEvent(e)
		}
	}
}

// write writes st.Record by CAS (MayAct right before).
func (r *RecoveryRunner) write(ctx context.Context, st recovery.Step) bool {
	if !r.mayAct() {
		r.log().Info("not acting: recovery record not written", "host", st.Host)
		return false
	}
	b, err := st.Record.Encode()
	if err != nil {
		r.log().Error("recovery record not encodable", "host", st.Host, "err", err)
		return false
	}
	k, err := proto.HostToken(st.Host)
	if err != nil {
		r.log().Error("recovery record: bad host", "host", st.Host, "err", err)
		return false
	}
	r.mu.Lock()
	rev, bad := r.revs[st.Host], r.unreadable[k]
	r.mu.Unlock()
	if bad != "" {
		r.log().Error("not acting: the host's recovery record is unreadable (another version's, or corrupted); not overwritten", "host", st.Host, "err", bad)
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	var n uint64
	if rev == 0 {
		n, err = r.KV.Create(wctx, k, b)
	} else {
		n, err = r.KV.Update(wctx, k, b, rev)
	}
	cancel()
	if err != nil {
		// A conflict (or an earlier write whose outcome was unknown
		// that landed): take the bucket's record as the truth.
		r.log().Warn("recovery record not written; re-reading it", "host", st.Host, "revision", rev, "err", err)
		if natslease.IsConflict(err) {
			r.reload(ctx, st.Host, k)
		}
		select {
		case <-ctx.Done():
		case <-time.After(RecoveryIdleWait):
		}
		return true
	}
	r.mu.Lock()
	r.revs[st.Host] = n
	r.Core.Written(st.Record)
	r.mu.Unlock()
	r.say(st.Events)
	return true
}

func (r *RecoveryRunner) reload(ctx context.Context, host, k string) {
	gctx, cancel := context.WithTimeout(ctx, natslease.ReadTimeout)
	defer cancel()
	e, err := r.KV.Get(gctx, k)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			r.mu.Lock()
			r.revs[host] = 0
			delete(r.unreadable, k)
			r.mu.Unlock()
		}
		return
	}
	rec, err := recovery.DecodeRecord(e.Value())
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revs[host] = e.Revision()
	if err != nil {
		if r.unreadable[k] == "" {
			r.log().Error("undecodable recovery record (another version's, or corrupted): that host is not recovered by this controller and its record is not overwritten; delete the key to recover it afresh", "key", k, "err", err)
		}
		r.unreadable[k] = err.Error()
		return
	}
	delete(r.unreadable, k)
	r.Core.Load(rec)
}

func (r *RecoveryRunner) isUnreadable(k string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unreadable[k] != ""
}

// freshLease reads host's lease key now, with the tracker's verdicts.
func (r *RecoveryRunner) freshLease(ctx context.Context, host string) recovery.Lease {
	r.mu.Lock()
	l := r.leases[host]
	r.mu.Unlock()
	l.Host = host
	if r.NC != nil {
		return r.freshLeader(ctx, l)
	}
	rec, rev, err := r.Leases.Read(ctx, host)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		l.Present, l.ReadErr = false, ""
	case err != nil:
		l.Present, l.ReadErr = false, err.Error()
	default:
		l.Present, l.ReadErr = true, ""
		l.State, l.Epoch, l.Revision, l.AgentState, l.Reason = string(rec.State), rec.Epoch, rev, string(rec.AgentState), rec.Reason
	}
	return l
}

// freshLeader is freshLease reading from the lease stream's leader. When
// the key holds an untrusted value or a delete marker, the tracker's view
// decides: if it shows the declaration standing (signatures required, the
// last trusted record this declaration, every later revision untrusted or
// a delete, none skipped) and has seen the revision read (or a later one),
// the declaration is taken as it stands — a compromised node's garbage or
// delete stops no recovery. Otherwise (signing optional or off, the
// tracker behind the read) the read is what it was: an untrusted value is
// an error that pauses the recovery, a delete ends it.
func (r *RecoveryRunner) freshLeader(ctx context.Context, l recovery.Lease) recovery.Lease {
	rd, err := r.Leases.ReadLeader(ctx, r.NC, l.Host)
	if err == nil && (rd.Deleted || rd.Err != nil) {
		r.mu.Lock()
		seen, stands := r.stands[l.Host]
		r.mu.Unlock()
		if stands && seen >= rd.Revision {
			return l // the trusted view (leaseOf): the declaration stands
		}
	}
	switch {
	case err != nil:
		l.Present, l.ReadErr = false, err.Error()
	case rd.Deleted:
		l.Present, l.ReadErr = false, ""
	case rd.Err != nil:
		l.Present, l.ReadErr = false, rd.Err.Error()
	default:
		rec := rd.Record
		l.Present, l.ReadErr = true, ""
		l.State, l.Epoch, l.Revision, l.AgentState, l.Reason = string(rec.State), rec.Epoch, rd.Revision, string(rec.AgentState), rec.Reason
	}
	return l
}

// call performs one OpenStack call, bounded by recovery.CallTimeout.
func (r *RecoveryRunner) call(ctx context.Context, st recovery.Step) recovery.Result {
	if r.Cloud == nil {
		return recovery.Result{Kind: recovery.ErrOther, Err: "no OpenStack configured (mode notify)"}
	}
	cctx, cancel := context.WithTimeout(ctx, recovery.CallTimeout)
	defer cancel()
	var res recovery.Result
	var err error
	c := r.Cloud
	switch st.Op {
	case recovery.OpForceDown:
		err = c.ForceDown(cctx, st.NovaHost, true)
	case recovery.OpClearForceDown:
		err = c.ForceDown(cctx, st.NovaHost, false)
	case recovery.OpListServers:
		res.Servers, err = c.HostServers(cctx, st.NovaHost)
	case recovery.OpServer:
		res.Server, err = c.Server(cctx, st.Server)
	case recovery.OpVolume:
		res.Volume, err = c.Volume(cctx, st.Volume)
	case recovery.OpRemoveAttachment:
		r.mu.Lock()
		host := r.Core.Record(st.Host).NovaHost
		r.mu.Unlock()
		err = c.RemoveAttachment(cctx, st.Volume, st.Attachment, host)
	case recovery.OpEvacuate:
		err = c.Evacuate(cctx, st.Server)
	case recovery.OpMigrations:
		res.Migrations, err = c.Migrations(cctx, st.NovaHost, st.Since)
	case recovery.OpHostNotification:
		r.mu.Lock()
		at := r.Core.Record(st.Host).StartedAt
		r.mu.Unlock()
		res.NotificationID, err = c.HostNotification(cctx, st.NovaHost, at)
	case recovery.OpNotificationStatus:
		res.NotificationStatus, err = c.Notification(cctx, st.NotificationID)
	default:
		err = fmt.Errorf("unknown recovery call %s", st.Op)
	}
	if err != nil {
		res.Kind, res.Err = RecoveryKind(err), err.Error()
	}
	return res
}
