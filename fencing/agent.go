package fencing

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// maxSent bounds the remembered send times of renewals whose outcome is not
// known (a few per lease at the defaults).
const maxSent = 64

// minRoundGap is the least time between the starts of two peer rounds:
// a round whose peers all answered at once (e.g. connection refused) does
// not turn into a busy loop.
const minRoundGap = 500 * time.Millisecond

// relayerMemory is how long a peer that reached NATS for us is asked first.
const relayerMemory = time.Minute

// peerRetry is how often the unanswered peers of an open round are asked
// again (a question or its answer may be lost; a peer may be restarting).
const peerRetry = time.Second

// fenceRetry is the pause before a failed domain operation is retried.
const fenceRetry = 500 * time.Millisecond

// Agent is the agent-side lease, isolation and fence state machine. It is
// pure: it never reads the clock, performs no I/O and is driven by one
// goroutine; every method takes now and returns a Ready to perform.
type Agent struct {
	cfg   Config
	state State

	epoch uint64
	rev   uint64 // revision of the latest record of ours we know landed
	// absentAt: the delete marker the last conflict with no record named
	// (0: none); a relayed create is sealed for it while rev is 0.
	absentAt uint64
	lease    bool      // lastAck is valid
	lastAck  time.Time // send time of the last acknowledged renewal
	declared bool
	released bool
	held     bool
	reason   Reason

	seq         uint64
	writes      uint64 // Durable.Writes of the last state persisted
	landedSeq   uint64 // highest seq known to have landed
	incarnation uint64 // one per NewAgent: tells our renewals from an earlier process's
	nextRound   time.Time
	isolation   Reason               // what the last unsuccessful round showed
	roundSeqs   map[uint64]uint64    // recent round IDs -> their renewal seq (late relays)
	sent        map[uint64]time.Time // send times of renewals not yet settled
	inflight    uint64               // seq of the outstanding own renewal (0: none)
	inflightT   time.Time            // its deadline
	nextRenew   time.Time

	members []string
	guard   Guard
	rng     *rand.Rand

	round      *roundState
	roundID    uint64
	confirmed  map[string]time.Time // peers that answered CannotRenew, and when
	relayers   map[string]time.Time // peers that reached NATS for us, and when
	nextHeld   time.Time            // next Held round
	heldUntil  time.Time            // Held confirmation valid until
	fenceStart time.Time
	fenceDL    time.Time
	escalated  bool
	pending    map[string]time.Time // domain -> retry-at (zero: in flight)
	paused     map[string]bool
	inventory  map[string]bool // uuid -> running
	// inventoryKnown: Domains was called; a fence never completes before.
	inventoryKnown bool

	reconcileID uint64
	rejoinDecl  bool // the rejoin follows a declaration (release)

	// selfDecl: the key was found deleted while unsafe (keydelete.go);
	// renewals re-create it as an expired record by CAS on declRev until
	// one lands. selfDeclSeqs are those writes' seqs.
	selfDecl   bool
	declRev    uint64
	invalidRev uint64 // revision of the last untrusted record alerted
	// relayReports: the peers that reported a landing of (seq, revision)
	// (corroborated; only with LyingPeers > 0).
	relayReports map[[3]uint64]map[string]bool
	selfDeclSeqs map[uint64]bool

	// Orderly stop (Stop): no renewal or peer round starts any more; the
	// withdrawal (seq withdrawSeq, deadline withdrawDL) is in flight until
	// it lands (Withdrawn) or fails (the agent fences).
	stopping   bool
	stopReason string
	// recWithdrawn: the key holds our withdrawn record (this process
	// started from it, an earlier process did and crashed before a
	// renewal landed, or a conflict showed it) and no renewal of ours
	// landed on it yet: the controller neither declares nor counts the
	// host, so this agent's "cannot renew" must not count toward a
	// peer's hold either.
	recWithdrawn bool
	// feedLimit (zero: none): the lease feeds the watchdog only before it.
	// Set by a restart with a longer watchdog_timeout than the record the
	// controller saw last; cleared when a renewal of ours lands.
	feedLimit     time.Time
	withdrawSeq   uint64
	withdrawDL    time.Time
	withdrawTries int

	r Ready
}

type roundState struct {
	id        uint64
	nextRetry time.Time // unanswered peers are asked again then
	renewal   RenewRequest
	deadline  time.Time
	asked     map[string]bool
	answers   map[string]PeerAnswerKind
}

