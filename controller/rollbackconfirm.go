package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/proto"
)

// An operator's confirmation that a host the rollback gate keeps
// undeclared (rollbackgate.go) may be declared: written by
// `hvguard-controller confirm-rollback HOST` to the control bucket
// (ControlBucket, the controllers' own account: no agent can write it) as
// ConfirmKeyPrefix+HOST. It names the rollback marker that stood when the
// operator confirmed (RollbackMarker.ID): a running controller takes it
// only while that marker stands — one left from an earlier rollback, or
// brought back by a restore of the control bucket, names another marker
// and confirms nothing (reviewer X50).
const ConfirmKeyPrefix = "_confirm."

// Confirmation polling. ConfirmPollInterval: how often the runner reads
// the rollback marker and the confirmations of the hosts the gate holds
// (only while the gate is on and a host is gated and due, or the marker
// was not read yet): an operator's command takes effect within it.
// ConfirmPollBatch bounds the reads of one poll (a rack gated at once is
// read in turns), ConfirmReadTimeout the whole poll: it runs off the
// tracker's loop.
const (
	ConfirmPollInterval = 2 * time.Second
	ConfirmPollBatch    = 32
	ConfirmReadTimeout  = 2 * time.Second
)

// ConfirmMaxAge and ConfirmClockSkew: a confirmation is taken only if the
// NATS server stored it, and the command says it wrote it, at most
// ConfirmMaxAge before the controller's wall clock (and at most
// ConfirmClockSkew after it). ConfirmClockSkew also moves
// its stamp earlier (confirmStamp): a server clock behind the
// controller's, or the poll's own delay, would make it look written later
// than it was, and signs of life in between would not spend it. 10 s: NTP keeps clocks within
// milliseconds; the price is that signs of life up to 10 s before the
// command spend it — confirm a host that has been silent longer. A restore of the control bucket
// brings back whatever it held — an earlier incident's marker with its
// confirmations, which name it — and a months-old "h3 is down" must not
// declare h3 now (reviewer X50). 10 minutes: a running controller takes a
// confirmation within ConfirmPollInterval, and keeps it until the host
// shows signs of life; an operator who confirms ahead of time, or a
// controller restarted later, needs the command run again (the price, c).
// The command's machine and the controllers keep NTP time (as the
// controllers and the NATS servers must: docs/security.md).
const (
	ConfirmMaxAge    = 10 * time.Minute
	ConfirmClockSkew = 10 * time.Second
)

// MarkerRecheckInterval: how often a controller with no gated host reads
// the rollback marker again. A controller that read "no marker" once
// never looked again, and one started after a restore but before the
// detecting controller wrote it — or before an operator ran mark-rollback
// because that write failed — judged hosts without the gate for good
// (reviewer X51). 10 s: one message get; a host falls due no sooner than
// lease_ttl + grace after the rollback's outage, and the rollback check
// finds it within RollbackCheckInterval.
const MarkerRecheckInterval = 10 * time.Second

// RollbackConfirmation is the value of ConfirmKeyPrefix+Host.
type RollbackConfirmation struct {
	Host string `json:"host"`
	// Marker is the ID of the rollback marker it confirms against.
	Marker string    `json:"marker"`
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// ConfirmKey is host's confirmation key in the control bucket: the
// prefix and its host token (proto.HostToken, as its lease key).
func ConfirmKey(host string) (string, error) {
	t, err := proto.HostToken(host)
	if err != nil {
		return "", err
	}
	return ConfirmKeyPrefix + t, nil
}

// ErrNoRollbackMarker: confirm-rollback found no rollback marker — no
// controller found a rollback (or an operator cleared it): nothing to
// confirm.
var ErrNoRollbackMarker = errors.New("no rollback marker in the control bucket: no controller is gated by a rollback (if one found a rollback and could not write the marker, its log says so: write it with hvguard-controller mark-rollback, then confirm)")

// WriteRollbackConfirmation writes c to the control bucket kv (the
// command's side), naming the rollback marker that stands, and returns
// the revision it landed at.
func WriteRollbackConfirmation(ctx context.Context, kv jetstream.KeyValue, c RollbackConfirmation) (uint64, error) {
	k, err := ConfirmKey(c.Host)
	if err != nil {
		return 0, err
	}
	m, _, err := ReadRollbackMarker(ctx, kv)
	if err != nil {
		return 0, err
	}
	c.Marker = m.ID
	b, err := json.Marshal(c)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, k, b)
	if err != nil {
		return 0, fmt.Errorf("write %s to the control bucket %s: %w", k, ControlBucket, err)
	}
	return rev, nil
}

