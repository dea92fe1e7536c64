// Package natslease is the NATS JetStream KV shell of self-fencing: the
// lease bucket (fencing.Bucket), compare-and-set renewals classified into
// fencing.RenewResult (acked, conflict with the current value, definitely
// failed, or timed out with an UNKNOWN outcome), the controller's
// declaration and release writes, the published guard, and a watcher for
// the controller. It holds no state machine: fencing.Agent and
// controller.Tracker decide, this package only talks to NATS.
package natslease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/proto"
)

// ReadTimeout bounds the Get that follows a CAS conflict (to report the
// current value) and the reads of the membership.
const ReadTimeout = 2 * time.Second

// BucketConfig returns the lease bucket's configuration: file storage
// (leases survive a NATS restart), history 1 (only the latest value of a
// key matters; measured: a watcher at saturation sees each key's latest
// state), replicas as given (3 on a 3-node cluster).
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      fencing.Bucket,
		Description: "hvguard self-fencing leases (see hvguard/fencing)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// EnsureBucket opens the lease bucket, creating it (1 replica) when create
// is set and it does not exist.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, create bool) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, fencing.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !create {
		return nil, fmt.Errorf("lease bucket %s: %w (provision it with: nats kv add %s --history 1 --storage file --replicas 3 && nats stream edit %s --no-allow-rollup --no-allow-direct --deny-purge --deny-delete -f)", fencing.Bucket, err, fencing.Bucket, StreamName)
	}
	return CreateBucket(ctx, js, 1)
}

// StreamName is the lease bucket's stream.
const StreamName = "KV_" + fencing.Bucket

// StreamWarning is said (log at ERROR, status, the insecure-settings
// metric) by a daemon that finds the lease bucket's stream allowing
// rollups, direct gets, purges or message deletes, or the server's
// JetStream API not strict (StreamInsecure says which):
//   - rollups: any writer of a lease key (every agent) can purge every
//     record and the guard with one "Nats-Rollup: all" publish, and a dead
//     host's declaration (a CAS on its last revision) fails for ever;
//   - direct gets: the server publishes a direct get's answer (a stored
//     message, headers included) on the reply subject the requester names,
//     and such an answer published on a JetStream API subject is executed
//     as an API request with the server's rights — any agent could delete
//     the lease bucket or the event stream, or delete and re-create the
//     controllers' consumer (reviewer X14, "reflection");
//   - purges, message deletes, a non-strict API: the answers an agent can
//     still aim at an API subject (a PubAck {"stream":…,"seq":N}) are
//     refused only by the strict API's decoding (unknown fields); with
//     jetstream { strict: false } a PubAck aimed at $JS.API.STREAM.PURGE
//     purged every record and event below N (reviewer X17). Denying purges
//     and deletes on the streams closes that whatever the server's mode.
const StreamWarning = "lease bucket " + fencing.Bucket + " allows rollups, direct gets, purges or message deletes, or the NATS server's JetStream API is not strict: any agent can purge or delete leases and events " +
	"(fix: nats stream edit " + StreamName + " --no-allow-rollup --no-allow-direct --deny-purge --deny-delete -f; the same --deny-purge --deny-delete on HVGUARD_EVENTS; jetstream { strict: true })"

// CreateBucket creates the lease bucket (BucketConfig(replicas)) and then
// hardens its stream (HardenStream): no rollups (a KV stream allows them:
// KV purge uses them; the lease bucket never purges), no direct gets (KV
// reads then use the stream API's message get, whose answer is JSON). KV
// create, get, update, delete and watch still work; a rollup or a KV purge
// is refused by the server (10111).
func CreateBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := CreateHardened(ctx, js, BucketConfig(replicas))
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", fencing.Bucket, err)
	}
	return kv, nil
}

// CreateHardened creates the KV bucket cfg, hardens its stream
// (HardenStream) and returns a handle bound after that (a handle bound
// before would keep making direct gets).
func CreateHardened(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, err := js.CreateKeyValue(ctx, cfg); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if err := HardenStream(ctx, js, "KV_"+cfg.Bucket); err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, cfg.Bucket)
}

// HardenStream sets AllowRollup and AllowDirect false and DenyPurge and
// DenyDelete true on stream (a KV bucket's stream: KV_<bucket>; nats.go's
// KV then reads with the stream API's message get; KV deletes are
// markers, not message deletes, and hvguard never purges a stream).
// DenyPurge and DenyDelete cannot be undone on the stream.
func HardenStream(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if hardened(cfg) {
		return nil
	}
	cfg.AllowRollup, cfg.AllowDirect, cfg.DenyPurge, cfg.DenyDelete = false, false, true, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("stream %s: forbid rollups, direct gets, purges and message deletes (allow_rollup_hdrs, allow_direct false; deny_purge, deny_delete true): %w", stream, err)
	}
	return nil
}

// hardened reports whether c is what HardenStream makes of a stream.
func hardened(c jetstream.StreamConfig) bool {
	return !c.AllowRollup && !c.AllowDirect && c.DenyPurge && c.DenyDelete
}

