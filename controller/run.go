package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// Runner defaults.
const (
	// TickInterval is how often the runner evaluates the tracker.
	TickInterval = 250 * time.Millisecond
	// GuardPublishInterval is how often the guard is published again (and
	// at once when the membership changes).
	GuardPublishInterval = 30 * time.Second
	// GuardPublishRetry is the pause after a failed guard publish.
	GuardPublishRetry = time.Second
	// WriteTimeout bounds a declaration or release write.
	WriteTimeout = 2 * time.Second
	// RewatchDelay is the pause before a failed watch is re-established.
	RewatchDelay = time.Second
	// WrittenReadTimeout bounds the read of a first value's stored
	// message (Tracker.NeedsWritten; natslease.Store.WrittenOn), which
	// the tracker's goroutine waits for: a failed or slow read leaves the
	// value untrusted (the safe side: the host counts silent, is never
	// declared, until its next renewal is verified). 1 s: a message get
	// takes milliseconds on a healthy server; a controller starting over
	// a bucket it cannot read in 1 s has a broken connection (its watch
	// fails too), and a listing of many hosts must not stall the loop
	// (heartbeats, ticks) for long.
	WrittenReadTimeout = time.Second
	// MaxBeaconHosts bounds the hosts whose beacons wait for the
	// tracker's goroutine at once (beaconBox): with the shipped
	// permissions only real hosts publish beacons; without them this
	// bounds the memory a flood of made-up host names can take.
	MaxBeaconHosts = 65536
)

// The beacon verification budget (reviewer X75's open (c)). The runner
// verifies each beacon (decoded and an ed25519 signature checked: 46 µs
// here, BenchmarkRunnerBeacon) on NATS's goroutine for the subscription, in arrival order, and a compromised
// node may publish its own beacon subject as fast as it likes: a paced
// flood of its validly signed beacons (nothing dropped) delayed every
// other host's beacons by 1.2–4 s, and more than maxLaterValues values
// of a victim's key landed between its create and the beacon that
// vouches for it — the dead victim never declared. So each enrolled host
// has a budget: BeaconVerifyBurst beacons verified at once, refilled at
// BeaconVerifyRate a second; a beacon beyond it is shed — counted and
// dropped once decoded (3.6 µs), never verified. It is charged only once
// it decodes as its subject host's beacon: an agent may have the server
// publish a JetStream API answer on any subject of its account
// (reflection; the stream message get's answer is JSON of another
// shape), and charging by the subject alone let compute-1 spend any
// host's budget — its shed window then refused that host's hidden write
// for good, and an honest companion's chain gap and missing beacon were
// taken for shedding, hiding a route loss (reviewer X80,
// TestX80ReflectedBurstThenHiddenWriteNATS,
// TestX80ReflectionHidesCompanionLossNATS, chargeFirstMutation). With the
// shipped permissions only a host itself publishes a beacon-shaped
// message on its subject (no direct gets: their raw answers are denied),
// so what a shed beacon's loss hides is that host's alone: the tracker counts the shedding against the shedding
// host only (Tracker.BeaconsShed: its own hidden writes are covered, its
// chain restarts, its missing beacons make no fleet-wide loss window) —
// a runner's own drops opening fleet-wide windows refused the dead
// victim in the reverted first try.
const (
	// BeaconVerifyRate: an agent publishes one beacon per write it made
	// (its beacon queue holds one; a newer write supersedes it), so at
	// most 1/renew_interval a second plus a retry's (renew_interval/2):
	// 4 a second at 500 ms, the shortest interval a deployment would
	// use. 50: over ten times that; a flooding host then costs the runner
	// ~5 ms of verification a second.
	BeaconVerifyRate = 50
	// BeaconVerifyBurst: what a host may send at once before its rate
	// applies — a reconnect flushing what was published meanwhile, a
	// relayed renewal's beacon beside its own. 200: 4 s at the rate.
	BeaconVerifyBurst = 200
)

// ErrBeaconShed: a beacon beyond its host's verification budget
// (BeaconVerifyRate), dropped unverified (Runner.OnBeacon).
var ErrBeaconShed = errors.New("beacon shed: its host publishes beacons beyond the verification budget (" + fmt.Sprint(BeaconVerifyRate) + "/s, burst " + fmt.Sprint(BeaconVerifyBurst) + "); not verified, counted against that host only")

// beaconBudgetMutation: no budget, every beacon verified in arrival order
// (reviewer X75's open (c)). Tests only.
var beaconBudgetMutation bool

// beaconBudget is one host's verification budget (a token bucket), kept
// by NATS's goroutine for the subscription alone.
type beaconBudget struct {
	tokens float64
	at     time.Time
	// shed: beacons of the host were shed since its last verified one.
	shed bool
}

