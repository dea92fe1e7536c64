package controller

import (
	"fmt"
	"slices"
	"time"

	"hvguard/fencing"
)

// Untrusted values of a host's key (issue 11, docs/security.md "Signed
// leases"). A node holding NATS credentials can write any key; with signed
// records what it writes is not trusted, but it still moves the key's
// revision. The tracker then:
//
//   - never takes an untrusted value as the host's record (state,
//     constants, guard version): the last trusted one stays;
//   - moves the revision its declaration is a compare-and-set on to the
//     untrusted value's (a declaration on the last trusted revision would
//     fail for ever: one forged write would keep a dead host undeclared);
//   - for a value that may be a genuine renewal it cannot verify
//     (unsigned, an unknown signer, a bad signature, undecodable: a host
//     key not provisioned here, an agent whose signing is off), restarts
//     the host's declaration clock as a renewal would — a host whose
//     agent keeps renewing with such records is never declared (alerted
//     at every value); it does not end its silence for the guard (a
//     forged value must not lower the count a Held peer relies on);
//     EXCEPT while the host's beacons bind it (beaconsBind: signatures
//     required, a trusted record signed by the host's known key seen, a
//     beacon of the host received, some host's beacon within
//     BeaconTrustWindow): then such a value counts only when the host's
//     own beacon (fencing.Beacon, which with the shipped NATS permissions
//     only the host itself can publish) names its revision — before the
//     value arrives or after it (within the host's last beaconMemory
//     beacons and discounted values). A value no beacon names restarts
//     nothing (discounted): a compromised node writing garbage, unsigned or
//     unknown-signer values into a dead host's key does not keep it
//     undeclared, and a live host renewing with records this controller
//     cannot verify is not declared (its beacons name them). A
//     declaration made while values were discounted is "contested": host
//     recovery confirms it only lease_ttl + grace after it was observed
//     (silentFor) — the time an agent that wrote them needs to see the
//     controller's expired record and fence, or its backstop to fire;
//   - for a value that cannot be genuine (fencing.ErrForgedRecord: signed
//     by another known key, or a replay) restarts nothing;
//   - in either case, when the watch skipped a revision since the host's
//     last one (Skipped), restarts the clock (a genuine renewal may have
//     been overwritten before it was delivered) — except for a host its
//     beacons bind: its beacons name its own writes, skipped or not, and
//     a compromised node makes the watch skip at will with a burst of
//     writes (reviewer X4, TestX4WatchSkipKeepsDeadHostUndeclared).

// BeaconTrustWindow: a host's beacons bind its unverifiable values while
// some host's beacon (any host's) arrived within this window
// (beaconsBind). Beacons that stopped for the whole fleet mean this
// controller does not receive them (its NATS account lacks the beacon
// subscription, its subscription broke): the tracker is then lenient
// again — a live host is never declared over values it cannot verify,
// at the price of invariant (c) (docs/security.md). The window is per
// fleet, not per host: a dead host's own beacons stop with it, and a
// mass-failure hold that outlasts any per-host window made the tracker
// lenient for the dead host (reviewer X4, TestX4LongHoldLapsesBeacons).
// 5 minutes: far above the renewal interval every live agent beacons at,
// short enough that a broken subscription is noticed (alerted:
// hvguard_controller_beacons_total stops growing).
const BeaconTrustWindow = 5 * time.Minute

// beaconsBind reports whether an unverifiable value of h observed at now
// counts only when a beacon names it (see above).
func (t *Tracker) beaconsBind(h *hostState, now time.Time) bool {
	return t.pinned(h) && (!h.beacons.at.IsZero() || h.beacons.remembered) && now.Sub(t.lastBeacon) <= BeaconTrustWindow
}

// ObserveBeacon reports a beacon of host naming revision rev, received at
// now on host's own beacon subject (the caller checked the subject is
// host's). A beacon of a host not tracked is ignored (beacons make no
// member). A beacon naming an unverifiable value discounted before (one
// of the host's last beaconMemory) counts it as the host's renewal at the
// time that value was observed — even if a later value superseded it
// since (a compromised node writing right after each renewal must not
// make a live host's renewals count for nothing).
func (t *Tracker) ObserveBeacon(now time.Time, host string, rev uint64) {
	// A deleted host's beacons count too: its agent re-creates its key
	// (with a value this controller may not verify) and lives on
	// (reviewer X4, TestX4DeleteMakesLiveHostsBeaconsIgnored: ignored,
	// the live host was declared at 26 s).
	h := t.hosts[host]
	if h == nil {
		t.keepEarly(earlyBeacon{kind: earlyObserve, now: now, host: host, rev: rev}) // beaconloss.go
		return
	}
	if now.After(t.lastBeacon) {
		t.lastBeacon = now // a replayed kept beacon (replayHost) is older: not back
	}
	b := &h.beacons
	b.beaconCame(rev) // beaconloss.go
	if rev > b.withdrawnRev {
		b.withdrawnRev = 0 // a later write of its own: back from the withdrawal
	}
	if rev > b.withdrew {
		if b.withdrew != 0 {
			t.rememberHost(host) // its memory's Withdrew ends (reviewer X97)
		}
		b.withdrew, b.withdrewBoot, b.withdrewInc = 0, "", 0
	}
	if rev > b.maxRev {
		b.maxRev, b.maxAt = rev, now
	}
	if h.pin != nil && !t.pinnable(h) {
		// A write of its own after its pinned withdrawal (or
		// declaration): it is back, and a restart taking the pin would
		// not count it — a comeback's create dropped by garbage before
		// its beacon left the pin in the memory, and a restarted
		// controller restored the Held host withdrawn (reviewer X76,
		// TestX76ComebackBeaconLeavesWithdrawnPin).
		h.pin = nil
		t.rememberHost(host)
	}
	h.clearHidden(rev) // it wrote at or after the hidden write (beaconloss.go)
	if hw := &h.hidden; hw.rev != 0 && rev > hw.firstRev && !hiddenAnchorMutation {
		// Alive after the first hidden write: the wait for a missing
		// beacon (HiddenWriteWait) starts again for the later ones — a
		// compromised node overwriting each renewal of a live host
		// before its beacon came had the wait run out before the
		// withdrawal it then hid (reviewer X29,
		// TestX29HiddenWriteWaitAnchoredEarly).
		hw.anchorAt(now, hw.rev, hw.before)
	}
	if b.at.IsZero() && !b.remembered {
		t.rememberHost(host) // its beacons bind it from now on (memory.go)
	}
	b.at = now
	t.bindLate(now, host, h) // bound now: a value delivered after a skip before (beaconloss.go)
	seen := b.revs.has(rev)
	b.revs.add(rev)
	if i := slices.IndexFunc(b.pending, func(p pendingValue) bool { return p.rev == rev }); i >= 0 {
		at := b.pending[i].at
		b.pending = slices.Delete(b.pending, i, i+1)
		h.namedByBeacon(rev, at)
		return
	}
	if !seen && rev > h.trustedRev && !beaconMutation {
		// A write of the host's own after its last trusted record, not
		// among the discounted values: the watch has not delivered it
		// yet, skipped it (a value superseded before delivery — a
		// compromised node can make the watch skip at will with a burst
		// of writes, reviewer X4), or counted it already (then this
		// extends the clock by the beacon's delay: the lenient side).
		// The host was alive and wrote: a renewal now.
		h.namedByBeacon(rev, now)
	}
}

