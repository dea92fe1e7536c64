package controller

import (
	"fmt"
	"time"

	"hvguard/fencing"
)

// A host's first record vouched by its own beacon (reviewer X65, the
// delete loop across a controller start).
//
// With signatures required, a tracker that holds no trusted record of a
// host trusts a value of its key only when the stored message shows it
// written fresh (ObserveWritten, fencing.Written.Fresh). A create over a
// delete marker never shows that: a genuine create and a replayed one are
// both written on the marker's revision. A compromised node that deletes
// a host's key right after each of its writes, while a controller starts
// (a restart, an upgrade, a new leader's first listing), so kept that
// controller from ever trusting a record of the host — and a host without
// a trusted record is never declared: the host died, undeclared while the
// loop ran (TestX65DeleteLoopAcrossStartNATS).
//
// A beacon is positive evidence the revision check lacks: the host signs
// it after its own write landed, naming the revision the write landed at
// and the record's identity (epoch, incarnation, seq). A stream revision
// holds one message, so a value observed at exactly that revision with
// exactly that identity is the host's own write there, not a copy put
// back later (a copy lands at another revision). Such a value is trusted
// as if verified fresh — whether the beacon came before it (ObserveWritten
// checks the beacons' named writes) or after (BeaconVouches: the values
// of the key observed after it — delete markers, untrusted values, at
// most maxLaterValues — are observed again after it once it is trusted, so
// a delete stops nothing, as for any host with a trusted record; a
// compromised node's garbage between a create and its beacon kept the
// create unvouched: reviewer X71, TestX71GarbageBeforeBeaconKeepsDeadUndeclared).
//
// Where nothing else orders the value: a first record (no trusted record
// of the host yet), or a create of another agent process after a delete
// (otherBootCreate: identities order records only within a process; an
// agent restarted under the delete loop was never trusted again, reviewer
// X71, TestX71AgentRestartUnderLoopAfterVouch) — without a rollback
// carry or bar (rollback.go judges those). A signed record its host
// writes (active, withdrawn) with a beacon identity (seq > 0), not older
// than a record the same agent process (incarnation) already named in a
// beacon. The beacon is verified by the runner (its host's key) and came
// on the host's own subject; a copy of an old beacon is denied by the
// shipped NATS permissions (docs/security.md). Across lives of a
// re-created bucket a revision number can repeat; the identity must
// match too, and a record sealed in the old life names an identity the
// host's current process has passed.

// vouchMutation: no beacon vouches for a record, as before reviewer X65's
// fix; vouchCoverMutation: a vouched create counts receipts coverage from
// nothing (coverNever), as any create not chained to a trusted record;
// vouchLaterMutation: a later value drops the kept one (reviewer X71's
// garbage back); vouchOtherBootMutation: no vouching of another
// process's create (X71's restart back); vouchCandidateMutation: a later
// vouchable value takes the kept one's place, as before reviewer X75.
// Tests only.
var vouchMutation, vouchCandidateMutation, vouchCoverMutation, vouchLaterMutation, vouchOtherBootMutation, vouchProcMutation bool

// beaconProc is the newest record a host's current agent process (boot
// and incarnation of its last beacon) named in its beacons.
type beaconProc struct {
	boot   string
	newest writeID
}

// named notes a beacon of boot naming id: a beacon of another process
// (boot or incarnation) starts over.
func (p *beaconProc) named(boot string, id writeID) {
	if p.boot != boot || p.newest.inc != id.inc || id.newer(p.newest) {
		p.boot, p.newest = boot, id
	}
}

// unfreshValue is a signed record of a host's own that could not be
// trusted (see above), kept for a later beacon to vouch for.
type unfreshValue struct {
	rev uint64
	rec fencing.LeaseRecord
	at  time.Time // when it was observed
	unfreshMark
	// later: the values of the key observed after it, in order.
	later []laterValue
}

// unfreshMark is what the tracker knew of a key before one of its
// values: its last revision and deleted state (restored to observe the
// value as trusted), and the stored times of the value and of the one
// before it (the receipts coverage of a vouched record: coverStart).
type unfreshMark struct {
	before             uint64
	deleted            bool
	stored, prevStored int64
	// whileWithdrawn: refused over a trusted record as another process's
	// while the host's withdrawal stood (otherProcessWhileWithdrawn): its
	// own beacon, which ends that withdrawal, vouches for it (reviewer
	// X101).
	whileWithdrawn bool
}

