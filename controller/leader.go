package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Leader election among controllers: a pure core, time passed in,
// decisions returned as values (LeaderOp), driven by one goroutine of a
// runner that owns the NATS I/O.
//
// The lock is one key of the lease bucket, LeaderKey, holding a LockRecord.
// It is taken and renewed by compare-and-set on its revision, like the
// agents' leases:
//
//   - The holder renews every RenewInterval by CAS on the revision of its
//     own last landed record. A renewal counts from its SEND time, and only
//     once it is known to have landed (acknowledged, or its record seen by
//     the watch or in a CAS conflict). A renewal whose answer does not come
//     has an unknown outcome: the next one uses the same expected revision.
//   - The holder may act (MayAct) only while now < sent + TTL − ActMargin,
//     `sent` being the send time of its last landed renewal, on its own
//     clock. It keeps renewing when that has passed: a CAS on its own
//     revision that lands proves that nobody took the lock in between.
//   - A standby takes the lock by CAS on the revision it observes, only
//     once it has observed that same revision, unchanged, for
//     TakeoverAfter(TTL) = TTL × (1+δ)/(1−δ) on its own clock (δ: the
//     clock-rate bound). An absent or deleted key is treated the same way:
//     nobody acts on a key nobody has watched stand still for that long.
//
// Safety (never two controllers acting): let S be the real time the
// holder sent its last landed renewal. It starts no action after local
// sent + TTL − ActMargin, i.e. no later than real S + (TTL − ActMargin)/(1−δ),
// The renewal landed at A ≥ S; a standby observed that revision at O ≥ A
// and takes over no earlier than O + TakeoverAfter/(1+δ) ≥ S + TTL/(1−δ)
// (real): ActMargin/(1−δ) ≥ ActMargin after the holder's last action
// started. So every action whose effect lands within ActMargin (real time)
// of its start has landed before another controller can act. A takeover
// CAS on an older revision fails (the renewal changed it), so the
// standby's clock restarts at every landed renewal. A holder that resigns
// (orderly stop) stops acting first, then writes a released record by CAS;
// a standby that sees it waits only TakeoverAfter(ActMargin).
// The holder learns of a takeover from the watch or from its next CAS
// conflict and steps down; until then MayAct already says no.
//
// What timing cannot cover: an action whose effect lands later than
// ActionBound after it was started (a KV write delivered 16 s late, an
// OpenStack call that hangs). Every such write must therefore be
// conditioned itself — a CAS on the revision of the record it changes
// (declarations, releases, recovery steps) — and every OpenStack step
// idempotent, so a deposed leader's late effect is refused or harmless.
// A process frozen (SIGSTOP) past its lease re-checks MayAct on its clock
// (CLOCK_BOOTTIME counts the freeze) before its next action and does not
// act.

// Leader lock constants.
const (
	// LeaderKey is the lock's key in the lease bucket: like GuardKey it
	// starts with '_', which no host token does.
	LeaderKey = "_leader"
	// LockSchema is the version of LockRecord.
	LockSchema = 1
	// DefaultLeaderTTL: the standby takes over 10.2 s (at 1 % drift) after
	// the last renewal it saw; with renewals every 2.5 s a leader survives
	// three lost or slow renewals (a KV write took up to 1.8 s under 30 %
	// packet loss, shared/reference/nats-partitions.md) before it stops
	// acting.
	DefaultLeaderTTL = 10 * time.Second
	// DefaultLeaderRenew is the renewal period: TTL/4.
	DefaultLeaderRenew = DefaultLeaderTTL / 4
	// DefaultActMargin: the leader stops starting actions this long before
	// its lease ends, so an action started just before is applied before
	// any standby can take over. 2 s is the bound of one KV write
	// (WriteTimeout); slower effects must be conditioned (see above).
	DefaultActMargin = 2 * time.Second
)

