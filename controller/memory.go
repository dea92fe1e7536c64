package controller

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"hvguard/fencing"
)

// The controller's memory across restarts (issue 11, docs/security.md
// "Restart memory"). A host's beacons bind it (invalid.go) only once this
// controller received one: a controller that starts (or a standby that
// takes over without having watched) after a host died is lenient for it,
// and a compromised node writing garbage into its key every lease_ttl +
// grace kept it undeclared (invariant c). So the leader remembers, in a
// bucket only controllers may write (MemoryBucket), each host whose
// beacons bound it — written when its first beacon arrives — and a
// controller restores that once its watch listed the lease bucket and it
// restored the guard (RestoreMemory): such a host is bound again at once
// if this controller holds a trusted record of it (beaconsBind), so a
// value of its key no beacon names restarts nothing (its beacons must
// still arrive: the fleet-wide BeaconTrustWindow applies).
//
// A memory says what was, not what is. Taking a remembered record as the
// host's record declared a host that withdrew while no controller ran and
// let a remembered withdrawal end a hold over a rack that took its leases
// back meanwhile (reviewer X11, TestX11UnobservedWithdrawal*,
// TestX11StaleWithdrawnMemoryEndsHold). One record is taken, on evidence
// that nothing changed since (a Pin): when the leader sees a value it
// will declare over — a delete marker, or an untrusted value that does
// not restart the host's clock — in the key of a host whose last trusted
// record is active and signed by its key, with no watch skip since that
// record and no withdrawal beacon, it remembers that record and the
// key's revision. (Likewise a withdrawn or declared record under such a
// value: pinnable, restoreQuietPin — restored as it was, never declared.) A controller that restores it while the key is still
// at that very revision knows every write since the record: the one it
// will declare over, nothing else (a withdrawal, a renewal, any write
// moves the revision; the watch delivered every revision in between to
// the controller that wrote the pin). So it takes the record and declares
// the host lease_ttl + grace after its own start, by CAS on that
// revision — a dead host whose key a compromised node deleted or wrote
// garbage into, followed by a controller restart or takeover, was never
// declared (reviewer X11, TestX11DeleteAtRestartBypassesMemory). A key
// written while no controller runs moves the revision: its host stays
// undeclared, as before (docs/security.md, What is left).
//
// "At that very revision" is a message, not a number: a lease stream
// rolled back (a NATS failure losing acknowledged writes; or restored
// from a backup) keeps its creation time and hands the lost revisions out
// again, so a pin written before the rollback matched garbage on a reused
// revision over a host that withdrew since, and the withdrawn host was
// declared (reviewer X20, TestX20PinTakenAfterStreamRollback). So a pin
// also names the time the server stored the value at that revision
// (KeyStored: JetStream stamps every stored message, in nanoseconds;
// no publisher sets it), and is taken only when the key's value at
// KeyRev has that very stamp.

// MemoryBucket is the controllers' bucket of Memory values, one per host
// token. Only controllers may read or write it (controller/natsperm).
const MemoryBucket = "hvguard-controller-memory"

// Memory is what the controller remembers of a host across restarts.
type Memory struct {
	// Beacons: the host's beacons bound it (invalid.go beaconsBind).
	Beacons bool `json:"beacons"`
	// Pin, if set: the state of the host's key the writer would declare
	// it on, or keep it withdrawn or declared on (see above).
	Pin *MemoryPin `json:"pin,omitempty"`
	// Withdrew, if set: the host's own withdrawal beacon the writer
	// handled that no beacon naming a later revision followed
	// (beaconState.withdrew), with the newest write its beacons named —
	// what adjacency and the trust of a first record compare with
	// (Tracker.adjacent, withdrawnBar). Kept in memory only, a
	// controller restarted between the withdrawal beacon and a copy of
	// an older record of the host's (aligned after a rollback that moved
	// revisions down) trusted the copy and declared the withdrawn host
	// (reviewer X97, TestX97RestartForgetsWithdrawalBeforeAdjacentCopy;
	// memoryWithdrewMutation).
	Withdrew *MemoryWithdrew `json:"withdrew,omitempty"`
}

// restoreBelowMaxRevMutation: RestoreMemory drops a memory's withdrawal
// below a revision this tracker's beacons named, as before (reviewer
// X101). Tests only.
var restoreBelowMaxRevMutation bool

// memoryWithdrewBootMutation: the memory carries no withdrawal's boot, as
// before (reviewer X100's restart cases). Tests only.
var memoryWithdrewBootMutation bool

// MemoryWithdrew: a host's withdrawal beacon's revision (Rev) and the
// newest write its beacons named then (Epoch, Incarnation, Seq: wrote;
// WroteMax: the highest revision of such writes).
type MemoryWithdrew struct {
	Rev         uint64 `json:"rev"`
	Epoch       uint64 `json:"epoch,omitempty"`
	Incarnation uint64 `json:"incarnation,omitempty"`
	Seq         uint64 `json:"seq,omitempty"`
	WroteMax    uint64 `json:"wrote_max,omitempty"`
	// Boot: the boot that wrote the withdrawal (reviewer X100).
	Boot string `json:"boot,omitempty"`
	// BootIncarnation: the incarnation of the process that wrote it
	// (reviewer X101).
	BootIncarnation uint64 `json:"boot_incarnation,omitempty"`
}