// NewAgent returns an agent for cfg, restoring d (nil on a first start) and
// taking the current record of the host's key (cur nil: no key; rev its
// revision) as read at start. The returned Ready carries the initial
// transition (and fence operations when restarting fenced).
func NewAgent(cfg Config, d *Durable, cur *LeaseRecord, rev uint64, now time.Time) (*Agent, Ready, error) {
	if err := cfg.Validate(); err != nil {
		return nil, Ready{}, err
	}
	a := &Agent{
		cfg: cfg, state: StateStarting, sent: map[uint64]time.Time{},
		confirmed: map[string]time.Time{}, pending: map[string]time.Time{}, relayers: map[string]time.Time{},
		paused: map[string]bool{}, inventory: map[string]bool{},
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	reason := ReasonStarted
	if d != nil && d.Host == cfg.Host {
		a.incarnation, a.writes = d.Incarnation, d.Writes
		a.epoch, a.rev = d.Epoch, d.Revision
		a.declared, a.released = d.Declared, d.Released
		for _, u := range d.Paused {
			a.paused[u] = true
		}
		if d.BootID == cfg.BootID {
			a.lease, a.lastAck = d.HaveLease, d.LastAck
			a.feedLimit = d.FeedUntil
			a.held = d.Held
			if d.Fenced {
				a.state, reason = StateFenced, ReasonRestartedFenced
			} else if d.Held {
				a.state, reason = StateHeld, ReasonRestartedHeld
			}
		} else {
			// A new boot: whatever ran before is gone.
			clear(a.paused)
		}
	}
	// The previous process withdrew (orderly stop): the key holds a
	// withdrawn record (or NATS cannot tell, and the durable state says the
	// withdrawal landed). The controller declares nothing until it sees a
	// renewal of this process, so the lease age starts afresh below
	// (unless the host is fenced: it carries on fenced).
	if cur != nil && (cur.Host != cfg.Host || StaleRecord(*cur, rev, a.rev)) {
		// Not this host's current record (a replay, or another host's):
		// no evidence of anything; the first renewal's conflict shows it
		// again and handles it as an untrusted record.
		cur = nil
	}
	fromWithdrawn := d != nil && d.Host == cfg.Host && d.Withdrawn && cur == nil
	if cur != nil && cur.Host == cfg.Host {
		if cur.Sig != "" && cur.BootID == cfg.BootID {
			// Our records must be newer than any of this boot's already
			// in the key (a lost durable state restarts the count).
			a.incarnation = max(a.incarnation, cur.Incarnation)
		}
		if cur.State != LeaseExpired {
			a.rev = rev // never the revision of a declaration (see conflict)
		}
		switch cur.State {
		case LeaseWithdrawn:
			fromWithdrawn = cur.Epoch >= a.epoch
			a.epoch = max(a.epoch, cur.Epoch)
		case LeaseExpired:
			if cur.Epoch >= a.epoch {
				a.declared, a.released = true, false
				a.epoch = cur.Epoch
			}
		case LeaseReleased:
			if cur.Epoch >= a.epoch {
				// Released, not taken over yet (our renewal on it turns
				// it active): declared and released, whether or not we
				// saw the declaration; the takeover resumes nothing.
				a.declared, a.released = true, true
				if Mutations.ReleaseHidesDeclaration {
					a.declared, a.released = false, a.declared || a.released
				}
				a.epoch = cur.Epoch
			}
		default:
			a.epoch = max(a.epoch, cur.Epoch)
		}
	}
	if fromWithdrawn && a.state == StateStarting && !a.declared && !Mutations.RestartKeepsWithdrawnAge {
		a.lease = false
		reason = ReasonStartedFromWithdrawn
	}
	// Also when an earlier process of this boot started from it and
	// crashed before a renewal landed (NATS unreachable now): the durable
	// state carries the flag, not the withdrawn lease age.
	carried := d != nil && d.Host == cfg.Host && d.KeyWithdrawn && cur == nil && !Mutations.WithdrawnKeyNotCarried
	a.recWithdrawn = (fromWithdrawn || carried) && !Mutations.WithdrawnRestartConfirms
	if a.lease && !Mutations.NewTimingForOldLease {
		// The lease inherited from the durable state was granted by a
		// record with the constants the controller saw last (the key's, if
		// read; else the durable state's): a restart with changed
		// constants must not stretch it.
		var seen *Timing
		if d != nil && d.Timing != nil {
			seen = d.Timing
		}
		if cur != nil && cur.Host == cfg.Host && cur.State == LeaseActive {
			seen = &cur.Timing
		}
		if seen != nil {
			// A longer watchdog_timeout: a dead agent's reset must still
			// come by the seen record's lease_ttl + watchdog_timeout, so
			// the lease feeds the watchdog only until then.
			if lim := a.lastAck.Add(seen.LeaseTTL + seen.WatchdogTimeout - cfg.Timing.WatchdogTimeout); cfg.Timing.WatchdogTimeout > seen.WatchdogTimeout &&
				(a.feedLimit.IsZero() || lim.Before(a.feedLimit)) {
				a.feedLimit = lim
			}
			a.lastAck = a.lastAck.Add(-leaseTimingShift(*seen, cfg.Timing))
		}
	}
	if !a.lease {
		// No lease known in this boot: act as if the last acknowledged
		// renewal was one interval ago, so that one renewal and one peer
		// round fit before fencing.
		a.lease, a.lastAck = true, now.Add(-cfg.Timing.RenewInterval)
	}
	a.incarnation++
	if !Mutations.IncarnationFloorIgnored {
		a.incarnation = max(a.incarnation, cfg.IncarnationFloor)
	}
	a.nextRenew = now
	a.transition(now, StateStarting, a.state, reason, "")
	if a.state == StateHeld {
		// Confirm the hold again at once; fence if the round does not —
		// and never later than the last confirmation allowed (found by the
		// simulation: an agent crash-looping while Held, cut off and with
		// libvirt down, gave itself a fresh hold at every start and fed
		// the watchdog for ever while the controller declared it).
		a.heldUntil = now.Add(cfg.Timing.PeerTimeout)
		if d != nil && d.BootID == cfg.BootID && d.HeldUntil.Before(a.heldUntil) && !Mutations.RestartRefreshesHold {
			// A durable state without held_until (written by a release
			// before it) says nothing of the last confirmation: the hold
			// is over (a zero time is before now).
			a.heldUntil = d.HeldUntil
		}
		a.nextHeld = now
	}
	switch {
	case !a.declared:
	case a.state == StateFenced:
		a.setState(now, StateAwaitingRelease, ReasonDeclaredExpired, "")
	case a.released:
		// Released while this agent was down (a new boot, a lost state):
		// the release is the evidence that what runs now may run;
		// nothing is fenced, nothing of the paused set is resumed.
	default:
		a.startFence(now, ReasonDeclaredExpired)
	}
	a.persist()
	// No timers run here: the caller first gives SetMembers and Domains,
	// then calls Tick.
	return a, a.take(), nil
}

// leaseTimingShift is how much earlier than its send time a lease granted
// by a record advertising seen must be counted under the constants now, so
// that every deadline the controller derived from seen still holds: the
// fence starts by seen's fence_by, escalates by its lease_ttl, and no
// confirmation is given past its confirmable_age (a longer
// watchdog_timeout is bounded by feedLimit instead). Zero when nothing
// grew.
func leaseTimingShift(seen, now Timing) time.Duration {
	return max(0,
		now.FenceBy()-seen.FenceBy(),
		now.LeaseTTL-seen.LeaseTTL,
		now.ConfirmableAge()-seen.ConfirmableAge())
}

// State returns the current state.
func (a *Agent) State() State { return a.state }

// Reason returns the reason of the last transition.
func (a *Agent) Reason() Reason { return a.reason }

// Epoch returns the lease epoch the agent writes.
func (a *Agent) Epoch() uint64 { return a.epoch }

// Declared reports whether the controller declared this host expired (and
// did not release it yet).
func (a *Agent) Declared() bool { return a.declared }

// LeaseExpiry returns when the lease lapses: the send time of the last
// acknowledged renewal plus LeaseTTL.
func (a *Agent) LeaseExpiry() time.Time { return a.lastAck.Add(a.cfg.Timing.LeaseTTL) }

// LeaseHeld reports whether the agent holds its lease at now.
func (a *Agent) LeaseHeld(now time.Time) bool {
	return a.lease && !a.declared && now.Before(a.LeaseExpiry())
}

// Paused returns the domains hvguard paused (sorted).
func (a *Agent) Paused() []string { return sortedKeys(a.paused) }

// PeerStatus is what this agent answers a peer asking whether it can renew.
func (a *Agent) PeerStatus(now time.Time) PeerStatus { return a.PeerView().Status(now) }

// PeerView is a snapshot of what PeerStatus needs, for a peer endpoint
// that answers off the agent's goroutine: the loop stores a fresh one after
// every call into the Agent, the endpoint evaluates it at the request time
// (on the same clock).
type PeerView struct {
	Lease    bool
	LastAck  time.Time
	Declared bool
	Held     bool
	// Withdrawn: the agent withdrew (or is stopping): it renews nothing,
	// and its "cannot renew" must not count toward a hold (the controller
	// does not count a withdrawn host).
	Withdrawn bool
	Timing    Timing
}

// PeerView returns the current snapshot.
func (a *Agent) PeerView() PeerView {
	return PeerView{Lease: a.lease, LastAck: a.lastAck, Declared: a.declared, Held: a.state == StateHeld && !a.stopping && !a.recWithdrawn,
		Withdrawn: a.stopping || a.recWithdrawn, Timing: a.cfg.Timing}
}

// Status evaluates the snapshot at now.
func (v PeerView) Status(now time.Time) PeerStatus {
	age := now.Sub(v.LastAck)
	return PeerStatus{
		Declared: v.Declared,
		CanRenew: !v.Declared && v.Lease && age < v.Timing.SuspectAfter() && !v.Withdrawn,
		Held:     !v.Declared && v.Held,
		Lapsed:   !v.Lease || age >= v.Timing.ConfirmableAge() || v.Withdrawn,
	}
}

// FeedWatchdog reports whether the hardware watchdog may be fed at now:
// only while the lease is held, the fence is complete, or a mass-failure
// hold is freshly confirmed. The caller feeds it from the loop that drives
// this Agent, never from a separate ticker.
//
// Against a dead (crashed, hung, killed) agent: feeding stops with the
// process, and while it ran it fed only (a) while the lease was held,
// i.e. before L + lease_ttl (L: the send time of the last landed
// renewal), (b) with every domain fenced, or (c) while a hold was
// confirmed (the controller holds too). So the watchdog resets the host
// no later than L + lease_ttl + watchdog_timeout on the agent's clock in
// case (a), which the controller's grace covers. A restarted agent may
// feed (and arm) only when this says so: arming feeds the device, so an
// agent that armed unconditionally at every start would keep a
// crash-looping host with a lapsed lease alive.
func (a *Agent) FeedWatchdog(now time.Time) bool {
	switch a.state {
	case StateWithdrawn:
		return true
	case StateFenced, StateAwaitingRelease, StateRejoining:
		// Fenced, as far as this process knows: only once it listed the
		// domains (a restart carries "fenced" over from the durable state,
		// and a crash mid-fence leaves domains running; the listing
		// fences them again, or libvirt does not answer and the watchdog
		// must not be fed on the strength of the file alone).
		return a.inventoryKnown || Mutations.FencedFeedsUnlisted
	case StateHeld:
		return now.Before(a.heldUntil)
	case StateFencing:
		if a.escalated {
			return false // the fence missed its deadline: let the watchdog reset
		}
	}
	if !a.feedLimit.IsZero() && !now.Before(a.feedLimit) {
		return false
	}
	return a.LeaseHeld(now)
}

// SetMembers sets the hosts of the lease bucket (peers are drawn from them)
// and the guard the controller published. The caller refreshes both from
// the bucket while it can read it; while cut off the cached values stay.
// A guard that is not valid, or older (Version) than the one the agent
// has, is ignored: the agent names its guard in its records, and the
// controller relies on an agent never going back to a version it no
// longer keeps.
func (a *Agent) SetMembers(members []string, g Guard) {
	a.members = a.members[:0]
	for _, m := range members {
		if m != a.cfg.Host {
			a.members = append(a.members, m)
		}
	}
	sort.Strings(a.members)
	if g.Valid() && (!a.guard.Valid() || g.Version >= a.guard.Version || Mutations.AcceptOlderGuard) {
		a.guard = g
	}
}

// Guard returns the guard the agent acts on (to cache across restarts).
func (a *Agent) Guard() Guard { return a.guard }

// Durable returns the state to persist.
func (a *Agent) Durable() Durable {
	return Durable{
		Host: a.cfg.Host, BootID: a.cfg.BootID, Epoch: a.epoch, Incarnation: a.incarnation, Writes: a.writes, Revision: a.rev,
		HaveLease: a.lease, LastAck: a.lastAck,
		Fenced: a.state == StateFencing || a.state == StateFenced || a.state == StateRejoining || (a.state == StateAwaitingRelease) ||
			// withdrawn during a fence: the next start carries on fenced
			// and resumes what was paused only through the rejoin.
			(a.state == StateWithdrawn && len(a.paused) > 0),
		Held: a.state == StateHeld, HeldUntil: a.heldUntil,
		Declared: a.declared, Released: a.released,
		Paused: sortedKeys(a.paused), Reason: a.reason,
		Timing: &a.cfg.Timing, FeedUntil: a.feedLimit,
		Withdrawn: a.state == StateWithdrawn, KeyWithdrawn: a.recWithdrawn || a.state == StateWithdrawn,
	}
}

// NextDeadline returns when Tick must be called next at the latest.
func (a *Agent) NextDeadline() time.Time {
	t := a.nextRenew
	if a.inflight != 0 {
		t = a.inflightT
	}
	upd := func(x time.Time) {
		if !x.IsZero() && x.Before(t) {
			t = x
		}
	}
	switch a.state {
	case StateStarting, StateHealthy, StateSuspect:
		upd(a.lastAck.Add(a.cfg.Timing.SuspectAfter()))
	case StateAskingPeers:
		upd(a.lastAck.Add(a.cfg.Timing.FenceBy()))
		if a.round == nil {
			upd(a.nextRound)
		}
	case StateHeld:
		upd(a.nextHeld)
		upd(a.heldUntil)
		if a.round == nil {
			upd(a.nextRound)
		}
	case StateFencing:
		if !a.escalated {
			upd(a.fenceDL)
		}
		for _, at := range a.pending {
			upd(at)
		}
	case StateRejoining:
		upd(a.lastAck.Add(a.cfg.Timing.SuspectAfter()))
	}
	if a.round != nil {
		upd(a.round.deadline)
		upd(a.round.nextRetry)
	}
	if a.withdrawSeq != 0 {
		upd(a.withdrawDL)
	}
	return t
}

// Tick advances timers to now.
func (a *Agent) Tick(now time.Time) Ready {
	a.step(now)
	return a.take()
}

// Renewed reports the outcome of the renewal seq (own or relayed).
func (a *Agent) Renewed(now time.Time, seq uint64, res RenewResult) Ready {
	if seq == a.inflight {
		a.inflight = 0
	}
	if seq != 0 && seq == a.withdrawSeq {
		a.withdrawResult(now, res)
		a.step(now)
		return a.take()
	}
	a.renewResult(now, seq, res)
	a.step(now)
	return a.take()
}

// PeerAnswered reports peer's answer to round id.
func (a *Agent) PeerAnswered(now time.Time, id uint64, peer string, ans PeerAnswer) Ready {
	rd := a.round
	if rd == nil || rd.id != id || !rd.asked[peer] {
		if ans.Kind == PeerRelayed && a.corroborated(reportLanding, a.roundSeq(id), ans.Revision, peer) {
			// A late relay is still a landed renewal of ours.
			a.renewResult(now, a.roundSeq(id), RenewResult{Outcome: RenewAcked, Revision: ans.Revision})
		}
		a.step(now)
		return a.take()
	}
	rd.answers[peer] = ans.Kind
	if ans.Kind != PeerCannotRenew && ans.Kind != PeerUnreachable {
		delete(a.confirmed, peer) // a newer answer replaces the confirmation
	}
	if ans.Kind == PeerRelayed || (ans.Kind == PeerRelayFailed && ans.Current != nil) {
		a.relayers[peer] = now // it reached NATS: ask it first next time
	}
	switch ans.Kind {
	case PeerRelayed:
		if a.corroborated(reportLanding, rd.renewal.Seq, ans.Revision, peer) {
			a.renewResult(now, rd.renewal.Seq, RenewResult{Outcome: RenewAcked, Revision: ans.Revision})
		}
	case PeerRelayFailed:
		claim := revisionClaim(a, ans)
		switch c := ans.Current; {
		case c != nil && a.ownRecord(*c) && !a.corroborated(reportLanding, c.Seq, ans.Revision, peer):
			// A landing of ours that only this peer reports so far: not
			// counted yet (LyingPeers).
		case c != nil && c.State == LeaseExpired && c.Epoch > a.epoch && c.Sig != "" && !Mutations.RelayShownDeclarationIgnored:
			// A declaration of a later epoch than ours, signed (the shell
			// verified it: a controller's key, or our own), shown by a
			// peer whose relay conflicted with it: the controller has
			// declared us — fence now, Held or not, instead of at the
			// lease's lapse (reviewer X4, TestX4RelayShownDeclarationIgnored).
			// Only a later epoch: a declaration released since (our epoch
			// took it over) replayed by a liar changes nothing, whatever
			// revision it names. Unsigned: not acted on. (With signing off
			// the shell verifies nothing, so a lying peer could show a
			// made-up "signed" declaration — mode off trusts peers by
			// design: lying_peers 0, and any node can write the key.)
			a.declaredBy(now, c)
		case (ans.Invalid != "" || ans.KeyAbsent || c != nil && !a.ownRecord(*c)) && !a.keyDeleteSafe(now):
			// "No record", "a record you would not trust" or "a record
			// that is not your landing" (an old genuine record of ours
			// replayed: untrusted → taken like a deleted key) is a claim
			// nothing verifies: acted on while the lease is lapsed, one
			// lying peer fenced and self-declared a Held host (a NATS
			// outage turned into fencing; reviewers X2 and X4,
			// TestX4LyingReplayFencesHeldHost). Only our own read acts on
			// it then (docs/fencing.md, "Key deleted").
		case ans.KeyAbsent && ans.Current == nil && ans.Revision == 0 && a.cfg.LyingPeers > 0 && !Mutations.KeyAbsentZeroActed:
			// "Key absent" naming no marker (revision 0: a peer of an
			// earlier release, a relayer whose marker read failed or lost
			// a race with a put, or a liar) names nothing to seal for:
			// acted on, the next relayed renewal was a create sealed for
			// 0 — unverifiable, of this very process, held by the liar
			// asked to relay it: one liar beside one such honest peer got
			// X84's creates from an upgraded agent (reviewer X92,
			// TestX92ZeroMarkerClaimUnanchorsRelayedCreate). Not acted
			// on: the next round asks again, and upgraded relayers name
			// the marker.
		case claim != 0 && !Mutations.PeerRevisionTrusted && !a.corroborated(claim, rd.renewal.Seq, ans.Revision, peer):
			// A revision only this peer reports so far: the next
			// renewal would be sealed for it, and a liar's revision far
			// ahead got it a genuine renewal it could write fresh once
			// the stream got there (reviewer X85). Counted like a
			// landing: LyingPeers + 1 peers must report it. "Key
			// absent" too (reviewer X87): one liar reset the revision to
			// 0, and the next relayed renewal was a create sealed for
			// 0 — verifiable only through beacons — it could hold.
		case ans.Invalid != "":
			a.conflict(now, rd.renewal.Seq, RenewResult{Outcome: RenewConflict, Revision: ans.Revision, Invalid: ans.Invalid, peer: true})
		case c != nil && c.State == LeaseActive:
			a.conflict(now, rd.renewal.Seq, RenewResult{Outcome: RenewConflict, Revision: ans.Revision, Current: c, peer: true})
		case ans.KeyAbsent:
			// Revision: the marker the key ends with (0: none read), so
			// that the next relayed renewal is an anchored create.
			a.conflict(now, rd.renewal.Seq, RenewResult{Outcome: RenewConflict, Revision: ans.Revision, peer: true})
		}
	case PeerCannotRenew:
		a.confirmed[peer] = now
		if (a.state == StateAskingPeers || a.state == StateHeld) && a.holdConfirmed(now) {
			// Held now; the round stays open, so a relay still arriving
			// in it renews the lease.
			a.enterHeld(now, a.confirmedCount(now))
		}
	}
	if a.round != nil && len(rd.answers) == len(rd.asked) {
		a.endRound(now)
	}
	a.step(now)
	return a.take()
}

// corroborated reports whether the landing of our renewal seq at rev, as
// peer reports it (relayed, or a conflict showing that record), may be
// counted: at once with LyingPeers 0; else once more than LyingPeers
// distinct peers reported the same landing — one compromised peer could
// claim a relay that never happened, and the asker, cut off from NATS,
// would count a lease the controller never saw (docs/security.md). A
// peer that relays and another whose relay of the same question then
// conflicts with it report the same (seq, rev).
//
// kind keeps the tallies apart: reportLanding (our renewal seq landed at
// rev: relayed, or shown) and the revision claims (revisionClaim: the key
// holds at rev a record we would not trust, none, or an active one not
// ours: the next renewal would be sealed for rev, or be a create). In one
// tally an honest peer's "invalid record at R" (its relay conflicted with
// the compromised node's put at R) counted toward the liar's "relayed at
// R": a cut-off host counted a landing that never happened, skipped
// fencing and kept its guests running while the controller declared it
// (reviewer X86, TestX86LiarRelayedCorroboratedByHonestConflict;
// Mutations.SharedTally).
func (a *Agent) corroborated(kind, seq, rev uint64, peer string) bool {
	if Mutations.SharedTally {
		kind = reportLanding
	}
	if a.cfg.LyingPeers == 0 {
		return true
	}
	if a.relayReports == nil {
		a.relayReports = map[[3]uint64]map[string]bool{}
	}
	for k := range a.relayReports {
		if k[1] <= a.landedSeq || len(a.relayReports) > maxSent {
			delete(a.relayReports, k) // counted already, or too many
		}
	}
	k := [3]uint64{kind, seq, rev}
	if a.relayReports[k] == nil {
		a.relayReports[k] = map[string]bool{}
	}
	a.relayReports[k][peer] = true
	return len(a.relayReports[k]) > a.cfg.LyingPeers
}

// The tallies of corroborated (LyingPeers): landings, and each kind of
// revision claim apart — the answer that crosses LyingPeers decides what
// is done, so in one tally of claims an honest peer's "invalid record at
// R" (its relay conflicted with the compromised node's put at R) and the
// liar's "key absent" naming R made the asker take its key for deleted
// and seal its next relayed renewal as a create for 0, which the liar
// could hold (reviewer X88, TestX88LiarKeyAbsentCorroboratedByHonestInvalid;
// Mutations.SharedClaimTally).
const (
	reportLanding uint64 = iota
	reportInvalid
	reportAbsent
	reportActive
)

// revisionClaim returns the tally of ans's revision claim: a record we
// would not trust at its revision, no record, or an active record not ours
// (0: none of these).
func revisionClaim(a *Agent, ans PeerAnswer) uint64 {
	c := ans.Current
	var k uint64
	switch {
	case ans.Invalid != "":
		k = reportInvalid
	case ans.KeyAbsent:
		k = reportAbsent
	case c != nil && c.State == LeaseActive && !a.ownRecord(*c):
		k = reportActive
	default:
		return 0
	}
	if Mutations.SharedClaimTally {
		return reportInvalid
	}
	return k
}

// ownRecord: r is an active record of this very process that it sent.
func (a *Agent) ownRecord(r LeaseRecord) bool {
	_, sent := a.sent[r.Seq]
	return sent && r.State == LeaseActive && r.Host == a.cfg.Host && r.BootID == a.cfg.BootID &&
		r.Epoch == a.epoch && r.Incarnation == a.incarnation
}

// roundSeq returns the renewal seq of a recent round, or 0.
func (a *Agent) roundSeq(id uint64) uint64 {
	return a.roundSeqs[id]
}

// Domains reports the host's domains (a full list). While fencing or
// fenced, any running domain not yet fenced is fenced.
func (a *Agent) Domains(now time.Time, ds []Domain) Ready {
	clear(a.inventory)
	a.inventoryKnown = true
	for _, d := range ds {
		a.inventory[d.UUID] = d.Running
	}
	switch a.state {
	case StateFencing, StateFenced, StateAwaitingRelease:
		a.fenceRunning(now)
	case StateRejoining:
		if a.stopping && !Mutations.StopTrustsFencedState {
			// Leaving: whatever started while rejoining (the lease was
			// held) is fenced, or the stop would leave it running into
			// a declaration.
			a.fenceRunning(now)
		}
	}
	a.step(now)
	return a.take()
}

// fenceRunning fences every domain of the inventory that runs and is not
// being fenced already (a domain started on a fenced host, or while
// rejoining at a stop).
func (a *Agent) fenceRunning(now time.Time) {
	var run []string
	for u, r := range a.inventory {
		if _, p := a.pending[u]; r && !p {
			run = append(run, u)
		}
	}
	sort.Strings(run)
	if len(run) > 0 && a.cfg.Enabled && a.cfg.Action != ActionNone {
		if a.state != StateFencing {
			a.fenceStart = now
			a.setState(now, StateFencing, ReasonDomainRunningWhileFenced, fmt.Sprintf("%d running", len(run)))
			a.fenceDL = now.Add(a.cfg.Timing.FenceDeadline)
			a.escalated = false
		}
		a.fenceDomains(now, run)
	}
}

// FenceDone reports the outcome of a Pause or Destroy of uuid (err nil:
// done). A failed operation is retried until the fence deadline.
func (a *Agent) FenceDone(now time.Time, uuid string, err error) Ready {
	if _, ok := a.pending[uuid]; ok {
		if err == nil {
			delete(a.pending, uuid)
			a.inventory[uuid] = false
		} else {
			a.pending[uuid] = now.Add(fenceRetry)
			a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonFenceComplete, Detail: fmt.Sprintf("fence of %s failed (retrying): %v", uuid, err)})
		}
	}
	a.step(now)
	return a.take()
}

