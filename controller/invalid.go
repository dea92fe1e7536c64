package controller

import (
	"fmt"
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
//     key not provisioned here, an old agent), restarts the host's
//     declaration clock as a renewal would — a host whose agent keeps
//     renewing with such records is never declared (alerted at every
//     value); it does not end its silence for the guard (a forged value
//     must not lower the count a Held peer relies on);
//     — in `optional` or `off` mode, or before the host's first trusted
//     signed record in `required` mode only;
//   - for a value that cannot be genuine (fencing.ErrForgedRecord: signed
//     by another known key, or a replay; with signatures required, any
//     untrusted value once the host has a trusted record signed by its
//     known key: Tracker.pinned) restarts nothing, unless the watch
//     skipped a revision since the host's last one (Skipped): a genuine
//     renewal may then have been overwritten before it was delivered, and
//     the clock restarts as if it had been observed.

// Skipped tells the tracker the watch delivered rev although some revision
// before it was never delivered (superseded before the watch reached it,
// or the watch's first listing).
func (t *Tracker) Skipped(rev uint64) {
	t.skippedRev = max(t.skippedRev, rev)
}

// ObserveInvalid reports an untrusted value of host's key at rev (why:
// the reason; forged: fencing.ErrForgedRecord).
func (t *Tracker) ObserveInvalid(now time.Time, host string, rev uint64, why string, forged bool) []Decision {
	t.out = t.out[:0]
	t.observeInvalid(now, host, rev, why, forged)
	return t.out
}

func (t *Tracker) observeInvalid(now time.Time, host string, rev uint64, why string, forged bool) {
	h := t.hosts[host]
	switch {
	case h != nil && rev <= h.rev:
		return // stale delivery
	case h == nil:
		// No trusted record yet: tracked (never declared: no constants),
		// and said loudly.
		h = &hostState{lastSeen: now}
		t.hosts[host] = h
	}
	hidden := t.skippedRev > h.rev
	// An unverifiable value (unsigned, unknown signer, undecodable) may be
	// the live host's genuine renewal even after a trusted record was seen
	// (an agent rolled back to a release that does not sign, a host key
	// changed before this controller re-read host_keys_file): it restarts
	// the declaration clock. Counting it as forged declared a running host
	// (TestLiveHostRenewingUnverifiablyIsNotDeclared, reviewer X3); the
	// price is that a node writing such values keeps a dead host
	// undeclared, loudly (docs/security.md, "What is left").
	h.rev = rev
	h.untrusted, h.untrustedWhy = now, why
	restart := !forged || hidden
	if restart {
		h.unverifiedAt = now
	}
	kind := "forged"
	if !forged {
		kind = "unverifiable"
	}
	detail := "declaration clock kept"
	if restart {
		detail = "counted as a renewal for its declaration (never declared while such values keep coming)"
	}
	if h.rec.State == "" {
		detail = "no trusted record yet: never declared"
	}
	t.out = append(t.out, Decision{Op: OpInvalid, Host: host, Revision: rev, Record: h.rec,
		Reason: fmt.Sprintf("invalid-record: %s value at revision %d ignored (%s); %s", kind, rev, why, detail)})
}

// replay reports whether rec, observed at rev, is a replay of an earlier
// record of h (fencing.StaleRecord against the last revision observed).
func replay(h *hostState, rev uint64, rec *fencing.LeaseRecord) bool {
	return h != nil && !h.deleted && fencing.StaleRecord(*rec, rev, h.rev)
}

// declClock is when h's declaration clock last restarted: its last
// observed renewal (or release, or watch start), or an unverifiable value.
func (h *hostState) declClock() time.Time {
	if h.unverifiedAt.After(h.lastSeen) {
		return h.unverifiedAt
	}
	return h.lastSeen
}
