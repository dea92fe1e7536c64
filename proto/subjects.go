package proto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Subjects. Every subject is hvguard.v1.<host-token>.<kind>, where
// <host-token> is HostToken(host). One token per host lets a consumer
// subscribe to one host (hvguard.v1.<token>.>) or one kind on all hosts
// (hvguard.v1.*.lifecycle), and lets JetStream filter per host.
const (
	// SubjectPrefix is the first two tokens of every hvguard v1 subject.
	SubjectPrefix = "hvguard.v1"

	// KindLifecycle: agent -> controller lifecycle events (LifecycleEvent),
	// stored in the StreamName stream.
	KindLifecycle = "lifecycle"
	// KindFence is reserved for fencing messages (a later issue).
	KindFence = "fence"
	// KindReconcile: agent -> anyone, ReconcileEvent (a domain the rejoin
	// reconciliation destroyed or would destroy), stored in the StreamName
	// stream.
	KindReconcile = "reconcile"
	// KindBeacon: agent -> controllers, fencing.Beacon (the revision of
	// each renewal the agent wrote itself), core NATS only (not stored):
	// with the shipped permissions only the host itself publishes on its
	// beacon subject (docs/security.md, "Beacons").
	KindBeacon = "beacon"
	// KindWithdrawn: agent -> controllers, the receipt of an orderly
	// withdrawal (the withdrawal's fencing.Beacon, state withdrawn),
	// published with a JetStream publish ack into the host's own stream
	// (WithdrawalStreamOf): a controller reads a host's last one before it declares the
	// host (docs/security.md, "Withdrawal receipts"). With the shipped
	// permissions only the host itself publishes on its subject.
	KindWithdrawn = "withdrawn"

	// ControllerDecisionSubject carries the leading controller's decisions
	// (controller.DecisionEvent: declarations, releases, guard holds,
	// refusals, …), published live with a core NATS publish, best effort:
	// the lease bucket is the authority, the events are for humans and
	// tools. Its third token starts with '_', which no host token does.
	ControllerDecisionSubject = SubjectPrefix + "._controller.decision"
	// ControllerRecoverySubject carries the leading controller's host
	// recovery progress (controller.RecoveryEvent), published like the
	// decisions: live, best effort; the recovery bucket is the authority.
	ControllerRecoverySubject = SubjectPrefix + "._controller.recovery"

	// ControllerInstanceRecoverySubject carries the leading controller's
	// instance recovery progress (controller.InstanceRecoveryEvent: a stop
	// skipped and why, waiting, acting, recovered, failed, over budget),
	// published live, best effort: the KV bucket hvguard-instance-recovery
	// is the authority.
	ControllerInstanceRecoverySubject = SubjectPrefix + "._controller.instance-recovery"

	// LifecycleWildcard matches the lifecycle subjects of every host.
	LifecycleWildcard = SubjectPrefix + ".*." + KindLifecycle
	// FenceWildcard matches the (reserved) fence subjects of every host.
	FenceWildcard = SubjectPrefix + ".*." + KindFence
	// ReconcileWildcard matches the reconcile subjects of every host.
	ReconcileWildcard = SubjectPrefix + ".*." + KindReconcile
	// BeaconWildcard matches the beacon subjects of every host.
	BeaconWildcard = SubjectPrefix + ".*." + KindBeacon
	// WithdrawnWildcard matches the withdrawal receipt subjects of every
	// host (what the older shared WithdrawalStream captured).
	WithdrawnWildcard = SubjectPrefix + ".*." + KindWithdrawn

	// WithdrawalStream is the one JetStream stream of every agent's
	// withdrawal receipts that earlier releases provisioned: still read
	// (a receipt found there stops a declaration), but it cannot vouch
	// that it stored every receipt — another host flooding its own
	// receipt subject fills the stream's ingest queue, which then refuses
	// the withdrawing host's receipt (reviewer X60). Each host's receipts
	// now have their own stream: WithdrawalStreamOf.
	WithdrawalStream = "hvguard-withdrawals"
	// WithdrawalStreamPrefix prefixes each host's own receipts stream
	// (WithdrawalStreamOf).
	WithdrawalStreamPrefix = WithdrawalStream + "-"
	// WithdrawalReceiptsKept: receipts kept per host — the controller reads
	// only the last; a few more show an operator the history.
	WithdrawalReceiptsKept = 4
)

// MaxHostLen is the longest RFC 1123 host name (in its textual form).
const MaxHostLen = 253

// maxLabelLen is the longest label (dot-separated part) of a host name.
const maxLabelLen = 63