// StreamInsecure reports what makes the lease bucket's stream insecure
// (StreamWarning): its settings (rollups, direct gets, purges or message
// deletes allowed) and a JetStream API that is not strict (StrictAPI).
// Nothing: "".
func StreamInsecure(ctx context.Context, js jetstream.JetStream) (string, error) {
	st, err := js.Stream(ctx, StreamName)
	if err != nil {
		return "", fmt.Errorf("lease bucket %s: stream %s: %w", fencing.Bucket, StreamName, err)
	}
	c := st.CachedInfo().Config
	var why []string
	if !hardened(c) {
		why = append(why, fmt.Sprintf("allow_rollup_hdrs %t, allow_direct %t, deny_purge %t, deny_delete %t", c.AllowRollup, c.AllowDirect, c.DenyPurge, c.DenyDelete))
	}
	strict, err := StrictAPI(ctx, js.Conn())
	if err != nil {
		return "", err
	}
	if !strict {
		why = append(why, "the server's JetStream API accepts unknown fields (jetstream { strict: false })")
	}
	return strings.Join(why, "; "), nil
}

// StrictAPI reports whether the server's JetStream API refuses a request
// with an unknown field (strict, nats-server's default): it asks for the
// lease stream's info with one.
func StrictAPI(ctx context.Context, nc *nats.Conn) (bool, error) {
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+StreamName, []byte(`{"hvguard_strict_probe":true}`))
	if err != nil {
		return false, fmt.Errorf("strict API probe: %w", err)
	}
	var resp struct {
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Errorf("strict API probe: %w", err)
	}
	switch {
	case resp.Error == nil:
		return false, nil
	case resp.Error.ErrCode == 10025: // invalid JSON: the unknown field refused
		return true, nil
	}
	return false, fmt.Errorf("strict API probe: %s (%d)", resp.Error.Description, resp.Error.ErrCode)
}

// Store reads and writes the lease bucket.
type Store struct {
	KV jetstream.KeyValue
	// Signer seals what this Store writes for its owner (renewals,
	// declarations, releases, the guard; fencing.Signer.Seal); zero: not
	// signed. Relays are written as the asker sealed them.
	Signer fencing.Signer
	// Keys verifies what is read (records, the guard) and what is relayed
	// (fencing.Keyring.CheckRelay); nil: nothing is verified.
	Keys *fencing.Keyring
	// OnInvalid, if set, is told of every record (or guard) refused:
	// read, found in a conflict, or asked to be relayed (host "" for the
	// guard). The caller logs it loudly and counts it.
	OnInvalid func(host string, rev uint64, err error)
	// NC, if set, is the connection WrittenOn reads the lease stream's
	// stored messages on (the controller, signatures required: without
	// it no first value of a host is verified fresh).
	NC *nats.Conn
	// Control, if set, is the controllers' own bucket (controller.
	// ControlBucket, in the controllers' NATS account): it holds the
	// guard's authoritative copy, which ReadGuard reads and PublishGuard
	// writes before the copy in KV the agents read. An agent can make the
	// server write into any key of KV ("reflection", docs/security.md),
	// none of Control's. Nil: the guard is read from and written to KV
	// only.
	Control jetstream.KeyValue
}

func (s *Store) invalid(host string, rev uint64, err error) {
	if s.OnInvalid != nil {
		s.OnInvalid(host, rev, err)
	}
}

// key returns the host token of host (the record's key); an invalid host
// name yields an invalid key, which the KV rejects (never passed through).
func key(host string) string {
	t, err := proto.HostToken(host)
	if err != nil {
		return ".invalid"
	}
	return t
}

// hostOf returns the host of a key, or "" for a key that is not a host
// token.
func hostOf(k string) string {
	h, err := proto.TokenToHost(k)
	if err != nil {
		return ""
	}
	return h
}

// Renew performs req (a CAS of req.Record on req.Revision; 0: create, which
// also succeeds over the marker a delete or purge left) with timeout and
// classifies the outcome for fencing.Agent.Renewed. A conflict with a key
// that holds no record (deleted, purged, never written) has Current nil. It is also
// the relay a peer performs for another host (the relay contract — retry
// once on a conflict with the asker's own active record of the same epoch
// — is Relay).
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest, timeout time.Duration) fencing.RenewResult {
	if req.Revision == 0 {
		// The read takes at most half the write's timeout: a create is
		// one renewal's work (a plain create's conflict reads too).
		rctx, cancel := context.WithTimeout(ctx, timeout/2)
		m, ok := s.marker(rctx, req.Record.Host)
		cancel()
		if ok {
			// An anchored create: a compare-and-set on the marker's
			// revision, sealed for it (see marker).
			return s.cas(ctx, req.Record.Host, m, s.Signer.Seal(req.Record, m), timeout)
		}
	}
	return s.cas(ctx, req.Record.Host, req.Revision, s.Signer.Seal(req.Record, req.Revision), timeout)
}