// LockRecord is the value of LeaderKey.
type LockRecord struct {
	Schema int    `json:"schema"`
	Holder string `json:"holder"`
	// Term increases with every takeover; it is the fencing token of the
	// holder's actions (written into what it writes).
	Term uint64 `json:"term"`
	// Seq numbers the holder's renewals within a term, so a late write is
	// recognised as the holder's own.
	Seq uint64 `json:"seq"`
	// TTLMillis and Drift are the holder's constants: a standby waits
	// TakeoverAfter(TTL, Drift) measured on its own clock.
	TTLMillis int64   `json:"ttl_ms"`
	Drift     float64 `json:"drift"`
	// Released: the holder resigned (it acts no more); ActMarginMillis is
	// how long its last actions may still take to land.
	Released        bool  `json:"released,omitempty"`
	ActMarginMillis int64 `json:"act_margin_ms,omitempty"`
}

// Encode returns the JSON encoding of r.
func (r LockRecord) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode leader lock: %w", err)
	}
	return b, nil
}

// DecodeLockRecord decodes a LockRecord, rejecting other schemas and
// records without a holder, a term or a TTL.
func DecodeLockRecord(b []byte) (LockRecord, error) {
	var r LockRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode leader lock: %w", err)
	}
	switch {
	case r.Schema != LockSchema:
		return r, fmt.Errorf("decode leader lock: schema %d (want %d)", r.Schema, LockSchema)
	case r.Holder == "":
		return r, errors.New("decode leader lock: no holder")
	case r.Term == 0:
		return r, errors.New("decode leader lock: term 0")
	case r.TTLMillis <= 0:
		return r, fmt.Errorf("decode leader lock: ttl_ms %d", r.TTLMillis)
	case r.Drift < 0 || r.Drift >= 0.5:
		return r, fmt.Errorf("decode leader lock: drift %g", r.Drift)
	}
	return r, nil
}

// TakeoverAfter is how long a standby must have seen the lock's revision
// unchanged, on its own clock, before it may take it: ttl × (1+δ)/(1−δ).
func TakeoverAfter(ttl time.Duration, drift float64) time.Duration {
	return time.Duration(float64(ttl) * (1 + drift) / (1 - drift))
}

// LeaderConfig configures a Leader.
type LeaderConfig struct {
	// ID names this controller in the lock (unique per process: host name
	// and a random suffix).
	ID string
	// TTL, RenewInterval, WriteTimeout: the lock's lease, renewal period
	// and the bound on one write (after it the outcome is unknown).
	TTL, RenewInterval, WriteTimeout time.Duration
	// ActMargin: see DefaultActMargin.
	ActMargin time.Duration
	// Drift bounds this controller's clock-rate error.
	Drift float64
}

// DefaultLeaderConfig returns the defaults for id.
func DefaultLeaderConfig(id string) LeaderConfig {
	return LeaderConfig{ID: id, TTL: DefaultLeaderTTL, RenewInterval: DefaultLeaderRenew,
		WriteTimeout: WriteTimeout, ActMargin: DefaultActMargin, Drift: DefaultDrift}
}

// DefaultDrift is the controllers' clock-rate bound (the agents' too).
const DefaultDrift = 0.01

// Validate checks c.
func (c LeaderConfig) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, fmt.Errorf("%w: leader id is empty", ErrInvalidConfig))
	}
	if c.Drift < 0 || c.Drift > 0.1 {
		errs = append(errs, fmt.Errorf("%w: leader drift %g outside [0, 0.1]", ErrInvalidConfig, c.Drift))
	}
	if c.TTL <= 0 || c.RenewInterval <= 0 || c.WriteTimeout <= 0 || c.ActMargin < 0 {
		errs = append(errs, fmt.Errorf("%w: leader ttl %s, renew %s, write timeout %s, act margin %s must be > 0",
			ErrInvalidConfig, c.TTL, c.RenewInterval, c.WriteTimeout, c.ActMargin))
	} else if c.RenewInterval+c.WriteTimeout+c.ActMargin >= c.TTL {
		// One renewal must be able to land (sent, answered within the
		// write timeout) while the lease still allows acting.
		errs = append(errs, fmt.Errorf("%w: leader renew %s + write timeout %s + act margin %s must be < ttl %s",
			ErrInvalidConfig, c.RenewInterval, c.WriteTimeout, c.ActMargin, c.TTL))
	}
	return errors.Join(errs...)
}

// LeaderOpKind is the kind of a LeaderOp.
type LeaderOpKind int