// MemoryPin is a host's last trusted record (active or withdrawn, signed
// by its key; or its declaration, signed by a controller) and the
// revision of the key's value after it — a delete marker (Deleted) or an
// untrusted value — that the controller writing it would declare the
// host over (active), or that left it withdrawn or declared.
type MemoryPin struct {
	Record     fencing.LeaseRecord `json:"record"`
	TrustedRev uint64              `json:"trusted_rev"`
	KeyRev     uint64              `json:"key_rev"`
	Deleted    bool                `json:"deleted,omitempty"`
	// Stream identifies the lease stream the revisions are of
	// (Tracker.SetStream: its creation time): a stream deleted and
	// re-created numbers its revisions again, and an old pin's revision
	// could be a new value's (reviewer X18,
	// TestX18StalePinTakenAfterStreamRecreated).
	Stream string `json:"stream"`
	// KeyStored: when the server stored the key's value at KeyRev (Unix
	// nanoseconds, the stream's own stamp: Tracker.Stored). A revision
	// handed out again after a rollback is stored at another time
	// (reviewer X20). Zero (a pin written before it existed): not taken.
	KeyStored int64 `json:"key_stored,omitempty"`
	// TrustedStored: when the server stored Record (Unix nanoseconds;
	// zero: unknown, a pin of an earlier release). A restored record
	// keeps it, so a receipts stream created after it still vouches for
	// nothing before (Tracker.ReceiptsCover, reviewer X62) and one created
	// before still vouches after a restart.
	TrustedStored int64 `json:"trusted_stored,omitempty"`
	// TrustedFrom: when the value Record replaced was stored, if known
	// (the tracker's trustedFrom: coverage counts from it, reviewer X63).
	TrustedFrom int64 `json:"trusted_from,omitempty"`
}

// keyStamp: the revision of a key's last value and when it was stored.
type keyStamp struct {
	rev    uint64
	stored int64
	// prev, prevRev: the stored time and revision of the key's value
	// before rev (0: unknown).
	prev    int64
	prevRev uint64
}

// Stored tells the tracker when the server stored host's value at rev
// (Unix nanoseconds: natslease.Update.Stored; the Runner calls it before
// it observes the value). Pins are written and taken only with it.
func (t *Tracker) Stored(host string, rev uint64, at time.Time) {
	if at.IsZero() {
		delete(t.stored, host)
		return
	}
	s := keyStamp{rev: rev, stored: at.UnixNano()}
	if old, ok := t.stored[host]; ok && old.rev < rev {
		s.prev, s.prevRev = old.stored, old.rev
	}
	t.stored[host] = s
}

// storedAround is when host's value at rev and the one before it were
// stored (0: unknown).
func (t *Tracker) storedAround(host string, rev uint64) (prev, at int64) {
	if s, ok := t.stored[host]; ok && s.rev == rev {
		return s.prev, s.stored
	}
	return 0, 0
}

// storedBefore is the revision and stored time of the value host's key
// held before rev, as this tracker saw it (0, 0: unknown — rev is the
// first value it saw of the key).
func (t *Tracker) storedBefore(host string, rev uint64) (prevRev uint64, prev int64) {
	if s, ok := t.stored[host]; ok && s.rev == rev {
		return s.prevRev, s.prev
	}
	return 0, 0
}

// storedAt is when host's value at rev was stored (0: unknown).
func (t *Tracker) storedAt(host string, rev uint64) int64 {
	_, at := t.storedAround(host, rev)
	return at
}

// SetStream tells the tracker which lease stream it watches (the
// Runner: the stream's creation time). Pins are written with it and
// taken only from it; "" (unknown): none is taken.
func (t *Tracker) SetStream(id string) { t.stream = id }

// pinMutation (reviewer X11's TestX11DeleteAtRestartBypassesMemory): no
// pin is written or taken, as before. Tests only.
var pinMutation bool

// withdrawnPinMutation (reviewer X72's restart case): only active
// records are pinned, as before. Tests only.
var withdrawnPinMutation bool

// pin remembers h's key state at rev (deleted: a marker) when h would be
// declared over it (declarable: the caller's part of that; see above);
// any other state drops the pin.
func (t *Tracker) pin(host string, h *hostState, rev uint64, deleted, declarable bool) {
	// Every write of the key since a proven point was seen: its trusted
	// record (no skip since), or the pin it holds (taken at a restore,
	// where the key was at the pin's revision, or its own) — with no skip
	// since but the first listing's, which only shows each key's value
	// (a restore checked that value; a re-watch's listing counts: writes
	// may have been missed meanwhile). Without the pin's case a pin
	// lived through one restart only: the next untrusted value dropped it
	// (reviewer X19, TestX19PinLostAfterOneRestart).
	seen := t.skippedRev <= h.trustedRev || h.pin != nil && t.liveSkippedRev <= h.pin.KeyRev && h.pin.Stream == t.stream
	var p *MemoryPin
	stored := t.storedAt(host, rev)
	if declarable && t.required && t.pinned(h) && t.pinnable(h) && h.trustedRev > 0 &&
		seen && !h.regressed && stored != 0 && !pinMutation {
		p = &MemoryPin{Record: h.rec, TrustedRev: h.trustedRev, KeyRev: rev, Deleted: deleted, Stream: t.stream, KeyStored: stored, TrustedStored: h.trustedStored, TrustedFrom: h.trustedFrom}
	}
	if p == nil && h.pin == nil {
		return
	}
	h.pin = p
	t.rememberHost(host)
}