// marker returns the revision of the delete marker host's key ends with,
// read from the lease stream's leader (the stream API's message get, as
// Read): ok false when the key holds a value or nothing, or the read
// fails (then the write is a plain create, as before anchoring).
//
// Anchored creates. nats.go's Create writes a create over a delete marker
// by a compare-and-set on the marker's revision, but the record inside
// was sealed for revision 0 (prev_rev 0): its stored header (the marker's
// revision) cannot match its prev_rev, so a controller can never verify
// it written fresh (fencing.Written.Fresh), and a copy of it put back over
// a later marker looks the same. A compromised node deleting a host's key
// after each of its writes made every write such a create — unverifiable
// until the host's own beacon vouched for it, and reviewers X65 to X84
// broke that vouching again and again (controller/vouch.go). An agent's
// own create is sealed for the marker's revision instead and written by a
// compare-and-set on it: the stored header equals prev_rev, so it is
// verified fresh like any renewal (when the controller reads the stored
// message before a later delete supersedes it: a delete loop faster than
// that read still leaves it to the beacons, reviewer X85), and a copy of
// it cannot land on that
// marker again (stream sequences are never reused) — a replay by
// revision (prev_rev below the key's last revision). A relayed create is
// anchored too: the relayer's conflict names the marker (markerAt), the
// asker's next renewal is sealed for it and relayed as a compare-and-set
// on it. It stays a plain create, sealed for 0, when no marker was read
// (docs/security.md, "Anchored creates").
func (s *Store) marker(ctx context.Context, host string) (uint64, bool) {
	if s.NC == nil || AnchorMutation {
		return 0, false
	}
	m, deleted, hdrErr, err := lastMsg(ctx, s.NC, subject(host))
	if err != nil || m.Seq == 0 {
		return 0, false
	}
	if hdrErr != nil {
		// A header block strictHeaders refuses: read it as nats.go's
		// Create does (it writes over what it takes for a marker, by a
		// CAS on its revision, whatever else the block holds) — or a
		// compromised node's delete with one odd header line made every
		// create of the host a plain one again (reviewer X85).
		h, derr := nats.DecodeHeadersMsg(m.Hdrs)
		if derr != nil || StrictMarkerMutation {
			return 0, false
		}
		op := h.Get("KV-Operation")
		deleted = op == "DEL" || op == "PURGE"
	}
	return m.Seq, deleted
}

// markerAt is the revision of the delete marker a read found (Store.get's
// not-found error wraps it). A conflict that found no record names it
// (Store.cas), and the agent seals its next relayed record for it: an
// anchored create — before, a relayed create was sealed for 0, verifiable
// only through the host's beacons (docs/security.md, "Anchored creates").
// Its own next write stays on revision 0: Renew anchors it on the marker
// it reads as it writes.
type markerAt uint64

func (m markerAt) Error() string { return fmt.Sprintf("deleted at revision %d", uint64(m)) }

// RereadMarkerMutation: a conflict that found no record names the marker
// a second read finds (Store.marker), as before reviewer X92: a put
// between the reads names 0. Tests only.
var RereadMarkerMutation bool

// AbsentMarkerMutation: a conflict that found no record names no marker
// (revision 0), as before relayed creates were anchored. Tests only.
var AbsentMarkerMutation bool

// AnchorMutation: an agent's create over a delete marker is sealed for
// revision 0 (a plain create), as before anchoring. Tests only.
var AnchorMutation bool

// StrictMarkerMutation: a marker whose header block strictHeaders
// refuses is no marker to anchor on, as before reviewer X85. Tests only.
var StrictMarkerMutation bool

// Relay performs req for another host: a CAS of the asker's record as the
// asker sealed it, only when fencing.Keyring.CheckRelay accepts it (an
// active record, signed by its own host for the revision asked; anything
// else is refused: RenewFailed, nothing written, OnInvalid told). An
// unsigned record's conflict with an active record of the asking process
// itself (LeaseRecord.RelayRetryOver) is retried once on its revision
// (never over an expired, released or withdrawn record, nor over another
// process's record); a signed record names the revision it was sealed for,
// so it is never retried on another one (the asker learns of its landed
// renewal from the conflict's record).
func (s *Store) Relay(ctx context.Context, req fencing.RenewRequest, timeout time.Duration) fencing.RenewResult {
	if err := s.Keys.CheckRelay(req.Record, req.Revision); err != nil {
		s.invalid(req.Record.Host, req.Revision, err)
		return fencing.RenewResult{Outcome: fencing.RenewFailed}
	}
	res := s.cas(ctx, req.Record.Host, req.Revision, req.Record, timeout)
	if c := res.Current; res.Outcome == fencing.RenewConflict && c != nil && c.RelayRetryOver(req.Record) && req.Record.Sig == "" {
		res = s.cas(ctx, req.Record.Host, res.Revision, req.Record, timeout)
	}
	return res
}

// Write writes rec to host's key by CAS on rev (the controller's
// declaration and release). A conflict is returned as an error wrapping
// jetstream.ErrKeyRevisionMismatch or jetstream.ErrKeyExists.
func (s *Store) Write(ctx context.Context, host string, rev uint64, rec fencing.LeaseRecord, timeout time.Duration) (uint64, error) {
	b, err := s.Signer.Seal(rec, rev).Encode()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, err := s.KV.Update(ctx, key(host), b, rev)
	if err != nil {
		return 0, fmt.Errorf("lease %s: CAS on revision %d: %w", host, rev, err)
	}
	return n, nil
}

