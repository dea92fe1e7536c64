package controller

import (
	"context"
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
// ConfirmKeyPrefix+HOST. A running controller takes one only if it was
// written after its tracker started afresh on the rolled-back stream (its
// revision is above the bucket's last one then): a confirmation left from
// an earlier rollback confirms nothing now.
const ConfirmKeyPrefix = "_confirm."

// Confirmation polling. ConfirmPollInterval: how often the runner reads
// the confirmations of the hosts the gate holds (only after a rollback,
// only while a host is gated and due): an operator's command takes effect
// within it. ConfirmPollBatch bounds the reads of one poll (a rack gated
// at once is read in turns), ConfirmReadTimeout the whole poll: it runs
// off the tracker's loop.
const (
	ConfirmPollInterval = 2 * time.Second
	ConfirmPollBatch    = 32
	ConfirmReadTimeout  = 2 * time.Second
)

// RollbackConfirmation is the value of ConfirmKeyPrefix+Host.
type RollbackConfirmation struct {
	Host   string    `json:"host"`
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

// WriteRollbackConfirmation writes c to the control bucket kv (the
// command's side) and returns the revision it landed at.
func WriteRollbackConfirmation(ctx context.Context, kv jetstream.KeyValue, c RollbackConfirmation) (uint64, error) {
	k, err := ConfirmKey(c.Host)
	if err != nil {
		return 0, err
	}
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

// confirmPoll is the runner's reading of confirmations (one poll at a
// time, off the loop: the fields are the polling goroutine's).
type confirmPoll struct {
	// baseline: the control bucket's last revision when this Run started
	// (read at its first poll); read: it was.
	baseline uint64
	read     bool
	next     int
	ignored  map[string]uint64 // host: the old revision said
}

// readConfirmations reads the confirmations of gated (at most
// ConfirmPollBatch, in turns) from kv and returns the hosts confirmed
// after the baseline. The first call reads the baseline only.
func (p *confirmPoll) readConfirmations(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger, gated []string) []string {
	ctx, cancel := context.WithTimeout(ctx, ConfirmReadTimeout)
	defer cancel()
	if !p.read {
		st, err := kv.Status(ctx)
		if err != nil {
			log.Warn("rollback gate: reading the control bucket's last revision failed; operators' confirmations are taken once it is read", "err", err)
			return nil
		}
		bs, ok := st.(*jetstream.KeyValueBucketStatus)
		if !ok || bs.StreamInfo() == nil {
			log.Warn("rollback gate: the control bucket's status has no stream info; operators' confirmations cannot be taken")
			return nil
		}
		p.baseline, p.read = bs.StreamInfo().State.LastSeq, true
		return nil
	}
	var out []string
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
		case e.Revision() <= p.baseline:
			if p.ignored[host] != e.Revision() {
				if p.ignored == nil {
					p.ignored = map[string]uint64{}
				}
				p.ignored[host] = e.Revision()
				log.Warn("rollback gate: the confirmation on record predates this rollback (written before the fresh tracker started): ignored — run hvguard-controller confirm-rollback again", "host", host, "revision", e.Revision(), "baseline", p.baseline)
			}
		case err != nil || c.Host != host:
			log.Warn("rollback gate: an unreadable confirmation, or one naming another host: ignored", "host", host, "revision", e.Revision(), "err", err, "names", c.Host)
		default:
			log.Warn("rollback gate: an operator confirmed the host may be declared", "host", host, "by", c.By, "reason", c.Reason, "at", c.At, "revision", e.Revision())
			out = append(out, host)
		}
	}
	if len(gated) > 0 {
		p.next = (p.next + n) % len(gated)
	}
	return out
}