// laterValue is a value of a key observed after a kept unfresh one: a
// delete marker, or an untrusted value (why, forged: as observed).
type laterValue struct {
	rev    uint64
	at     time.Time
	marker bool
	why    string
	forged bool
	// rec: an unfresh value of the host's own that could be vouched for
	// too (a candidate: keepUnfresh), with what was known before it.
	rec  *fencing.LeaseRecord
	mark unfreshMark
	// superseded: rec is older than two records of its process u keeps
	// (rankProc): still vouchable, but compactLater may fold it
	// (reviewers X82, X83).
	superseded bool
}

// namedWrite is a revision a beacon of the host named and the record it
// said it wrote there (its boot and identity).
type namedWrite struct {
	rev  uint64
	boot string
	id   writeID
}

// vouchable reports whether h's record rec, which could not be trusted
// (not verified as written fresh, or another process's create after a
// delete), may be trusted on its beacon's word (see above). h: the
// tracker's state before rec.
func (t *Tracker) vouchable(h *hostState, rec *fencing.LeaseRecord) bool {
	if !t.required || vouchMutation || h == nil || h.carried != nil || h.countedCarry != nil ||
		rec.Sig == "" || rec.Seq == 0 || !hostWritten(rec.State) {
		return false
	}
	if p := h.beacons.proc; p.boot == rec.BootID && p.newest.inc == rec.Incarnation && p.newest.newer(idOf(*rec)) && !vouchProcMutation {
		// Its agent process named a newer record in a beacon already: an
		// older write of its own landed late (a relay's) is not its
		// newest (reviewer X71's defence in depth).
		return false
	}
	return h.trustedRev == 0 || otherBootCreate(h, rec) && h.rollbackBar == nil && !vouchOtherBootMutation ||
		t.otherProcessWhileWithdrawn(h, rec) && h.rollbackBar == nil
}

// vouchedCreate reports whether Observe is taking a create its beacon
// vouched for over a delete of a trusted record of another process: its
// identity is not ordered against that record's (otherBootCreate), so
// it is not judged a replay by them.
func (t *Tracker) vouchedCreate(h *hostState, rec *fencing.LeaseRecord) bool {
	return t.vouching && h != nil && h.deleted && rec.PrevRev == 0 && h.rollbackBar == nil && h.carried == nil
}

// namedRing holds the last beaconMemory writes a host's beacons named.
type namedRing struct {
	w    [beaconMemory]namedWrite
	next int
}

// named reports whether a beacon of the host named revision rev with
// rec's boot and identity (one of the last beaconMemory) — while a
// withdrawal beacon stands, one received after it (or the withdrawal's
// own: namedFloor).
func (b *beaconState) named(rev uint64, rec *fencing.LeaseRecord) bool {
	if b.writes == nil {
		return false
	}
	standing := (b.withdrew != 0 || b.withdrawnRev != 0) && !namedFloorMutation
	for i, n := range b.writes.w {
		if standing && b.writes.index(i) < b.namedFloor {
			continue
		}
		if n.rev == rev && n.rev != 0 && n.boot == rec.BootID && n.id == idOf(*rec) {
			return true
		}
	}
	return false
}

// namedFloorMutation: beacons received before a standing withdrawal's
// vouch as any, as before (reviewer X100, named cases). Tests only.
var namedFloorMutation bool

// index returns the number of the write noted in slot i (noteNamed's
// count when it was noted); -1 for a slot never written.
func (r *namedRing) index(i int) int {
	if i >= r.next {
		return -1
	}
	return i + (r.next-1-i)/beaconMemory*beaconMemory
}

// floorAtWithdrawal sets namedFloor for a withdrawal at rev written by
// boot, just handled: the beacons received before it named writes made
// before it, and while it stands none of them vouches for a record
// (named) — after a rollback that moved revisions down, a copy of an
// earlier boot's record lined up at the revision its beacon named before
// the rollback was vouched, and the withdrawn host declared (reviewer
// X100, named cases). The withdrawal's own beacon, and any of the host's
// received after it in the same batch, still count.
func (b *beaconState) floorAtWithdrawal(rev uint64, boot string) {
	if b.writes == nil {
		return
	}
	b.namedFloor = b.writes.next
	for k := b.writes.next - 1; k >= 0 && k >= b.writes.next-beaconMemory; k-- {
		if n := b.writes.w[k%beaconMemory]; n.rev == rev && (boot == "" || n.boot == boot) {
			b.namedFloor = k
			return
		}
	}
}