func (s *Store) cas(ctx context.Context, host string, rev uint64, rec fencing.LeaseRecord, timeout time.Duration) fencing.RenewResult {
	b, err := rec.Encode()
	if err != nil {
		return fencing.RenewResult{Outcome: fencing.RenewFailed}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	var n uint64
	if rev == 0 {
		// Create, not Update on revision 0: a key that was deleted or
		// purged keeps a marker at its own revision, and an Update on 0
		// fails on it forever. Create writes by CAS on the marker's
		// revision (or on nothing), and never over a record.
		n, err = s.KV.Create(cctx, key(host), b)
	} else {
		n, err = s.KV.Update(cctx, key(host), b, rev)
	}
	cancel()
	switch {
	case err == nil:
		return fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: n}
	case IsConflict(err):
		cur, crev, gerr := s.Read(ctx, host)
		if errors.Is(gerr, fencing.ErrInvalidRecord) {
			// The key holds a record nobody may trust: the agent handles
			// it like a deleted key at that revision.
			return fencing.RenewResult{Outcome: fencing.RenewConflict, Revision: crev, Invalid: gerr.Error()}
		}
		if gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound) {
			// The conflict is certain, the current value unknown: the
			// write was not applied.
			return fencing.RenewResult{Outcome: fencing.RenewFailed}
		}
		if cur == nil {
			// No record: name the delete marker, so that the next write
			// (a relayed one too: the asker seals it) is anchored on it —
			// the marker the read above found (markerAt), not a second
			// read: a compromised node's put between the two made the
			// second find a value and name 0, "no marker", and the
			// asker's next relayed renewal a create sealed for 0
			// (reviewer X92, TestX92RacingPutNamesNoMarkerNATS).
			var ma markerAt
			switch {
			case AbsentMarkerMutation:
			case RereadMarkerMutation:
				rctx, cancel := context.WithTimeout(ctx, ReadTimeout)
				if m, ok := s.marker(rctx, host); ok {
					crev = m
				}
				cancel()
			case errors.As(gerr, &ma):
				crev = uint64(ma)
			}
		}
		return fencing.RenewResult{Outcome: fencing.RenewConflict, Revision: crev, Current: cur}
	case definitelyNotSent(err):
		return fencing.RenewResult{Outcome: fencing.RenewFailed}
	}
	// Timeouts and anything unclassified: the write may still land.
	return fencing.RenewResult{Outcome: fencing.RenewTimedOut}
}

// IsConflict reports a CAS rejection: the key's last revision was not the
// expected one (codes 10071 and, on replicated streams, 10164, however the
// client wrapped them), or Create found a record.
func IsConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) &&
		(api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// definitelyNotSent reports errors after which the write cannot land: not
// connected with the reconnect buffer disabled (nats.ReconnectBufSize(-1),
// as agent/delivery.ConnOptions sets), a closed connection, or no stream
// listening on the subject.
func definitelyNotSent(err error) bool {
	return errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrInvalidKey)
}

// Read returns host's record and revision (nil, 0 and an error wrapping
// jetstream.ErrKeyNotFound when there is none; nil, its revision and an
// error wrapping fencing.ErrInvalidRecord when the key holds a record that
// does not decode or verify).
func (s *Store) Read(ctx context.Context, host string) (*fencing.LeaseRecord, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	e, err := s.get(ctx, key(host))
	if err != nil {
		return nil, 0, fmt.Errorf("lease %s: read: %w", host, err)
	}
	r, err := s.decode(host, e.Revision(), e.Value())
	if err != nil {
		return nil, e.Revision(), err
	}
	return &r, e.Revision(), nil
}

// decode decodes and verifies the record of host's key at rev; a record
// that is not the key's host's is invalid too.
func (s *Store) decode(host string, rev uint64, b []byte) (fencing.LeaseRecord, error) {
	r, err := fencing.DecodeVerified(b, s.Keys)
	if err == nil && r.Host != host {
		err = fmt.Errorf("%w: record of host %q in the key of %q", fencing.ErrInvalidRecord, r.Host, host)
	}
	if err != nil {
		err = fmt.Errorf("lease %s: revision %d: %w", host, rev, err)
		s.invalid(host, rev, err)
	}
	return r, err
}

// Members returns the hosts in the bucket (sorted) and the published
// guard (zero when none is published yet). With signatures required,
// only hosts with a key in Keys: a peer without one is of no use (its
// answers and relays are refused) and keys under made-up names, which any
// agent can write (reviewer X17: 3000 of them), would take the questions
// of a peer round. With NC (the agents) the hosts
// are the keys of the lease stream's stream-info answer (Subjects), so
// that an agent creates no consumer; without NC (tests), KV.Keys.
func (s *Store) Members(ctx context.Context) ([]string, fencing.Guard, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	var keys []string
	var err error
	if s.NC != nil {
		keys, err = Subjects(ctx, s.NC)
	} else if keys, err = s.KV.Keys(ctx); errors.Is(err, jetstream.ErrNoKeysFound) {
		err = nil
	}
	if err != nil {
		return nil, fencing.Guard{}, fmt.Errorf("lease bucket: list keys: %w", err)
	}
	var hosts []string
	for _, k := range keys {
		if h := hostOf(k); h != "" && (!s.Keys.Required() || len(s.Keys.Hosts[h]) > 0) {
			hosts = append(hosts, h)
		}
	}
	sort.Strings(hosts)
	g, err := s.readGuard(ctx)
	if errors.Is(err, ErrInvalidGuard) {
		// Said through OnInvalid; the hosts stand: reflected garbage in
		// the guard's key froze every agent's membership (reviewer X16,
		// TestX16ReflectedGuardFreezesAgentMembershipNATS). A zero guard
		// replaces no guard an agent holds (fencing.Agent.SetMembers).
		return hosts, fencing.Guard{}, nil
	}
	if err != nil {
		return hosts, fencing.Guard{}, err
	}
	return hosts, g, nil
}

// ErrInvalidGuard wraps a guard read that does not decode or verify
// (Store.ReadGuard, Members).
var ErrInvalidGuard = errors.New("invalid guard")

// ReadGuard returns the published guard (zero when none is published
// yet): Control's copy, or, when Control is nil or holds none yet (the
// first start after an upgrade from one account, or before any
// controller published), KV's. An invalid guard is an error wrapping
// ErrInvalidGuard (the caller decides whether anything was lost:
// controller.Runner).
func (s *Store) ReadGuard(ctx context.Context) (fencing.Guard, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	if s.Control != nil {
		e, err := s.Control.Get(ctx, fencing.GuardKey)
		if g, found, err := s.guardOf(e, err, "control bucket"); found || err != nil {
			return g, err
		}
	}
	return s.readGuard(ctx)
}

