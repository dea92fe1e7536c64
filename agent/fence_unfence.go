package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// UnfenceTimeout bounds `hvguard-agent unfence` as a whole (connect,
// read, reconciliation check, CAS).
const UnfenceTimeout = 30 * time.Second

// ErrUnreconciled is returned by Unfence while the reconciliation hook
// reports evacuations of this host that are not reconciled yet.
var ErrUnreconciled = errors.New("unreconciled evacuations")

// ErrNotDeclared is returned by Unfence when the host's lease is not
// declared expired: there is nothing to release (a fenced agent whose
// renewals land again rejoins by itself, after reconciliation).
var ErrNotDeclared = errors.New("host is not declared expired")

// ErrNoRecord is returned by Unfence when the host's lease key holds no
// record (never written, deleted or purged).
var ErrNoRecord = errors.New("no lease record")

// Unfence is the operator's explicit release (`hvguard-agent unfence`):
// it writes a `released` record of the declaration's epoch by CAS on the
// declaration's revision. The running agent then takes the lease over with
// a renewal, reconciles, and resumes NOTHING (the instances were rebuilt
// elsewhere): the domains it paused are left for the operator. It refuses
// while rec (the Nova reconciliation hook, issue 4; nil = none wired yet)
// reports unreconciled evacuations.
func Unfence(ctx context.Context, cfg Config, log *slog.Logger, rec FenceReconciler) (string, error) {
	if rec == nil {
		rec = noReconcile{}
	}
	ctx, cancel := context.WithTimeout(ctx, UnfenceTimeout)
	defer cancel()
	auth, err := cfg.NATS.Options()
	if err != nil {
		return "", fmt.Errorf("unfence: %w", err)
	}
	opts := append([]nats.Option{nats.Name("hvguard-agent unfence " + cfg.Host), nats.Timeout(5 * time.Second),
		nats.CustomInboxPrefix(proto.AgentInboxPrefix(cfg.Host))}, auth...)
	nc, err := nats.Connect(cfg.NATS.URL(), opts...)
	if err != nil {
		return "", fmt.Errorf("unfence: nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", fmt.Errorf("unfence: jetstream: %w", err)
	}
	kv, err := natslease.EnsureBucket(ctx, js, false)
	if err != nil {
		return "", fmt.Errorf("unfence: %w", err)
	}
	keys, signer, serr := cfg.Fence.Signing.load(cfg.Host)
	if serr != nil {
		return "", fmt.Errorf("unfence: %s %v: %s", serr.field, serr.val, serr.why)
	}
	// The release is sealed by this host's key: a host may release only
	// itself; an untrusted record in the key is refused by Read.
	st := &natslease.Store{KV: kv, Signer: signer, Keys: keys}
	cur, rev, err := st.Read(ctx, cfg.Host)
	if isNotFound(err) {
		// Deleted or purged (docs/fencing.md, "Key deleted"): nothing to
		// release yet. A fenced agent that finds its key deleted writes an
		// expired record of its own when it reaches NATS; a healthy one
		// re-creates its active record.
		return "", fmt.Errorf("unfence: %s has no lease record (deleted or purged): the agent re-creates it when it reaches NATS — "+
			"as an expired record if it was fenced or its lease had lapsed (run hvguard-agent unfence again then), as an active one if it was healthy: %w",
			cfg.Host, ErrNoRecord)
	}
	if err != nil {
		return "", fmt.Errorf("unfence: %w", err)
	}
	switch cur.State {
	case fencing.LeaseReleased:
		return fmt.Sprintf("host %s already released (epoch %d): the agent takes its lease over at its next renewal", cfg.Host, cur.Epoch), nil
	case fencing.LeaseActive:
		return "", fmt.Errorf("unfence: %s (state %s, epoch %d, agent state %s): nothing to release: %w",
			cfg.Host, cur.State, cur.Epoch, cur.AgentState, ErrNotDeclared)
	}
	pending, err := rec.Unreconciled(ctx)
	if err != nil {
		return "", fmt.Errorf("unfence: reconciliation check failed, refusing: %w", err)
	}
	if len(pending) > 0 {
		return "", fmt.Errorf("unfence: refusing: Nova shows %d evacuations of %s not reconciled yet (%s): %w",
			len(pending), cfg.Host, strings.Join(pending, ", "), ErrUnreconciled)
	}
	rel := *cur
	rel.State = fencing.LeaseReleased
	rel.Reason = "released by an operator (hvguard-agent unfence)"
	if _, err := st.Write(ctx, cfg.Host, rev, rel, natsReadTimeout); err != nil {
		return "", fmt.Errorf("unfence: %w (the record changed meanwhile: run it again)", err)
	}
	if log != nil {
		log.Warn("host released by operator", "host", cfg.Host, "epoch", rel.Epoch, "reason", rel.Reason)
	}
	return fmt.Sprintf("host %s released (epoch %d): the agent takes its lease over, reconciles, and resumes nothing; the domains it paused stay paused for you to decide", cfg.Host, rel.Epoch), nil
}