// Leader op kinds.
const (
	// LeaderWrite: write Record to LeaderKey by CAS on Revision (0: the
	// key must not exist or must be a delete marker of that revision — the
	// runner maps it to a create) and report the result with WriteResult.
	LeaderWrite LeaderOpKind = iota
	// LeaderElected: this controller holds the lock (term Record.Term).
	LeaderElected
	// LeaderDeposed: this controller no longer holds the lock (Reason).
	LeaderDeposed
)

var leaderOpNames = [...]string{"lock-write", "elected", "deposed"}

func (k LeaderOpKind) String() string {
	if int(k) < len(leaderOpNames) {
		return leaderOpNames[k]
	}
	return fmt.Sprintf("leader-op(%d)", int(k))
}

// LeaderOp is one thing the runner must do or say.
type LeaderOp struct {
	Kind     LeaderOpKind
	Revision uint64
	Record   LockRecord
	Reason   string
}

// WriteOutcome classifies the answer to a LeaderWrite.
type WriteOutcome int

// Write outcomes.
const (
	// WriteLanded: acknowledged at Revision.
	WriteLanded WriteOutcome = iota
	// WriteConflict: the CAS failed; Current/CurrentRev is what the key
	// holds (nil: absent or deleted) if the runner could read it.
	WriteConflict
	// WriteUnknown: no answer within the write timeout (it may land later).
	WriteUnknown
)

type sentWrite struct {
	seq    uint64
	term   uint64
	sentAt time.Time
	expect uint64
}

// leaderMutation switches one rule of the core off, for the simulation's
// mutation checks only (leader_sim_test.go): each must make its safety
// property fail, which shows the property can fail and the rule is needed.
var leaderMutation struct {
	noActMargin     bool // act until the whole TTL has passed
	countFromAnswer bool // count a renewal from its answer, not its send time
	unknownLanded   bool // take a write with no answer as landed
}

// Leader is the lock's state machine for one controller.
type Leader struct {
	cfg LeaderConfig

	// What the watch shows.
	watching bool
	rev      uint64      // revision of the key's current value (or delete marker)
	cur      *LockRecord // current value (nil: absent)
	since    time.Time   // when rev was first seen (or the watch started)
	maxTerm  uint64      // highest term ever seen

	// This controller's claim.
	leading  bool
	term     uint64
	seq      uint64      // last seq sent
	ownRev   uint64      // revision of our last landed record
	landed   uint64      // seq of our last landed record
	validAt  time.Time   // send time of our last landed record
	sent     []sentWrite // writes not known to have landed (by seq)
	inflight time.Time   // send time of the write awaiting its answer (zero: none)
	lastSend time.Time
	out      []LeaderOp
}

// NewLeader returns the state machine (not watching, not leading).
func NewLeader(cfg LeaderConfig) (*Leader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Leader{cfg: cfg}, nil
}

// Leading reports whether this controller believes it holds the lock (it
// may still not be allowed to act: MayAct).
func (l *Leader) Leading() bool { return l.leading }

// Term returns the term of this controller's claim (0: none): the fencing
// token its actions carry.
func (l *Leader) Term() uint64 { return l.term }

// Holder returns the current holder as the watch shows it ("" if none).
func (l *Leader) Holder() (string, uint64) {
	if l.cur == nil {
		return "", 0
	}
	return l.cur.Holder, l.cur.Term
}

// MayAct reports whether this controller may start an action at now: it
// holds the lock and its last landed renewal was sent less than
// TTL − ActMargin ago. Call it immediately before every action.
func (l *Leader) MayAct(now time.Time) bool {
	return l.leading && now.Before(l.ValidUntil())
}

// ValidUntil returns when MayAct turns false unless a renewal lands.
func (l *Leader) ValidUntil() time.Time {
	if !l.leading {
		return time.Time{}
	}
	if leaderMutation.noActMargin {
		return l.validAt.Add(l.cfg.TTL)
	}
	return l.validAt.Add(l.cfg.TTL - l.cfg.ActMargin)
}