// pinnable reports whether h's last trusted record may be pinned: an
// active one its beacons did not say it withdrew after — declared over
// the marker by a restarted controller, as above — or a withdrawn or
// declared one no beacon of the host named a newer write after: a
// controller that starts later and knew only the marker (or the untrusted
// value) counted such a host silent for good (keyGone, silentUntrusted),
// and three withdrawn hosts' keys deleted by a compromised node held the
// mass-failure guard over every later dead host (reviewer X72's restart
// case, TestX72WithdrawnDeletedKeysAcrossRestart). Taken, it is what the
// controller that saw the delete holds: a member, not silent (withdrawn),
// or silent one guard window from the restart (declared, as a declaration
// first listed at a start), never declared again.
func (t *Tracker) pinnable(h *hostState) bool {
	switch h.rec.State {
	case fencing.LeaseActive:
		return !h.beaconWithdrawn()
	case fencing.LeaseWithdrawn, fencing.LeaseExpired:
		return quietPinnable(&h.beacons, h.rec, h.trustedRev)
	}
	return false
}

// quietPinnable reports whether a withdrawn or declared record rec,
// trusted at revision trustedRev, stands as far as the host's beacons b
// say — pinned (pinnable) or restored from a pin (RestoreMemory): no
// beacon named a newer write or a withdrawal after it, nor any revision
// after it (a host back with its durable state lost names a write whose
// identity is not newer, reviewer X76). Restoring, it is asked too: a
// controller handles beacons while it waits to act, before its first
// acting tick restores the memory, and took a withdrawn pin of a host
// whose comeback beacon it had already handled — kept in the memory, a
// later restart restored the Held host withdrawn (reviewer X79,
// TestX79BeaconBeforeRestoreKeepsWithdrawnPin).
func quietPinnable(b *beaconState, rec fencing.LeaseRecord, trustedRev uint64) bool {
	return !withdrawnPinMutation && !b.wrote.newer(idOf(rec)) && b.withdrawnRev <= trustedRev &&
		(b.maxRev <= trustedRev || quietPinBeaconMutation)
}

// quietPinBeaconMutation: a beacon naming a write after a pinned
// withdrawal leaves the pin (reviewer X76); recreatedPinMutation: a
// trusted create over a marker drops the pin without rewriting the
// memory, as before. Tests only.
var quietPinBeaconMutation, recreatedPinMutation bool

// restoreQuietMutation: RestoreMemory takes a withdrawn or declared pin
// whatever the beacons handled before it said, as before reviewer X79.
// Tests only.
var restoreQuietMutation bool

// storedMutation (reviewer X20's TestX20PinTakenAfterStreamRollback): a
// pin is taken without comparing the stored time, as before. Tests only.
var storedMutation bool

// StreamRolledBack tells the tracker that the lease stream lost values
// its watch delivered (the Runner's rollback check: the stream's last
// revision below the last one delivered, or a delivered revision holding
// another message). Every pin is dropped — a pin written or moved along
// since may rest on a record the rollback made stale, and a restarted
// controller would take it (reviewer X21) — and every host counts as
// regressed: not declared until a trusted record comes. The runner then
// writes the memories and stops; the daemon runs it again with a fresh
// tracker, which lists the stream as it is.
func (t *Tracker) StreamRolledBack(now time.Time, why string) []Decision {
	t.out = t.out[:0]
	for name, h := range t.hosts {
		h.regressed = true
		if h.pin != nil {
			h.pin = nil
			t.rememberHost(name)
		}
	}
	t.out = append(t.out, Decision{Op: OpRevisionRegressed, Reason: "revision-regressed: " + why +
		"; every pin dropped from the controllers' memory, no host declared; the lease tracker starts afresh"})
	return t.out
}

// AfterRollback tells a fresh tracker that an earlier one stopped on a
// rolled-back lease stream after its watch was delivered revision rev
// (rollback.go): RestoreMemory takes no pin whose record was trusted at or
// below it. It also turns the rollback gate on (rollbackgate.go) for the
// tracker's life.
func (t *Tracker) AfterRollback(rev uint64) {
	t.rolledBackRev = rev
	t.gate, t.gateWhy = true, fmt.Sprintf("the lease stream rolled back (this controller's watch had reached revision %d)", rev)
}

// CarriedHost is a host and its last trusted record in a tracker that
// stopped on a rolled-back lease stream, carried to the fresh one
// (rollback.go: Withdrawals, CountedSilent).
type CarriedHost struct {
	Host   string
	Record fencing.LeaseRecord
	// Why says how the earlier tracker knew the host withdrawn, or why
	// it may have (Withdrawals); empty for CountedSilent.
	Why string
	// From (CountedSilent): when the host counts silent if it writes
	// nothing newer — zero: it counts already.
	From time.Time
	// Wrote: the newest record the host's beacons said it wrote
	// (Tracker.BeaconWrote; zero: none said). With Record it is the bar
	// a record must pass to end the carry (barOf): a copy of a record
	// the host wrote before the rollback is not newer than it, whatever
	// revision the node landed it at (reviewer X44).
	Wrote writeID
}

// barOf is the record a carry compares later records with (notNewer):
// rec, with its epoch, incarnation and seq raised to w's when the host's
// beacons said it wrote a newer record. It only ever stands as a carry's
// bar (countedCarry, carried) and is handed on as a CarriedHost's Record:
// never as the host's record, never verified again. A withdrawn record is
// not raised (KeepWithdrawn makes it the host's record).
func barOf(rec fencing.LeaseRecord, w writeID) fencing.LeaseRecord {
	if w.zero() || !w.newer(idOf(rec)) || rec.State == fencing.LeaseWithdrawn || beaconBarMutation {
		return rec
	}
	rec.Epoch, rec.Incarnation, rec.Seq = w.epoch, w.inc, w.seq
	return rec
}

