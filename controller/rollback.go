package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing/natslease"
)

// A lease stream that rolls back (restored from a backup, a NATS failure
// losing acknowledged writes) while a controller runs is invisible to its
// watch: nats.go re-creates the watch's ordered consumer at the last
// revision it delivered + 1, so the revisions the rollback hands out
// again are never delivered, and the next new one comes as the successor
// of the last — no skip, no lower revision, no revision-regressed
// (reviewer X21, measured on nats-server: TestX21WatchAcrossRollbackNATS).
// Meanwhile a host's withdrawal written at a reused revision is never
// seen, a compromised node's garbage written after it moves the host's
// pin along with the stale record, and the withdrawal's beacon, naming a
// revision below the record the controller trusts, is dropped: the
// withdrawn host (guests running) was declared, by this controller or by
// the next one taking the pin (TestX21PinLaunderedByRollbackWhileRunning,
// TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon).
//
// So the runner checks that the stream still holds what its watch
// delivered, at every reconnect of its connection and every
// RollbackCheckInterval: the stream's last revision is not below the last
// one delivered, and each of the last RollbackSamples values delivered is
// either still stored with the stamp it was delivered with or superseded
// (gone, and its key holds a later value). A stored message never changes, so either check failing is
// proof of a rollback (or a re-created stream); nothing an agent can write
// fails it. On failure the tracker drops every pin
// (Tracker.StreamRolledBack), the memories are written and Run returns
// ErrLeaseStreamRolledBack: the daemon runs it again with a fresh tracker,
// which lists the stream as it now is (as a restarted controller would).

// ErrLeaseStreamRolledBack: the lease stream no longer holds what the
// watch delivered (see above).
var ErrLeaseStreamRolledBack = errors.New("the lease stream rolled back")

// RollbackCheckInterval is how often the runner checks the lease stream
// for a rollback besides each reconnect: a rollback without a reconnect
// (a clustered stream's new leader lacking acknowledged writes) is found
// within it. 2 s: one stream info and RollbackSamples message gets, off
// the decision loop; a rolled-back stream is found long before a host
// silent since it is due (lease_ttl + grace: 22 s by default).
const RollbackCheckInterval = 2 * time.Second

// RollbackSamples is how many of the last delivered values each check
// reads back. A compromised node can supersede the reused revisions it
// wrote itself, not the genuine renewals that land among them: with 8,
// a rollback that refilled the stream past the last delivered revision is
// still found unless all 8 reused revisions were superseded before the
// check — the residual (docs/security.md, What is left).
const RollbackSamples = 8

// rollbackCheckMutation: the runner never checks (reviewer X21's holes
// reopen). Tests only.
var rollbackCheckMutation bool

// delivered is a value the watch delivered: its host, revision and
// stored time.
type delivered struct {
	host   string
	rev    uint64
	stored time.Time
}

// deliveredRing keeps the last RollbackSamples values delivered and the
// highest revision delivered.
type deliveredRing struct {
	last  []delivered
	next  int
	maxRv uint64
}

func (d *deliveredRing) add(host string, rev uint64, stored time.Time) {
	d.maxRv = max(d.maxRv, rev)
	if stored.IsZero() {
		return
	}
	if len(d.last) < RollbackSamples {
		d.last = append(d.last, delivered{host, rev, stored})
		return
	}
	d.last[d.next%RollbackSamples] = delivered{host, rev, stored}
	d.next++
}

func (d *deliveredRing) snapshot() ([]delivered, uint64) {
	return append([]delivered(nil), d.last...), d.maxRv
}

// rollbackCheck is a check's outcome: err (see checkRollback) and the
// server's clock as its stream info said (ts, zero if not said), read
// between sent and got of the runner's clock (Tracker.ServerTime).
type rollbackCheck struct {
	err           error
	sent, got, ts time.Time
	// read: the stream info was read; last: the stream's last revision
	// then.
	read bool
	last uint64
}