// BeaconWrote reports that host's beacon named the record it wrote at
// revision rev: epoch, incarnation and seq (fencing.Beacon; seq 0 from an
// agent from before them, which is ignored). The newest one is carried
// across a rollback as the bar a record must pass to end a carry
// (CarriedHost.Wrote): the host wrote it before the rollback, so a copy
// of it or of any older record is a replay whatever revision it landed
// at — a compromised node that lined the rolled-back stream's revisions
// up with its copies' prev_rev (filler writes, garbage on the key at
// exactly the copy's prev_rev, then the copy by a compare-and-set on it)
// passed Written.Fresh and the prev_rev check, ended the count carry of
// a Held rack's hosts and a Held host was declared 22 s after the fresh
// start (reviewer X44, TestX44AlignedCopiesEndHold). A beacon of a host
// not tracked is not kept for this (its records' identity is carried
// from what this tracker trusted) — a host not tracked yet keeps
// it until it is (earlyWrote).
func (t *Tracker) BeaconWrote(host string, rev, epoch, inc, seq uint64) {
	h := t.hosts[host]
	w := writeID{epoch: epoch, inc: inc, seq: seq}
	if seq == 0 || rev == 0 {
		return
	}
	if h == nil {
		// Its withdrawal beacon may come before its first record (a
		// listing, a lagging watch: kept, replayHost); carried by a
		// rollback then, with no record, its bar was 0 and a copy of a
		// record it wrote before the withdrawal ended the carry: the
		// withdrawn host was declared 22 s after the fresh start
		// (reviewer X45, TestX45EarlyWithdrawalCarriedWithoutBar).
		old, ok := t.earlyWrote[host]
		if !ok && len(t.earlyWrote) >= maxEarlyBeacons || earlyWroteMutation {
			return
		}
		if !ok || w.newer(old) {
			if t.earlyWrote == nil {
				t.earlyWrote = map[string]writeID{}
			}
			t.earlyWrote[host] = w
		}
		if t.earlyWroteMax == nil {
			t.earlyWroteMax = map[string]uint64{}
		}
		t.earlyWroteMax[host] = max(t.earlyWroteMax[host], rev)
		return
	}
	if w.newer(h.beacons.wrote) {
		h.beacons.wrote = w
	}
	h.beacons.wroteMax = max(h.beacons.wroteMax, rev)
}

// earlyWroteMutation: BeaconWrote ignores a host not tracked, as before
// (reviewer X45). Tests only.
var earlyWroteMutation bool

// namedByBeacon: h's beacon named its write at rev, seen at at.
func (h *hostState) namedByBeacon(rev uint64, at time.Time) {
	h.beacons.corroboratedRev = max(h.beacons.corroboratedRev, rev)
	h.renewedByBeacon(rev, at)
}

// discount records an untrusted value at rev, seen at now, that no
// beacon of h named (yet): it restarts nothing until one does.
func (h *hostState) discount(rev uint64, now time.Time) {
	h.discountedAt = now
	b := &h.beacons
	if len(b.pending) == beaconMemory {
		b.pending = b.pending[1:]
	}
	b.pending = append(b.pending, pendingValue{rev: rev, at: now})
}

// renewedByBeacon counts a write of h's that its beacon named, seen at at,
// as its renewal: its declaration clock restarts and, while its trusted
// record is active, its silence for the mass-failure guard ends as a
// trusted renewal's would — a beacon is sent only after the host's own
// write landed: it reached NATS, it is not cut off. (Renewals a
// compromised node superseded before the watch delivered them otherwise
// left live hosts counted silent: with a dead host, the guard held for as
// long as the attacker kept it up — reviewer X5,
// TestX5HiddenRenewalsHoldTheGuard.) Of a deleted host, only a write
// at rev after the delete (deletedRev): it re-created its key — a
// compromised node deleting each renewal of live hosts before the watch
// delivered it (the watch then shows the markers only) kept them counted
// silent and held the guard over a dead host for good (reviewer X73,
// TestX73SkippedCreatesUnderDeleteLoopHoldGuard); the declaration stays
// a compare-and-set on the newest marker.
func (h *hostState) renewedByBeacon(rev uint64, at time.Time) {
	if at.After(h.unverifiedAt) {
		h.unverifiedAt = at
	}
	if h.rec.State != fencing.LeaseActive && h.rec.State != "" || beaconSilenceMutation {
		return // ("": no trusted record yet, counted silent: observeInvalid)
	}
	if h.deleted && (h.rec.State == "" || rev <= h.deletedRev || deletedBeaconMutation) {
		return
	}
	if h.silentAft > 0 && at.Sub(h.lastSeen) > h.silentAft {
		h.silentEnd = at
	}
	if at.After(h.lastSeen) {
		h.lastSeen = at
	}
}

// deletedBeaconMutation: a deleted host's beacons never end its silence,
// as before reviewer X73. Tests only.
var deletedBeaconMutation bool

// contested reports whether h's declaration came while values of its key
// were discounted (no beacon named them) after its last renewal.
func (h *hostState) contested() bool {
	return !h.discountedAt.IsZero() && h.discountedAt.After(h.lastSeen)
}

// silentFor is how long h has been silent for host recovery's
// confirmation (recovery.Lease.SilentFor): since its declaration clock
// last restarted, and for a contested declaration no longer than since
// the declaration was observed.
func (t *Tracker) silentFor(h *hostState, now time.Time) time.Duration {
	d := now.Sub(h.declClock())
	if h.contested() && !h.declaredAt.IsZero() && !contestMutation {
		d = min(d, now.Sub(h.declaredAt))
	}
	return d
}

// Skipped tells the tracker the watch delivered rev although some revision
// before it was never delivered (superseded before the watch reached it,
// or the watch's first listing).
func (t *Tracker) Skipped(rev uint64) {
	t.skippedRev = max(t.skippedRev, rev)
	t.frontier.skipPending = true // beaconloss.go, companionsChecked
	if t.listed {
		t.liveSkippedRev = max(t.liveSkippedRev, rev)
	}
}

// ObserveInvalid reports an untrusted value of host's key at rev (why:
// the reason; forged: fencing.ErrForgedRecord).
func (t *Tracker) ObserveInvalid(now time.Time, host string, rev uint64, why string, forged bool) []Decision {
	t.out = t.out[:0]
	defer t.whenTracked(now, host, t.hosts[host] != nil) // beaconloss.go
	t.observeInvalid(now, host, rev, why, forged)
	return t.out
}