// take spends one token at now, reporting false when none is left.
func (b *beaconBudget) take(now time.Time) bool {
	if b.at.IsZero() {
		b.tokens = BeaconVerifyBurst
	} else if d := now.Sub(b.at); d > 0 {
		b.tokens = min(BeaconVerifyBurst, b.tokens+d.Seconds()*BeaconVerifyRate)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Runner is the controller's I/O shell: it watches the lease bucket into
// the Tracker, ticks it, performs its declarations by CAS, publishes the
// guard and logs every loud decision. One goroutine (Run) owns the Tracker.
type Runner struct {
	Store   *natslease.Store
	Tracker *Tracker
	// Receipts, if set, is the connection (the agents' account) on
	// which, before a declaration is written, the host's withdrawal
	// receipts are read from its own stream (natslease.ReadHostReceipts,
	// receipt.go). Nil: none is read, and a host whose key may hide a
	// write is not declared (ErrReceiptsUnsound).
	Receipts jetstream.JetStream
	// ReceiptsAccount, if set, says why the receipts stream's account may
	// refuse a receipt for room (natslease.AccountUnsound; nil: it
	// cannot): read before a declaration that a missing receipt would
	// let through (checkReceipt).
	ReceiptsAccount func(context.Context) error
	// Memory, if set, is the controllers' memory bucket (MemoryBucket,
	// memory.go): the leader writes each host's memory there when it
	// changes, and a (re)started controller or a new leader restores it
	// after the published guard.
	Memory jetstream.KeyValue
	Log    *slog.Logger
	// Now is the controller's clock (time.Now if nil).
	Now func() time.Time
	// OnDecision, if set, is called with every decision after it was
	// performed (tests, metrics); a write not made because MayAct said no
	// is reported with ErrNotActing.
	OnDecision func(Decision, error)
	// MayAct, if set, gates every write to the bucket (declarations,
	// releases, the guard): it is asked immediately before each one, with
	// Now's clock, and nothing is written unless it says yes. A standby
	// controller (MayAct false) keeps its tracker warm, watching, and
	// writes nothing; its due hosts are decided again at the next tick.
	MayAct func(time.Time) bool
	// Heartbeat, if set, is called from Run's goroutine at every tick,
	// watching or not: it proves the loop makes progress (the daemon
	// feeds systemd's watchdog from it).
	Heartbeat func()
	// OnSynced, if set, is called from Run's goroutine each time the lease
	// watch has delivered the bucket's current values.
	OnSynced func(hosts int)
	// Signature, if set, is appended to the reason of every declaration
	// written (the daemon's: its id and leader term), so the record says
	// which controller declared the host.
	Signature func() string
	// Beacons, if set, is the connection the agents' beacons
	// (fencing.Beacon, hvguard.v1.*.beacon) are received on (invalid.go);
	// OnBeacon, if set, is told of each (err: refused, not passed on).
	Beacons  *nats.Conn
	OnBeacon func(host string, b fencing.Beacon, err error)
	// OnBeaconsLost, if set, is told of each window in which beacons may
	// have been lost (beaconloss.go): why, and the hosts not declared
	// from then on.
	OnBeaconsLost func(why string, notDeclared []string)

	// shedSaid, shedHosts: when beaconsShed last said so, and the hosts
	// shed since (Run's goroutine).
	shedSaid  time.Time
	shedHosts map[string]struct{}

	viewOnce sync.Once
	views    chan chan TrackerView

	// rolledBack: what the last Run, stopped by a rolled-back lease
	// stream (rollback.go), hands to the next Run on a fresh tracker — nil
	// otherwise.
	rolledBack *rollbackCarry
	// saidNoClock: a stream info without the server's clock was said.
	saidNoClock bool
}

// actRecheckMutation: MayAct is not checked again after the receipt read,
// as before (reviewer X57). Tests only.
var actRecheckMutation bool

// ErrNotActing is reported to OnDecision for a write MayAct did not allow.
var ErrNotActing = errors.New("not acting (standby, or the leader lock lapsed): nothing written")

func (r *Runner) viewReqs() chan chan TrackerView {
	r.viewOnce.Do(func() { r.views = make(chan chan TrackerView) })
	return r.views
}

// View asks Run's goroutine for the tracker's state (safe for concurrent
// use); it fails when ctx ends first (Run not running or stuck).
func (r *Runner) View(ctx context.Context) (TrackerView, error) {
	reply := make(chan TrackerView, 1)
	select {
	case r.viewReqs() <- reply:
	case <-ctx.Done():
		return TrackerView{}, fmt.Errorf("tracker view: %w", ctx.Err())
	}
	select {
	case v := <-reply:
		return v, nil
	case <-ctx.Done():
		return TrackerView{}, fmt.Errorf("tracker view: %w", ctx.Err())
	}
}

func (r *Runner) mayAct() bool { return r.MayAct == nil || r.MayAct(r.now()) }

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Run runs until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	r.Tracker.SetSigningRequired(r.Store.Keys != nil && r.Store.Keys.Mode == fencing.SigningRequired)
	if k := r.Store.Keys; k != nil {
		r.Tracker.SetEnrolled(func(host string) bool { return len(k.Hosts[host]) > 0 })
	}
	r.Tracker.SetStream(streamID(ctx, r.Store, log))
	if c := r.rolledBack; c != nil {
		r.Tracker.AfterRollback(c.rev)
	}
	tick := time.NewTicker(TickInterval)
	defer tick.Stop()
	var lastPublish, retryPublish time.Time
	var published uint64
	// restored: the published guard's versions were read since this
	// controller last started acting (see restoreGuard).
	restored := false
	views := r.viewReqs()
	beacons := newBeaconBox()
	r.shedHosts = map[string]struct{}{}
	var losses beaconLosses // beaconloss.go
	if r.Beacons != nil {
		sub, err := r.Beacons.Subscribe(proto.BeaconWildcard, func(m *nats.Msg) { r.beacon(m, beacons) })
		if err != nil {
			return fmt.Errorf("subscribe to the agents' beacons (%s): %w", proto.BeaconWildcard, err)
		}
		defer sub.Unsubscribe()
		losses = beaconLosses{nc: r.Beacons, sub: sub, box: beacons, last: r.now()}
		losses.check(r.now()) // the counters' starting values
	}
	// The rollback check (rollback.go): what the watch delivered, and one
	// check at a time, off the loop.
	var ring deliveredRing
	var reconnects uint64
	var lastCheck time.Time
	checked := make(chan rollbackCheck, 1)
	checking := false
	// The controllers' rollback marker and the operators' confirmations
	// (rollbackconfirm.go): one poll at a time, off the loop. Until the
	// marker is read, a tracker that may follow a rollback found by
	// another controller is gated.
	var poll confirmPoll
	var steps stepWatch
	earlySaid := map[string]uint64{} // host: a confirmation's revision said too early (ConfirmTooEarly)
	confirmed := make(chan pollResult, 1)
	polling, markerKnown := false, false
	var lastPoll time.Time
	if r.Store.Control != nil && r.rolledBack == nil {
		r.Tracker.SetRollbackGate(MarkerUnread, "the controllers' rollback marker (control bucket) is not read yet")
	}
	for ctx.Err() == nil {
		updates := make(chan natslease.Update, 1024)
		wctx, cancel := context.WithCancel(ctx)
		werr := make(chan error, 1)
		go func() { werr <- r.Store.Watch(wctx, updates, make(chan struct{})) }()
		watching := false
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case err := <-werr:
				log.Error("lease watch failed; declaring nothing until it is back", "err", err)
				break loop

			case reply := <-views:
				reply <- r.Tracker.View(r.now())
			case <-beacons.ready:
				now := r.now()
				revs, withdrawn, shed := beacons.takeAll()
				r.beaconsShed(now, log, shed)
				gaps, vouched := r.observeBeacons(now, revs)
				for _, d := range vouched {
					r.perform(ctx, log, d)
				}
				if len(gaps) > 0 {
					// Beacons these hosts published never came (beaconloss.go,
					// the chain): lost on the way.
					slices.Sort(gaps)
					r.beaconsLost(log, chainWhy(slices.Compact(gaps)), r.Tracker.RefuseCovered())
				}
				for host, w := range withdrawn {
					for _, d := range r.Tracker.ObserveWithdrawalBy(now, host, w.rev, w.boot, w.inc) {
						r.perform(ctx, log, d)
					}
				}
			case u := <-updates:
				if u.Listed {
					// Every listed value is observed: only now may the
					// memory and the guard be restored (the first acting
					// tick) — reviewer X18's TestX18PartialListingSkipsMemoryNATS.
					watching = true
					r.Tracker.WatchStarted(r.now())
					for _, d := range r.rolledBack.applyTo(r.Tracker) { // once (rollback.go)
						r.perform(ctx, log, d)
					}
					log.Info("lease watch synced", "hosts", r.Tracker.Members())
					if r.OnSynced != nil {
						r.OnSynced(r.Tracker.Members())
					}
					continue
				}
				if u.Skipped {
					r.Tracker.Skipped(u.Revision)
				}
				r.Tracker.Stored(u.Host, u.Revision, u.Stored)
				r.Tracker.ClockSample(r.now(), u.Revision, u.Stored)
				ring.add(u.Host, u.Revision, u.Stored)
				var ds []Decision
				switch {
				case u.Err != nil:
					ds = r.Tracker.ObserveInvalid(r.now(), u.Host, u.Revision, u.Err.Error(), errors.Is(u.Err, fencing.ErrForgedRecord))
				case u.Record != nil && r.Tracker.NeedsWritten(u.Host):
					// A first value of the host: trusted only if its
					// stored message shows it written fresh (invalid.go).
					w, err := r.Store.WrittenOn(ctx, u.Host, u.Revision, WrittenReadTimeout)
					if err != nil {
						log.Warn("reading how a lease value was written failed: not trusted as the host's first record", "host", u.Host, "revision", u.Revision, "err", err)
					}
					w.After = u.After // the watch's adjacency (natslease.Update.After)
					ds = r.Tracker.ObserveWritten(r.now(), u.Host, u.Revision, u.Record, w)
				default:
					ds = r.Tracker.Observe(r.now(), u.Host, u.Revision, u.Record)
				}
				for _, d := range ds {
					r.perform(ctx, log, d)
				}
			case res := <-confirmed:
				polling = false
				if res.known {
					if res.marker && !r.Tracker.RollbackGateOn() {
						log.Warn("ROLLBACK GATE: the controllers' rollback marker stands: this controller declares only hosts whose beacon proves their record, or that an operator confirms (hvguard-controller confirm-rollback HOST)", "why", res.why)
					}
					markerKnown = true
					m := MarkerAbsent
					if res.marker {
						m = MarkerStands
					}
					// Off: unless this runner found the rollback, or a
					// marker stood when it read it before.
					if r.Tracker.SetRollbackGate(m, res.why) {
						log.Warn("ROLLBACK GATE KEPT: the controllers' rollback marker is gone (cleared, or the control bucket re-created or restored), but it stood when this controller read it: it keeps its gate until it restarts (an operator who cleared it after rotating the host keys restarts the controllers)")
					}
				}
				for _, c := range res.confirmed {
					// Stamped when the operator wrote it, in the tracker's
					// clock: signs of life since then spend it (reviewer X52).
					// Its age was measured against the wall clock when the
					// poll started (lastPoll, in this clock): a loop busy
					// with declarations' writes when the result came would
					// stamp it later (reviewer X55).
					at := confirmStamp(lastPoll, c)
					if r.Tracker.ConfirmTooEarly(at) {
						if earlySaid[c.host] != c.rev {
							earlySaid[c.host] = c.rev
							log.Warn("rollback gate: a confirmation written before this controller started (or less than 10 s after) is not taken: the host may have shown signs of life this controller could not see — check it again and run hvguard-controller confirm-rollback again", "host", c.host, "revision", c.rev, "written_ago", c.age)
						}
						continue
					}
					r.Tracker.ConfirmRollback(c.host, c.marker, c.rev, at) // declared at its next due Tick
				}
			case c := <-checked:
				checking = false
				err := c.err
				if !c.ts.IsZero() {
					r.Tracker.ServerTime(c.sent, c.got, c.ts, c.last) // beaconloss.go
				} else if c.read && !r.saidNoClock {
					r.saidNoClock = true
					log.Warn("the NATS server's stream info does not say its clock (no \"ts\"; nats-server before 2.10?): every loss window of this runner stays open (a host whose write is hidden after one is refused-due, not declared) — run nats-server 2.10 or later (docs/security.md, \"The controller's clock\")")
				}
				if errors.Is(err, ErrLeaseStreamRolledBack) {
					// What the fresh tracker must not lose (rollback.go):
					// the withdrawals this one saw.
					r.rolledBack = carryOn(r.rolledBack, r.Tracker, r.now(), ring.maxRv)
					r.markRollback(ctx, log, err)
					for _, d := range r.Tracker.StreamRolledBack(r.now(), err.Error()) {
						r.perform(ctx, log, d)
					}
					if r.mayAct() {
						r.writeMemories(ctx, log, 0) // the pins dropped
					}
					cancel()
					log.Error("LEASE STREAM ROLLED BACK: stopping; a restarted controller lists it as it is now", "err", err)
					return err
				}
				if err != nil {
					log.Warn("lease stream rollback check failed; retried", "err", err)
				}
			case <-tick.C:
				if r.Heartbeat != nil {
					r.Heartbeat()
				}
				// The runner's clock against the monotonic one: the
				// daemon's boot clock steps only by a suspend (forward:
				// windows only widen); a wall clock (r.Now nil) steps with
				// NTP or an operator.
				if d := steps.observe(r.now().Round(0), time.Since(monoStart)); d > ClockStepMin {
					log.Warn("the controller's clock stepped forward: open beacon loss windows moved with it (docs/security.md, \"The controller's clock\")", "step", d)
					r.Tracker.ClockStepped(d) // beaconloss.go
				}
				if from, why := losses.check(r.now()); why != "" {
					r.beaconsLost(log, why, r.Tracker.BeaconsLost(from, r.now()), "from", from)
				}
				if nc := r.Store.NC; nc != nil && nc.IsConnected() && !checking && !rollbackCheckMutation && ring.maxRv > 0 {
					if rc := nc.Stats().Reconnects; rc != reconnects || r.now().Sub(lastCheck) >= RollbackCheckInterval {
						reconnects, lastCheck, checking = rc, r.now(), true
						samples, last := ring.snapshot()
						go func() { checked <- r.checkRollback(ctx, samples, last) }()
					}
				}
				if kv := r.Store.Control; kv != nil && !polling && r.now().Sub(lastPoll) >= ConfirmPollInterval {
					if gated := r.Tracker.RollbackGated(); !markerKnown || len(gated) > 0 || r.now().Sub(lastPoll) >= MarkerRecheckInterval {
						polling, lastPoll = true, r.now()
						// Wall time: a confirmation's age is judged against the
						// command's clock (RollbackConfirmation.At), not the
						// controller's boot clock (r.now).
						go func() { confirmed <- poll.poll(ctx, kv, log, gated, time.Now()) }()
					}
				}
				if !watching {
					continue // silence is measured only while watching
				}
				now := r.now()
				// The missing beacons at the very time Tick decides at (a
				// later reading let an expectation due in between wait a
				// tick that companionsChecked counted on: reviewer X32).
				if missing, refused := r.Tracker.BeaconsMissing(now); len(missing) > 0 || len(refused) > 0 {
					r.beaconsLost(log, missingWhy(missing), refused)
				}
				acting := r.mayAct()
				if !acting {
					restored = false // a standby: read the guard again when it takes over
				} else if !restored {
					// Before it declares or publishes anything, a
					// (re)started controller or a new leader takes over
					// the earlier controllers' memory (its pins give
					// hosts records naming guard versions: before the
					// guard's versions are pruned to the members' —
					// reviewer X11's TestX11RestorePrunesVersionHeldRackActsOn)
					// and the published guard's versions: agents may still
					// act on them.
					r.restoreMemory(ctx, log)
					g, err := r.Store.ReadGuard(ctx)
					if errors.Is(err, natslease.ErrInvalidGuard) && len(updates) == 0 && !r.Tracker.GuardNamed() {
						// No trusted record names a guard version (every
						// value the watch listed is observed: none is
						// waiting): no agent acts on a guard, none is lost.
						// Garbage written into the key (an agent's
						// reflection: reviewer X16) before any controller
						// published stalled the controller for good
						// otherwise.
						log.Warn("the published guard is invalid, and no agent names a guard version: starting without one", "err", err)
						g, err = fencing.Guard{}, nil
					}
					if err != nil {
						log.Error("reading the published guard failed; declaring and publishing nothing until it is read", "err", err)
						continue
					}
					r.Tracker.RestoreGuard(g)
					restored = true
				}
				if g := r.Tracker.Guard(); acting && (g.Version != published || now.Sub(lastPublish) > GuardPublishInterval) && !now.Before(retryPublish) {
					// Adopted only once written; a failed write is kept
					// as possibly landed (the threshold only gets lower).
					err := r.Store.PublishGuard(ctx, g)
					r.Tracker.GuardPublished(g, err)
					if err != nil {
						log.Warn("publish guard", "version", g.Version, "err", err)
						retryPublish = now.Add(GuardPublishRetry)
					} else {
						published, lastPublish = g.Version, now
					}
				}
				if acting && restored {
					r.writeMemories(ctx, log, MemoryWritesPerTick) // hosts whose beacons bound them since (memory.go)
				}
				for _, d := range r.Tracker.Tick(now) {
					r.perform(ctx, log, d)
				}
			}
		}
		cancel()
		pause := time.NewTimer(RewatchDelay)
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case <-pause.C:
				break wait
			case <-tick.C:
				if r.Heartbeat != nil {
					r.Heartbeat()
				}
			case reply := <-views:
				reply <- r.Tracker.View(r.now())
			}
		}
		pause.Stop()
	}
	return nil
}