// beaconBarMutation: the carries' bar is the carried record alone, as
// before (reviewer X44). Tests only.
var beaconBarMutation bool

// CountedSilent lists the hosts the guard counts silent at now, with
// their last trusted records, for a fresh tracker to keep counting after a
// rollback (KeepCounted).
func (t *Tracker) CountedSilent(now time.Time) []CarriedHost {
	var out []CarriedHost
	for _, name := range t.Hosts() {
		h := t.hosts[name]
		rec, from := h.rec, time.Time{}
		switch {
		case t.counted(h, now):
		case h.countedCarry != nil && !countedFromMutation:
			from = h.countFrom // an earlier carry, not counting yet
		case h.rec.State == fencing.LeaseActive && h.trustedRev > 0 && h.silentAft > 0 && !countedFromMutation:
			// Active here, not silent long enough to count yet: the
			// rollback may have put an older withdrawal back in its key
			// (or emptied it), which the fresh tracker never counts — a
			// rack cut off seconds before the rollback was found was
			// never counted, the hold never formed and its Held hosts
			// were declared (reviewer X42,
			// TestX42RecentCutOffNotCarriedEndsHold). It counts from when
			// it would here, unless it writes something newer.
			from = h.lastSeen.Add(h.silentAft)
		default:
			continue
		}
		if h.countedCarry != nil {
			// Counted on an earlier rollback's carry: hand that on —
			// the listed (or empty) record would let an older copy end
			// it after a second rollback (reviewer X38's note).
			rec = *h.countedCarry
		}
		out = append(out, CarriedHost{Host: name, Record: rec, From: from, Wrote: h.wroteBar()})
	}
	return out
}

// countedFromMutation: CountedSilent hands on only the hosts counted
// already, as before (reviewer X42). Tests only.
var countedFromMutation bool

// KeepCounted: an earlier tracker counted c.Host silent when the lease
// stream rolled back (rollback.go). This one counts it silent too until a
// trusted record newer than c.Record comes: the rollback may have put an
// older record back in its key — a withdrawal from before the backup,
// which is never counted — and the hold over a cut-off rack ended, its
// Held hosts declared while their guests ran (reviewer X25,
// TestX25RollbackResurrectedWithdrawalsEndHeldRackHold). It declares
// nothing: it only keeps the mass-failure guard's count.
func (t *Tracker) KeepCounted(c CarriedHost) {
	h := t.hosts[c.Host]
	if h == nil && !countedUntrackedMutation {
		// Not listed: the rollback emptied its key (a backup older than
		// the host), and a host cut off from NATS writes nothing to
		// re-create it — uncounted, it left the guard's count and could
		// end a hold over its rack (reviewer X37's note, the counted
		// version of TestX36RollbackBeforeHostExistedDropsCarry;
		// TestX25RollbackResurrectedWithdrawalsEndHeldRackHold/keys-gone).
		// Tracked as a host whose key is gone: counted, never declared;
		// a dead one counts until the controller restarts (the carry
		// lives in the process) or Tracker.Forget (no command calls it
		// yet; TestX38CountedCarryCountsForever/rollback-keys-gone).
		h = t.keyGone(c.Host, c.Record.Guard)
		t.hosts[c.Host] = h
	}
	if h != nil {
		rec := barOf(c.Record, c.Wrote)
		h.countedCarry, h.countFrom = &rec, c.From
		h.raiseRollbackBar(c)
	}
}

// countedUntrackedMutation: KeepCounted drops the carry of a host not
// tracked, as before. Tests only.
var countedUntrackedMutation bool