func (t *Tracker) observeInvalid(now time.Time, host string, rev uint64, why string, forged bool) {
	h := t.hosts[host]
	switch {
	case h != nil && rev <= h.rev:
		t.regress(h, host, rev)
		return // stale delivery
	case h == nil:
		// No trusted record yet: tracked (never declared: no constants),
		// and said loudly. It counts silent for the guard from
		// suspect_after on (the default timing), as a host whose
		// renewals stopped, until a trusted record or a beacon of it
		// arrives: it may be a Held host of a cut-off rack whose key
		// holds a forgery when this controller (re)starts — not counting
		// it ended the hold and the rack's other Held hosts were declared
		// while their guests ran (reviewer X8,
		// TestX8ForgedValuesAtRestartEndHoldOverHeldRack). Not a host
		// without a key in host_keys_file (signatures required): made-up
		// names would hold the guard (keydelete.go).
		// Only with signatures required and the host enrolled: with
		// signing off or optional any undecodable key (another tool's, a
		// leftover) counted silent for ever and held the guard (reviewer
		// X9, TestX9UndecodableKeysHoldGuardForEverSigningOff). Silent
		// after the shortest silence of any host's record (counted): with
		// the default one, hosts with shorter timings fell due first
		// (reviewer X9, TestX9ForgedValuesAtRestartShortTiming).
		h = &hostState{lastSeen: now}
		h.silentUntrusted = t.silentUntrusted(host)
		t.hosts[host] = h
	}
	h.laterValue(laterValue{rev: rev, at: now, why: why, forged: forged}) // vouch.go
	hidden := t.skippedRev > h.rev
	t.afterSkip(now, host, h, rev) // its withdrawal may be what a skip hid (beaconloss.go)
	// bind: the host's beacons decide for any untrusted value, forged or
	// not (a forged value after a burst-made skip restarted the clock:
	// reviewer X4, TestX4WatchSkipKeepsDeadHostUndeclared/...-then-forged).
	bind := t.beaconsBind(h, now) && !beaconMutation
	h.rev = rev // an untrusted value does not end a regression (only a trusted record does: reviewer X20)
	h.untrusted, h.untrustedWhy = now, why
	restart := !forged || hidden
	named := false
	if bind {
		// The beacons decide, skip or not (see the top of this file).
		named = h.beacons.revs.has(rev)
		restart = named
		if named {
			h.namedByBeacon(rev, now)
		} else {
			h.discount(rev, now)
		}
	}
	if restart {
		h.unverifiedAt = now
	}
	t.pin(host, h, rev, false, !restart)
	kind := "forged"
	if !forged {
		kind = "unverifiable"
	}
	detail := "declaration clock kept"
	switch {
	case named:
		detail = "the host's beacon names this revision: counted as its renewal"
	case bind:
		detail = "declaration clock kept: no beacon of the host names this revision (only a value the host's own beacon names counts)"
	case restart:
		detail = "counted as a renewal for its declaration (never declared while such values keep coming)"
	}
	if h.rec.State == "" {
		detail = "no trusted record yet: never declared"
	}
	t.out = append(t.out, Decision{Op: OpInvalid, Host: host, Revision: rev, Record: h.rec,
		Reason: fmt.Sprintf("invalid-record: %s value at revision %d ignored (%s); %s", kind, rev, why, detail)})
}

// NeedsWritten reports whether a record of host observed now must come
// with what its stored message says about its write (ObserveWritten):
// signatures are required and this tracker holds no trusted record of
// host yet (it never saw one, or only untrusted values, or host was
// restored from the published guard's deleted list) — replay has nothing
// to compare a first value with.
func (t *Tracker) NeedsWritten(host string) bool {
	h := t.hosts[host]
	// And while a rollback's carry holds: revisions after a rollback say
	// nothing of a copy once the stream has passed its prev_rev
	// (StaleRecord compares it with the key's listed revision, older), and
	// a copy of a hidden renewal, newer than the carried record, ended the
	// count of a Held rack's hosts (reviewer X43,
	// TestX43HiddenRenewalCopyEndsPendingCarry/copies-stream-passed). A
	// genuine record was written by a compare-and-set on its prev_rev.
	return t.required && (h == nil || h.trustedRev == 0 ||
		(h.countedCarry != nil || h.carried != nil) && !carryWrittenMutation)
}

// carryWrittenMutation: a carried host's records need no fresh write, as
// before (reviewer X43). Tests only.
var carryWrittenMutation bool

// ObserveWritten is Observe for a record whose stored message says w
// about its write (fencing.Written, read by the runner when NeedsWritten).
// A host's first value, signatures required, is trusted only when it was
// written fresh (fencing.Written.Fresh: by a compare-and-set on the very
// revision it was sealed for). Otherwise it may be a replay of an old
// genuine record — a withdrawal from an earlier orderly stop, a
// declaration released since — written back while no controller ran or
// at a restart: taken as genuine, withdrawn hosts of a Held rack were not
// counted silent, the hold ended and the rack's other Held hosts were
// declared ~22 s after the controller started while their guests ran
// (reviewers X6, X9: TestX6ReplayedWithdrawalsAcrossRestartEndHold,
// TestX9ReplayedReleaseAtRestartEndsHold). Such a value is handled as
// untrusted (observeInvalid, not forged: it may be a genuine record whose
// stored message is gone or a genuine create over a delete marker): the
// host has no trusted record yet, counts silent for the guard as such
// until a trusted record (its next renewal, a compare-and-set on that
// revision, is verified) or a beacon of it arrives, and is never declared
// meanwhile. Once a trusted record is held, replay compares with it.
func (t *Tracker) ObserveWritten(now time.Time, host string, rev uint64, rec *fencing.LeaseRecord, w fencing.Written) []Decision {
	if rec != nil && t.NeedsWritten(host) && !writtenMutation {
		if !t.adjacent(t.hosts[host], rev, rec, w) {
			w.After = 0
		}
		ok, why := w.Fresh(*rec)
		if ok && t.withdrawnBar(host, t.hosts[host], rec) {
			ok, why = false, "older than the write its own beacons named before the withdrawal they named"
		}
		if !ok {
			h := t.hosts[host]
			if t.vouchable(h, rec) && h.beacons.named(rev, rec) {
				return t.observeVouched(now, host, rev, rec) // its beacon came first (vouch.go)
			}
			t.out = t.out[:0]
			defer t.whenTracked(now, host, h != nil) // beaconloss.go
			mark := t.unfreshMark(host, h, rev)
			t.observeInvalid(now, host, rev, fmt.Sprintf("a %s record not verified as written fresh: possibly a replay (%s)", rec.State, why), false)
			t.ownRefused(now, host, rev, rec) // rollbackgate.go
			t.keepUnfresh(host, rev, rec, now, mark)
			return t.out
		}
	}
	return t.Observe(now, host, rev, rec)
}