// beaconBox holds the beacons waiting for the tracker's goroutine, per
// host: each host's last beaconMemory revisions (a host publishing its
// own beacon subject in a loop only overwrites its own: reviewer X4 found
// one shared queue let one compromised host crowd out every other host's
// beacons, TestX4BeaconQueueCrowdedOutByOneHost).
type beaconBox struct {
	mu    sync.Mutex
	lost  uint64 // beacons refused because the box was full
	hosts map[string][]beaconRef
	// withdrawn: per host, the highest revision a beacon named as its
	// withdrawal (fencing.Beacon.State).
	withdrawn map[string]withdrawalRef
	// shed: per host, when the first of its beacons shed since the last
	// take was (beaconBudget).
	shed  map[string]time.Time
	ready chan struct{}
	// budgets: NATS's goroutine's alone (put, shedOver).
	budgets map[string]*beaconBudget
}

func newBeaconBox() *beaconBox {
	return &beaconBox{hosts: map[string][]beaconRef{}, withdrawn: map[string]withdrawalRef{}, shed: map[string]time.Time{}, budgets: map[string]*beaconBudget{}, ready: make(chan struct{}, 1)}
}

// shedOver reports whether host's beacon, arriving at now, is beyond its
// verification budget, and if so notes it shed. Called on NATS's
// goroutine before the beacon is decoded; only for enrolled hosts (the
// map is bounded by the keyring).
func (b *beaconBox) shedOver(host string, now time.Time) bool {
	bb := b.budgets[host]
	if bb == nil {
		bb = &beaconBudget{}
		b.budgets[host] = bb
	}
	if bb.take(now) {
		return false
	}
	bb.shed = true
	b.mu.Lock()
	_, noted := b.shed[host]
	if !noted {
		b.shed[host] = now
	}
	b.mu.Unlock()
	if !noted {
		// Once per host per take: a flood wakes the tracker's loop no
		// more often than one verified beacon would.
		select {
		case b.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// withdrawalRef: a host's withdrawal beacon: the revision it named and
// the boot that wrote it (fencing.Beacon.BootID; Tracker.withdrawnBar).
type withdrawalRef struct {
	rev  uint64
	boot string
	inc  uint64 // its process's incarnation (reviewer X101)
}

// beaconRef: what a beacon named: its revision and Prev
// (fencing.Beacon.Prev), and the written record's epoch, incarnation and
// seq (zero from an agent from before them).
type beaconRef struct {
	rev, prev, epoch, inc, seq uint64
	boot                       string
	// afterShed: beacons of its host were shed between the one before it
	// and it (beaconBudget): a gap in its chain is the runner's doing.
	afterShed bool
}

// put adds host's beacon b (withdrawn: its withdrawal).
func (b *beaconBox) put(host string, bc fencing.Beacon, withdrawn bool) error {
	rev := bc.Revision
	b.mu.Lock()
	q, ok := b.hosts[host]
	if !ok && len(b.hosts) >= MaxBeaconHosts {
		b.lost++
		b.mu.Unlock()
		return fmt.Errorf("beacons of %d hosts already waiting: revision %d dropped", MaxBeaconHosts, rev)
	}
	if w, ok := b.withdrawn[host]; withdrawn && (!ok || rev >= w.rev) {
		b.withdrawn[host] = withdrawalRef{rev: rev, boot: bc.BootID, inc: bc.Incarnation}
	}
	if len(q) == beaconMemory {
		q = q[1:]
	}
	afterShed := false
	if bb := b.budgets[host]; bb != nil {
		afterShed, bb.shed = bb.shed, false
	}
	b.hosts[host] = append(q, beaconRef{rev: rev, prev: bc.Prev, epoch: bc.Epoch, inc: bc.Incarnation, seq: bc.Seq, boot: bc.BootID, afterShed: afterShed})
	b.mu.Unlock()
	select {
	case b.ready <- struct{}{}:
	default:
	}
	return nil
}

// take returns the waiting beacons and withdrawals and empties the box.
func (b *beaconBox) take() (map[string][]beaconRef, map[string]withdrawalRef) {
	m, w, _ := b.takeAll()
	return m, w
}

// takeAll is take, and the hosts whose beacons were shed meanwhile (from
// when).
func (b *beaconBox) takeAll() (map[string][]beaconRef, map[string]withdrawalRef, map[string]time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, w, s := b.hosts, b.withdrawn, b.shed
	b.hosts, b.withdrawn = map[string][]beaconRef{}, map[string]withdrawalRef{}
	if len(s) > 0 {
		b.shed = map[string]time.Time{}
	}
	return m, w, s
}

// observeBeacons hands the beacons taken from the box to the tracker: the
// chain (beaconloss.go), the revision each names and the record each says
// its host wrote. It returns the hosts whose chain has a gap (a beacon
// they published never came; a host once per gap) and the decisions of
// the records the beacons vouched for (vouch.go).
func (r *Runner) observeBeacons(now time.Time, revs map[string][]beaconRef) (gaps []string, ds []Decision) {
	for host, revs := range revs {
		for _, b := range revs {
			if r.Tracker.BeaconChainShed(now, host, b.rev, b.prev, b.afterShed) {
				gaps = append(gaps, host)
			}
			r.Tracker.ObserveBeacon(now, host, b.rev)
			r.Tracker.BeaconWrote(host, b.rev, b.epoch, b.inc, b.seq)
			ds = append(ds, r.Tracker.BeaconVouches(now, host, b.rev, b.boot, b.epoch, b.inc, b.seq)...)
		}
	}
	return gaps, ds
}

// shedLogEvery spaces the WARNs of shed beacons (each is counted:
// Runner.OnBeacon with ErrBeaconShed).
const shedLogEvery = 10 * time.Second

// beaconsShed tells the tracker of the hosts whose beacons were shed
// (beaconBudget) since the last take, each from when, and says so.
func (r *Runner) beaconsShed(now time.Time, log *slog.Logger, shed map[string]time.Time) {
	if len(shed) == 0 {
		return
	}
	hosts := slices.Sorted(maps.Keys(shed))
	for _, host := range hosts {
		r.Tracker.BeaconsShed(now, host, shed[host])
		r.shedHosts[host] = struct{}{}
	}
	if now.Sub(r.shedSaid) < shedLogEvery {
		return // a flood takes the box at every turn: said once a while, naming every host since
	}
	hosts = slices.Sorted(maps.Keys(r.shedHosts))
	clear(r.shedHosts)
	r.shedSaid = now
	log.Warn("agent beacons shed: their hosts publish beacons beyond the verification budget (a compromised node flooding its own beacon subject?); counted against those hosts only (their own writes the watch may hide are not trusted to be theirs, they are not declared on such a write)",
		"hosts", namedHosts(hosts), "rate_per_s", BeaconVerifyRate, "burst", BeaconVerifyBurst)
}

// beaconsLost says that beacons may have been lost (why) and the hosts
// not declared from now on (beaconloss.go).
func (r *Runner) beaconsLost(log *slog.Logger, why string, refused []string, attrs ...any) {
	if r.OnBeaconsLost != nil {
		r.OnBeaconsLost(why, refused)
	}
	log.Warn("beacons may have been lost: a host whose write the watch may have hidden meanwhile is not declared (its withdrawal may be among them)",
		append([]any{"why", why, "hosts_not_declared", refused}, attrs...)...)
}

// beacon decodes one beacon message (NATS's goroutine) and puts it in
// box: only a beacon whose host is its subject's host (with the shipped
// permissions, the only host that may publish there) is passed on.
func (r *Runner) beacon(m *nats.Msg, box *beaconBox) {
	if chargeFirstMutation {
		if host, err := beaconSubjectHost(m.Subject); err == nil && r.overBudget(host, box) {
			if r.OnBeacon != nil {
				r.OnBeacon(host, fencing.Beacon{Host: host}, ErrBeaconShed)
			}
			return
		}
	}
	host, b, err := decodeBeaconMsg(m)
	if err == nil && !chargeFirstMutation && r.overBudget(host, box) {
		// Charged only once decoded as its subject host's beacon: a
		// reflected JetStream API answer (JSON of another shape) on that
		// host's subject spends nothing of its budget (reviewer X80).
		if r.OnBeacon != nil {
			r.OnBeacon(host, b, ErrBeaconShed)
		}
		return
	}
	if err == nil && r.Store != nil {
		err = r.Store.Keys.VerifyBeacon(b) // signed by its host's key (NATS permissions alone do not authenticate it)
	}
	if err == nil {
		err = box.put(host, b, b.State == fencing.LeaseWithdrawn)
	}
	if r.OnBeacon != nil {
		r.OnBeacon(host, b, err)
	}
}

// overBudget reports whether host's beacon, decoded, is beyond its
// verification budget (beaconBudget): only an enrolled host's with signing
// on (without a key nothing costs a verification).
func (r *Runner) overBudget(host string, box *beaconBox) bool {
	if beaconBudgetMutation || r.Store == nil || !r.Store.Keys.Enabled() || len(r.Store.Keys.Hosts[host]) == 0 {
		return false
	}
	return box.shedOver(host, r.now())
}

// chargeFirstMutation: a beacon is charged to its subject's host before
// it is decoded (reviewer X80's hole: the server publishes JetStream API
// answers on any reply subject an agent names, so compute-1 spent any
// host's budget with reflected answers). Tests only.
var chargeFirstMutation bool

// beaconSubjectHost returns the host of a beacon subject.
func beaconSubjectHost(subject string) (string, error) {
	toks := strings.Split(subject, ".")
	if len(toks) != 4 || toks[3] != proto.KindBeacon {
		return "", fmt.Errorf("beacon on subject %q", subject)
	}
	host, err := proto.TokenToHost(toks[2])
	if err != nil {
		return "", fmt.Errorf("beacon on subject %q: %w", subject, err)
	}
	return host, nil
}

// decodeBeaconMsg returns the host of m's subject and m's beacon, which
// must be that host's.
func decodeBeaconMsg(m *nats.Msg) (string, fencing.Beacon, error) {
	host, err := beaconSubjectHost(m.Subject)
	if err != nil {
		return "", fencing.Beacon{}, err
	}
	b, err := fencing.DecodeBeacon(m.Data)
	if err == nil && b.Host != host {
		err = fmt.Errorf("beacon of host %q on the subject of %q", b.Host, host)
	}
	return host, b, err
}

func (r *Runner) perform(ctx context.Context, log *slog.Logger, d Decision) {
	var err error
	switch d.Op {
	case OpDeclare, OpRelease:
		if !r.mayAct() {
			// Checked immediately before the write: a standby, or a
			// leader whose lock lapsed, writes nothing. The tracker
			// decides the host again at its next tick.
			r.Tracker.NotPerformed(d)
			log.Debug("not acting: "+d.Op.String()+" not written", "host", d.Host)
			if r.OnDecision != nil {
				r.OnDecision(d, ErrNotActing)
			}
			return
		}
	}
	switch d.Op {
	case OpDeclare:
		if err := r.checkReceipt(ctx, log, d); err != nil {
			r.Tracker.NotPerformed(d)
			if r.OnDecision != nil {
				r.OnDecision(d, err)
			}
			return
		}
		if !r.mayAct() && !actRecheckMutation {
			// Checked again: the receipt read (up to ReceiptReadTimeout)
			// came between the first check and the write, and the lock's
			// safety holds only for one write within ActMargin of the
			// last check (leader.go; reviewer X57).
			r.Tracker.NotPerformed(d)
			if r.OnDecision != nil {
				r.OnDecision(d, ErrNotActing)
			}
			return
		}
		if r.Signature != nil {
			d.Record.Reason += " (" + r.Signature() + ")"
		}
		_, err = r.Store.Write(ctx, d.Host, d.Revision, d.Record, WriteTimeout)
		if err != nil {
			log.Info("declaration not written (the host renewed, or NATS failed)", "host", d.Host, "err", err)
		} else {
			log.Warn("host declared expired", "host", d.Host, "epoch", d.Record.Epoch, "reason", d.Reason)
		}
	case OpRelease:
		_, err = r.Store.Write(ctx, d.Host, d.Revision, d.Record, WriteTimeout)
		if err != nil {
			err = fmt.Errorf("release %s: %w", d.Host, err)
			log.Error("release failed", "host", d.Host, "err", err)
		}
	case OpHoldStarted:
		log.Error("MASS FAILURE GUARD: holding, declaring nothing", "silent", d.Silent, "threshold", d.Threshold, "reason", d.Reason)
	case OpHoldEnded:
		log.Warn("mass failure guard: hold ended", "silent", d.Silent, "threshold", d.Threshold)
	case OpRefuse:
		log.Error("REFUSING host: its constants cannot be honoured; it will never be declared expired", "host", d.Host, "reason", d.Reason)
	case OpRefusedDue:
		log.Error("refused host is silent and will NOT be declared", "host", d.Host, "reason", d.Reason)
	case OpLeaseDeleted:
		log.Error("LEASE KEY DELETED: host unprotected, it will not be declared until its agent re-creates the key", "host", d.Host, "reason", d.Reason)
	case OpHeldBack:
		log.Warn("host due but held back by the mass-failure guard", "host", d.Host)
	case OpInvalid:
		log.Error("INVALID LEASE RECORD ignored: a forged or unverifiable value in the host's key", "host", d.Host, "revision", d.Revision, "reason", d.Reason)
	case OpVouched:
		log.Warn("lease record vouched by the host's beacon: trusted as its first record", "host", d.Host, "revision", d.Revision, "reason", d.Reason)
	case OpRevisionRegressed:
		log.Error("LEASE REVISIONS WENT DOWN: the lease stream was re-created or rolled back; the host is not declared until its revisions pass the last one seen — restart the controllers", "host", d.Host, "revision", d.Revision, "reason", d.Reason)
	case OpWithdrawn:
		log.Error("host WITHDREW its lease: unprotected (no fencing), will not be declared or recovered until its agent renews",
			"host", d.Host, "reason", d.Record.Reason, "epoch", d.Record.Epoch)
	default:
		err = errors.New("unknown decision")
	}
	if r.OnDecision != nil {
		r.OnDecision(d, err)
	}
}

// streamID is StreamID for the runner: "" (and a WARN) when it cannot be
// read (no pin is then taken).
func streamID(ctx context.Context, st *natslease.Store, log *slog.Logger) string {
	id, err := StreamID(ctx, st.KV)
	if err != nil {
		log.Warn("the lease stream's creation time is unknown: no memory pin will be taken", "err", err)
	}
	return id
}

// StreamID identifies kv's stream by its creation time (memory pins are
// taken only from the stream they were written for: memory.go).
func StreamID(ctx context.Context, kv jetstream.KeyValue) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, natslease.ReadTimeout)
	defer cancel()
	s, err := kv.Status(cctx)
	if err != nil {
		return "", err
	}
	b, ok := s.(*jetstream.KeyValueBucketStatus)
	if !ok || b.StreamInfo() == nil {
		return "", errors.New("no stream info in the bucket's status")
	}
	return b.StreamInfo().Created.UTC().Format(time.RFC3339Nano), nil
}

// monoStart anchors the monotonic readings of stepWatch: time.Since of it
// is the process's monotonic clock.
var monoStart = time.Now()

// ClockStepMin: a difference between the wall and the monotonic clock's
// progress between two ticks above it is a step (Tracker.ClockStepped).
// NTP slews at most 0.5 ms/s; 1 s is far above that and below any
// lease's timing.
const ClockStepMin = time.Second

// stepWatch finds steps of the wall clock between two readings.
type stepWatch struct {
	wall time.Time
	mono time.Duration
	set  bool
}

// observe takes a reading (the wall clock, without its monotonic reading;
// the monotonic one) and returns how much more the wall clock moved than
// the monotonic one since the last reading (0 at the first).
func (s *stepWatch) observe(wall time.Time, mono time.Duration) time.Duration {
	var d time.Duration
	if s.set {
		d = wall.Sub(s.wall) - (mono - s.mono)
	}
	s.wall, s.mono, s.set = wall, mono, true
	return d
}
