package fencing

import (
	"fmt"
	"time"
)

// A deleted or purged lease key (docs/fencing.md, "Key deleted").
//
// An operator can delete or purge a host's key. NATS then keeps a marker at
// its own revision: a CAS on the agent's last revision fails, and the
// conflict shows no record (RenewConflict with Current nil, or a relay's
// PeerAnswer.KeyAbsent). The agent writes its next record by create (the
// shell's Create accepts the marker), so it is not locked out. What it
// writes depends on what the delete may have erased:
//
//   - Safe: the lease is held (not lapsed, not declared) and the agent is
//     not fencing or fenced. The controller declares nothing before the
//     lease lapses, so the delete erased no declaration: the agent re-creates
//     its active record and carries on (transition LeaseKeyDeletedRecreated,
//     logged at WARN).
//   - Unsafe: fencing, fenced, rejoining, awaiting release, declared, or the
//     lease lapsed. The delete may have erased a declaration (whose instances
//     may already be rebuilt elsewhere), so the absence of a record is no
//     evidence that the host may resume. The agent fences (if not fenced),
//     treats itself as declared and, once the fence is complete (never while a
//     domain may run), re-creates the key as an `expired` record of the
//     next epoch (SelfDeclaredAfterKeyDeleted), by create;
//     only the explicit release of that declaration (the controller, or
//     `hvguard-agent --unfence`) lets it take the lease again, and then it
//     resumes nothing (the ordinary release path).

// keyDeleted handles a conflict that showed no record in the key (rev 0),
// or a record this agent does not trust at rev (an invalid record: the
// same reasoning applies — it may have been written over a declaration,
// and it is no evidence of anything).
func (a *Agent) keyDeleted(now time.Time, rev uint64) {
	// Seen again before our create landed (the create was rejected too):
	// no second transition, the renewals go on at their pace.
	repeat := a.rev == rev && a.landedSeq > 0
	a.rev = rev // the next write creates the key over the marker (0), or CAS on the invalid record
	if a.selfDecl {
		a.declRev = rev
		return
	}
	if a.keyDeleteSafe(now) || Mutations.KeyDeleteAlwaysRecreates {
		if !repeat {
			a.nextRenew = now
			a.transition(now, a.state, a.state, ReasonLeaseKeyDeletedRecreated,
				fmt.Sprintf("lease held for %s more, not fenced: re-creating the key", a.LeaseExpiry().Sub(now).Round(time.Millisecond)))
		}
		return
	}
	a.nextRenew = now
	detail := fmt.Sprintf("lease key deleted while %s (lease held: %t, declared: %t): a declaration may have been erased; "+
		"re-declaring the host expired, it stays fenced until released (hvguard-agent --unfence)", a.state, a.LeaseHeld(now), a.declared)
	if !a.declared {
		a.epoch++
	}
	a.declared, a.released, a.lease = true, false, false
	a.selfDecl, a.declRev = true, rev
	a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonLeaseKeyDeletedWhileFenced, Detail: detail})
	switch a.state {
	case StateFenced, StateRejoining:
		a.setState(now, StateAwaitingRelease, ReasonLeaseKeyDeletedWhileFenced, detail)
	case StateFencing, StateAwaitingRelease:
		a.persist()
	default:
		a.startFence(now, ReasonLeaseKeyDeletedWhileFenced)
	}
}

// keyDeleteSafe: nothing the delete can have erased matters (see above).
func (a *Agent) keyDeleteSafe(now time.Time) bool {
	switch a.state {
	case StateStarting, StateHealthy, StateSuspect, StateAskingPeers, StateHeld:
		return a.LeaseHeld(now)
	}
	return false
}