// adjacent reports whether w.After — the watch's word that the key's
// previous message was at After and nothing of the bucket was missed
// since (natslease.Update.After) — may stand in for the stored message's
// header (fencing.Written.After): the tracker saw the same, its h.rev
// being After and rev after it, with no regression and no rollback
// carried or gated. It closes reviewer X85's race: a delete loop faster
// than the runner's read of the stored message left an anchored create
// unverifiable (its beacon had to vouch for it). After a rollback under a
// running controller the watch re-creates its consumer at its last
// revision + 1 and sees no skip (reviewer X21): until the rollback check
// finds it (rollback.go), a copy of the host's first new-life record,
// sealed for A and landed at a reused revision the watch never
// delivered, looks adjacent above the old last revision where the
// header check would refuse it (reviewer X93: a genuine record of the
// host's current life, no declaration found; docs/security.md). From
// then on, and for a host whose revisions regressed, the header alone
// counts. Nor is a record adjacent that is older than a write the host's
// own beacons named (h.beacons.wrote): adjacent, a genuine record is the
// host's newest write; in that rollback window the copy was older than the
// withdrawal the host beaconed after it, and trusted it ended the
// withdrawn state (TestX93AdjacentCopyAfterUndetectedRollback,
// beacons/undetected; adjacentBeaconMutation) — unless the record was
// sealed for a revision at or above every revision the host's beacons
// named (b.maxRev): writeID orders no boots, and an earlier boot's
// beacon otherwise blocked a new boot's records for ever (reviewer X94,
// adjacentBootMutation).
func (t *Tracker) adjacent(h *hostState, rev uint64, rec *fencing.LeaseRecord, w fencing.Written) bool {
	return w.After != 0 && h != nil && h.rev == w.After && rev > w.After && !h.regressed &&
		h.carried == nil && h.countedCarry == nil && !t.RollbackGateOn() && !adjacentMutation &&
		(!h.beacons.wrote.newer(idOf(*rec)) || adjacentBeaconMutation ||
			h.beacons.adjacentBar() <= rec.PrevRev && !adjacentBootMutation)
}

// adjacentBar: the highest revision h's beacons named, for adjacency's
// escape — maxRev, and the revisions of the writes that set wrote: a
// host's beacons kept before it was tracked raise maxRev only while
// within earlyKeep, but wrote (and its early withdrawal) for ever, and
// with maxRev alone every adjacent record escaped the wrote bar: a copy
// of the host's create ended the withdrawal its kept beacon named and it
// was declared while its guests ran (reviewer X95,
// TestX95EarlyWroteEscapesAdjacencyBar; adjacentWroteMaxMutation).
func (b *beaconState) adjacentBar() uint64 {
	if adjacentWroteMaxMutation {
		return b.maxRev
	}
	return max(b.maxRev, b.wroteMax)
}

// adjacentBootMutation (reviewer X94): a record the host's beacons named
// a newer-looking write than is never adjacent, even when it was sealed
// for a revision at or above every revision those beacons named. writeID
// has no boot: an agent booted with its durable state lost over a deleted
// key starts at a lower epoch than its earlier boot (declared and
// released since), and one beacon of that boot made every record of the
// new one "older" — never adjacent, and with its beacons lost the dead
// host was never declared (TestX94EarlierBootBeaconBlocksAdjacency). A
// record sealed for a revision no named write is above was sealed after
// every write the beacons named (revisions only grow while no rollback
// is carried, gated or regressed: the conditions above); reviewer X93's
// copy was sealed for the old life's last revision A, below the
// withdrawal its beacon named. Tests only.
var adjacentBootMutation bool

// adjacentMutation: the watch's adjacency is ignored, as before: a value
// whose stored message was superseded before it was read is not verified.
// Tests only.
var adjacentMutation bool

// adjacentBeaconMutation: a record older than a write the host's beacons
// named may be adjacent. Tests only.
var adjacentBeaconMutation bool

// replay reports whether rec, observed at rev, is a replay of an earlier
// record of h (fencing.StaleRecord against the last revision observed).
// After a delete (h.rev: the marker's revision) a genuine record is a
// create (prev_rev 0) or a write on a revision at or after the marker; a
// signed record naming an earlier revision was sealed before the delete
// and copied back since, and a signed create must be newer than the last
// trusted record seen (replayedAfterDelete). Without this one delete
// and one write of an old genuine record (a withdrawal from an earlier
// orderly stop, a declaration released since) kept a dead host
// undeclared and, over a Held rack, ended the mass-failure hold while its
// hosts' guests ran (reviewer X5).
// prevRevMutation: a signed record landed at or below its own prev_rev
// is not taken for a copy, as before (reviewer X43). Tests only.
var prevRevMutation bool

func replay(h *hostState, rev uint64, rec *fencing.LeaseRecord) bool {
	switch {
	case h == nil:
		return false
	case rec.Sig != "" && rec.PrevRev >= rev && !prevRevMutation:
		// Written by a compare-and-set on revision PrevRev, a genuine
		// record lands above it: this one landed at or below, a copy of
		// a record from before a rollback whose revisions the stream
		// hands out again (StaleRecord compares with the key's last
		// revision, reused too). A hidden renewal's copy, newer than a
		// rollback's carried record, ended the count of a Held rack's
		// hosts, re-landed every second, and the hold ended (reviewer
		// X43, TestX43HiddenRenewalCopyEndsPendingCarry).
		return true
	case h.carried != nil && rec.Sig != "" && notNewer(*rec, *h.carried) && !replayMutation:
		// Not newer than the record an earlier tracker knew when the
		// lease stream rolled back (Tracker.KeepWithdrawn): a copy of
		// one of its records from before the rollback, whose revisions
		// the rollback handed out again (reviewer X23).
		return true
	case h.rollbackBar != nil && rec.Sig != "" && !rollbackBarMutation &&
		(hostWritten(rec.State) && !idOf(*rec).newer(*h.rollbackBar) || !hostWritten(rec.State) && h.rollbackBar.newer(idOf(*rec)) && !rollbackDeclMutation):
		// Not newer than the newest record an earlier tracker knew the
		// host wrote when the lease stream rolled back (rollbackBar): a
		// copy from before the rollback, whatever carry ended since. A
		// host that renewed on after the rollback and then stopped in
		// order had its withdrawal ended by a copy of its pre-rollback
		// renewal, landed on a revision the rollback handed out again
		// (not stale), and was declared while its guests ran (reviewer
		// X24, TestX24ReusedRevisionReplayAfterRollbackNotCarried); an
		// old withdrawal's copy kept a dead host undeclared (c,
		// TestX24ReusedRevisionWithdrawalReplayKeepsDeadHost). A
		// controller's record (expired, released) only when strictly
		// older: a re-declaration after the rollback has the lost one's
		// identity (TestX38CountedCarryCountsForever) — and a copy of an
		// old declaration of a host released and back since was taken
		// (the live host declared 10.6 s after the fresh start), of an
		// old release kept a dead host undeclared (reviewer X46,
		// TestX46ReplayedDeclarationOfLiveHostAfterRollback,
		// TestX46ReplayedReleaseKeepsDeadHostUndeclared).
		return true
	case !h.deleted:
		return fencing.StaleRecord(*rec, rev, h.rev)
	}
	return replayedAfterDelete(h, rec) && !replayMutation
}