// RollbackMarkerKey is the controllers' rollback marker in the control
// bucket: written by the controller that finds the lease stream rolled
// back (Runner.Run) — or by hand, hvguard-controller mark-rollback, after
// a restore made while no controller ran —, it makes every controller
// that (re)starts while it stands run its tracker behind the rollback
// gate: a controller restarted by hand after a rollback had none, and
// judged hosts by whatever the rolled-back stream listed. Only an
// operator deletes it (hvguard-controller mark-rollback --clear), once
// the fleet's host keys are rotated: copies of records from before the
// rollback then fail their signature, which is what the gate stands in
// for.
const RollbackMarkerKey = "_rollback"

// RollbackMarker is the value of RollbackMarkerKey. ID is random: what
// confirmations name.
type RollbackMarker struct {
	ID     string    `json:"id"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// WriteRollbackMarker writes m with a fresh ID and returns its revision.
func WriteRollbackMarker(ctx context.Context, kv jetstream.KeyValue, m RollbackMarker) (uint64, error) {
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		return 0, err
	}
	m.ID = hex.EncodeToString(id[:])
	b, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, RollbackMarkerKey, b)
	if err != nil {
		return 0, fmt.Errorf("write %s to the control bucket %s: %w", RollbackMarkerKey, ControlBucket, err)
	}
	return rev, nil
}

// ReadRollbackMarker reads the marker: ErrNoRollbackMarker when there is
// none; an unreadable one is an error too (the gate stays on).
func ReadRollbackMarker(ctx context.Context, kv jetstream.KeyValue) (RollbackMarker, uint64, error) {
	e, err := kv.Get(ctx, RollbackMarkerKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return RollbackMarker{}, 0, ErrNoRollbackMarker
	}
	if err != nil {
		return RollbackMarker{}, 0, fmt.Errorf("read %s in the control bucket %s: %w", RollbackMarkerKey, ControlBucket, err)
	}
	var m RollbackMarker
	if err := json.Unmarshal(e.Value(), &m); err != nil || m.ID == "" {
		return RollbackMarker{}, e.Revision(), fmt.Errorf("the rollback marker at revision %d is unreadable or has no id (%v)", e.Revision(), err)
	}
	return m, e.Revision(), nil
}

// confirmPoll is the runner's reading of the rollback marker and the
// operators' confirmations (one poll at a time, off the loop: the fields
// are the polling goroutine's).
type confirmPoll struct {
	next    int
	ignored map[string]uint64 // host: the confirmation's revision said
}

// taken is one confirmation a poll found: host, the marker it names, its
// revision, and how long before the poll's wall clock it was written (0
// if its clock is ahead).
type taken struct {
	host, marker string
	rev          uint64
	age          time.Duration
}

// pollResult is what one poll found.
type pollResult struct {
	confirmed []taken
	// known: the marker was read now: marker says whether it stands
	// (why: its description).
	known, marker bool
	why           string
}

// poll reads the marker, then — while it stands — the confirmations of
// gated (at most ConfirmPollBatch, in turns) that name it and were
// written within ConfirmMaxAge of wall (the wall clock now).
func (p *confirmPoll) poll(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger, gated []string, wall time.Time) (res pollResult) {
	ctx, cancel := context.WithTimeout(ctx, ConfirmReadTimeout)
	defer cancel()
	m, rev, err := ReadRollbackMarker(ctx, kv)
	switch {
	case errors.Is(err, ErrNoRollbackMarker):
		res.known = true
		return res
	case err != nil:
		log.Warn("rollback gate: reading the control bucket's rollback marker failed; retried (declaring no host this controller cannot prove meanwhile)", "err", err)
		return res
	}
	res.known, res.marker = true, true
	server := serverClock(ctx, kv) // the confirmations' ages in the server's clock
	res.why = fmt.Sprintf("the lease stream rolled back (the controllers' rollback marker %s, revision %d: %s, at %s: %s)", m.ID, rev, m.By, m.At.UTC().Format(time.RFC3339), m.Reason)
	n := min(len(gated), ConfirmPollBatch)
	for i := range n {
		host := gated[(p.next+i)%len(gated)]
		k, err := ConfirmKey(host)
		if err != nil {
			continue // tracked hosts have valid names
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			log.Warn("rollback gate: reading an operator's confirmation failed; retried", "host", host, "err", err)
			break
		}
		var c RollbackConfirmation
		switch err := json.Unmarshal(e.Value(), &c); {
		case err != nil || c.Host != host || c.Marker != m.ID || !confirmFresh(server, wall, e.Created(), c.At):
			if p.ignored[host] != e.Revision() {
				if p.ignored == nil {
					p.ignored = map[string]uint64{}
				}
				p.ignored[host] = e.Revision()
				log.Warn("rollback gate: a confirmation that names another host or another rollback marker (an earlier rollback's, or restored with the control bucket), or written more than 10 minutes ago (or in the future: clocks), is ignored — run hvguard-controller confirm-rollback again", "host", host, "revision", e.Revision(), "names", c.Host, "marker", c.Marker, "standing_marker", m.ID, "written_at", c.At, "err", err)
			}
		default:
			// Its age: the older of the NATS server's stored time and
			// the command's clock — a command running 50 s fast made it
			// look written at the take (reviewer X53); a restore keeps
			// the stored time of what it brings back, the command's says
			// when it was written (X50).
			res.confirmed = append(res.confirmed, taken{host, m.ID, e.Revision(), confirmAge(server, wall, e.Created(), c.At)})
			log.Warn("rollback gate: an operator confirmed the host may be declared", "host", host, "by", c.By, "reason", c.Reason, "at", c.At, "revision", e.Revision())
		}
	}
	if len(gated) > 0 {
		p.next = (p.next + n) % len(gated)
	}
	return res
}

// serverClock is the NATS server's clock as the control bucket's stream
// info says (zero if it does not: a server before 2.10, or the read
// failed — the poll then judges ages by the controller's wall clock).
func serverClock(ctx context.Context, kv jetstream.KeyValue) time.Time {
	st, err := kv.Status(ctx)
	if err != nil {
		return time.Time{}
	}
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok && s.StreamInfo() != nil {
		return s.StreamInfo().TimeStamp
	}
	return time.Time{}
}

// markRollback writes the controllers' rollback marker (any controller
// that finds the rollback: a standby's tracker is gated too, and any
// controller started while it stands). A failed write leaves the gate to
// this process (logged).
func (r *Runner) markRollback(ctx context.Context, log *slog.Logger, found error) {
	kv := r.Store.Control
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, ConfirmReadTimeout)
	defer cancel()
	by := "a controller"
	if r.Signature != nil {
		by = r.Signature()
	}
	rev, err := WriteRollbackMarker(ctx, kv, RollbackMarker{By: by, At: r.now(), Reason: found.Error()})
	if err != nil {
		log.Error("writing the rollback marker failed: a controller restarted now declares hosts the rollback gate would hold, and no operator can confirm a gated host until it is written (hvguard-controller mark-rollback)", "err", err)
		return
	}
	log.Warn("rollback marker written: every controller declares only hosts whose beacon proves their record, or that an operator confirms, until an operator clears it (hvguard-controller mark-rollback --clear, after rotating the host keys)", "revision", rev)
}

// confirmCommandClockMutation: a confirmation's age by the command's
// clock (RollbackConfirmation.At), as before (reviewer X53). Tests only.
var confirmCommandClockMutation bool

// confirmStamp is when the operator wrote c, at the earliest, in the
// tracker's clock (now: when the poll that found it started): its age by the wall
// clocks, and ConfirmClockSkew earlier — signs of life since then spend
// it (confirmation.spent, reviewer X52).
func confirmStamp(now time.Time, c taken) time.Time {
	if confirmTakenMutation {
		return now
	}
	return now.Add(-c.age - ConfirmClockSkew)
}

// fresh: at (a confirmation's time) is within ConfirmMaxAge before wall
// and at most ConfirmClockSkew after it.
func fresh(wall, at time.Time) bool {
	return !at.Before(wall.Add(-ConfirmMaxAge)) && !at.After(wall.Add(ConfirmClockSkew))
}

// confirmFresh: a confirmation the NATS server stored at created, which
// says it was written at at, is taken when the server's clock reads
// server (its stream info's, at the poll; zero: unknown — wall then) and
// the controller's wall clock wall: created fresh by the server's clock,
// at by the controller's. A command's clock more than ConfirmClockSkew
// ahead is refused (logged): its age would be wrong.
func confirmFresh(server, wall, created, at time.Time) bool {
	return fresh(serverOr(server, wall), created) && (fresh(wall, at) || confirmCommandClockMutation)
}

// confirmAge is a confirmation's age at the poll (0 if ahead): the older
// of its age by the server's clock (server − created: one clock, whatever
// the controller's reads) and by the command's (wall − at). By the
// controller's wall clock alone, a controller 20 s behind the server's
// took a confirmation as written 20 s later than it was: one written
// before its start, which the host's signs of life had spent (reviewer
// X56, TestX56ControllerBehindTakesConfirmationBeforeListing;
// serverAgeMutation).
func confirmAge(server, wall, created, at time.Time) time.Duration {
	age := max(serverOr(server, wall).Sub(created), wall.Sub(at))
	if confirmCommandClockMutation {
		age = wall.Sub(at)
	}
	return max(age, 0)
}

// serverAgeMutation: a confirmation's age by the controller's wall clock,
// as before (reviewer X56). Tests only.
var serverAgeMutation bool

// serverOr: the server's clock at the poll, or wall when unknown (a
// server before 2.10: its stream info says no time).
func serverOr(server, wall time.Time) time.Time {
	if server.IsZero() || serverAgeMutation {
		return wall
	}
	return server
}