// Reconciled reports that the rejoin reconciliation id ran; drop lists
// domains that must not be resumed (moved or rebuilt elsewhere).
func (a *Agent) Reconciled(now time.Time, id uint64, drop []string) Ready {
	if a.state != StateRejoining || id != a.reconcileID || !a.LeaseHeld(now) || a.stopping {
		a.step(now)
		return a.take()
	}
	for _, u := range drop {
		delete(a.paused, u)
	}
	all := sortedKeys(a.paused)
	clear(a.paused)
	if a.rejoinDecl {
		a.r.LeftPaused = all
		a.setState(now, StateHealthy, ReasonReleasedReconciled, fmt.Sprintf("%d domains left paused", len(all)))
	} else {
		a.r.Resume = all
		for _, u := range all {
			if _, ok := a.inventory[u]; ok {
				a.inventory[u] = true // running again once resumed
			}
		}
		a.setState(now, StateHealthy, ReasonResumedAfterReconcile, fmt.Sprintf("%d domains resumed", len(all)))
	}
	a.rejoinDecl = false
	a.persist()
	a.step(now)
	return a.take()
}

// take returns the accumulated Ready and starts a new one.
func (a *Agent) take() Ready {
	r := a.r
	a.r = Ready{}
	return r
}

func (a *Agent) persist() {
	a.writes++
	d := a.Durable()
	a.r.Persist = &d
}