// heldBack reports whether rec, a signed record its host writes, is not
// newer than h's trusted record of the same agent process (boot and
// incarnation): one process seals its records in seq order, and a record
// lands only by a compare-and-set on the key's last revision, so a genuine
// record of the process never lands after a newer one of it — this one was
// held back and put back. Revisions alone did not tell: a compromised
// peer that chose the revision a cut-off host sealed its relayed renewal
// for (far ahead: a lying "invalid record at R" answer) held a genuine
// renewal it could write fresh at R once the stream got there, and landed
// it after the host's orderly withdrawal — the withdrawn host, guests
// running, declared 31 s later (reviewer X85,
// TestX85FutureSealedRenewalEndsWithdrawal; the agent no longer takes one
// peer's revision: fencing.Agent.PeerAnswered). Another process's record
// is not ordered by this (sameProcess), nor a record without an identity
// (seq 0: an agent from before beacons). Only over a withdrawal: refused,
// the withdrawal stands and the host is not declared (the safe side) —
// over an active record a refusal makes the host look silent, and an
// agent restarted within a boot with its durable state lost while its key
// showed none of its records reuses an incarnation and restarts its seqs
// (reviewer X68): its genuine renewals would be refused and the live host
// declared. An older active record trusted after a newer one only delays
// a dead host's declaration by a lease (the c side).
func heldBack(h *hostState, rec *fencing.LeaseRecord) bool {
	if h == nil || h.trustedRev == 0 || heldBackMutation {
		return false
	}
	last := h.rec
	return rec.Sig != "" && last.Sig != "" && rec.Seq != 0 && last.Seq != 0 && hostWritten(rec.State) && (last.State == fencing.LeaseWithdrawn || heldBackActiveMutation) &&
		last.Host == rec.Host && sameProcess(*rec, last) && !idOf(*rec).newer(idOf(last))
}

// heldBackMutation: heldBack refuses nothing, as before;
// heldBackActiveMutation: over an active record too (the first version).
// Tests only.
var heldBackMutation, heldBackActiveMutation bool

// hostWritten reports whether a record in state st is one its host
// writes (active, withdrawn) rather than the controller (expired,
// released).
func hostWritten(st fencing.LeaseState) bool {
	return st == fencing.LeaseActive || st == fencing.LeaseWithdrawn
}

// rollbackBarMutation: replay ignores rollbackBar, as before (reviewer
// X24's reused-revision replays). Tests only.
var rollbackBarMutation bool

// rollbackDeclMutation: the bar judges only the host's own records, as
// before (reviewer X46). Tests only.
var rollbackDeclMutation bool

// raiseRollbackBar: h's newest record known when the lease stream rolled
// back is at least c's record, or the newer one its beacons named
// (replay refuses anything not newer from now on).
func (h *hostState) raiseRollbackBar(c CarriedHost) {
	var id writeID
	if c.Record.Sig != "" {
		id = idOf(c.Record) // unsigned (or no record): no identity to trust
	}
	if c.Wrote.newer(id) {
		id = c.Wrote // what its signed beacons named (signing required)
	}
	if id.zero() {
		return
	}
	if h.rollbackBar == nil || id.newer(*h.rollbackBar) {
		h.rollbackBar = &id
	}
}

// wroteBar is the newest record h is known to have written, for a
// rollback's carry (CarriedHost.Wrote): what its beacons named, or an
// earlier rollback's bar (a second rollback hands it on).
func (h *hostState) wroteBar() writeID {
	if b := h.rollbackBar; b != nil && b.newer(h.beacons.wrote) {
		return *b
	}
	return h.beacons.wrote
}

// replayedAfterDelete: see replay.
func replayedAfterDelete(h *hostState, rec *fencing.LeaseRecord) bool {
	if rec.Sig == "" {
		return false // unsigned: cannot be told (signing off or optional)
	}
	if rec.PrevRev != 0 {
		return rec.PrevRev < h.rev
	}
	last := h.rec
	if last.Host == "" || last.Sig == "" {
		return false // nothing trusted and signed to compare with
	}
	return notNewer(*rec, last)
}

// otherBootCreate reports whether rec, observed after h's key was
// deleted, is a signed create of another agent process than h's last
// trusted record: another boot, or another incarnation. Their identities
// say nothing of their order: a boot whose agent lost its state restarts
// its count (fencing.NewAgent raises the incarnation from the key only
// within a boot), and so does an agent restarted within a boot with its
// durable state lost while its key held a value not its own (reviewer
// X68); only one process seals in seq order for certain. So it is
// neither trusted nor taken for a replay: an unverifiable value
// (observeInvalid, not forged). Trusted, a copy of an old process's
// create, put back after a delete over a newer process's withdrawal, was
// "newer", and the withdrawn host was declared while its guests ran
// (reviewers X66, X68: TestX66LostStateOldCreateOverWithdrawal,
// TestX68SameBootLostStateOldCreateOverWithdrawal); taken for a replay
// (forged), a rebooted live host whose key a compromised node deleted
// after each write, its beacons not binding, was declared (reviewer X67,
// TestX67RebootDeleteLoopLiveHostDeclared). A genuine create of a new
// process is trusted with the host's next renewal (a compare-and-set on
// the create's revision); meanwhile its beacons decide, or (not binding)
// it restarts the host's clock as any unverifiable value.
func otherBootCreate(h *hostState, rec *fencing.LeaseRecord) bool {
	if h == nil || !h.deleted || rec.Sig == "" || rec.PrevRev != 0 || bootOrderMutation {
		return false
	}
	last := h.rec
	return last.Host != "" && last.Sig != "" && !sameProcess(*rec, last)
}

// unseenPrevRev reports whether the signed update rec was sealed for a
// revision of h's key above the last one the watch delivered (h.rev)
// although the watch skipped nothing since (skippedRev: the highest
// revision delivered after a gap). A genuine record is a compare-and-set
// on the key's last revision, and every revision of the bucket after
// h.rev was delivered: its prev_rev is h.rev, or a write the watch never
// had — none. Such a record was sealed in an earlier life of the bucket
// (re-created, or rolled back: revisions handed out again) and put back
// once the stream passed its prev_rev; StaleRecord refuses only a
// prev_rev below h.rev. Trusted, an earlier life's renewal ended a
// withdrawal and the withdrawn host was declared, and an earlier life's
// withdrawal kept a dead host undeclared (reviewer X69,
// TestX69EarlierBucketLifeRecordOverWithdrawal,
// TestX69EarlierBucketLifeWithdrawalKeepsDeadHost). It is an unverifiable
// value (not forged): the host's next renewal, sealed for this revision,
// is trusted.
func unseenPrevRev(h *hostState, rec *fencing.LeaseRecord, skippedRev uint64) bool {
	return rec.Sig != "" && rec.PrevRev > h.rev && skippedRev <= h.rev && !unseenPrevMutation
}

// unseenPrevMutation: a record sealed for a revision the watch never had,
// nothing skipped, is trusted as before (reviewer X69's holes back).
// Tests only.
var unseenPrevMutation bool

// sameProcess reports whether a and b were sealed by one agent process
// (one boot, one incarnation): the only records whose identities surely
// order when they were sealed.
func sameProcess(a, b fencing.LeaseRecord) bool {
	return sameProc(a.BootID, a.Incarnation, b.BootID, b.Incarnation)
}

// sameProc is sameProcess on a boot and an incarnation each (a receipt's,
// a coverBound's).
func sameProc(bootA string, incA uint64, bootB string, incB uint64) bool {
	return bootA == bootB && (incA == incB || sameBootMutation)
}

// sameBootMutation: records of one boot are ordered by identity whatever
// their incarnations (reviewer X68's in-boot state loss back). Tests only.
var sameBootMutation bool

// otherBootForgedMutation: otherBootCreate's values are taken for
// replays (forged: they restart no clock; reviewer X67's live host
// declared). Tests only.
var otherBootForgedMutation bool