// namedAbove reports whether a beacon of the host named a write of the
// agent process (boot, incarnation) at a revision above rev (one of the
// last beaconMemory).
func (b *beaconState) namedAbove(rev uint64, boot string, inc uint64) bool {
	if b.writes == nil {
		return false
	}
	for _, n := range b.writes.w {
		if n.rev > rev && n.boot == boot && n.id.inc == inc {
			return true
		}
	}
	return false
}

// noteNamed keeps what a beacon said the host wrote (a ring of the last
// beaconMemory, like revs).
func (b *beaconState) noteNamed(n namedWrite) {
	if b.writes == nil {
		b.writes = &namedRing{}
	}
	b.writes.w[b.writes.next%beaconMemory] = n
	b.writes.next++
}

// unfreshMark is what the tracker knows of host's key before its value
// at rev (h: host's state, nil if not tracked), taken before observing it.
func (t *Tracker) unfreshMark(host string, h *hostState, rev uint64) unfreshMark {
	_, prev := t.storedBefore(host, rev)
	m := unfreshMark{stored: t.storedAt(host, rev), prevStored: prev}
	if h != nil {
		m.before, m.deleted = h.rev, h.deleted
	}
	return m
}

// keepUnfresh keeps host's record rec at rev, observed at now and not
// trusted, for its beacon to vouch for (BeaconVouches) — if it is the
// key's last value now and may be vouched for.
func (t *Tracker) keepUnfresh(host string, rev uint64, rec *fencing.LeaseRecord, now time.Time, m unfreshMark) {
	h := t.hosts[host]
	if h == nil || h.rev != rev {
		return
	}
	if !t.vouchableAt(h, rec, m.deleted) || !landable(rec, m) {
		return
	}
	if u := h.unfresh; u != nil && len(u.later) > 0 && u.later[len(u.later)-1].rev == rev && !vouchCandidateMutation {
		// Not in place of the kept one: a copy of the host's record put
		// back before the kept one's beacon came took its place
		// (reviewer X75). Both wait for a beacon.
		if u.holds(rec) && !laterCompactMutation {
			// A record kept already, seen again at a later revision: a
			// copy (a write lands once; its beacon names the first), never
			// vouched — a value compactLater may fold, or a compromised
			// node's copies would count toward maxLaterValues.
			return
		}
		r := *rec
		u.later[len(u.later)-1].rec, u.later[len(u.later)-1].mark = &r, m
		if !candidateProcMutation {
			u.rankProc(rec)
		}
		return
	}
	h.unfresh = &unfreshValue{rev: rev, rec: *rec, at: now, unfreshMark: m}
}

// landable reports whether rec, a signed record of the host observed
// after m (what was known of the key before it), could have been written
// where it was observed: a compare-and-set record (prev_rev set: a
// renewal, or an anchored create over a delete marker — natslease.Store.
// marker) lands only on the key's last revision, and the watch delivered
// m.before before it, so its prev_rev is m.before or later (later: values
// the watch skipped). One sealed for an earlier revision is a copy put
// back (fencing.StaleRecord): no beacon names it — the host's beacon names
// the revision its own write landed at, once. Kept as a candidate, every
// saved renewal of the host's earlier boots or agent restarts counted
// toward maxLaterValues: two per agent process (rankProc), so an
// attacker holding renewals of 32 of them put back between a create and
// its beacon dropped the create (the open item after reviewer X83). A
// create (prev_rev 0: an agent's before anchoring, or over a marker
// nobody could read) names no revision and is judged by rankProc alone.
// m.before 0: nothing known of the key (a start's first value): nothing
// to compare with.
//
// A bookkeeping filter, never a decision of trust: a record it refuses
// would be refused as a replay anyway (fencing.StaleRecord in replay, the
// same condition) when its beacon named it and BeaconVouches observed it
// — a genuine withdrawal sealed below the controller's view after an
// unseen rollback included (reviewer X91, attack_x91_test.go: its beacon,
// its receipt and the rollback check keep the host undeclared).
func landable(rec *fencing.LeaseRecord, m unfreshMark) bool {
	return rec.PrevRev == 0 || m.before == 0 || rec.PrevRev >= m.before || landableMutation
}