// HostToken encodes an RFC 1123 host name as one NATS subject token: dots
// (which separate subject tokens) become '_', which cannot occur in a host
// name, so the encoding is reversible (TokenToHost). Case is preserved.
//
// Anything that is not a valid host name (empty, longer than 253 bytes, an
// empty or over-long label, a label starting or ending with '-', any byte
// other than letters, digits, '-' and '.', notably ' ', '*' and '>') is
// rejected with an error and never passed through into a subject.
func HostToken(host string) (string, error) {
	if err := checkHost(host); err != nil {
		return "", err
	}
	return strings.ReplaceAll(host, ".", "_"), nil
}

// TokenToHost is the inverse of HostToken. It rejects any token HostToken
// could not have produced.
func TokenToHost(token string) (string, error) {
	if strings.Contains(token, ".") {
		return "", fmt.Errorf("host token %s contains '.'", quote(token))
	}
	host := strings.ReplaceAll(token, "_", ".")
	if err := checkHost(host); err != nil {
		return "", fmt.Errorf("host token %s: %w", quote(token), err)
	}
	return host, nil
}

func checkHost(host string) error {
	if host == "" {
		return errors.New("host name is empty")
	}
	if len(host) > MaxHostLen {
		return fmt.Errorf("host name %s is longer than %d bytes", quote(host), MaxHostLen)
	}
	for label := range strings.SplitSeq(host, ".") {
		if label == "" {
			return fmt.Errorf("host name %s has an empty label", quote(host))
		}
		if len(label) > maxLabelLen {
			return fmt.Errorf("host name %s has a label longer than %d bytes", quote(host), maxLabelLen)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host name %s has a label starting or ending with '-'", quote(host))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return fmt.Errorf("host name %s contains %q (allowed: letters, digits, '-', '.')", quote(host), c)
			}
		}
	}
	return nil
}

// LifecycleSubject returns hvguard.v1.<HostToken(host)>.lifecycle.
func LifecycleSubject(host string) (string, error) {
	return hostSubject(host, KindLifecycle)
}

// FenceSubject returns hvguard.v1.<HostToken(host)>.fence (reserved).
func FenceSubject(host string) (string, error) {
	return hostSubject(host, KindFence)
}

// BeaconSubject returns hvguard.v1.<HostToken(host)>.beacon.
func BeaconSubject(host string) (string, error) {
	return hostSubject(host, KindBeacon)
}

// WithdrawnSubject returns hvguard.v1.<HostToken(host)>.withdrawn.
func WithdrawnSubject(host string) (string, error) {
	return hostSubject(host, KindWithdrawn)
}

// maxStreamNameLen is nats-server's longest stream name (JSMaxNameLen).
const maxStreamNameLen = 255

// WithdrawalStreamOf returns the name of host's own withdrawal receipts
// stream, "hvguard-withdrawals-<HostToken(host)>", in the agents' account:
// it captures host's receipt subject (WithdrawnSubject) only, so that no
// other host's publishes share its ingest queue (docs/security.md, "The
// receipts stream vouches"). A host name whose stream name would exceed
// nats-server's 255 bytes (a token longer than 235 bytes) is refused.
func WithdrawalStreamOf(host string) (string, error) {
	tok, err := HostToken(host)
	if err != nil {
		return "", fmt.Errorf("withdrawal receipts stream: %w", err)
	}
	name := WithdrawalStreamPrefix + tok
	if len(name) > maxStreamNameLen {
		return "", fmt.Errorf("withdrawal receipts stream of host %s: its name would be %d bytes, longer than the %d a NATS stream name may have", quote(host), len(name), maxStreamNameLen)
	}
	return name, nil
}

// ReconcileSubject returns hvguard.v1.<HostToken(host)>.reconcile.
func ReconcileSubject(host string) (string, error) {
	return hostSubject(host, KindReconcile)
}

func hostSubject(host, kind string) (string, error) {
	tok, err := HostToken(host)
	if err != nil {
		return "", fmt.Errorf("%s subject: %w", kind, err)
	}
	return SubjectPrefix + "." + tok + "." + kind, nil
}

// AgentInboxPrefix returns the reply inbox prefix of host's agent,
// "_INBOX.hvguard-agent.<HostToken(host)>" ("" for an invalid host name):
// the agent's connection uses it for every request (KV, JetStream API,
// publish acks), so a least-privilege NATS user may subscribe to its own
// replies only (docs/security.md, "NATS permissions"). The second token
// contains '-', which no default inbox (a NUID) does.
func AgentInboxPrefix(host string) string {
	tok, err := HostToken(host)
	if err != nil {
		return ""
	}
	return "_INBOX.hvguard-agent." + tok
}