func (a *Agent) transition(now time.Time, from, to State, reason Reason, detail string) {
	a.reason = reason
	a.r.Transitions = append(a.r.Transitions, Transition{At: now, From: from, To: to, Reason: reason, Epoch: a.epoch, Detail: detail})
}

func (a *Agent) setState(now time.Time, to State, reason Reason, detail string) {
	from := a.state
	a.state = to
	a.transition(now, from, to, reason, detail)
	a.persist()
}

// record returns the lease record the agent writes now.
func (a *Agent) record(seq uint64) LeaseRecord {
	return LeaseRecord{
		Schema: RecordSchema, Host: a.cfg.Host, BootID: a.cfg.BootID, Epoch: a.epoch,
		State: LeaseActive, Incarnation: a.incarnation, Seq: seq, FencingEnabled: a.cfg.Enabled && a.cfg.Action != ActionNone,
		Action: a.cfg.Action, Backstop: a.cfg.Backstop(), Timing: a.cfg.Timing, AgentState: a.state,
		Guard: a.guard.Ref(), AgentVersion: a.cfg.AgentVersion,
	}
}

// withdrawal returns the withdrawn record of seq.
func (a *Agent) withdrawal(seq uint64) LeaseRecord {
	r := a.record(seq)
	r.State, r.Reason = LeaseWithdrawn, a.stopReason
	return r
}