// landableMutation: a record sealed for a revision before the key's last
// one may be kept and be a candidate, as before. Tests only.
var landableMutation bool

// holds reports whether u keeps rec's record (boot and identity) already:
// as the kept value or a candidate.
func (u *unfreshValue) holds(rec *fencing.LeaseRecord) bool {
	same := func(r *fencing.LeaseRecord) bool { return r.BootID == rec.BootID && idOf(*r) == idOf(*rec) }
	if same(&u.rec) {
		return true
	}
	for _, l := range u.later {
		if l.rec != nil && same(l.rec) {
			return true
		}
	}
	return false
}

// rankProc marks the candidates of rec's process (the last one of u.later
// is rec) superseded but for the two newest, the kept value counted: a
// superseded candidate stays vouchable but compactLater may fold it.
// Without it a compromised node that had saved 64 of the host's records of
// an earlier boot or incarnation — each of its own identity, each
// vouchable while no trusted record is held, or another process's create
// after a delete — put them back between the host's create and its
// beacon, and the 65th dropped the kept create every round: never
// vouched, the dead host never declared (reviewer X82,
// TestX82OldProcessCopiesBeforeBeacon, TestX82OldProcessCreatesAfterRestart;
// candidateProcMutation). Two, not one: the write the host's beacon names
// may be second to a newer record of its process whose beacon never comes
// — a sealed renewal a compromised peer was asked to relay and put back
// later, a write whose beacon was lost, writes landing out of seq order —
// and demoting it (reviewer X83, attack_x83_test.go) kept the dead host
// undeclared. What is left counting toward maxLaterValues is two records
// per agent process of the host — records that could have landed where
// they are (landable): an attacker holding creates of 32 of its reboots or
// agent restarts (docs/security.md). A newer record counts against l only
// if sealed before l landed (supersedes, reviewer X84).
func (u *unfreshValue) rankProc(rec *fencing.LeaseRecord) {
	for i := range u.later {
		l := &u.later[i]
		if l.rec == nil || !sameProcess(*l.rec, *rec) {
			continue
		}
		newer := 0
		if sameProcess(u.rec, *l.rec) && supersedes(&u.rec, l) {
			newer++
		}
		for _, o := range u.later {
			if o.rec != nil && sameProcess(*o.rec, *rec) && supersedes(o.rec, l) {
				newer++
			}
		}
		l.superseded = newer >= 2
	}
}

// supersedes reports whether o, a record of l's agent process, counts
// against candidate l in rankProc: newer, and sealed for a revision before
// l's (a create: prev_rev 0), so sealed without knowing l had landed — the
// write a beacon named may be older than such records whose beacons never
// come (reviewer X83's relay-held renewal). One sealed for l's revision or
// later (prev_rev ≥ l's: a renewal over it, or over a value after it, an
// anchored create over a marker after it) was sealed after l landed: the
// host's own next writes, at its own rate (only the host seals; a
// compromised node holds such a record only if the host gave it one to
// relay, and then over l's revision as l's successor). Counting those,
// two newer writes whose beacons never came — two relay-held renewals, or
// writes whose beacons were lost — superseded the write the host's last
// beacon named, and a flood folded it: the dead host never declared
// (reviewer X84, TestX84TwoNewerSupersedeThenFoldNamed, anchored cases;
// supersedeMutation).
func supersedes(o *fencing.LeaseRecord, l *laterValue) bool {
	if !idOf(*o).newer(idOf(*l.rec)) {
		return false
	}
	return o.PrevRev < l.rev || supersedeMutation
}

// supersedeMutation: every newer record of its process counts against a
// candidate, as before. Tests only.
var supersedeMutation bool

// candidateProcMutation: every vouchable record is a candidate, as before
// reviewer X82. Tests only.
var candidateProcMutation bool

// vouchableAt is vouchable judged with h's key deleted or not as it was
// before rec (otherBootCreate needs the delete rec came after).
func (t *Tracker) vouchableAt(h *hostState, rec *fencing.LeaseRecord, deleted bool) bool {
	was := h.deleted
	h.deleted = deleted
	ok := t.vouchable(h, rec)
	h.deleted = was
	return ok
}