// MsgID returns the JetStream Nats-Msg-Id of a host's event seq in
// incarnation inc: "<host>:<incarnation>:<seq>", or "<host>:<seq>" without
// one (zero) (outboxes created before incarnations existed keep the
// Msg-Ids their events always had). It is unique per (host, incarnation,
// seq), so a re-sent event is dropped by the stream's duplicate window,
// while the events of a new incarnation, whose seqs start again at 1, are
// not mistaken for the old ones (issue 10). ':' cannot occur in a host
// name nor an incarnation, so the ID is unambiguous.
func MsgID(host string, inc Incarnation, seq uint64) string {
	if inc == 0 {
		return host + ":" + strconv.FormatUint(seq, 10)
	}
	return host + ":" + inc.String() + ":" + strconv.FormatUint(seq, 10)
}

// Event signature headers (docs/events.md, "Signatures"): an agent whose
// host key is configured (fence.signing.mode optional or required) puts
// its key's ID (nkey "U…") in EventSignerHeader and the ed25519
// signature of the subject and payload (fencing.Signer.SignEvent, base64
// without padding) in EventSigHeader on every event it publishes on its
// lifecycle, reconcile and fence subjects. The controller verifies them against
// the host's enrolled key before its fleet view or instance recovery sees
// the event (fencing.Keyring.VerifyEvent). The payload is unchanged: an
// event without them is what an agent without a key publishes.
const (
	EventSignerHeader = "Hvguard-Signer"
	EventSigHeader    = "Hvguard-Sig"
)

// SubjectHost returns the host and kind of a per-host subject
// hvguard.v1.<host-token>.<kind>, or an error naming the subject.
func SubjectHost(subject string) (host, kind string, err error) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	tok, kind, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || kind == "" || strings.Contains(kind, ".") {
		return "", "", fmt.Errorf("subject %s: not %s.<host-token>.<kind>", quote(subject), SubjectPrefix)
	}
	if host, err = TokenToHost(tok); err != nil {
		return "", "", fmt.Errorf("subject %s: %w", quote(subject), err)
	}
	return host, kind, nil
}

// The JetStream stream holding lifecycle events, and its recommended
// configuration. The agent creates it when missing (if allowed) and never
// changes an existing one (it reports settings that differ); see
// agent/delivery.EnsureStream. Recommended config, as `nats` CLI flags:
//
//	nats stream add HVGUARD_EVENTS --subjects 'hvguard.v1.*.lifecycle,hvguard.v1.*.reconcile' \
//	  --storage file --retention limits --discard old \
//	  --max-age 168h --max-bytes 1GiB --dupe-window 5m --replicas 3
//
// File storage: events must survive a NATS restart. Limits retention with
// discard-old: the stream is a bounded log the controller reads with its own
// durable consumer; if the controller is away longer than MaxAge, the oldest
// events go and the controller sees a seq hole and resyncs. Replicas 3 on a
// 3-node cluster (1 for a single server).
//
// The reconcile subjects are in the stream (ReconcileEvent: a record of
// domains powered off, kept for the same week; consumers of lifecycle events
// filter on LifecycleWildcard). The fence subjects are deliberately NOT:
// they are expected to be request/reply, and a stream capturing a subject
// answers requests on it with its own publish ack.
const (
	StreamName = "HVGUARD_EVENTS"
	// StreamDuplicatesWindow is how long JetStream remembers Nats-Msg-Ids.
	// It must cover the agent's re-sends after a publish timeout or a NATS
	// restart (seconds: measured cluster recovery is 4-7 s), with a wide
	// margin; longer windows cost server memory per message. Re-sends after
	// a longer outage can still be duplicates (a "late write" stored just
	// before the cut), so consumers must also drop seq <= last seen per host.
	StreamDuplicatesWindow = 5 * time.Minute
	// StreamMaxAge bounds how long events are kept: a week covers a
	// controller outage over a long weekend.
	StreamMaxAge = 7 * 24 * time.Hour
	// StreamMaxBytes bounds the stream's storage: ~3 million events of ~350
	// bytes, far more than a fleet produces in StreamMaxAge.
	StreamMaxBytes = 1 << 30
)

// RequiredStreamSubjects are the subjects an existing stream must capture
// for the agent to use it: lifecycle only. A stream provisioned before
// reconcile events existed keeps carrying lifecycle events after an
// upgrade; only the reconcile events then fail to publish (the agent warns
// at start and logs the command that adds the subject).
func RequiredStreamSubjects() []string {
	return []string{LifecycleWildcard}
}

// StreamSubjects returns the subjects the StreamName stream should capture
// (what the agent creates it with).
func StreamSubjects() []string {
	return []string{LifecycleWildcard, ReconcileWildcard}
}