func (a *Agent) newRenewal(now time.Time) RenewRequest {
	a.seq++
	a.sent[a.seq] = now
	if len(a.sent) > maxSent {
		var oldest uint64
		for s := range a.sent {
			if oldest == 0 || s < oldest {
				oldest = s
			}
		}
		delete(a.sent, oldest)
	}
	return RenewRequest{Seq: a.seq, Revision: a.rev, Record: a.record(a.seq)}
}

// step runs every timer due at now.
func (a *Agent) step(now time.Time) {
	t := a.cfg.Timing
	if a.inflight != 0 && !now.Before(a.inflightT) {
		// Outcome unknown; the CAS makes a late landing harmless.
		a.inflight = 0
		a.renewFailed(now, ReasonRenewTimedOut)
	}
	// While the lease is in doubt a new renewal goes out every half
	// interval even if one is outstanding (same expected revision: at most
	// one lands, a conflict shows which), so that a healed link is noticed
	// within about a second.
	if a.withdrawSeq != 0 && !now.Before(a.withdrawDL) {
		// The withdrawal's outcome is unknown: it may land later (then
		// the controller never declares), or not (then it may): fence.
		a.withdrawFailed(now, "timed out (outcome unknown)")
	}
	doubt := a.state != StateHealthy && a.state != StateStarting && a.state != StateRejoining
	// A self-declaration (keydelete.go) waits for the fence to complete:
	// a record saying "declared" is never written while domains may run.
	waitFence := a.selfDecl && a.state == StateFencing && !Mutations.SelfDeclareBeforeFence
	if (a.inflight == 0 || doubt) && !now.Before(a.nextRenew) && !a.stopping && !waitFence {
		var req RenewRequest
		if a.selfDecl {
			req = a.selfDeclaration(now)
		} else {
			req = a.newRenewal(now)
		}
		a.r.Renew = &req
		a.inflight, a.inflightT = req.Seq, now.Add(t.RenewTimeout)
		a.nextRenew = now.Add(t.RenewInterval)
		if doubt {
			a.nextRenew = now.Add(t.RenewInterval / 2)
		}
	}
	age := now.Sub(a.lastAck)
	switch a.state {
	case StateStarting, StateHealthy, StateSuspect:
		if age >= t.SuspectAfter() {
			a.isolation = ""
			a.setState(now, StateAskingPeers, ReasonNoRenewalForSuspectAfter, fmt.Sprintf("last acknowledged renewal %s ago", age))
			if !a.stopping {
				a.startRound(now)
			}
		}
	case StateAskingPeers:
		if a.round != nil && !now.Before(a.round.deadline) {
			a.endRound(now)
		}
		a.retryRound(now)
		if a.state == StateAskingPeers && age >= t.FenceBy() {
			if a.holdConfirmed(now) {
				a.enterHeld(now, a.confirmedCount(now))
			} else if a.isolation != "" {
				a.startFence(now, a.isolation)
			} else {
				a.startFence(now, ReasonIsolatedAtFenceDeadline)
			}
		}
		if a.state == StateAskingPeers && a.round == nil && !now.Before(a.nextRound) && !a.stopping {
			a.startRound(now)
		}
	case StateHeld:
		if a.round != nil && !now.Before(a.round.deadline) {
			a.endRound(now)
		}
		a.retryRound(now)
		if a.state == StateHeld && a.round == nil && !now.Before(a.heldUntil) {
			a.startFence(now, ReasonIsolatedBecauseHoldNoLongerConfirmed)
		}
		if a.state == StateHeld && a.round == nil && !now.Before(a.nextHeld) && !now.Before(a.nextRound) && !a.stopping {
			a.startRound(now)
		}
	case StateFencing:
		a.retryFence(now)
		if len(a.pending) == 0 && a.inventoryKnown {
			a.fenceComplete(now)
		} else if !a.escalated && !now.Before(a.fenceDL) {
			a.escalate(now)
		}
	case StateRejoining:
		if age >= t.SuspectAfter() {
			a.setState(now, StateFenced, ReasonLeaseLostWhileRejoining, "")
		}
	}
}

// Stop begins an orderly stop (SIGTERM, or a start step that failed and
// makes the process exit); reason goes into the record ("orderly-stop",
// "start-failed: ..."). From now on no renewal or peer round starts. A
// host holding its lease (starting, healthy, suspect, asking, held)
// writes a withdrawn record by CAS on the revision of its last landed
// record; the controller never declares it once that landed (the CAS of
// a declaration on an older revision fails: the linearization point).
// If the withdrawal is not confirmed (NATS unreachable, timeout = unknown
// outcome, a conflict with anything but our own renewal), the agent
// fences before leaving, with the fence deadline counted from then. A
// host already fencing also withdraws (not declared) while its fence goes
// on; a fenced, rejoining or
// declared host stays fenced (its domains are paused; a declaration is
// safe), after fencing whatever its inventory shows running (a domain
// started while rejoining). The caller waits until StopOutcome is not StopPending, then
// disarms the watchdog only when StopOutcome.MagicClose says so (a
// confirmed withdrawal); after any other outcome it leaves it armed.
func (a *Agent) Stop(now time.Time, reason string) Ready {
	if a.stopping {
		a.step(now)
		return a.take()
	}
	a.stopping, a.stopReason = true, reason
	a.round = nil
	switch a.state {
	case StateStarting, StateHealthy, StateSuspect, StateAskingPeers, StateHeld:
		if Mutations.StopWithoutWithdrawal {
			a.setState(now, StateWithdrawn, ReasonWithdrawn, reason+" (mutation: nothing written)")
			break
		}
		a.sendWithdrawal(now)
	case StateFencing:
		// The fence goes on; if NATS takes the withdrawal meanwhile the
		// host cannot be declared whatever the fence does (a fence that
		// cannot complete — libvirt not connected yet, hung — would
		// otherwise leave an active record lapsing into a declaration
		// with no watchdog armed, or none configured).
		if !a.declared && !Mutations.StopWithoutWithdrawal {
			a.sendWithdrawal(now)
		}
	case StateFenced, StateRejoining, StateAwaitingRelease:
		if !Mutations.StopTrustsFencedState {
			// "Fenced" is as of the last listing: fence whatever it shows
			// running (a domain started while rejoining, when the lease
			// was held and Domains fenced nothing) before the stop may
			// end "fenced" (the controller may then declare the host).
			a.fenceRunning(now)
		}
	}
	a.step(now)
	return a.take()
}