// checkRollback reads the lease stream's last revision and the samples
// back (see above). Its err wraps ErrLeaseStreamRolledBack on proof of a
// rollback, another error when it could not check.
func (r *Runner) checkRollback(ctx context.Context, samples []delivered, last uint64) (c rollbackCheck) {
	c.sent = r.now()
	ls, ts, err := natslease.LastRevisionAt(ctx, r.Store.NC)
	c.got = r.now()
	if err != nil {
		c.err = fmt.Errorf("rollback check: %w", err)
		return c
	}
	c.read, c.ts, c.last = true, ts, ls
	c.err = r.rollbackProof(ctx, samples, ls, last)
	return c
}

// rollbackProof checks the stream's last revision ls and the samples.
func (r *Runner) rollbackProof(ctx context.Context, samples []delivered, ls, last uint64) error {
	nc := r.Store.NC
	if ls < last {
		return fmt.Errorf("%w: its last revision is %d, below revision %d this controller's watch delivered", ErrLeaseStreamRolledBack, ls, last)
	}
	for _, d := range samples {
		at, err := natslease.StoredAt(ctx, nc, d.rev)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Superseded by a later value of its key — or lost, its
			// revision reused and superseded since: then the key holds
			// no value above it (reviewer X22: gone alone proved nothing).
			lr, err := r.Store.ReadLeader(ctx, nc, d.host)
			if err != nil {
				return fmt.Errorf("rollback check: revision %d: %w", d.rev, err)
			}
			if lr.Revision <= d.rev {
				return fmt.Errorf("%w: revision %d of %s, delivered, is gone, and the key's last value is at revision %d", ErrLeaseStreamRolledBack, d.rev, d.host, lr.Revision)
			}
		case err != nil:
			return fmt.Errorf("rollback check: revision %d: %w", d.rev, err)
		case !at.Equal(d.stored):
			return fmt.Errorf("%w: revision %d, delivered as stored at %s, now holds a message stored at %s", ErrLeaseStreamRolledBack,
				d.rev, d.stored.UTC().Format(time.RFC3339Nano), at.UTC().Format(time.RFC3339Nano))
		}
	}
	return nil
}

// rollbackCarry is what a Run stopped by a rolled-back stream hands to
// the next Run (Runner.rolledBack): the hosts its tracker knew withdrawn
// (Tracker.Withdrawals) and the last revision its watch delivered. The
// rollback may have lost a withdrawal: the key then holds the host's
// older active record, written fresh, and a fresh tracker trusting it
// declared the stopped host while its guests ran (reviewer X22,
// TestX22FreshTrackerForgetsWithdrawalLostInRollback). The fresh tracker
// keeps them withdrawn until they write past that revision
// (Tracker.KeepWithdrawn), and takes no pin from the memory (a pin
// dropped by the last Run may not have reached the bucket: reviewer X22,
// TestX22RollbackFoundButDroppedPinsNotWritten); those are rewritten
// without their pins. The carry lives as long as the Runner: a process
// restart loses it (docs/security.md).
type rollbackCarry struct {
	withdrawn []CarriedHost
	// counted: the hosts the stopped tracker counted silent
	// (Tracker.CountedSilent): the fresh one keeps counting them
	// (Tracker.KeepCounted) — a rollback that put a host's old withdrawn
	// record back ended a hold (reviewer X25).
	counted []CarriedHost
	// bars: every host the stopped tracker knew a signed record or a
	// beacon's identity of (Tracker.Bars): the fresh one refuses older
	// copies of the host's records (Tracker.KeepBar) — not only of the
	// hosts carried above (reviewer X46).
	bars []CarriedHost
	rev  uint64
	// applied: handed to the fresh tracker at its first listing's end
	// (applyTo), not again at a re-watch's.
	applied bool
}