// Withdrawals lists the hosts this tracker knows withdrawn — by a trusted
// withdrawn record (Record is it) or by their own withdrawal beacon
// (Record is the last trusted one) — for a fresh tracker to keep them so
// after a rollback (KeepWithdrawn).
func (t *Tracker) Withdrawals() []CarriedHost {
	var out []CarriedHost
	for _, name := range t.Hosts() {
		// lostBeacon: possibly withdrawn (beaconloss.go; reviewer X26,
		// TestX26RollbackDropsLostBeaconRefusal). So is a hidden write
		// still waiting for its evidence (HiddenWriteWait,
		// companionsChecked): the loss that would refuse it may be found
		// only after the rollback, by a tracker that never sees the
		// hidden write (TestX26RollbackDropsLostBeaconRefusal/
		// rollback-before-loss-found).
		h := t.hosts[name]
		why := ""
		switch {
		case h.rec.State == fencing.LeaseWithdrawn:
			why = "it withdrew (its withdrawn record)"
		case h.beaconWithdrawn():
			why = "it withdrew (its withdrawal beacon)"
		case h.lostBeacon != 0:
			why = fmt.Sprintf("it may have withdrawn: beacons were lost while the watch may have hidden its write before revision %d", h.lostBeacon)
		case h.hidden.rev != 0 && !carryHiddenMutation:
			why = fmt.Sprintf("it may have withdrawn: the watch may have hidden its write before revision %d, whose evidence was still awaited", h.hidden.rev)
		case h.lateSkip.rev != 0 && !carryHiddenMutation:
			// Delivered after a skip before its beacons bound it (a
			// standby, or before the first acting tick): noted only once
			// they do, which the fresh tracker never will (reviewer X37,
			// TestX37LateSkipNotCarriedAcrossRollback).
			why = fmt.Sprintf("it may have withdrawn: the watch may have hidden its write before revision %d, delivered before its beacons bound it", h.lateSkip.rev)
		}
		if why != "" {
			rec := h.rec
			if c := h.carried; c != nil && !carriedRecordMutation && (rec.Sig == "" || notNewer(rec, *c)) {
				// Withdrawn on an earlier rollback's carry: hand that on —
				// the listed record, older, let a copy of a record between
				// them end the withdrawal after a second rollback (reviewer
				// X40, TestX40SecondRollbackDowngradesBeaconCarry).
				rec = *c
			}
			out = append(out, CarriedHost{Host: name, Record: rec, Why: why, Wrote: h.wroteBar()})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.carriedEarly)) {
		// A carry of an earlier rollback, its host not tracked yet.
		if !slices.ContainsFunc(out, func(c CarriedHost) bool { return c.Host == name }) {
			out = append(out, t.carriedEarly[name].w)
		}
	}
	for _, name := range t.earlyWithdrawals() {
		// A withdrawal beacon kept, not replayed yet (beaconloss.go): its
		// host was not tracked — the rollback came during the listing
		// (reviewer X35, TestX35RollbackDuringListingDropsEarlyWithdrawal).
		if !slices.ContainsFunc(out, func(c CarriedHost) bool { return c.Host == name }) {
			rec := fencing.LeaseRecord{Host: name}
			if h := t.hosts[name]; h != nil {
				rec = h.rec
			}
			out = append(out, CarriedHost{Host: name, Record: rec, Why: "it withdrew (its withdrawal beacon, kept before its first record was delivered)", Wrote: t.earlyWroteOf(name)})
		}
	}
	return out
}

// Bars lists every host this tracker knows a signed record or a beacon's
// record identity of — Wrote: the newest of its trusted record, what its
// beacons named and an earlier rollback's bar (which covers its carries'
// bars: KeepCounted and KeepWithdrawn raise it); Record: its trusted
// record, if signed — for a fresh tracker after a rollback (KeepBar).
func (t *Tracker) Bars() []CarriedHost {
	var out []CarriedHost
	for _, name := range t.Hosts() {
		h := t.hosts[name]
		c := CarriedHost{Host: name, Wrote: h.wroteBar()}
		if h.rec.Sig != "" && h.trustedRev > 0 {
			c.Record = h.rec
			if id := idOf(h.rec); id.newer(c.Wrote) {
				c.Wrote = id
			}
		}
		if !c.Wrote.zero() {
			out = append(out, c)
		}
	}
	return out
}

// KeepBar: an earlier tracker knew c.Host wrote (or a controller wrote
// for it) c.Wrote when the lease stream rolled back. This one refuses
// older copies of its records from now on (hostState.rollbackBar,
// replay) — every host's, not only the carried ones': a host declared
// more than a guard window before the rollback was neither, and a copy
// of its old withdrawal kept it undeclared for good (reviewer X46,
// TestX46DeclaredBeforeGuardWindowNotCarried). A declaration or release
// this tracker listed before the bar was set (the listing comes first)
// that is older than c.Record, the host's own — a backup taken while the
// host was declared; it was released and came back since — gives way to
// c.Record: the live host was taken as declared from the start (reviewer
// X47, TestX47ListedDeclarationOfLiveHostNotGivenWay). A listed record of
// the host's own is left as it is, even an older one: putting c.Record
// back over it (be52f8c) declared withdrawn hosts whose genuine newest
// record only looked older — an agent restarted with its state lost, a
// withdrawal whose beacon reached the stopped tracker — and applied the
// wrong constants (reviewers X47, X48: TestX48*, listedHostMutation). The
// price (c): a dead host listed on an older withdrawal (a copy landed
// before the listing, or the backup's own from a maintenance stop) stays
// withdrawn (TestX46CopyListedBeforeCarryApplied, skipped).
func (t *Tracker) KeepBar(c CarriedHost) []Decision {
	t.out = t.out[:0]
	h := t.hosts[c.Host]
	if h == nil {
		if c.Wrote.zero() {
			return t.out
		}
		if old, ok := t.barEarly[c.Host]; !ok || c.Wrote.newer(old) {
			if t.barEarly == nil {
				t.barEarly = map[string]writeID{}
			}
			t.barEarly[c.Host] = c.Wrote
		}
		return t.out
	}
	h.raiseRollbackBar(c)
	if r := c.Record; r.Sig != "" && hostWritten(r.State) && !h.deleted && h.carried == nil && !listedBarMutation &&
		h.rec.Sig != "" && (!hostWritten(h.rec.State) && !listedDeclMutation || hostWritten(h.rec.State) && listedHostMutation) && idOf(r).newer(idOf(h.rec)) &&
		(!h.beaconWithdrawn() && !h.beacons.wrote.newer(idOf(r)) || keepBarBeaconMutation) {
		// Not over a carry (KeepWithdrawn), nor where this tracker knows
		// by the host's own beacons of a write newer than r: it wrote
		// since — its withdrawal, hidden under the listed copy, and r
		// put back made the withdrawn host active, declared 15 s after
		// the fresh start (TestKeepBarAfterHiddenWithdrawal). Over a
		// listed declaration too (a backup taken while the host was
		// declared; it was released and came back since: the live host
		// was taken as declared from the start, reviewer X47,
		// TestX47ListedDeclarationOfLiveHostNotGivenWay). The record put
		// back is judged as Observe judges one (its grace, refusal and
		// silence): unjudged, a monitor-only host was declared 15 s
		// after the fresh start, and a host with a watchdog before its
		// grace (reviewer X47, TestX47ListedWithdrawal*).
		prev := h.rec
		h.rec, h.trustedStored, h.trustedFrom, h.spanSkip = r, 0, 0, true // carried: its stored time unknown (ReceiptStale)
		if r.State == fencing.LeaseActive && !judgeBarMutation {
			h.declaredAt, h.declaring = time.Time{}, time.Time{}
			t.judge(c.Host, h, prev)
		}
	}
	return t.out
}