// readGuard reads the guard of the lease bucket (the agents' copy).
func (s *Store) readGuard(ctx context.Context) (fencing.Guard, error) {
	e, err := s.get(ctx, fencing.GuardKey)
	g, _, err := s.guardOf(e, err, "lease bucket")
	return g, err
}

// guardOf verifies the guard read from where as e (err: the read's
// error; found false: there is none).
func (s *Store) guardOf(e kvEntry, err error, where string) (fencing.Guard, bool, error) {
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fencing.Guard{}, false, nil
	}
	if err != nil {
		return fencing.Guard{}, false, fmt.Errorf("%s: read guard: %w", where, err)
	}
	g, err := fencing.DecodeGuard(e.Value())
	if err == nil {
		err = s.Keys.VerifyGuard(g)
	}
	if err != nil {
		err = fmt.Errorf("%w: %s: guard at revision %d: %w", ErrInvalidGuard, where, e.Revision(), err)
		s.invalid("", e.Revision(), err)
		return fencing.Guard{}, true, err
	}
	return g, true, nil
}

// PublishGuard writes the controller's guard (sealed by Signer): to
// Control first (when set), then to KV for the agents.
func (s *Store) PublishGuard(ctx context.Context, g fencing.Guard) error {
	b, err := fencing.EncodeGuard(s.Signer.SealGuard(g))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	if s.Control != nil {
		if _, err := s.Control.Put(ctx, fencing.GuardKey, b); err != nil {
			return fmt.Errorf("control bucket: publish guard: %w", err)
		}
	}
	if _, err := s.KV.Put(ctx, fencing.GuardKey, b); err != nil {
		return fmt.Errorf("lease bucket: publish guard: %w", err)
	}
	return nil
}

// Update is one value seen by Watch: Record nil means the key was deleted.
type Update struct {
	Host     string
	Revision uint64
	Record   *fencing.LeaseRecord
	// Err is a record that could not be decoded or verified (Record nil;
	// it wraps fencing.ErrInvalidRecord).
	Err error
	// Listed: not a key's update but the end of the watch's first
	// listing, sent in order after every listed value (Watch): whoever
	// reads it has read every listed value.
	Listed bool
	// Skipped: some revision of the bucket before this one was never
	// delivered (the watch's first listing, or a value superseded before
	// the watch reached it: the bucket keeps one value per key). The
	// controller's tracker needs it to trust an untrusted value's
	// revision (controller.Tracker.Skipped).
	Skipped bool
	// After: the revision of this key's previous message, when the watch
	// delivered it live and every message of the bucket since (0: not
	// known so — none delivered live, or a skip since). A value sealed for
	// it (prev_rev = After) was written while the key ended there: what a
	// compare-and-set on prev_rev proves, known at delivery
	// (fencing.Written.After; the stored message may be gone by the time
	// the controller reads it — reviewer X85's race).
	After uint64
	// Stored: when the server stored the value (the stream's stamp, in
	// nanoseconds; no publisher sets it): a revision handed out again
	// after the stream lost messages is stored at another time
	// (controller.Tracker.Stored, reviewer X20).
	Stored time.Time
}