// WatchStarted tells the core its watch of LeaderKey was (re)established
// at now; the current value follows through Observe. A standby's takeover
// clock restarts: it must see the key stand still for TakeoverAfter while
// watching.
func (l *Leader) WatchStarted(now time.Time) {
	l.watching = true
	l.since = now
}

// WatchLost tells the core the watch failed: no takeover until it is back.
func (l *Leader) WatchLost() { l.watching = false }

// Observe reports the key's value at revision rev (rec nil: absent or
// deleted) as seen by the watch at now.
func (l *Leader) Observe(now time.Time, rev uint64, rec *LockRecord) []LeaderOp {
	l.out = l.out[:0]
	if rev <= l.rev && (rev != 0 || l.rev != 0) {
		// Stale or repeated: revisions only grow, so an older one (or an
		// "absent" snapshot after a revision was seen, as a watch that
		// started before a delete may deliver it) says nothing new.
		return l.out
	}
	l.rev, l.cur, l.since = rev, rec, now
	if rec != nil && rec.Term > l.maxTerm {
		l.maxTerm = rec.Term
	}
	if rec != nil && l.own(rec) {
		l.adopt(now, rev, rec.Seq)
		return l.out
	}
	if l.leading {
		reason := "lock deleted"
		if rec != nil {
			reason = fmt.Sprintf("lock taken by %s (term %d)", rec.Holder, rec.Term)
		}
		l.depose(reason)
	}
	return l.out
}

// own reports whether rec is a record of this controller's current claim.
func (l *Leader) own(rec *LockRecord) bool {
	return l.term != 0 && rec.Holder == l.cfg.ID && rec.Term == l.term
}

// adopt records that our write seq landed at rev (learned at now).
func (l *Leader) adopt(now time.Time, rev, seq uint64) {
	if seq <= l.landed {
		if rev > l.ownRev {
			l.ownRev = rev
		}
		return
	}
	var w *sentWrite
	for i := range l.sent {
		if l.sent[i].seq == seq && l.sent[i].term == l.term {
			w = &l.sent[i]
		}
	}
	if w == nil {
		return // not a write of ours we know the send time of: do not count it
	}
	l.landed, l.ownRev, l.validAt = seq, rev, w.sentAt
	if leaderMutation.countFromAnswer {
		l.validAt = now
	}
	kept := l.sent[:0]
	for _, s := range l.sent {
		if s.seq > seq {
			kept = append(kept, s)
		}
	}
	l.sent = kept
	if !l.leading {
		l.leading = true
		l.out = append(l.out, LeaderOp{Kind: LeaderElected, Revision: rev, Record: l.record(seq)})
	}
}

func (l *Leader) depose(reason string) {
	l.leading = false
	l.term, l.seq, l.landed, l.ownRev = 0, 0, 0, 0
	l.sent = l.sent[:0]
	l.inflight = time.Time{}
	l.out = append(l.out, LeaderOp{Kind: LeaderDeposed, Reason: reason})
}

func (l *Leader) record(seq uint64) LockRecord {
	return LockRecord{Schema: LockSchema, Holder: l.cfg.ID, Term: l.term, Seq: seq,
		TTLMillis: l.cfg.TTL.Milliseconds(), Drift: l.cfg.Drift}
}

// Tick evaluates renewals and takeovers at now.
func (l *Leader) Tick(now time.Time) []LeaderOp {
	l.out = l.out[:0]
	if !l.inflight.IsZero() {
		if now.Sub(l.inflight) < l.cfg.WriteTimeout {
			return l.out // one write at a time
		}
		l.inflight = time.Time{} // unanswered: unknown outcome
		if leaderMutation.unknownLanded && l.term != 0 && len(l.sent) > 0 {
			w := l.sent[len(l.sent)-1]
			l.adopt(now, l.ownRev, w.seq)
		}
	}
	switch {
	case l.term != 0:
		// Renew (also while not yet confirmed leading: a takeover whose
		// outcome is unknown is retried on the same expected revision).
		every := l.cfg.RenewInterval
		if !l.MayAct(now) || len(l.sent) > 0 {
			every /= 2 // in doubt: retry faster
		}
		if now.Sub(l.lastSend) >= every {
			l.send(now, l.ownRev)
		}
	case l.watching && now.Sub(l.since) >= l.takeoverWait():
		// Take the lock by CAS on the revision that stood still.
		l.term = l.maxTerm + 1
		l.maxTerm = l.term
		l.seq, l.landed, l.ownRev = 0, 0, l.rev
		l.send(now, l.rev)
	}
	return l.out
}