// listedHostMutation: KeepBar also puts the record back over a listed
// record of the host's own (an older withdrawal or renewal), as be52f8c
// did (reviewers X47, X48). Tests only.
var listedHostMutation bool

// judgeBarMutation: KeepBar puts a record back without judging it, as
// before (reviewer X47); listedDeclMutation: only over a listed record of
// the host's own. Tests only.
var judgeBarMutation, listedDeclMutation bool

// listedBarMutation: KeepBar leaves a listed record older than the
// carried one, as before (reviewer X46). Tests only.
var listedBarMutation bool

// keepBarBeaconMutation: KeepBar puts the carried record back whatever
// the host's beacons said since. Tests only.
var keepBarBeaconMutation bool

// earlyWroteOf: the newest record host's beacons named, tracked or not.
func (t *Tracker) earlyWroteOf(host string) writeID {
	w := t.earlyWrote[host]
	if h := t.hosts[host]; h != nil {
		if hw := h.wroteBar(); hw.newer(w) {
			w = hw
		}
	}
	return w
}

// KeepWithdrawn: an earlier tracker knew w.Host withdrawn before the lease
// stream rolled back, which may have lost the withdrawal (rollback.go;
// rev: the last revision that tracker was delivered). Whatever record of
// the host this tracker listed (the rolled-back stream may hold a record
// newer than w.Record that the old tracker never trusted: reviewer X37),
// the host is withdrawn as that tracker knew it:
//   - by its withdrawn record: that record is the host's again — never
//     declared, not counted by the guard (as before the rollback: three
//     maintenance hosts counted silent held the guard for good, reviewer
//     X23's TestX23CarriedWithdrawalsHoldGuardForever), until a record
//     newer than it comes (TestX23RestartedHostStuckWithdrawnAfterBehindRollback:
//     a restarted agent's records at reused revisions end it);
//   - by its own beacon: as by its beacon, until it writes past rev.
//
// Either way a signed record not newer than w.Record is a replay (its
// revisions reused by the rollback made it look fresh:
// TestX23ReplayOnReusedPrevRevEndsKeepWithdrawn).
func (t *Tracker) KeepWithdrawn(w CarriedHost, rev uint64) []Decision {
	t.out = t.out[:0]
	h := t.hosts[w.Host]
	if h == nil && !carryUntrackedMutation {
		// Not listed: the rollback emptied its key (a backup older than
		// the host). Taken when it is tracked (replayHost): a compromised
		// node's copy of its first record, written as a create on the
		// empty key, looked fresh and the withdrawn host was declared
		// (reviewer X36, TestX36RollbackBeforeHostExistedDropsCarry).
		if c, ok := t.carriedEarly[w.Host]; !ok || c.rev < rev {
			if t.carriedEarly == nil {
				t.carriedEarly = map[string]carriedWithdrawal{}
			}
			t.carriedEarly[w.Host] = carriedWithdrawal{w: w, rev: rev}
		}
		return t.out
	}
	if h != nil {
		h.raiseRollbackBar(w)
	}
	// A record newer than w.Record in the rolled-back stream does not end
	// the carry: the old tracker may never have trusted it (a renewal
	// between its last trusted record and the withdrawal, superseded
	// before its watch reached it), and the rollback put it back (reviewer
	// X37, TestX37RollbackRestoresUnseenNewerRecord). A record of the host
	// delivered after this does (Observe: h.carried).
	if h == nil || listedEndsCarryMutation && h.trustedRev > 0 && h.rec.Sig != "" && w.Record.Sig != "" && !notNewer(h.rec, w.Record) {
		return t.out
	}
	if h.rec.State == fencing.LeaseWithdrawn || h.beaconWithdrawn() {
		// Withdrawn here already — perhaps by an OLDER withdrawal the
		// rollback listed (a backup taken during an earlier maintenance
		// stop): the carried record is still the replay bar, and the
		// withdrawn record the newer of the two; with none, a copy of a
		// record between them was trusted and the withdrawn host declared
		// (reviewer X41, TestX41ListedOlderWithdrawalDropsReplayBar).
		if c := w.Record; c.Sig != "" && (h.rec.Sig == "" || notNewer(h.rec, c)) && !listedWithdrawnBarMutation {
			bar := barOf(c, w.Wrote)
			h.carried = &bar
			if c.State == fencing.LeaseWithdrawn {
				h.rec, h.trustedStored, h.trustedFrom, h.spanSkip = c, 0, 0, true
			}
		}
		return t.out
	}
	last, bar := w.Record, barOf(w.Record, w.Wrote)
	h.carried = &bar
	if last.State == fencing.LeaseWithdrawn {
		h.rec, h.trustedStored, h.trustedFrom, h.spanSkip = last, 0, 0, true
	} else {
		h.beacons.withdrawnRev = max(h.beacons.withdrawnRev, rev, h.trustedRev+1)
	}
	h.declaring, h.saidDue, h.heldBack = time.Time{}, false, false
	if h.pin != nil {
		h.pin = nil
		t.rememberHost(w.Host)
	}
	t.out = append(t.out, Decision{Op: OpWithdrawn, Host: w.Host, Revision: rev, Record: h.rec, Reason: fmt.Sprintf(
		"withdrawn: before the lease stream rolled back, which may have lost its withdrawal, %s (its key holds revision %d): not declared until a record newer than its last (epoch %d, incarnation %d, seq %d) comes", why(w), h.rev, last.Epoch, last.Incarnation, last.Seq)})
	return t.out
}

