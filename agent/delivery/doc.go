// Package delivery gets a host's lifecycle events from the agent to the
// controller: a durable on-disk Outbox, and a Publisher that sends its
// records to JetStream in order and removes them once stored.
//
//	agent loop --Append--> Outbox (disk) --Publisher--> JetStream stream HVGUARD_EVENTS
//	                           ^                  |
//	                           +------ ack -------+
//
// # Invariants
//
//   - No event appended is lost while the outbox is below its bound: Append
//     returns only after write(2), so the event survives the agent being
//     killed (SIGKILL: the page cache survives); it is fsynced within
//     SyncDelay (power loss can take at most that window); it leaves the
//     outbox only when JetStream has acked it.
//   - Per-host order: records are published and acked in seq order, and
//     after any error the publisher re-sends from the first unacked record.
//     On one connection to a healthy stream leader the stream therefore
//     holds each host's events in seq order. The exception is a failure of
//     one publish while a later one in the same window is stored (a stream
//     leader change in a cluster): the re-sent earlier event then lands
//     after it. Consumers must apply the rule in package proto (process
//     seq == last+1; seq <= last is a duplicate; seq > last+1 is a hole:
//     resync the host), which makes such a late arrival harmless.
//   - Seq strictly increases across restarts, even when the outbox was fully
//     acked and its segments deleted: the last seq assigned is persisted in
//     state.json before any segment is deleted, and events dropped because
//     the outbox was full consume seqs too. state.json's last seq lags the
//     records while the agent runs, so it also records the active segment
//     (as soon as one is created) and whether Close wrote it: after an
//     unclean stop whose active segment is gone (segment files deleted or
//     lost while state.json stayed) the outbox continues above every seq
//     that segment could have held (ActiveLimit): never a published seq
//     again under the same incarnation (JetStream would ack the new event
//     as a duplicate, a consumer would drop it); a seq hole instead, and
//     consumers resync the host (TestSegmentsLostAfterCrash).
//   - Every outbox has an incarnation (proto.Incarnation), drawn from
//     crypto/rand when the outbox is created and kept in state.json: a lost
//     state directory (reinstall, disk swap, a corrupt outbox removed) makes
//     a new outbox whose seqs restart at 1 under a new incarnation, so its
//     Msg-Ids differ from the old outbox's and JetStream stores its events
//     instead of acking them as duplicates; consumers resync the host on
//     the new incarnation. An outbox created by an agent from before
//     incarnations gets one at the first start that finds none of its
//     events unacked (until then its Msg-Ids are <host>:<seq>, which
//     another host could pre-empt: JetStream deduplicates Msg-Ids
//     stream-wide); its seqs continue.
//   - A seq is never visible outside the host before it is durable: the
//     publisher sends only fsynced records, so a power loss cannot make the
//     agent reuse a seq the stream has already seen.
//   - Nothing is silently dropped: when the outbox is full an event is
//     counted (Stats.Dropped), logged at ERROR once per burst, its seq is
//     consumed, and a gap marker (proto.TransitionGap) covering the dropped
//     seqs is appended as soon as the outbox has drained below
//     ResumeFraction, ahead of any later event. The consumer sees either the
//     gap marker or, at least, a seq hole, and resyncs the host.
//
// # On disk
//
// The outbox directory holds segment files named by the seq of their first
// record (%020d.seg), state.json, and a lock file that the open outbox holds
// an exclusive flock(2) on: a second process opening it (another agent on
// the same state_dir) is refused, since it would assign the same seqs under
// the same incarnation (TestOutboxSecondOpenRefused). A segment is a sequence of records:
//
//	u32 payload length | u32 CRC-32C of (seq, payload) | u64 seq | payload (proto JSON)
//
// little-endian, each written with one write(2). A segment is sealed (fsynced)
// at SegmentBytes and deleted once all its records are acked. state.json
// holds the incarnation, the ack cursor, the last seq assigned and any
// pending gap (without it, the incarnation is read from the last record,
// or drawn anew when there is none); it is
// replaced atomically (write tmp, fsync, rename, fsync dir), at most every
// StatePersistInterval unless a segment is to be deleted or events were
// dropped. A lagging cursor only causes re-sends, which JetStream drops by
// Nats-Msg-Id.
//
// On open, records after the ack cursor are replayed in order. A record
// that does not check out is handled by design as follows:
//   - torn tail (a bad record not followed by any good one: a write cut
//     short by a crash): truncated, logged at WARN. It was never fsynced, so
//     never published.
//   - corrupt middle record (a bad record followed by a good one: disk
//     corruption): logged at ERROR, counted (Stats.Corrupt) and skipped; the
//     agent keeps running, since refusing to start would lose every later
//     event. Its seq shows as a hole, so the consumer resyncs.
//
// # Publishing
//
// Publisher.Run sends records with Nats-Msg-Id =
// proto.MsgID(host, incarnation, seq),
// up to Window in flight (PublishMsgAsync), and applies acks in order.
// With PublisherConfig.Signer (the host key) each message carries the
// headers Hvguard-Signer and Hvguard-Sig (EventMsg: the signature of the
// subject and the record's bytes, made at each send; deterministic, so a
// re-send is identical and deduplicated as before; docs/events.md). On a
// publish error, an ack error (the client fails pending acks on disconnect)
// or an ack timeout it abandons everything in flight and re-sends from the
// first unacked record after a backoff. The connection must not buffer
// publishes while disconnected (ConnOptions sets ReconnectBufSize(-1)):
// the outbox is the buffer, it is on disk and bounded.
//
// JetStream drops re-sends within the stream's Duplicates window. Beyond it
// (a very long outage after a publish was stored but its ack lost), the
// stream can hold an event twice; consumers must therefore also drop
// events with seq <= the last seq they processed for the host.
//
// The agent's NATS user needs publish on hvguard.v1.<host-token>.lifecycle,
// the JetStream API $JS.API.STREAM.INFO.HVGUARD_EVENTS (and
// $JS.API.STREAM.CREATE.HVGUARD_EVENTS with CreateStream, used only while
// the stream is missing: an existing stream is never updated), and
// subscribe on its inbox prefix for publish acks.
package delivery