// takeoverWait is TakeoverAfter for the current holder's constants (ours
// for an absent key), never less than for ours.
func (l *Leader) takeoverWait() time.Duration {
	w := TakeoverAfter(l.cfg.TTL, l.cfg.Drift)
	if l.cur != nil && l.cur.Released {
		m := max(l.cfg.ActMargin, time.Duration(l.cur.ActMarginMillis)*time.Millisecond)
		return TakeoverAfter(m, max(l.cur.Drift, l.cfg.Drift))
	}
	if l.cur != nil {
		if h := TakeoverAfter(time.Duration(l.cur.TTLMillis)*time.Millisecond, max(l.cur.Drift, l.cfg.Drift)); h > w {
			w = h
		}
	}
	return w
}

func (l *Leader) send(now time.Time, expect uint64) {
	l.seq++
	l.sent = append(l.sent, sentWrite{seq: l.seq, term: l.term, sentAt: now, expect: expect})
	if len(l.sent) > 64 {
		l.sent = l.sent[1:]
	}
	l.inflight, l.lastSend = now, now
	l.out = append(l.out, LeaderOp{Kind: LeaderWrite, Revision: expect, Record: l.record(l.seq)})
}

// WriteResult reports the answer to the LeaderWrite of rec: landed at rev,
// a conflict (current: what the key holds at currentRev, nil if absent or
// unread), or unknown.
func (l *Leader) WriteResult(now time.Time, rec LockRecord, outcome WriteOutcome, rev uint64, current *LockRecord) []LeaderOp {
	l.out = l.out[:0]
	if rec.Term != l.term || l.term == 0 {
		return l.out // a write of a claim we gave up
	}
	if rec.Seq == l.seq {
		l.inflight = time.Time{}
	}
	switch outcome {
	case WriteLanded:
		l.adopt(now, rev, rec.Seq)
	case WriteConflict:
		if current != nil && l.own(current) {
			l.adopt(now, rev, current.Seq) // an earlier write of ours landed late
			return l.out
		}
		if current != nil && current.Term > l.maxTerm {
			l.maxTerm = current.Term
		}
		if rev > l.rev {
			// The conflict shows a newer revision than the watch has
			// delivered: take it as observed now (the takeover wait
			// restarts: conservative).
			l.rev, l.cur, l.since = rev, current, now
		}
		if l.leading {
			reason := "lock deleted or rewritten"
			if current != nil {
				reason = fmt.Sprintf("lock taken by %s (term %d)", current.Holder, current.Term)
			}
			l.depose(reason)
		} else {
			// Lost the race for the lock; wait for the watch again.
			l.term, l.seq, l.landed, l.ownRev = 0, 0, 0, 0
			l.sent = l.sent[:0]
		}
	case WriteUnknown:
	}
	return l.out
}

// Resign gives the lock up at now (orderly stop): MayAct is false from
// now on, and the returned ops are the released record to write by CAS on
// our revision (a standby that sees it takes over TakeoverAfter(ActMargin)
// later instead of a whole TTL) and the LeaderDeposed. Nothing when not
// leading.
func (l *Leader) Resign() []LeaderOp {
	l.out = l.out[:0]
	if !l.leading {
		return l.out
	}
	rec := l.record(l.seq + 1)
	rec.Released, rec.ActMarginMillis = true, l.cfg.ActMargin.Milliseconds()
	rev := l.ownRev
	l.depose("resigned")
	l.out = append(l.out, LeaderOp{Kind: LeaderWrite, Revision: rev, Record: rec})
	return l.out
}

// NextDeadline returns when Tick should run next at the latest.
func (l *Leader) NextDeadline(now time.Time) time.Time {
	next := now.Add(l.cfg.RenewInterval / 2)
	if l.term == 0 && l.watching {
		if d := l.since.Add(l.takeoverWait()); d.After(now) && d.Before(next) {
			next = d
		}
	}
	return next
}