// named returns the value u keeps that a beacon naming rev, boot and id
// names — u itself or one of its candidates (keepUnfresh), with the
// values after it — if any.
func (u *unfreshValue) named(rev uint64, boot string, id writeID) (unfreshValue, bool) {
	if u.rev == rev && idOf(u.rec) == id && u.rec.BootID == boot {
		return *u, true
	}
	for i, l := range u.later {
		if l.rec != nil && l.rev == rev && idOf(*l.rec) == id && l.rec.BootID == boot {
			return unfreshValue{rev: l.rev, rec: *l.rec, at: l.at, unfreshMark: l.mark, later: u.later[i+1:]}, true
		}
	}
	return unfreshValue{}, false
}

// maxLaterValues bounds the values of a key kept after an unfresh one
// (laterValue) once compacted (compactLater); one more drops the unfresh
// value. The runner hands the
// tracker one watch update per turn of its loop (each of an untrusted
// host's with a stored-message read) and the waiting beacons on another,
// chosen at random when both are ready: a compromised node's burst
// between a create and its beacon is delivered a few values at a time.
// 16 (beaconMemory) was passed with 17 values (reviewer X72,
// TestX72GarbageFloodBeforeBeacon); 64 values kept ahead of a beacon ready
// all along is a chance of 2^-64 per round, and at most 64 × ~100 bytes
// per host kept, only while it has no trusted record.
const maxLaterValues = 64

// laterValue notes a value of h's key observed after its kept unfresh one
// (maxLaterValues at most, compacted: then the kept one is dropped).
func (h *hostState) laterValue(l laterValue) {
	u := h.unfresh
	if u == nil || l.rev <= u.rev {
		return
	}
	if len(u.later) == maxLaterValues && !laterCompactMutation {
		u.compactLater()
	}
	switch {
	case len(u.later) >= maxLaterValues || vouchLaterMutation && !l.marker:
		h.unfresh = nil
	default:
		u.later = append(u.later, l)
	}
}

// compactLater drops the values inside each run of three or more later
// values that no beacon can vouch for (delete markers, untrusted values:
// not candidates), keeping each run's first and last. Reviewer X75's
// residual race: a compromised node's burst of values right after a
// create — 80 in ~10 ms on a real nats-server — outran the create's
// beacon whenever it was more than a few milliseconds late (every round
// under load, TestX75FloodPastLaterValuesNATS), and the 65th dropped the
// kept create: never vouched, the dead host never declared. Replayed after
// a vouch (BeaconVouches), a run's inner values only set the key's
// revision and state that its last one sets again; what they could add
// is a hidden write noted (afterSkip, from the previous value's revision)
// — the run's last value, replayed right after its first, notes one at
// least as wide (an earlier previous revision, the same stored times): a
// wider hidden write only refuses more (the (c) side). So only values a
// beacon may still vouch for — the host's own records with an identity
// not kept already (keepUnfresh) — count toward maxLaterValues, and those
// come at its own write rate.
func (u *unfreshValue) compactLater() {
	n := len(u.later)
	inner := make([]bool, n)
	for i := 1; i < n-1; i++ {
		inner[i] = u.later[i-1].foldable() && u.later[i].foldable() && u.later[i+1].foldable()
	}
	keep := u.later[:0]
	for i, l := range u.later {
		if !inner[i] {
			keep = append(keep, l) // i >= len(keep): nothing not yet read is overwritten
		}
	}
	clear(u.later[len(keep):n])
	u.later = keep
}

// foldable: no candidate, or one superseded by a newer record of its
// process (reviewer X83).
func (l laterValue) foldable() bool { return l.rec == nil || l.superseded }

// laterCompactMutation: later values are not compacted, as before
// (reviewer X75's residual race). Tests only.
var laterCompactMutation bool

// vouchWaitMutation: a host vouched for late may be due at once, as
// before compactLater (reviewer X74's burst). Tests only.
var vouchWaitMutation bool

// observeVouched observes host's record rec at rev, which could not be
// trusted, as trusted: a beacon of the host named exactly its revision
// and identity before it came (see above).
func (t *Tracker) observeVouched(now time.Time, host string, rev uint64, rec *fencing.LeaseRecord) []Decision {
	_, prev := t.storedBefore(host, rev)
	t.vouching, t.vouchPrev = true, prev
	ds := t.Observe(now, host, rev, rec)
	t.vouching = false
	if h := t.hosts[host]; h != nil && h.trustedRev == rev {
		t.out = append([]Decision{vouchedDecision(host, rev, *rec, 0, 0)}, ds...)
	}
	return t.out
}

