// Package proto defines the messages hvguard agents and the hvguard
// controller exchange over NATS, and the subjects and JetStream stream they
// use. It depends on the standard library only, so both sides (and tools)
// can import it without pulling in NATS or libvirt.
//
// # Encoding
//
// Messages are JSON objects with snake_case field names:
//   - JSON is human-debuggable on the wire (`nats sub 'hvguard.v1.>'` shows
//     readable events during an incident), which matters more here than
//     the few hundred bytes per event a binary encoding would save;
//   - schema evolution is by optional fields: a v1 reader ignores fields it
//     does not know, and a v1 writer omits fields it does not set. A field
//     that may be absent must have a zero value that means "not set". The
//     Nova classification of stops ("classification",
//     "classification_reason", issue 6) was added this way within schema 1:
//     optional, omitted when not classified, and no transition changed
//     meaning (a held Nova reboot is still a "rebooted"), so no v2. The
//     "incarnation" (issue 10) was added the same way: optional, absent
//     from older agents; an old consumer ignores it and behaves exactly as
//     before (it cannot tell a reinstalled host's restarted seqs from
//     duplicates, which is what the field is for); a new consumer reads an
//     absent incarnation as the empty one. Its Msg-Id change needs no
//     reader's cooperation: JetStream only compares Msg-Ids for equality.
//     "reboot_events" (issue 15) too: a guest reset makes libvirt send 2–4
//     REBOOT events, which agents used to publish as 2–4 "rebooted"; they
//     now publish one "rebooted" (reason "reboot-event") per burst with
//     the count in this optional field. "rebooted" keeps its meaning (the
//     domain reset), an old consumer just sees fewer duplicates of it and
//     a new one reads an absent count as 1.
//
// The published contract is JSON Schema (draft 2020-12): proto/schema/v1
// (package hvguard/proto/schema embeds it), documented with examples and
// the consumer rules in docs/events.md; its tests check the encoders and
// decoders against it.
//
// Every message carries "schema". SchemaVersion changes only for an
// incompatible change (a field removed, or its meaning changed); such a
// change also gets new subjects (hvguard.v2...) so old and new readers never
// see each other's messages.
//
// # Unknown fields
//
// DecodeLifecycle tolerates unknown JSON fields: within schema 1 a newer
// agent may add optional fields, and an older controller must keep working
// (forward compatibility). Everything it does know is checked strictly by
// Validate, so tolerance never lets a malformed known field through.
//
// # Invariants
//
//   - Anything DecodeLifecycle accepts passes Validate, and re-encodes (Encode)
//     to bytes that decode to the same value (times normalised to UTC).
//   - Encode never produces a message DecodeLifecycle would reject.
//   - classification and classification_reason are set together or not at
//     all, only on "stopped" (never "rebooted") and "rebooted" (only
//     "rebooted") events; the reason is a short [a-z0-9-] token.
//   - reboot_events is only set on "rebooted" events.
//   - HostToken and TokenToHost are inverse bijections between valid RFC 1123
//     host names and subject tokens; anything else is rejected, never passed
//     through into a subject.
//   - Per host and incarnation, seq is strictly increasing across agent
//     restarts; a hole in the sequence means events were lost (see
//     TransitionGap) and the consumer must resync that host. The agent's
//     outbox draws its incarnation (NewIncarnation) when it is created and
//     keeps it on disk with the last seq: losing the state directory
//     loses both, so a new outbox starts again at seq 1 under a new
//     incarnation, and its Msg-Ids (MsgID includes the incarnation) are
//     new too: JetStream stores its events instead of dropping them as
//     duplicates of the old outbox's.
//
// # Consumer rules
//
// A consumer keeps, per host, the incarnation, the stream sequence of that
// incarnation's first message, and the last seq it processed
// (controller.Fleet implements these rules) and, for each message:
//   - incarnation differs from the host's (including absent vs present)
//     and the message stands later in the stream than the current
//     incarnation's first message: the host's outbox was recreated (state
//     directory lost, the agent purged and reinstalled, a disk swap) or
//     first written by an agent with incarnations: the consumer's view of
//     that host is stale and the new seqs are unrelated to the old: resync
//     the host from a full listing, then follow the new incarnation from
//     this message's seq. Incarnations are random, so only the stream
//     orders them: a message of another incarnation that stands earlier
//     (a redelivery) is old: drop it;
//   - same incarnation: seq <= last: a duplicate (or a late re-send): drop
//     it; seq == last+1: process it; seq > last+1: events are missing
//     (lost, or a rare out-of-order re-send, see agent/delivery): resync
//     the host from a full listing, then process it.
//
// A gap marker is processed like any event and also triggers a resync.
//
// "Resync the host" needs no request: the agent sends a full report
// (TransitionInventory: every domain it knows and the state consumers last
// heard, split into parts with consecutive seqs) after every full domain
// listing (its start, a libvirt reconnect, an event overflow), after every
// gap marker it appends, and every 10 minutes. A consumer marks the host's
// view stale (its first message, a new incarnation, missing seqs, a gap
// marker) and replaces the host's domains with the next complete full
// report, which ends the staleness; events after it apply on top. A
// report with a part missing is ignored (the next one comes).
// JetStream's duplicate window (Nats-Msg-Id = MsgID) removes most
// duplicates before they reach a consumer, but not all. Incarnations that
// alternate on one host in new messages mean two agents publish under one
// host name: each change is a resync; alert on it.
package proto