// Watch watches every host key of the bucket and sends each update to out
// until ctx ends; the first batch is the current value of every key,
// followed by an Update with Listed set, after which synced is closed
// (the caller calls Tracker.WatchStarted once it has read the Listed
// update: synced only says it was queued — reviewer X18: a runner that
// acted on synced restored its memory with values still queued). It
// returns when ctx ends or the watch fails (the caller re-watches and
// calls WatchStarted again: silence is only measured while watching).
func (s *Store) Watch(ctx context.Context, out chan<- Update, synced chan<- struct{}) error {
	w, err := s.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("lease bucket: watch: %w", err)
	}
	defer w.Stop()
	// The watch sees every message of the bucket's stream in order, so
	// after its first listing the revisions it delivers are consecutive
	// unless one was superseded before it was delivered.
	var last uint64
	live, skipped := false, false
	var adj adjacency
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("lease bucket: watch ended")
			}
			if e == nil {
				if synced != nil {
					select {
					case out <- Update{Listed: true}:
					case <-ctx.Done():
						return nil
					}
					close(synced)
					synced = nil
				}
				live = true
				continue
			}
			if !live || last != 0 && e.Revision() != last+1 {
				skipped = true
			}
			last = e.Revision()
			h := hostOf(e.Key())
			after := adj.see(h, last, skipped, live)
			if h == "" {
				continue // the guard, or not a host
			}
			u := Update{Host: h, Revision: e.Revision(), Skipped: skipped, Stored: e.Created(), After: after}
			skipped = false
			if e.Operation() == jetstream.KeyValuePut {
				r, err := s.decode(h, e.Revision(), e.Value())
				if err != nil {
					u.Err = err
				} else {
					u.Record = &r
				}
			}
			select {
			case out <- u:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// adjacency is Watch's memory for Update.After: the newest revision
// delivered after a skip (the first listing's count as such) and each
// host key's last revision delivered live.
type adjacency struct {
	lastSkip uint64
	prev     map[string]uint64
}

// see notes the delivery of host's key ("": another key of the bucket) at
// rev, skipped (some revision before it was never delivered) and live
// (after the first listing); it returns the key's After: its previous
// live revision if nothing was skipped since, else 0.
func (a *adjacency) see(host string, rev uint64, skipped, live bool) uint64 {
	if skipped {
		a.lastSkip = rev
	}
	if host == "" {
		return 0
	}
	var after uint64
	if p := a.prev[host]; p != 0 && a.lastSkip <= p {
		after = p
	}
	if live {
		if a.prev == nil || len(a.prev) >= maxWatchAfter {
			a.prev = map[string]uint64{} // made-up keys: forget, never guess
		}
		a.prev[host] = rev
	}
	return after
}

// maxWatchAfter bounds Watch's memory of each key's last live revision
// (Update.After): any agent can write keys under made-up names (reviewer
// X17); past it the memory is dropped, and a value has no After until its
// key is delivered live again (it is then judged by its stored message).
const maxWatchAfter = 1 << 16

// WarnStream is what both daemons do once the lease bucket is open: when
// StreamInsecure finds something it logs it and StreamWarning at ERROR
// and returns
// true (the daemon lists it among its insecure settings: status, metric,
// alert). It never refuses to run: an agent refusing the bucket would
// fence, a controller refusing it would declare nobody — both worse than
// the hole. An error reading the stream is logged and reported as false.
func WarnStream(ctx context.Context, js jetstream.JetStream, log *slog.Logger) bool {
	cctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	why, err := StreamInsecure(cctx, js)
	if err != nil {
		log.Warn("cannot check the lease bucket's settings and the server's strict API", "err", err)
		return false
	}
	if why != "" {
		log.Error("insecure lease bucket or server", "found", why, "warning", StreamWarning)
	}
	return why != ""
}

// LeaderRead is a read of a host's key from the lease stream's leader:
// Deleted (a delete or purge marker) or the value, at Revision; Err is
// why the value is not a trusted record (undecodable, unverifiable,
// forged: it is then ignored like any untrusted value).
type LeaderRead struct {
	Record   *fencing.LeaseRecord
	Revision uint64
	Deleted  bool
	Err      error
}

// ReadLeader reads host's key with the stream API's message get
// ($JS.API.STREAM.MSG.GET, answered by the stream's leader) rather than a
// KV get, which with direct gets allowed (KV buckets allow them) may be
// answered by a replica that lags: the read that gates a destructive step
// must not miss a renewal or a release. A missing key (never written) is
// Deleted at revision 0. The error is an error of the read itself.
func (s *Store) ReadLeader(ctx context.Context, nc *nats.Conn, host string) (LeaderRead, error) {
	m, deleted, hdrErr, err := lastMsg(ctx, nc, subject(host))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return LeaderRead{Deleted: true}, nil
	case err != nil:
		return LeaderRead{}, fmt.Errorf("lease %s: leader read: %w", host, err)
	}
	out := LeaderRead{Revision: m.Seq, Deleted: deleted}
	if hdrErr != nil {
		out.Err = fmt.Errorf("%w: lease %s: revision %d: %w", fencing.ErrInvalidRecord, host, m.Seq, hdrErr)
		return out, nil // not a value anyone may trust (as an undecodable one)
	}
	if deleted {
		return out, nil
	}
	r, err := s.decode(host, out.Revision, m.Data)
	if err != nil {
		out.Err = err
		return out, nil
	}
	out.Record = &r
	return out, nil
}

// kvEntry is what Read and readGuard use of a KV entry.
type kvEntry interface {
	Value() []byte
	Revision() uint64
}

// leaderEntry is a kvEntry read with the stream API's message get.
type leaderEntry storedMsg

func (e leaderEntry) Value() []byte    { return e.Data }
func (e leaderEntry) Revision() uint64 { return e.Seq }

// get reads the lease bucket's key k. With NC set it uses the stream API's
// message get (whose answer is JSON) whatever the stream allows, never a
// direct get: agents may not make direct gets (natsperm: a direct get's
// answer published on a JetStream API subject is executed as an API
// request, reviewer X14), and a handle nats.go bound while the stream
// still allowed them would keep making them. A missing or deleted key is
// an error wrapping jetstream.ErrKeyNotFound, as KV.Get's. Without NC
// (tests): KV.Get.
func (s *Store) get(ctx context.Context, k string) (kvEntry, error) {
	if s.NC == nil {
		return s.KV.Get(ctx, k)
	}
	m, deleted, _, err := lastMsg(ctx, s.NC, "$KV."+fencing.Bucket+"."+k)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, fmt.Errorf("%w (%w)", jetstream.ErrKeyNotFound, err)
	case err != nil:
		return nil, err
	case deleted:
		return nil, fmt.Errorf("%w (%w)", jetstream.ErrKeyNotFound, markerAt(m.Seq))
	}
	// A header block strictHeaders refuses is not a delete here: the
	// value is judged by its reader (undecodable, untrusted).
	return leaderEntry(m), nil
}

// lastMsg reads the last message of subj from the lease stream's leader
// (the stream API's message get): deleted when its KV-Operation is a
// delete or a purge; hdrErr when its header block does not parse
// strictly (then deleted is false). No message: err wraps
// jetstream.ErrMsgNotFound.
func lastMsg(ctx context.Context, nc *nats.Conn, subj string) (m storedMsg, deleted bool, hdrErr, err error) {
	if m, err = streamMsg(ctx, nc, map[string]any{"last_by_subj": subj}, ReadTimeout); err != nil {
		return m, false, nil, err
	}
	h, hdrErr := strictHeaders(m.Hdrs)
	if hdrErr != nil {
		return m, false, hdrErr, nil
	}
	op := h["KV-Operation"]
	return m, slices.Contains(op, "DEL") || slices.Contains(op, "PURGE"), nil, nil
}