// why is w.Why, or what a caller that set none means.
func why(w CarriedHost) string {
	if w.Why != "" {
		return w.Why
	}
	return "it withdrew"
}

// listedEndsCarryMutation: a listed record newer than the carried one
// ends the carry, as before (reviewer X37). Tests only.
var listedEndsCarryMutation bool

// listedWithdrawnBarMutation: KeepWithdrawn of a host listed withdrawn
// sets no replay bar, as before (reviewer X41). Tests only.
var listedWithdrawnBarMutation bool

// carriedRecordMutation: Withdrawals hands on the listed record, not the
// carried one, as before (reviewer X40). Tests only.
var carriedRecordMutation bool

// carryUntrackedMutation: KeepWithdrawn drops the carry of a host not
// tracked, as before (reviewer X36). Tests only.
var carryUntrackedMutation bool

// carryHiddenMutation: Withdrawals leaves out the hosts whose hidden
// write still waits for its evidence, as before. Tests only.
var carryHiddenMutation bool

// memoryMutation (issue 11): RestoreMemory does nothing, as before.
// Tests only.
var memoryMutation bool

// rememberHost notes that host's memory is due to be written (Memories);
// a host already due keeps its place.
func (t *Tracker) rememberHost(host string) {
	if !t.required {
		return
	}
	if _, due := t.dirtyMemory[host]; !due {
		t.memorySeq++
		t.dirtyMemory[host] = t.memorySeq
	}
}

// memoryOrderMutation: Memories hands out the due memories in host order,
// as before (reviewer X18's "a flood of pins could delay a late-sorting
// host's pin": TestMemoryWritesNotStarved). Tests only.
var memoryOrderMutation bool

// Memories returns at most max (0: all) of the memories due to be
// written, oldest due first, for the leader to write to MemoryBucket
// (with signatures required only: beacons bind nothing without them);
// the rest stay due. A write that fails is retried by handing the memory
// back with MemoryFailed. Oldest first: in host order, a compromised node
// writing garbage over more live hosts' keys than one tick writes (each
// pinned, then unpinned by its next renewal) kept the hosts sorting after
// them due for good — a dead host's pin among them was never written,
// and a restart did not declare it (TestMemoryWritesNotStarved). Now a
// host waits at most (hosts due before it) / max ticks.
func (t *Tracker) Memories(max int) (out []string, ms []Memory) {
	for host := range t.dirtyMemory {
		if t.hosts[host] != nil {
			out = append(out, host)
		} else {
			delete(t.dirtyMemory, host)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if memoryOrderMutation {
			return strings.Compare(a, b)
		}
		return cmp.Compare(t.dirtyMemory[a], t.dirtyMemory[b])
	})
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	for _, host := range out {
		delete(t.dirtyMemory, host)
		h := t.hosts[host]
		m := Memory{Beacons: !h.beacons.at.IsZero() || h.beacons.remembered, Pin: h.pin}
		if b := &h.beacons; b.withdrew != 0 && !memoryWithdrewMutation {
			m.Withdrew = &MemoryWithdrew{Rev: b.withdrew, Epoch: b.wrote.epoch, Incarnation: b.wrote.inc, Seq: b.wrote.seq, WroteMax: b.wroteMax, Boot: b.withdrewBoot, BootIncarnation: b.withdrewInc}
			if memoryWithdrewBootMutation {
				m.Withdrew.Boot = ""
			}
		}
		ms = append(ms, m)
	}
	return out, ms
}

// MemoryFailed hands back a memory whose write failed: it is returned by
// a later Memories.
func (t *Tracker) MemoryFailed(host string) {
	if t.hosts[host] != nil {
		t.rememberHost(host)
	}
}