// Stopping reports whether Stop was called.
func (a *Agent) Stopping() bool { return a.stopping }

// StopOutcome reports how the stop ended (StopPending while it runs).
func (a *Agent) StopOutcome() StopOutcome {
	if !a.stopping {
		return StopPending
	}
	switch a.state {
	case StateWithdrawn:
		return StopWithdrawn
	case StateFenced, StateAwaitingRelease, StateRejoining:
		if !a.inventoryKnown {
			return StopUnfenced // restarted fenced, never listed: not verified
		}
		return StopFenced
	case StateFencing:
		if a.escalated {
			return StopUnfenced
		}
	}
	return StopPending
}

// maxWithdrawTries bounds the withdrawals sent at stop: one, and one more
// after a conflict with a renewal of ours that landed meanwhile.
const maxWithdrawTries = 2

func (a *Agent) sendWithdrawal(now time.Time) {
	a.withdrawTries++
	a.seq++
	a.withdrawSeq = a.seq
	a.withdrawDL = now.Add(a.cfg.Timing.RenewTimeout)
	a.r.Renew = &RenewRequest{Seq: a.seq, Revision: a.rev, Record: a.withdrawal(a.seq)}
}

// withdrawResult: the outcome of the withdrawal.
func (a *Agent) withdrawResult(now time.Time, res RenewResult) {
	a.withdrawSeq = 0
	switch res.Outcome {
	case RenewAcked:
		a.rev = max(a.rev, res.Revision)
		a.round = nil
		a.setState(now, StateWithdrawn, ReasonWithdrawn, a.stopReason)
		return
	case RenewConflict:
		cur := res.Current
		if cur != nil && cur.Host == a.cfg.Host && cur.State == LeaseActive && cur.BootID == a.cfg.BootID &&
			cur.Epoch == a.epoch && cur.Incarnation == a.incarnation && a.withdrawTries < maxWithdrawTries {
			if _, ours := a.sent[cur.Seq]; ours || cur.Seq <= a.landedSeq {
				// A renewal of ours landed meanwhile: withdraw on it.
				a.landed(now, cur.Seq, res.Revision, ReasonRenewed)
				a.rev = max(a.rev, res.Revision)
				a.sendWithdrawal(now)
				return
			}
		}
		if cur != nil && cur.Host == a.cfg.Host && cur.State == LeaseExpired && cur.Epoch >= a.epoch {
			a.conflict(now, 0, res) // declared: fence, never overwrite it
			return
		}
		if (cur == nil || a.untrusted(res) != "") && a.withdrawTries < maxWithdrawTries && a.keyDeleteSafe(now) {
			// The key was deleted or purged (or holds an untrusted
			// record) while the lease is held: no declaration can have
			// been erased (keydelete.go); withdraw by creating the record
			// over the marker (CAS on the untrusted record).
			a.rev = res.Revision
			if cur == nil && res.Invalid == "" {
				a.rev, a.absentAt = 0, res.Revision
			}
			a.sendWithdrawal(now)
			return
		}
		a.withdrawFailed(now, fmt.Sprintf("conflict at revision %d", res.Revision))
	case RenewTimedOut:
		a.withdrawFailed(now, "timed out (outcome unknown)")
	default:
		a.withdrawFailed(now, "failed")
	}
}

// withdrawFailed: the withdrawal cannot be confirmed: fence before leaving.
func (a *Agent) withdrawFailed(now time.Time, why string) {
	a.withdrawSeq = 0
	a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonWithdrawalNotConfirmed,
		Detail: "withdrawal at stop " + why + ": fencing before leaving (" + a.stopReason + ")"})
	switch a.state {
	case StateFencing, StateFenced, StateAwaitingRelease, StateRejoining, StateWithdrawn:
		return
	}
	a.startFence(now, ReasonWithdrawalNotConfirmed)
}

func (a *Agent) renewFailed(now time.Time, reason Reason) {
	if a.state == StateHealthy || a.state == StateStarting {
		a.setState(now, StateSuspect, reason, "")
	}
}

func (a *Agent) renewResult(now time.Time, seq uint64, res RenewResult) {
	if a.selfDeclSeqs[seq] {
		a.selfDeclResult(now, seq, res)
		return
	}
	switch res.Outcome {
	case RenewAcked:
		a.landed(now, seq, res.Revision, ReasonRenewed)
	case RenewTimedOut:
		a.renewFailed(now, ReasonRenewTimedOut)
	case RenewFailed:
		a.renewFailed(now, ReasonRenewFailed)
	case RenewConflict:
		a.conflict(now, seq, res)
	}
}

// landed: the record with seq landed at revision rev.
func (a *Agent) landed(now time.Time, seq uint64, rev uint64, reason Reason) {
	if rev > a.rev {
		a.rev, a.absentAt = rev, 0
	}
	sentAt, ok := a.sent[seq]
	if !ok {
		return
	}
	for s := range a.sent {
		if s <= seq {
			delete(a.sent, s)
		}
	}
	a.landedSeq = max(a.landedSeq, seq)
	if !a.feedLimit.IsZero() {
		a.feedLimit = time.Time{} // the controller saw our constants now
		a.persist()
	}
	if a.recWithdrawn && !a.stopping {
		a.recWithdrawn = false // the key holds an active record of ours now
		a.persist()
	}
	if a.declared {
		// A landed renewal after a declaration can only be one written on
		// the released record.
		if !a.released || a.stopping {
			return
		}
		a.declared, a.released = false, false
		a.lease, a.lastAck = true, sentAt
		a.rejoinDecl = true
		a.startRejoin(now, ReasonReleased)
		return
	}
	if sentAt.After(a.lastAck) || !a.lease {
		a.lease, a.lastAck = true, sentAt
		a.persist()
	}
	for _, rs := range a.roundSeqs {
		if rs == seq {
			reason = ReasonRelayedByPeer
		}
	}
	if reason == ReasonRelayedByPeer && a.cfg.LyingPeers >= 1 && !Mutations.RelayedNoBeacon {
		// Only a landing corroborated by another peer (LyingPeers ≥ 1):
		// with 0 one peer's claim is a landing, and a beacon naming the
		// revision it made up (10^9) made the controller ignore this
		// host's later withdrawal beacon as older than its newest
		// (reviewer X34, controller TestX34LyingRelayBeaconPoisonsWithdrawal).
		a.r.Relayed = &RelayedLanding{Seq: seq, Revision: rev, Record: a.record(seq)}
	}
	if now.Sub(a.lastAck) >= a.cfg.Timing.SuspectAfter() {
		// A late landing of an old renewal: it moves the revision, not the
		// state; the next renewal (sent at once) decides.
		a.nextRenew = now
		return
	}
	if a.stopping {
		return // the lease age moved; nothing rejoins or resumes on a stop
	}
	switch a.state {
	case StateStarting, StateSuspect, StateAskingPeers, StateHeld:
		a.round = nil
		clear(a.confirmed)
		a.setState(now, StateHealthy, reason, "")
	case StateFenced:
		a.startRejoin(now, ReasonRenewedAfterFence)
	}
}