// Subjects returns the keys of the lease bucket that hold a message
// (deleted or purged keys included: their marker is a message) from the
// stream API's stream info with a subject filter, page by page. Agents
// list the membership so because they may create no consumer: a push
// consumer delivers the stored messages (an agent's own value, headers
// included) to any subject that has a literal subscription — the
// server's own on $JS.API.CONSUMER.RESET.<stream>.<consumer> among them —
// in the agents' account (reviewer X15: a delivered {"seq":N} reset the
// controllers' event consumer past every event). A deleted host's key
// stays a member: peers asked in its name answer nothing (the safe side:
// docs/fencing.md, "Members").
func Subjects(ctx context.Context, nc *nats.Conn) ([]string, error) {
	prefix := "$KV." + fencing.Bucket + "."
	var keys []string
	for offset, pages := 0, 0; ; {
		b, _ := json.Marshal(map[string]any{"subjects_filter": prefix + ">", "offset": offset})
		m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+StreamName, b)
		if err != nil {
			return nil, err
		}
		var resp struct {
			State struct {
				Subjects map[string]uint64 `json:"subjects"`
			} `json:"state"`
			Total int       `json:"total"`
			Limit int       `json:"limit"`
			Error *apiError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("stream info: %s (%d)", resp.Error.Description, resp.Error.ErrCode)
		}
		for subj := range resp.State.Subjects {
			if k, ok := strings.CutPrefix(subj, prefix); ok {
				keys = append(keys, k)
			}
		}
		// The server pages its raw subjects by Limit; the decoded map may
		// hold fewer (encoding/json writes invalid UTF-8 as U+FFFD, so
		// names collide): paging by the map's size re-asked for every
		// key — 3000 colliding keys took 12.9 s and every agent's
		// membership read failed (reviewer X17).
		page := len(resp.State.Subjects)
		if resp.Limit > 0 {
			page = max(page, min(resp.Limit, resp.Total-offset))
		}
		offset += page
		if page <= 0 || offset >= resp.Total {
			return keys, nil
		}
		if pages++; pages >= MaxSubjectPages {
			return nil, fmt.Errorf("stream info: more than %d pages of keys (%d keys)", MaxSubjectPages, resp.Total)
		}
	}
}

// MaxSubjectPages bounds the stream-info pages Subjects reads (the server
// sends at most 100 000 subjects a page): a bucket with more keys is not
// a fleet but a flood of made-up keys, and reading it would stall every
// agent's membership refresh.
const MaxSubjectPages = 10

// apiError is a JetStream API answer's error.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

// subject is the lease stream's subject of host's key.
func subject(host string) string { return "$KV." + fencing.Bucket + "." + key(host) }

// storedMsg is a message of the lease stream as the stream API's message
// get returns it.
type storedMsg struct {
	Subject string    `json:"subject"`
	Seq     uint64    `json:"seq"`
	Hdrs    []byte    `json:"hdrs"`
	Data    []byte    `json:"data"`
	Time    time.Time `json:"time"`
}

// StoredAt reads when the lease stream stored its message at rev (the
// stream API's message get: the server's stamp, in nanoseconds). A
// message that is gone is an error wrapping jetstream.ErrMsgNotFound.
func StoredAt(ctx context.Context, nc *nats.Conn, rev uint64) (time.Time, error) {
	m, err := streamMsg(ctx, nc, map[string]any{"seq": rev}, ReadTimeout)
	return m.Time, err
}

// LastRevisionAt reads the lease stream's last sequence (stream info) and
// the server's clock when it answered (the info's "ts"; zero from a
// server that does not say it): the
// controller bounds its clock's offset from the server's stamps with it
// (controller.Tracker.ServerTime).
func LastRevisionAt(ctx context.Context, nc *nats.Conn) (uint64, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+StreamName, nil)
	if err != nil {
		return 0, time.Time{}, err
	}
	var resp struct {
		State struct {
			LastSeq uint64 `json:"last_seq"`
		} `json:"state"`
		TS    time.Time `json:"ts"`
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, time.Time{}, fmt.Errorf("stream info: %w", err)
	}
	if resp.Error != nil {
		return 0, time.Time{}, fmt.Errorf("stream info: %s (%d)", resp.Error.Description, resp.Error.ErrCode)
	}
	return resp.State.LastSeq, resp.TS, nil
}