// bootOrderMutation: a create after a delete is ordered against the last
// trusted record by identity whatever their boots, and the create chain
// too (reviewer X66's hole back). Tests only.
var bootOrderMutation bool

// notNewer reports whether the signed rec was written no later than last
// by its agent: (epoch, incarnation, seq) not above last's.
func notNewer(rec, last fencing.LeaseRecord) bool {
	switch {
	case rec.Epoch != last.Epoch:
		return rec.Epoch < last.Epoch
	case rec.Incarnation != last.Incarnation:
		return rec.Incarnation < last.Incarnation
	}
	return rec.Seq <= last.Seq
}

// declClock is when h's declaration clock last restarted: its last
// observed renewal (or release, or watch start), or an unverifiable value.
func (h *hostState) declClock() time.Time {
	if h.unverifiedAt.After(h.lastSeen) {
		return h.unverifiedAt
	}
	return h.lastSeen
}

// silentUntrusted reports whether host, tracked from an untrusted value
// with no trusted record yet, counts silent for the guard (see
// observeInvalid): signatures required and the host enrolled.
func (t *Tracker) silentUntrusted(host string) bool {
	return t.required && t.enrolled != nil && !t.unenrolled(host) && !untrustedSilentMutation
}

// withdrawalMutation (reviewer X11): a host's beacon naming its
// withdrawal is ignored, as before. Tests only.
var withdrawalMutation bool

// ObserveWithdrawal reports that host's own beacon named its withdrawal
// (an orderly stop: its guests run on, unprotected) written at rev
// (fencing.Beacon.State, signed by the host's key). Unless a trusted
// record of the host at or after rev was seen, the host is never declared
// until a trusted record or a beacon names a later write of its own. A
// compromised node that superseded the withdrawal with garbage before the
// watch delivered it (a burst makes the watch skip at will) kept the
// host's last active record in force and got it declared while its
// guests ran (reviewer X11, TestX11HiddenWithdrawalDeclared). It keeps
// counting for the mass-failure guard as any host (counted): only the
// host itself signs its beacon, so the beacon may only spare the host
// itself — a compromised node's own withdrawal beacon naming another
// host's write, taken as "not silent", ended a hold its peers relied on
// (reviewers X12, X13).
func (t *Tracker) ObserveWithdrawal(now time.Time, host string, rev uint64) []Decision {
	return t.ObserveWithdrawalBy(now, host, rev, "", 0)
}

// ObserveWithdrawalBy is ObserveWithdrawal for a withdrawal written by
// the agent process (boot, inc) (fencing.Beacon.BootID, Incarnation; ""
// and 0 unknown): while it stands, a first record of another boot, or of
// that boot and an earlier incarnation, is not trusted (withdrawnBar,
// reviewers X100, X101).
func (t *Tracker) ObserveWithdrawalBy(now time.Time, host string, rev uint64, boot string, inc uint64) []Decision {
	t.out = t.out[:0]
	h := t.hosts[host]
	if h == nil {
		t.keepEarly(earlyBeacon{kind: earlyWithdrawal, now: now, host: host, rev: rev, boot: boot, inc: inc}) // beaconloss.go
		return t.out
	}
	if boot == "" {
		inc = 0 // a process of no known boot orders nothing
	}
	if b := &h.beacons; !withdrawalMutation && (b.withdrew != rev || b.withdrewBoot != boot || b.withdrewInc != inc) {
		b.withdrew, b.withdrewBoot, b.withdrewInc = rev, boot, inc // whatever its revision (reviewer X96; adjacent)
		b.floorAtWithdrawal(rev, boot)                             // reviewer X100 (vouch.go)
		t.rememberHost(host)                                       // kept across a restart (Memory.Withdrew, reviewer X97)
	}
	// A withdrawal below the trusted record's revision but above the
	// revision that record was sealed for: the record was not written on
	// the key's state then (a genuine one is a compare-and-set on its
	// PrevRev), it landed over the withdrawal — a copy or a withheld
	// record (the receipt check's SealedBefore, from the beacon). Handled
	// after the copy was trusted (the runner takes beacons and watch
	// updates in no order; a flood makes beacons late), the withdrawal
	// did not stand and the withdrawn host was declared (reviewer X104,
	// TestX104LateWithdrawalBeaconAfterCopy): withdrawn, as a rollback's
	// carry is (withdrawnRev above the trusted revision).
	// And for a create (PrevRev 0: no revision to compare) of the
	// withdrawal's own agent process older than the newest write its
	// beacons named (BeaconWrote, the withdrawal's, just before): sealed
	// before the withdrawal, landed after it (SealedBefore's create gap).
	// And for a create of another agent process than the withdrawal's,
	// unless that process's own beacons named a write above the
	// withdrawal (it wrote after it: agent processes of a host follow one
	// another): SealedBefore's other-process create case. A copy of an
	// earlier process's hidden create, trusted before the later process's
	// withdrawal beacon was handled, was not "over" it and the withdrawn
	// host was declared (reviewer X105,
	// TestX105LateWithdrawalBeaconOtherProcessCreateCopy;
	// lateOtherCreateMutation). A genuine comeback's legacy create whose
	// beacons were lost is marked withdrawn until its next trusted
	// renewal ends it.
	create := h.rec.PrevRev == 0 && boot != ""
	over := rev < h.trustedRev && h.rec.Sig != "" && hostWritten(h.rec.State) && !lateWithdrawalMutation &&
		(h.rec.PrevRev != 0 && rev > h.rec.PrevRev ||
			create && sameProc(boot, inc, h.rec.BootID, h.rec.Incarnation) && h.beacons.wrote.newer(idOf(h.rec)) ||
			create && !sameProc(boot, inc, h.rec.BootID, h.rec.Incarnation) && !lateOtherCreateMutation &&
				!h.beacons.namedAbove(rev, h.rec.BootID, h.rec.Incarnation))
	at := rev
	if over {
		at = h.trustedRev + 1
	}
	if withdrawalMutation || rev <= h.trustedRev && !over || rev < h.beacons.maxRev || h.beacons.withdrawnRev >= at {
		return t.out
	}
	h.beacons.withdrawnRev = at
	h.declaring, h.saidDue, h.heldBack = time.Time{}, false, false
	if h.pin != nil && !withdrawalPinMutation {
		// The host withdrew after the pinned record: a pin, written or
		// moved along before this beacon came, would have a restarted
		// controller declare it (reviewer X21: a pin re-stamped after a
		// rollback hid the withdrawal, taken at the next restart).
		h.pin = nil
		t.rememberHost(host)
	}
	t.out = append(t.out, Decision{Op: OpWithdrawn, Host: host, Revision: rev, Record: h.rec,
		Reason: fmt.Sprintf("withdrawn: its own beacon names its withdrawal at revision %d, after its last trusted record (revision %d) — the withdrawn record was not seen (overwritten?): host unprotected, not declared, not recovered", rev, h.trustedRev)})
	return t.out
}

// withdrawalProcessOlderMutation: otherProcessWhileWithdrawn takes a
// record of the withdrawal's own process older than the newest write its
// beacons named (a create: (a) exempts it), as before (reviewer X104).
// Tests only.
var withdrawalProcessOlderMutation bool