// applyTo hands c to t at the end of t's first listing (Runner.Run at
// Update.Listed), once: a re-watch's listing re-applied it, put hosts
// back since (newer records this tracker trusted) to their old withdrawn
// records, they left the guard's count, the hold over a cut-off rack
// ended and a Held host was declared (reviewer X40,
// TestX40RewatchReappliesStaleWithdrawalCarry). It returns the decisions
// to perform. Nil-safe.
func (c *rollbackCarry) applyTo(t *Tracker) []Decision {
	if c == nil || c.applied && !carryOnceMutation {
		return nil
	}
	c.applied = true
	var out []Decision
	for _, w := range c.withdrawn {
		out = append(out, t.KeepWithdrawn(w, c.rev)...)
	}
	for _, h := range c.counted {
		t.KeepCounted(h)
	}
	if !barsMutation {
		for _, h := range c.bars {
			out = append(out, t.KeepBar(h)...)
		}
	}
	return out
}

// barsMutation: only the hosts carried as withdrawn or counted get a
// rollback bar, as before (reviewer X46). Tests only.
var barsMutation bool

// carryOnceMutation: the carry is applied at every listing, as before
// (reviewer X40). Tests only.
var carryOnceMutation bool

// carryOn is what a Run stopped by a rolled-back stream hands on: what
// its tracker t knows (Withdrawals, CountedSilent at now), the last
// revision its watch delivered (maxRv) — and, when the previous Run's
// carry prev was not applied yet (this rollback found during the fresh
// tracker's listing), prev's hosts too, and the higher revision: the
// half-listed tracker knew nothing of them, and a withdrawn host was
// declared after the second rollback (reviewer X40,
// TestX40RollbackDuringCarriedListingDropsCarry). The revision never goes
// down (AfterRollback: pins trusted below it are not taken).
func carryOn(prev *rollbackCarry, t *Tracker, now time.Time, maxRv uint64) *rollbackCarry {
	c := &rollbackCarry{withdrawn: t.Withdrawals(), counted: t.CountedSilent(now), bars: t.Bars(), rev: maxRv}
	if prev == nil || carryUnionMutation {
		return c
	}
	c.rev = max(c.rev, prev.rev)
	if !prev.applied {
		c.withdrawn = mergeCarried(c.withdrawn, prev.withdrawn)
		c.counted = mergeCarried(c.counted, prev.counted)
		c.bars = mergeCarried(c.bars, prev.bars)
	}
	return c
}

// carryUnionMutation: a rollback found during the fresh tracker's
// listing replaces the unapplied carry, as before (reviewer X40). Tests
// only.
var carryUnionMutation bool

// mergeWroteMutation: mergeCarried keeps the newer record's entry whole,
// as before (reviewer X45). Tests only.
var mergeWroteMutation bool

// mergeCarried: a's hosts and b's, one entry a host — the newer record
// (a signed one over an unsigned or empty one).
func mergeCarried(a, b []CarriedHost) []CarriedHost {
	out := slices.Clone(a)
	for _, x := range b {
		i := slices.IndexFunc(out, func(y CarriedHost) bool { return y.Host == x.Host })
		switch {
		case i < 0:
			out = append(out, x)
		case out[i].Record.Sig == "" && x.Record.Sig != "" || x.Record.Sig != "" && !notNewer(x.Record, out[i].Record):
			out[i], x = x, out[i]
			fallthrough
		default:
			// Whichever record is kept, the newest write either says
			// the host made stays the bar: the entry with the newer
			// record kept whole lowered it to that record, and copies
			// of the renewals between ended a Held rack's count carries
			// (reviewer X45, TestX45MergeDropsWrote).
			if mergeWroteMutation {
				break
			}
			w := x.Wrote
			if x.Record.Sig != "" && idOf(x.Record).newer(w) {
				w = idOf(x.Record)
			}
			if w.newer(out[i].Wrote) {
				out[i].Wrote = w
			}
		}
	}
	return out
}