// streamMsg performs the stream API's message get
// ($JS.API.STREAM.MSG.GET, answered by the stream's leader; the
// permission every reader of the bucket has) with req, waiting at most
// timeout. No message: an error wrapping jetstream.ErrMsgNotFound.
func streamMsg(ctx context.Context, nc *nats.Conn, req map[string]any, timeout time.Duration) (storedMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b, _ := json.Marshal(req)
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+StreamName, b)
	if err != nil {
		return storedMsg{}, err
	}
	var resp struct {
		Message *storedMsg `json:"message"`
		Error   *apiError  `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return storedMsg{}, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == 10037: // no message found
		return storedMsg{}, fmt.Errorf("%w (%s)", jetstream.ErrMsgNotFound, resp.Error.Description)
	case resp.Error != nil:
		return storedMsg{}, fmt.Errorf("%s (%d)", resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return storedMsg{}, errors.New("empty answer")
	}
	return *resp.Message, nil
}

// WrittenOn reads the stored message of host's key at rev from the lease
// stream's leader (the stream API's message get, as ReadLeader) and
// returns what its headers say about its write (fencing.Written; the
// controller's tracker judges it: fencing.Written.Fresh). A message that
// is gone (superseded: the bucket keeps one per key) is an error wrapping
// jetstream.ErrMsgNotFound; a message of another key at rev is an error.
// It waits at most timeout.
func (s *Store) WrittenOn(ctx context.Context, host string, rev uint64, timeout time.Duration) (fencing.Written, error) {
	if s.NC == nil {
		return fencing.Written{}, fmt.Errorf("lease %s: revision %d: no connection to read its stored message on", host, rev)
	}
	m, err := streamMsg(ctx, s.NC, map[string]any{"seq": rev}, timeout)
	if err != nil {
		return fencing.Written{}, fmt.Errorf("lease %s: revision %d: stored message: %w", host, rev, err)
	}
	if want := subject(host); m.Subject != want {
		return fencing.Written{}, fmt.Errorf("lease %s: revision %d: stored message is on %q, not %q", host, rev, m.Subject, want)
	}
	h, err := strictHeaders(m.Hdrs)
	if err != nil {
		return fencing.Written{}, fmt.Errorf("lease %s: revision %d: stored message's headers: %w", host, rev, err)
	}
	w, err := writtenOf(h)
	if err != nil {
		return fencing.Written{}, fmt.Errorf("lease %s: revision %d: %w", host, rev, err)
	}
	return w, nil
}

// strictHeaders parses a stored message's header block, refusing any block
// the server and a lenient reader could read differently: it must be
// "NATS/1.0\r\n", then "Key: value\r\n" lines with no bare CR or LF,
// then one empty line and nothing after. nats.go's DecodeHeadersMsg also
// splits lines on a bare LF and stops at the first empty line, while the
// server enforces the first CRLF-anchored Nats-Expected-Last-Subject-Sequence
// anywhere in the block: a publisher that hid the header the server
// checked behind one it did not made a replay look written fresh
// (reviewer X11, TestX11SmuggledHeaderReplayAcrossRestartNATS). A key
// that matches one of the headers Written reads only without regard to
// case is refused too (the server enforces the exact name only). No
// headers at all is an empty map.
func strictHeaders(raw []byte) (map[string][]string, error) {
	h := map[string][]string{}
	if len(raw) == 0 {
		return h, nil
	}
	const prefix, eol = "NATS/1.0\r\n", "\r\n"
	b := string(raw)
	if !strings.HasPrefix(b, prefix) || !strings.HasSuffix(b, eol+eol) && b != prefix+eol {
		return nil, fmt.Errorf("header block %q is not NATS/1.0 lines ending in an empty line", b)
	}
	body := strings.TrimSuffix(strings.TrimPrefix(b, prefix), eol)
	for _, line := range strings.SplitAfter(body, eol) {
		if line == "" {
			continue
		}
		line = strings.TrimSuffix(line, eol)
		k, v, ok := strings.Cut(line, ":")
		switch {
		case line == "" || strings.ContainsAny(line, "\r\n"):
			return nil, fmt.Errorf("header block %q: an empty line inside it, or a bare CR or LF", b)
		case !ok || k == "" || strings.ContainsAny(k, " \t"):
			return nil, fmt.Errorf("header block %q: line %q is not \"Key: value\"", b, line)
		}
		for _, want := range []string{fencing.ExpectedLastSubjectSeqHeader, fencing.ExpectedLastSubjectSeqSubjHeader} {
			if k != want && strings.EqualFold(k, want) {
				return nil, fmt.Errorf("header block %q: %q is %s in another case (the server does not enforce it)", b, k, want)
			}
		}
		h[k] = append(h[k], strings.Trim(v, " \t"))
	}
	return h, nil
}

// writtenOf reads fencing.Written from a stored message's headers
// (strictHeaders); a malformed Nats-Expected-Last-Subject-Sequence is an
// error.
func writtenOf(h map[string][]string) (fencing.Written, error) {
	w := fencing.Written{Known: true}
	if vs := h[fencing.ExpectedLastSubjectSeqSubjHeader]; len(vs) > 0 {
		w.OtherSubject = true
	}
	switch vs := h[fencing.ExpectedLastSubjectSeqHeader]; len(vs) {
	case 0:
	case 1:
		n, err := strconv.ParseUint(vs[0], 10, 64)
		if err != nil {
			return fencing.Written{}, fmt.Errorf("stored message: header %s %q: %w", fencing.ExpectedLastSubjectSeqHeader, vs[0], err)
		}
		w.HasExpected, w.Expected = true, n
	default:
		return fencing.Written{}, fmt.Errorf("stored message: header %s appears %d times (%q)", fencing.ExpectedLastSubjectSeqHeader, len(vs), vs)
	}
	return w, nil
}

// BeaconMsg returns the beacon (fencing.Beacon) of rec, the owner's own
// record, written at rev: the message its agent publishes after the
// renewal, on proto.BeaconSubject(rec.Host), signed by s (the host key),
// naming prev: the revision of the beacon the same process published
// before it (fencing.Beacon.Prev; 0: none).
func BeaconMsg(s fencing.Signer, rec fencing.LeaseRecord, rev, prev uint64, at time.Time) (*nats.Msg, error) {
	subj, err := proto.BeaconSubject(rec.Host)
	if err != nil {
		return nil, err
	}
	bc := fencing.Beacon{Schema: fencing.BeaconSchema, Host: rec.Host, BootID: rec.BootID, Incarnation: rec.Incarnation, Revision: rev, Prev: prev, At: at.UTC(), Epoch: rec.Epoch, Seq: rec.Seq}
	if rec.State == fencing.LeaseWithdrawn {
		bc.State = fencing.LeaseWithdrawn
	}
	b, err := s.SealBeacon(bc).Encode()
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: subj, Data: b}, nil
}