// lateOtherCreateMutation: a late withdrawal beacon does not stand over a
// trusted create of another agent process, as before (reviewer X105).
// Tests only.
var lateOtherCreateMutation bool

// lateWithdrawalMutation: a withdrawal beacon below the trusted record's
// revision is ignored even when that record was sealed before it, as
// before (reviewer X104). Tests only.
var lateWithdrawalMutation bool

// withdrawalPinMutation: a withdrawal beacon leaves the host's pin, as
// before (reviewer X21's late-beacon/restart). Tests only.
var withdrawalPinMutation bool

// beaconWithdrawn reports whether h's own beacon named a withdrawal after
// its last trusted record (ObserveWithdrawal).
func (h *hostState) beaconWithdrawn() bool {
	return h.beacons.withdrawnRev > h.trustedRev
}

// adjacentWroteMaxMutation (reviewer X95): adjacency's escape compares
// with maxRev only, as before (adjacentBar). Tests only.
var adjacentWroteMaxMutation bool

// withdrawnBar reports whether rec, a first record of h (NeedsWritten),
// may not be trusted however it was written: h's own beacon named a
// withdrawal that no beacon naming a later revision followed
// (beaconWithdrawn, beaconState.withdrew) and rec is older than the
// newest write its beacons named (wrote). X93's bar held for adjacency
// only, and its header is no better after a rollback that moved the
// stream's revisions down: the revision the copy was sealed for is
// handed out again, a compromised node lines its garbage up at exactly
// that revision (filler writes, reviewer X44's lever) and writes the
// copy by a compare-and-set on it — written fresh by its header — and
// the withdrawn host, its beacons arrived, was declared while its
// guests ran (reviewer X97, TestX97RestartForgetsWithdrawalBeforeAdjacentCopy/cas;
// withdrawnFreshMutation). The price is X94's: an agent that withdrew
// and came back with its durable state lost writes older-looking
// records, not trusted until a beacon of the new boot names a later
// revision.
//
// It holds reviewer X96's case too: a rollback that moves revisions down
// (a restore from a backup older than the key's last delivered message)
// put the host's withdrawal, newer than the record, at a reused revision
// below the record's PrevRev; its beacon named only that low revision, so
// adjacency's escape (adjacentBar) applied, the copy ended the withdrawal
// and the host was declared while its guests ran
// (TestX96DownwardRollbackEscapesAdjacencyBar). A withdrawal beacon
// ObserveWithdrawal ignored (below maxRev: a late beacon of an earlier,
// skipped write named a higher one) counts as well (beaconState.withdrew;
// lateBeacon). X96's fix was first a clause of adjacent; this bar, for
// every first record however written, subsumes it.
func (t *Tracker) withdrawnBar(host string, h *hostState, rec *fencing.LeaseRecord) bool {
	if h == nil && !withdrawnFreshMutation && !earlyBarMutation {
		// Not tracked yet: its withdrawal beacon, if one came, is kept
		// (keepEarly) and replayed only when the call that tracks the
		// host returns (replayHost) — after this first value was judged.
		// A starting controller holding the new boot's withdrawal beacon
		// trusted a listed copy of the old boot's create, and the
		// withdrawn host was declared (reviewer X101,
		// TestX101EarlyWithdrawalReplayedAfterFirstValue). Judged as the
		// replay will leave it: the kept withdrawal stands.
		w, ok := t.earlyWithdrawn[host]
		if !ok {
			return false
		}
		if wrote, ok := t.earlyWrote[host]; ok && wrote.newer(idOf(*rec)) {
			return true
		}
		return w.boot != "" && beforeProcess(rec, w.boot, w.inc)
	}
	if h == nil || withdrawnFreshMutation || !h.beaconWithdrawn() && h.beacons.withdrew == 0 {
		return false
	}
	if h.beacons.wrote.newer(idOf(*rec)) {
		return true
	}
	// Another boot's record (reviewer X100): write identities order no
	// boots — an agent whose durable state was lost restarts at a lower
	// epoch — so a copy of an earlier boot's record, higher by epoch, was
	// not "older" than the new boot's withdrawal and was trusted.
	b := h.beacons.withdrewBoot
	if b != "" && rec.BootID != b && !withdrawnBootMutation {
		return true
	}
	// An earlier agent process of the withdrawal's boot (reviewer X101):
	// an agent whose durable state was lost within the boot (both copies)
	// restarts at a lower epoch too, and its incarnation — never below the
	// wall clock at its start (fencing.Config.IncarnationFloor) — is
	// what orders the boot's processes: a copy of the earlier process's
	// create, higher by epoch, was trusted after the later one withdrew.
	return b != "" && rec.BootID == b && rec.Incarnation < h.beacons.withdrewInc && !withdrawnIncMutation
}