// RestoreMemory takes over what an earlier controller remembered of host
// (see above) at now. Call it after the watch's first listing and before
// RestoreGuard: a record it takes names a guard version, which the guard's
// restore must not prune (TestX11RestorePrunesVersionHeldRackActsOn). It
// may be called again (a new leader): a host with a trusted record takes
// nothing.
func (t *Tracker) RestoreMemory(now time.Time, host string, m Memory) []Decision {
	t.out = t.out[:0]
	h := t.hosts[host]
	if h == nil || !t.required || memoryMutation {
		return t.out
	}
	if m.Beacons {
		h.beacons.remembered = true
		defer t.bindLate(now, host, h) // beaconloss.go
	}
	if mw := m.Withdrew; mw != nil && mw.Rev != 0 && !memoryWithdrewMutation && (h.beacons.maxRev <= mw.Rev || !restoreBelowMaxRevMutation) {
		// The writer's withdrawal beacon: this tracker holds it as the
		// writer did (reviewer X97; Memory.Withdrew) — whatever revision
		// its own beacons named (reviewer X101): a beacon naming a later
		// revision ends a withdrawal only when it came after it, and a
		// standby's tracker cannot tell — after a downward rollback the
		// old boot's beacon, received before the new boot's withdrawal
		// (which this tracker lost), names a higher revision; the
		// memory's withdrawal was dropped, an old boot's copy trusted
		// and the withdrawn host declared by the standby that took over
		// (TestX101StandbyTakeoverDropsWithdrawalBelowMaxRev). The price:
		// a comeback beacon only this tracker received is not counted
		// until the host's next beacon (a later revision) ends it again.
		// Beacons received before this restore vouch for nothing while
		// it stands (floorAtWithdrawal: its own beacon, if received,
		// keeps its place).
		b := &h.beacons
		if mw.Rev >= b.withdrew {
			if b.withdrew != mw.Rev || b.withdrewBoot != mw.Boot {
				b.floorAtWithdrawal(mw.Rev, mw.Boot)
			}
			b.withdrew, b.withdrewBoot, b.withdrewInc = mw.Rev, mw.Boot, mw.BootIncarnation
		}
		if w := (writeID{epoch: mw.Epoch, inc: mw.Incarnation, seq: mw.Seq}); w.newer(b.wrote) {
			b.wrote = w
		}
		b.wroteMax = max(b.wroteMax, mw.WroteMax, mw.Rev)
	}
	p := m.Pin
	if p != nil && p.TrustedRev <= t.rolledBackRev {
		// Resting on a record trusted before a rollback an earlier
		// tracker of this runner found: the rollback may have made it
		// stale (a withdrawal hidden at a reused revision), whatever
		// revision the pin moved along to since — by that tracker, its
		// writes of the dropped pins failed or skipped (reviewer X22,
		// TestX22RollbackFoundButDroppedPinsNotWritten), or by the other
		// controller, still on its old watch after this one found it
		// (reviewer X25, TestX25OtherControllersPinAboveCarry: the pin's
		// key revision was above this runner's carried one). Not taken,
		// and written out of the memory.
		p = nil
		t.rememberHost(host)
	}
	if p == nil || pinMutation || h.trustedRev != 0 || h.rev != p.KeyRev || h.deleted != p.Deleted || p.Stream == "" || p.Stream != t.stream ||
		p.KeyStored == 0 || (t.storedAt(host, p.KeyRev) != p.KeyStored && !storedMutation) ||
		p.Record.Host != host || p.Record.Signer == "" || p.TrustedRev == 0 || p.TrustedRev >= p.KeyRev {
		return t.out // the key changed since (or nothing to take)
	}
	switch p.Record.State {
	case fencing.LeaseActive:
	case fencing.LeaseWithdrawn, fencing.LeaseExpired:
		if withdrawnPinMutation || !quietPinnable(&h.beacons, p.Record, p.TrustedRev) && !restoreQuietMutation {
			t.rememberHost(host) // written out of the memory
			return t.out
		}
	default:
		return t.out
	}
	// Nothing was written to the key since the pin's writer saw it: take
	// its record. Active: its declaration clock starts now (unverifiedAt:
	// a live host renews within lease_ttl); it counts silent for the
	// guard at once (lastSeen zero): it has renewed nothing since the
	// pin, and the pin's writer counted it so — a pinned Held host taken
	// as "seen now" at a standby's takeover ended the hold over its rack
	// (reviewer X18, TestX18TakeoverPinEndsHold). Withdrawn or declared
	// (pinnable): what the pin's writer held — withdrawn (a member, not
	// silent, never declared), or declared (counted one guard window from
	// now, as a declaration first listed at a start; not declared again).
	h.rec, h.trustedRev, h.pin, h.trustedStored, h.trustedFrom, h.spanSkip = p.Record, p.TrustedRev, p, p.TrustedStored, p.TrustedFrom, true
	// The pin was written with every write of the key since its trusted
	// record seen (pin): the listing's skip before this value hid nothing
	// (bindLate notes nothing).
	h.lateSkip = lateSkip{}
	h.silentUntrusted, h.silentEnd = false, time.Time{}
	then := "declared once silent for lease_ttl + grace from now"
	switch p.Record.State {
	case fencing.LeaseActive:
		h.lastSeen, h.unverifiedAt = time.Time{}, now
	case fencing.LeaseWithdrawn:
		h.lastSeen, h.unverifiedAt, h.declaring, h.declaredAt = now, time.Time{}, time.Time{}, time.Time{}
		then = "not declared; not counted silent (withdrawn)"
	case fencing.LeaseExpired:
		h.lastSeen, h.unverifiedAt, h.declaring, h.declaredAt = now, time.Time{}, time.Time{}, now
		then = "not declared again; counted silent for one guard window from now (a declaration)"
	}
	t.guards.named(&h.rec, t.required)
	t.judge(host, h, fencing.LeaseRecord{})
	what := "an untrusted value"
	if p.Deleted {
		what = "a delete marker"
	}
	t.out = append(t.out, Decision{Op: OpInvalid, Host: host, Revision: p.KeyRev, Record: h.rec, Reason: fmt.Sprintf(
		"invalid-record: its key still holds %s at revision %d, written over its %s record (revision %d, epoch %d) as the previous controller saw it: that record restored from the controllers' memory; %s",
		what, p.KeyRev, p.Record.State, p.TrustedRev, p.Record.Epoch, then)})
	return t.out
}

// countedCarryMutation: a host counted silent when the stream rolled back
// is not counted by the fresh tracker, as before (reviewer X25). Tests
// only.
var countedCarryMutation bool