func (a *Agent) startRejoin(now time.Time, reason Reason) {
	a.round = nil
	a.reconcileID++
	a.r.Reconcile, a.r.ReconcileID = true, a.reconcileID
	a.setState(now, StateRejoining, reason, fmt.Sprintf("%d paused by hvguard", len(a.paused)))
}

// declaredBy takes cur, an expired record of epoch ≥ ours in our key (the
// controller's declaration, or our own self-declaration), as our lease's
// end: fence (or, fenced, await the release).
func (a *Agent) declaredBy(now time.Time, cur *LeaseRecord) {
	// Never adopt the revision of a declaration: a renewal must not be
	// able to overwrite it. Only a released record is taken over.
	a.epoch = cur.Epoch
	if a.declared {
		return
	}
	a.declared, a.released = true, false
	a.lease = false
	reason := ReasonDeclaredExpired
	if a.LeaseHeldIgnoringDeclaration(now) {
		reason = ReasonDeclaredWhileHoldingLease
		a.r.Alerts = append(a.r.Alerts, Alert{Reason: reason, Detail: fmt.Sprintf("controller declared epoch %d while the lease was held until %s", cur.Epoch, a.LeaseExpiry())})
	}
	switch a.state {
	case StateFenced:
		a.setState(now, StateAwaitingRelease, reason, cur.Reason)
	case StateFencing:
		a.persist()
	case StateRejoining:
		a.setState(now, StateAwaitingRelease, reason, cur.Reason)
	case StateAwaitingRelease:
	default:
		a.startFence(now, reason)
	}
}

// conflictRev is the revision to renew on after a conflict showing an
// active record at res.Revision: our own store's answer is the key's
// revision (even below the one we had: a lying peer's "invalid record at
// revision r+1000" must not leave every later CAS conflicting while NATS
// works — reviewer X4, TestX4LyingRevisionPoisonsRenewals); a peer's
// report only ever raises it.
func (a *Agent) conflictRev(res RenewResult) uint64 {
	if res.peer {
		return max(a.rev, res.Revision)
	}
	return res.Revision
}

func (a *Agent) conflict(now time.Time, seq uint64, res RenewResult) {
	cur := res.Current
	if why := a.untrusted(res); why != "" {
		a.invalidRecord(now, res, why)
		return
	}
	if res.Invalid != "" || cur != nil && cur.Host != a.cfg.Host { // Mutations.UntrustedRecordsTrusted
		a.renewFailed(now, ReasonRenewFailed)
		return
	}
	if cur == nil {
		// The key holds no record: deleted or purged (keydelete.go). Our
		// own next write is on revision 0: the store reads the marker as
		// it writes and anchors the create on it (a delete loop's newest
		// marker, not one a renewal interval old). A relayed one is
		// sealed here, for the marker the conflict named (absentAt).
		a.renewFailed(now, ReasonRenewFailed)
		a.keyDeleted(now, 0)
		if !Mutations.KeyAbsentRevisionIgnored {
			a.absentAt = res.Revision
		}
		return
	}
	switch cur.State {
	case LeaseActive:
		if cur.Sig != "" && cur.BootID == a.cfg.BootID && (cur.Incarnation > a.incarnation || cur.Incarnation == a.incarnation && cur.Seq > a.seq) {
			// A record of a later process of this host than ours (our
			// durable state was lost): our records must be newer than it,
			// or readers take them for replays (sign.go).
			a.incarnation = cur.Incarnation + 1
			a.persist()
		}
		if cur.BootID == a.cfg.BootID && cur.Epoch == a.epoch && cur.Incarnation == a.incarnation {
			if _, ok := a.sent[cur.Seq]; ok {
				// One of our earlier renewals (late, or relayed) landed.
				a.landed(now, cur.Seq, res.Revision, ReasonRenewed)
				return
			}
			if cur.Seq <= a.landedSeq {
				// Already counted (its ack overtook this conflict): only
				// the revision is news. Renew again at once.
				a.rev = a.conflictRev(res)
				a.nextRenew = now
				return
			}
		}
		if r := a.conflictRev(res); r != a.rev {
			a.rev = r
			a.nextRenew = now // retry at once on the revision now known
		}
		a.renewFailed(now, ReasonRenewFailed)
	case LeaseExpired:
		if cur.Epoch < a.epoch {
			a.renewFailed(now, ReasonRenewFailed)
			return
		}
		a.declaredBy(now, cur)
	case LeaseWithdrawn:
		// A withdrawal of an earlier process of ours that landed late (its
		// stop timed out and fenced): take the lease back from it (the
		// controller declares nothing while it stands).
		if cur.Epoch < a.epoch || a.stopping {
			a.renewFailed(now, ReasonRenewFailed)
			return
		}
		if !a.recWithdrawn && !Mutations.WithdrawnRestartConfirms {
			// Not counted by the controller until our renewal lands on it.
			a.recWithdrawn = true
			a.persist()
		}
		if res.Revision > a.rev {
			a.rev = res.Revision
			a.nextRenew = now
		}
		a.renewFailed(now, ReasonRenewFailed)
	case LeaseReleased:
		if cur.Epoch < a.epoch {
			a.renewFailed(now, ReasonRenewFailed)
			return
		}
		if !a.declared && cur.Epoch > a.epoch && !Mutations.ReleaseHidesDeclaration {
			// The release of a declaration we never saw (cut off while
			// declared, evacuated and released): the declaration
			// happened. Take it first (fence if not fenced, never resume
			// what is paused), then the release below.
			exp := *cur
			exp.State = LeaseExpired
			a.conflict(now, seq, RenewResult{Outcome: RenewConflict, Revision: res.Revision, Current: &exp})
		}
		a.rev, a.epoch = res.Revision, cur.Epoch
		if a.declared {
			a.released = true
			a.persist()
		}
	}
}

// LeaseHeldIgnoringDeclaration reports whether the lease timing alone says
// the lease is held.
func (a *Agent) LeaseHeldIgnoringDeclaration(now time.Time) bool {
	return now.Before(a.LeaseExpiry())
}

func (a *Agent) threshold() (int, bool) {
	if !a.guard.Valid() {
		return 0, false
	}
	return a.guard.Threshold(a.guard.Members), true
}

func (a *Agent) startRound(now time.Time) {
	th, ok := a.threshold()
	n := th + a.cfg.PeerBatch
	if !ok {
		n = a.cfg.PeerBatch
	}
	if a.isolation != "" {
		n *= 4 // the last round decided nothing: cast a wider net
	}
	n = min(len(a.members), n)
	a.roundID++
	req := a.newRenewal(now)
	if req.Revision == 0 {
		// The key was found deleted: seal the relayed create for the
		// marker it named, an anchored create (0: none named).
		req.Revision = a.absentAt
	}
	if a.roundSeqs == nil {
		a.roundSeqs = map[uint64]uint64{}
	}
	a.roundSeqs[a.roundID] = req.Seq
	delete(a.roundSeqs, a.roundID-maxSent)
	a.nextRound = now.Add(minRoundGap)
	rd := &roundState{id: a.roundID, renewal: req, deadline: now.Add(a.cfg.Timing.PeerTimeout),
		asked: map[string]bool{}, answers: map[string]PeerAnswerKind{}, nextRetry: now.Add(peerRetry)}
	// A random sample of the whole membership. While asking, peers that
	// have not confirmed yet come first (to accumulate confirmations);
	// while Held, the confirmed ones come first (to re-confirm them).
	cand := slices.Clone(a.members)
	a.rng.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
	heldFirst := a.state == StateHeld
	sort.SliceStable(cand, func(i, j int) bool {
		_, ci := a.confirmed[cand[i]]
		_, cj := a.confirmed[cand[j]]
		if heldFirst {
			return ci && !cj
		}
		return !ci && cj
	})
	// Peers that reached NATS for us recently (relayed, or saw our key)
	// come first of all: they are the likeliest to relay again.
	for p, at := range a.relayers {
		if now.Sub(at) > relayerMemory {
			delete(a.relayers, p)
		}
	}
	sort.SliceStable(cand, func(i, j int) bool {
		ri, rj := a.relayers[cand[i]], a.relayers[cand[j]]
		return ri.After(rj)
	})
	peers := cand[:n]
	for _, p := range peers {
		rd.asked[p] = true
	}
	a.round = rd
	if a.state == StateHeld {
		a.nextHeld = now.Add(a.cfg.HeldRecheck)
	}
	if len(peers) == 0 {
		a.endRound(now)
		return
	}
	a.r.AskPeers = &PeerRound{ID: rd.id, Peers: slices.Clone(peers), Renewal: req, Deadline: rd.deadline}
}