// otherProcessWhileWithdrawn reports whether rec, a signed record of h's
// host observed over a trusted record, is of another agent process than
// the withdrawal its beacon named, while that withdrawal stands (no beacon
// naming a later revision since): another boot, or an earlier
// incarnation of its boot. withdrawnBar held this for first records
// only; over a trusted record — the withdrawal itself, listed by a
// restarted controller — nothing ordered two processes' records: after a
// downward rollback handed the old boot's revision P out again, the
// compromised node lined a delete marker (or garbage) up at P and wrote
// the old boot's anchored create, sealed for P, by a compare-and-set on
// it: not a replay (prev_rev = the marker's), not held back (another
// process), trusted over the withdrawal, and the withdrawn host declared
// (reviewer X101, TestX101TrustedWithdrawalAnchoredCopyOverMarker; no
// durable state lost needed). The price: a comeback of a new boot whose
// first record the watch delivers before its beacon is trusted from its
// next renewal; one whose beacons name revisions below the withdrawal's
// (a downward rollback after it) never ends it — withdrawn, not declared
// (X99's (c), over a trusted record too).
func (t *Tracker) otherProcessWhileWithdrawn(h *hostState, rec *fencing.LeaseRecord) bool {
	if h == nil || h.trustedRev == 0 || t.vouching || otherProcessMutation || rec.Sig == "" || !hostWritten(rec.State) {
		return false
	}
	b := &h.beacons
	if b.withdrew == 0 || b.withdrewBoot == "" {
		return false
	}
	if h.beaconWithdrawn() && rec.PrevRev != 0 && rec.PrevRev < b.withdrew && !sealedBeforeWithdrawalMutation {
		// Sealed for a revision below the withdrawal's: written before
		// it (a compare-and-set lands above the revision it names, and
		// the withdrawal landed at b.withdrew), of whatever process — the
		// withdrawal's own included. The watch skipped the host's
		// records since its trusted one (a burst over the key); a copy
		// of one of them, sealed for h.rev, was neither a replay nor held
		// back (the trusted record another process's) and was trusted
		// above the withdrawal: the withdrawn host declared (reviewer
		// X103, TestX103HiddenWithdrawalProcessFirstRecordCopy; no fault
		// needed). A comeback writes on the withdrawal's revision or
		// later. Only while this tracker's own beacon put the withdrawal
		// after the trusted record (beaconWithdrawn): a comeback a
		// restarted controller listed under the memory's withdrawal,
		// after a downward rollback below it, writes below it and was
		// refused — with its beacons lost the live host was declared
		// (TestX103ListedComebackBelowWithdrawalAfterRollback).
		return true
	}
	if h.beaconWithdrawn() && sameProc(rec.BootID, rec.Incarnation, b.withdrewBoot, b.withdrewInc) &&
		b.wrote.newer(idOf(*rec)) && !withdrawalProcessOlderMutation {
		// The withdrawal's own agent process, older than the newest write
		// its beacons named (the withdrawal's): written before it. (a)
		// exempts a create (PrevRev 0, a comeback over a deleted key): the
		// node deleted the key before the process's renewal, which became
		// a create, hid it and the withdrawal, deleted the key again and
		// re-landed the create's copy — not a replay (newer than the
		// trusted record), not held back, of the withdrawal's process:
		// trusted above the withdrawal and the withdrawn host declared
		// (reviewer X104, TestX104LateWithdrawalBeaconAfterCreateCopy/
		// beaconFirst; no fault needed).
		return true
	}
	if h.beaconWithdrawn() && !otherProcessOlderActiveMutation {
		// The trusted active record is no comeback: this tracker's own
		// withdrawal beacon named a revision after it, it is the record
		// the host wrote BEFORE it withdrew (the watch skipped everything since: a
		// burst over the key). The host's next record after it, written
		// on its revision — the same process's next renewal or a later
		// incarnation's — hidden then, its copy re-landed after the
		// withdrawal is neither a replay (sealed for h.rev) nor held
		// back (the trusted record is active): spared as "the trusted
		// active record's process", it was trusted over the standing
		// withdrawal and the withdrawn host declared (reviewer X103,
		// TestX103HiddenNextRecordCopySparedOverWithdrawal; no fault
		// needed). The spares below are for a comeback written after the
		// withdrawal (a restarted controller's listing under its
		// memory's withdrawal: no beacon of this tracker put that
		// withdrawal after the trusted record).
		return beforeProcess(rec, b.withdrewBoot, b.withdrewInc)
	}
	if h.rec.State == fencing.LeaseActive && h.rec.Sig != "" && sameProcess(*rec, h.rec) && !otherProcessActiveMutation {
		// The process of the trusted active record (a comeback a
		// restarted controller listed before its memory restored the
		// withdrawal): its own renewals, ordered by heldBack and
		// replay. Refused, they were unverifiable values, and with its
		// beacons lost (binding) the live host was declared.
		return false
	}
	if h.rec.State == fencing.LeaseActive && h.rec.Sig != "" && rec.BootID == h.rec.BootID && rec.BootID != "" &&
		rec.BootID != b.withdrewBoot && rec.Incarnation > h.rec.Incarnation && !otherProcessLaterIncMutation {
		// A later agent process of the trusted active record's boot
		// (incarnations order a boot's processes:
		// fencing.Config.IncarnationFloor): that comeback's agent
		// restarted (a crash, systemd's restart). Refused, its renewals
		// were unverifiable values, and with its beacons lost the live
		// host was declared (reviewer X102,
		// TestX102ListedComebackAgentRestartWhileMemoryWithdrawn). What
		// the trusted active record's own process may write, a later
		// process of its boot may: judged by replay as before. Not of
		// the withdrawal's boot: there an earlier incarnation than the
		// withdrawal's stays refused (X101's order of a boot's
		// processes).
		return false
	}
	if h.rec.State == fencing.LeaseActive && h.rec.Sig != "" && rec.PrevRev != 0 && rec.PrevRev >= h.trustedRev &&
		!otherProcessSealedAfterMutation {
		// Sealed for the trusted comeback's revision or a later one:
		// written after that comeback (a compare-and-set lands above the
		// revision it names), so after the withdrawal it was trusted
		// above (the spares apply only then: beaconWithdrawn is false).
		// The comeback rebooted (or restarted on another boot than the
		// spares cover): its next process's renewals, written on the
		// key's current state, were refused as another boot's while the
		// stale withdrawal stood — a withdrawal restored from the memory
		// under a listed comeback, or one handled in the same take as the
		// comeback's first beacon (beacons before withdrawals) — and
		// with its beacons lost the live host was declared (reviewer
		// X106, TestX106ListedComebackRebootWhileMemoryWithdrawn,
		// TestX106OneTakeWithdrawalThenReboots; no attacker).
		return false
	}
	return beforeProcess(rec, b.withdrewBoot, b.withdrewInc)
}

// otherProcessSealedAfterMutation: otherProcessWhileWithdrawn refuses a
// record sealed at or after the trusted comeback's revision when it is of
// another boot, as before (reviewer X106). Tests only.
var otherProcessSealedAfterMutation bool

// beforeProcess reports whether rec is of another agent process than
// (boot, inc), the writer of a standing withdrawal, in the sense the
// withdrawal rules use: another boot (boots are not ordered, reviewer
// X100), or an earlier incarnation of that boot (incarnations order a
// boot's processes, fencing.Config.IncarnationFloor; reviewer X101).
func beforeProcess(rec *fencing.LeaseRecord, boot string, inc uint64) bool {
	return rec.BootID != boot || rec.Incarnation < inc
}

// sealedBeforeWithdrawalMutation: otherProcessWhileWithdrawn takes a
// record sealed for a revision below the standing withdrawal's, as
// before (reviewer X103). Tests only.
var sealedBeforeWithdrawalMutation bool

// otherProcessOlderActiveMutation: otherProcessWhileWithdrawn spares
// the trusted active record's process (and later incarnations of its
// boot) even when that record is older than the withdrawal, as before
// (reviewer X103). Tests only.
var otherProcessOlderActiveMutation bool

// otherProcessLaterIncMutation: otherProcessWhileWithdrawn refuses a
// later incarnation of the trusted active record's boot, as before
// (reviewer X102). Tests only.
var otherProcessLaterIncMutation bool

// otherProcessActiveMutation: otherProcessWhileWithdrawn refuses the
// trusted active record's own process too. Tests only.
var otherProcessActiveMutation bool

// otherProcessMutation: a record of another process than a standing
// withdrawal's is judged over a trusted record as before (reviewer X101).
// Tests only.
var otherProcessMutation bool

// earlyBarMutation: withdrawnBar ignores a kept withdrawal beacon of a
// host not tracked yet, as before (reviewer X101). Tests only.
var earlyBarMutation bool

// withdrawnIncMutation: withdrawnBar does not order the processes of the
// withdrawal's boot by incarnation, as before (reviewer X101). Tests only.
var withdrawnIncMutation bool

// withdrawnBootMutation: withdrawnBar compares write identities only, as
// before (reviewer X100). Tests only.
var withdrawnBootMutation bool

// withdrawnFreshMutation: a first record written fresh is trusted whatever
// withdrawal the host's beacons named, as before (reviewer X97). Tests
// only.
var withdrawnFreshMutation bool

// memoryWithdrewMutation (reviewer X97): the controllers' memory carries
// nothing of a host's withdrawal beacon, as before (Memory.Withdrew).
// Tests only.
var memoryWithdrewMutation bool
