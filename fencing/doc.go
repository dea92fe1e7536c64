// Package fencing is hvguard's self-fencing core on the agent side: a
// lease in the JetStream KV bucket Bucket that the agent renews by
// compare-and-set, isolation detection with peers, the fence-action
// planner, and (in fencing/watchdog) the hardware watchdog state layer.
// The controller's half is package controller; the protocol, the safety
// argument and a timing diagram with these defaults are in
// docs/fencing.md.
//
// # Shape (etcd-raft style)
//
// Agent is a pure state machine. It never reads the clock (now is passed
// into every method), performs no I/O, starts no goroutines and is driven
// by one goroutine. Every method returns a Ready: what to persist, which
// domains to pause/destroy/resume, a renewal to send, a peer round to run,
// a reconciliation to run, and the typed Transitions to publish. The caller
// performs it (Persist first) and reports outcomes back (Renewed,
// PeerAnswered, FenceDone, Reconciled, Domains); it calls Tick no later
// than NextDeadline. now must come from a clock that is monotonic across
// agent restarts within one boot (CLOCK_BOOTTIME); Durable.BootID tells
// boots apart.
//
// # States
//
//	starting ─ack─▶ healthy ─timeout/fail─▶ suspect ─SuspectAfter─▶ asking-peers
//	asking-peers ─peer relayed / own ack─▶ healthy
//	asking-peers ─self+confirmed > guard threshold─▶ held ─(re-asked every HeldRecheck)
//	asking-peers ─anything else by FenceBy─▶ fencing ─all done─▶ fenced
//	held ─no longer confirmed─▶ fencing;   held ─own ack─▶ healthy
//	fenced ─ack (not declared)─▶ rejoining ─Reconciled─▶ healthy (resume)
//	any ─declaration seen─▶ fencing/awaiting-release ─release+ack─▶ rejoining ─▶ healthy (no resume)
//
// # Invariants (what must always hold)
//
//  1. Send-time lease: the lease is held until LeaseTTL after the time the
//     core EMITTED the last renewal that is known to have landed (an ack,
//     a peer's relay, or our own record found by a later CAS conflict).
//     A timed-out renewal changes nothing but the state (its outcome is
//     unknown) and the next CAS uses the same expected revision, so a late
//     landing either is adopted (counted from its own send time, which is
//     earlier than its landing) or is rejected by the CAS.
//  2. Fence before lapse: unless Held, an agent with no landed renewal
//     starts fencing no later than LeaseTTL-FenceDeadline after the last
//     one, and escalates (host reset if allowed, else alert and stop
//     feeding the hardware watchdog) when the fence is not complete at the
//     lease expiry (or FenceDeadline after a later start).
//  3. Held only on confirmation: the agent is Held only while itself plus
//     the peers that answered PeerCannotRenew within confirmFresh are
//     MORE than the guard threshold min(Count, Share*Members) published by
//     the controller; when no round re-confirms this within HeldRecheck +
//     PeerTimeout of the last confirmation, the hold ends with a fence. A
//     peer answers PeerCannotRenew only when it is Held, or has had no
//     landed renewal for SuspectAfter but for less than ConfirmableAge
//     (older, it may have been declared without knowing), and was not
//     declared.
//  4. No resume without the lease: domains are resumed only in Reconciled,
//     in state rejoining, while the lease is held, and never after a
//     declaration (a released host hands its paused set to LeftPaused).
//     Only domains in the durable paused set (recorded in Persist before
//     the Pause is issued) are ever resumed.
//  5. Declaration wins: a CAS conflict showing an expired record of an
//     epoch >= ours makes the agent fence (if not fenced) and stay in
//     awaiting-release until a released record of that epoch is seen and
//     a renewal on it lands.
//  6. Watchdog: FeedWatchdog is true only while the lease is held, the
//     fence is complete, or a hold is freshly confirmed.
//  7. Restart: Durable carries the lease age, the fence/held/declared
//     state and the paused set; a restarted agent resumes the same
//     deadlines and never resumes a domain it did not record.
//  8. Key deleted: a conflict showing no record (a delete or purge marker)
//     makes the next write a create. Only an agent holding its lease and
//     not fencing/fenced re-creates its active record; any other declares
//     itself (an expired record of the next epoch, never overwritten by a
//     renewal) and waits for the ordinary release (keydelete.go).
package fencing