// retryRound asks the peers that have not answered the open round again
// (a peer that was restarting or briefly unreachable gets another chance
// within the round).
func (a *Agent) retryRound(now time.Time) {
	rd := a.round
	if rd == nil || now.Before(rd.nextRetry) {
		return
	}
	rd.nextRetry = now.Add(peerRetry)
	var again []string
	for p := range rd.asked {
		if _, ok := rd.answers[p]; !ok {
			again = append(again, p)
		}
	}
	if len(again) == 0 || a.r.AskPeers != nil {
		return
	}
	sort.Strings(again)
	a.r.AskPeers = &PeerRound{ID: rd.id, Peers: again, Renewal: rd.renewal, Deadline: rd.deadline}
}

// confirmFresh is how long a CannotRenew answer counts.
func (a *Agent) confirmFresh() time.Duration { return a.cfg.HeldRecheck + a.cfg.Timing.PeerTimeout }

func (a *Agent) confirmedCount(now time.Time) int {
	n := 0
	for p, at := range a.confirmed {
		if now.Sub(at) <= a.confirmFresh() {
			n++
		} else {
			delete(a.confirmed, p)
		}
	}
	return n
}

// holdConfirmed: this host plus the peers that confirmed they cannot renew
// are more than the controller's guard threshold.
func (a *Agent) holdConfirmed(now time.Time) bool {
	th, ok := a.threshold()
	return ok && 1+a.confirmedCount(now) > th+a.cfg.LyingPeers
}

func (a *Agent) enterHeld(now time.Time, n int) {
	a.isolation = ""
	a.heldUntil = now.Add(a.cfg.HeldRecheck + a.cfg.Timing.PeerTimeout)
	if a.state == StateHeld {
		a.persist() // the new heldUntil survives a restart
	} else {
		a.nextHeld = now.Add(a.cfg.HeldRecheck)
		th, _ := a.threshold()
		a.setState(now, StateHeld, ReasonHeldBecauseMostPeersCantRenew, fmt.Sprintf("%d peers + self cannot renew > guard threshold %d + lying peers %d", n, th, a.cfg.LyingPeers))
	}
}

// endRound evaluates the current round.
func (a *Agent) endRound(now time.Time) {
	rd := a.round
	a.round = nil
	if rd == nil {
		return
	}
	if a.holdConfirmed(now) {
		a.enterHeld(now, a.confirmedCount(now))
		return
	}
	var can, cannot, none int
	for p := range rd.asked {
		switch k, ok := rd.answers[p]; {
		case !ok || k == PeerUnreachable || k == PeerDeclared || k == PeerLeaseLapsed:
			none++
		case k == PeerCannotRenew:
			cannot++
		default:
			can++
		}
	}
	reason := ReasonIsolatedBecauseNoPeerAnswered
	switch _, ok := a.threshold(); {
	case !ok || len(a.members) == 0:
		reason = ReasonIsolatedBecauseNoGuardKnown
	case can > 0 && can >= cannot:
		reason = ReasonIsolatedBecauseMostPeersCanRenew
	case cannot > 0:
		reason = ReasonIsolatedBecauseTooFewPeersCantRenew
	}
	switch a.state {
	case StateHeld:
		// Not re-confirmed by this round: the hold lasts until heldUntil
		// (HeldRecheck + PeerTimeout after the last confirmation), then
		// step fences, unless a round confirms it again (or a peer
		// relays) before: ask again at once, and more peers.
		a.isolation = reason
		a.nextHeld = now
	case StateAskingPeers:
		// Another round starts (in step) if it fits before FenceBy;
		// otherwise own renewals get the rest of the time, and at FenceBy
		// the agent fences for this reason.
		a.isolation = reason
	}
}

// startFence enters Fencing and plans the fence action.
func (a *Agent) startFence(now time.Time, reason Reason) {
	a.round = nil
	a.held = false
	a.fenceStart = now
	a.fenceDL = now.Add(a.cfg.Timing.FenceDeadline)
	if exp := a.LeaseExpiry(); a.lease && exp.After(a.fenceDL) && !a.stopping {
		// On a stop the process leaves: escalate at the fence deadline,
		// not at the lease expiry, so that a reset (if allowed) comes
		// before it goes.
		a.fenceDL = exp
	}
	a.escalated = false
	clear(a.pending)
	var run []string
	for u, r := range a.inventory {
		if r {
			run = append(run, u)
		}
	}
	sort.Strings(run)
	a.setState(now, StateFencing, reason, fmt.Sprintf("%d running domains, action %s", len(run), a.action()))
	a.fenceDomains(now, run)
	if len(a.pending) == 0 && a.inventoryKnown {
		a.fenceComplete(now)
	}
}

func (a *Agent) action() Action {
	if !a.cfg.Enabled {
		return ActionNone
	}
	return a.cfg.Action
}

func (a *Agent) fenceDomains(now time.Time, run []string) {
	switch a.action() {
	case ActionNone:
		a.r.WouldFence = append(a.r.WouldFence, run...)
	case ActionPause:
		for _, u := range run {
			a.paused[u] = true
			a.pending[u] = time.Time{}
		}
		a.r.Pause = append(a.r.Pause, run...)
		a.persist()
	case ActionDestroy:
		for _, u := range run {
			a.pending[u] = time.Time{}
		}
		a.r.Destroy = append(a.r.Destroy, run...)
	case ActionResetHost:
		if len(run) > 0 {
			for _, u := range run {
				a.pending[u] = time.Time{}
			}
			a.r.ResetHost = true
		}
	}
}

func (a *Agent) retryFence(now time.Time) {
	for u, at := range a.pending {
		if !at.IsZero() && !now.Before(at) {
			a.pending[u] = time.Time{}
			switch a.action() {
			case ActionPause:
				a.r.Pause = append(a.r.Pause, u)
			case ActionDestroy:
				a.r.Destroy = append(a.r.Destroy, u)
			}
		}
	}
}

func (a *Agent) fenceComplete(now time.Time) {
	switch {
	case a.declared:
		a.setState(now, StateAwaitingRelease, ReasonFenceComplete, fmt.Sprintf("fenced in %s; declared expired", now.Sub(a.fenceStart)))
	default:
		a.setState(now, StateFenced, ReasonFenceComplete, fmt.Sprintf("fenced in %s", now.Sub(a.fenceStart)))
		if a.LeaseHeld(now) && now.Sub(a.lastAck) < a.cfg.Timing.SuspectAfter() && a.lastAck.After(a.fenceStart) && !a.stopping {
			a.startRejoin(now, ReasonRenewedAfterFence)
		}
	}
}

func (a *Agent) escalate(now time.Time) {
	a.escalated = true
	detail := fmt.Sprintf("%d domains not fenced by %s", len(a.pending), a.fenceDL)
	if a.cfg.AllowReset || a.cfg.Action == ActionResetHost {
		a.r.ResetHost = true
		a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonFenceDeadlineMissedResettingHost, Detail: detail})
		a.transition(now, a.state, a.state, ReasonFenceDeadlineMissedResettingHost, detail)
		return
	}
	a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonFenceDeadlineMissedNoReset, Detail: detail + "; hardware watchdog no longer fed"})
	a.transition(now, a.state, a.state, ReasonFenceDeadlineMissedNoReset, detail)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