// selfDeclaration returns the renewal request that re-creates the key as
// an expired record of our (declared) epoch.
func (a *Agent) selfDeclaration(now time.Time) RenewRequest {
	a.seq++
	if a.selfDeclSeqs == nil {
		a.selfDeclSeqs = map[uint64]bool{}
	}
	a.selfDeclSeqs[a.seq] = true
	rec := a.record(a.seq)
	rec.State = LeaseExpired
	rec.Reason = "declared by the agent itself: its lease key was deleted while it was fenced or its lease had lapsed"
	return RenewRequest{Seq: a.seq, Revision: a.declRev, Record: rec}
}

// selfDeclResult handles the outcome of a self-declaration write.
func (a *Agent) selfDeclResult(now time.Time, seq uint64, res RenewResult) {
	delete(a.selfDeclSeqs, seq)
	if !a.selfDecl {
		return
	}
	switch res.Outcome {
	case RenewAcked:
		// Never adopt its revision: no renewal may overwrite it.
		a.selfDecl = false
		clear(a.selfDeclSeqs)
		a.transition(now, a.state, a.state, ReasonSelfDeclaredAfterKeyDeleted, fmt.Sprintf("epoch %d, revision %d", a.epoch, res.Revision))
		a.persist()
	case RenewConflict:
		switch cur := res.Current; {
		case cur == nil && res.Invalid == "" && !Mutations.SelfDeclOnNamedMarker:
			// The key holds no record: the next self-declaration is on
			// revision 0, which the store anchors on the marker it reads
			// as it writes (own writes stay on 0). A conflict names the
			// marker now (natslease.Store, for relayed creates): a CAS on
			// it at the next retry lost to any delete in between, so a
			// delete loop slower than the store's read-then-write kept the
			// self-declaration from ever landing (reviewer X92,
			// TestX92SelfDeclarationStaysOnZero).
			a.declRev = 0
		case cur == nil || a.untrusted(res) != "":
			a.declRev = res.Revision
		case cur.State == LeaseActive:
			if res.Revision != a.declRev {
				a.declRev = res.Revision // a record appeared (a late write): replace it
				a.nextRenew = now
			}
		default:
			// A declaration or release is there: the ordinary path.
			a.selfDecl = false
			clear(a.selfDeclSeqs)
			a.conflict(now, seq, res)
		}
	}
}

// untrusted returns why the record a conflict showed is not trusted, or ""
// (Current nil without Invalid is a deleted key, not an untrusted record).
// Beyond what the shell's Keyring found (res.Invalid): a record of another
// host in our key, a replay (fencing.StaleRecord: a signed record naming a
// revision older than one we know was in the key), and a withdrawal of an
// epoch older than ours. None of them can be current, and all of them left
// the agent unable to renew before (it never adopted their revision).
func (a *Agent) untrusted(res RenewResult) string {
	cur := res.Current
	if Mutations.UntrustedRecordsTrusted {
		return ""
	}
	switch {
	case res.Invalid != "":
		return res.Invalid
	case cur == nil:
		return ""
	case cur.Host != a.cfg.Host:
		return fmt.Sprintf("record of host %q in the key of %q", cur.Host, a.cfg.Host)
	case StaleRecord(*cur, res.Revision, a.rev):
		return fmt.Sprintf("replayed %s record (written on revision %d, found at %d after revision %d)", cur.State, cur.PrevRev, res.Revision, a.rev)
	case cur.State == LeaseWithdrawn && cur.Epoch < a.epoch && cur.Sig != "":
		return fmt.Sprintf("withdrawn record of epoch %d < %d", cur.Epoch, a.epoch)
	}
	return ""
}

// invalidRecord: a conflict showed an untrusted record (why): say so loudly
// (once per revision) and handle it like a deleted key at its revision.
func (a *Agent) invalidRecord(now time.Time, res RenewResult, why string) {
	if res.Revision != a.invalidRev {
		a.invalidRev = res.Revision
		a.r.Alerts = append(a.r.Alerts, Alert{Reason: ReasonInvalidLeaseRecord,
			Detail: fmt.Sprintf("revision %d of this host's lease key ignored: %s", res.Revision, why)})
	}
	a.renewFailed(now, ReasonRenewFailed)
	a.keyDeleted(now, res.Revision)
}