// BeaconVouches reports that host's beacon, received at now, named the
// record (boot, epoch, inc, seq) it wrote at revision rev (call it after
// ObserveBeacon and BeaconWrote). If that record was observed and kept
// as not trusted (see above), it is trusted now, as observed when it
// was, and the values of the key observed after it are observed again
// after it. It returns the decisions that says (OpVouched first; the
// later values' invalid-record and lease-deleted were said when they
// came).
func (t *Tracker) BeaconVouches(now time.Time, host string, rev uint64, boot string, epoch, inc, seq uint64) []Decision {
	t.out = t.out[:0]
	h := t.hosts[host]
	if h != nil && seq != 0 && rev != 0 {
		id := writeID{epoch: epoch, inc: inc, seq: seq}
		h.beacons.proc.named(boot, id)
		h.beacons.noteNamed(namedWrite{rev: rev, boot: boot, id: id})
	}
	if h == nil || h.unfresh == nil || vouchMutation {
		return t.out
	}
	u, ok := h.unfresh.named(rev, boot, writeID{epoch: epoch, inc: inc, seq: seq})
	if !ok {
		return t.out
	}
	h.unfresh = nil
	if !t.vouchableAt(h, &u.rec, u.deleted) && !(u.whileWithdrawn && h.trustedRev != 0 && h.rollbackBar == nil && !vouchMutation) {
		return t.out
	}
	rev0, deleted0 := h.rev, h.deleted
	h.rev, h.deleted = u.before, u.deleted // as it was before the value
	t.vouching, t.vouchPrev = true, u.prevStored
	t.Observe(u.at, host, u.rev, &u.rec)
	t.vouching = false
	if h = t.hosts[host]; h.trustedRev != u.rev {
		// Refused after all (a replay by comparison with what is known
		// of the key): as it was.
		h.rev, h.deleted = max(h.rev, rev0), deleted0
		return t.out
	}
	if h.trustedStored == 0 {
		h.trustedStored = u.stored // the stamp moved on to a later value
	}
	// Trusted as observed, perhaps long ago (silent since), but not due
	// before BeaconExpectWindow has passed: a stalled burst of its beacons
	// vouched an old create and a tick before the next beacon of the
	// burst — each a renewal — declared the live host (reviewer X74's
	// burst, TestX74LateBeaconBurstVouchOldValueLiveHost: 64 markers
	// dropped the kept create before compactLater; now it is kept).
	h.beacons.vouchedAt = now
	out := append([]Decision{vouchedDecision(host, u.rev, u.rec, now.Sub(u.at), len(u.later))}, t.out...)
	for _, l := range u.later {
		t.out = t.out[:0]
		if l.marker {
			t.observeDeleted(l.at, host, l.rev)
		} else if l.rec != nil && !vouchCandidateMutation {
			t.Observe(l.at, host, l.rev, l.rec) // a copy is a replay now; a newer create is trusted
		} else {
			t.observeInvalid(l.at, host, l.rev, l.why, l.forged)
		}
		for _, d := range t.out {
			if d.Op != OpInvalid && d.Op != OpLeaseDeleted {
				out = append(out, d)
			}
		}
	}
	t.out = out
	return t.out
}

// vouchedDecision says that host's record at rev, which could not be
// trusted, was trusted on its beacon's word (late: how long after it was
// observed; later: the values of the key observed after it again).
func vouchedDecision(host string, rev uint64, rec fencing.LeaseRecord, late time.Duration, later int) Decision {
	return Decision{Op: OpVouched, Host: host, Revision: rev, Record: rec, Reason: fmt.Sprintf(
		"vouched: the host's %s record at revision %d (boot %s, epoch %d, incarnation %d, seq %d) could not be trusted (not verifiable as written fresh — a create over a delete marker — or another agent process's create after a delete); the host's own signed beacon names exactly that revision and record: trusted (beacon %s after the value; %d later values of the key observed again after it)",
		rec.State, rev, rec.BootID, rec.Epoch, rec.Incarnation, rec.Seq, late.Round(time.Millisecond), later)}
}
