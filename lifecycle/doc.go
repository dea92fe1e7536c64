// Package lifecycle turns libvirt domain events into trustworthy lifecycle
// transitions for hvguard. Its core problem: libvirt emits STOPPED while a
// guest is being rebooted (Nova soft reboot: STOPPED/SHUTDOWN, RESUMED,
// STARTED; hard reboot: SHUTDOWN(HOST), STOPPED/DESTROYED, RESUMED,
// STARTED). Nova holds STOPPED a fixed 15 s and cancels it on the next
// event; when the start events are dispatched late (measured up to 33 s)
// Nova reports the rebooted guest stopped and shuts it down.
//
// The Debouncer holds each stop for a window (Config.Window, default 15 s)
// and, when no start or reboot event has cancelled it, returns an
// OpCheckState decision: the caller reads the domain's real state from
// libvirt off the hot path and answers with Resolve. Only a domain found off
// is reported stopped.
//
// # Shape (etcd-raft style)
//
// The Debouncer is a pure state machine. It never reads the clock (now is
// passed into every method), performs no I/O, starts no goroutines and is
// driven by one goroutine. Observe, Tick, Resolve and Resync return the
// decisions in a slice the Debouncer reuses on its next call (copy it to
// keep it); their Append* twins append to a caller-owned slice. Either way
// the hot path does not allocate. One timer structure (an indexed min-heap,
// one entry per domain with a pending stop or a held REBOOT burst) serves
// all domains; the caller arms one timer from NextDeadline and calls Tick
// when it fires. FlushReboots reports the held bursts at once when the
// caller stops.
//
// # Invariants (what must always hold)
//
//  1. Stop-once: a stop is reported (TransitionStopped) at most once until
//     the domain is reported alive again (started, rebooted, resumed,
//     suspended, pmsuspended) or forgotten. STOPPED/CRASHED for a domain
//     whose stop was already reported (or that was defined while watched
//     and never ran) are redundant and ignored. Never lost: a domain
//     believed off only because a listing or a Seed said so ("learnt off")
//     had its stop reported by nobody in this run, so its STOPPED/CRASHED
//     opens a pending stop like any other.
//  2. No false stop from a check: a Resolve answering an alive state
//     (running, blocked, paused, pmsuspended) with no error never yields a
//     stop; it yields rebooted/running-at-window-end.
//  3. Never lost, never held forever: a pending stop ends in exactly one of
//     rebooted (an alive event or an alive check), stopped (off or gone at
//     the check, missing from a resync, or ReasonStateCheckFailed after Config.MaxChecks
//     failed, inconclusive or unanswered checks). Driven only by Tick, it is
//     reported no later than Window + MaxChecks*(CheckTimeout +
//     RecheckInterval) after it began.
//  4. One pending stop per domain; later stop-like events merge their detail
//     into the Cause ("PANICKED+CRASHED") and do not move the deadline.
//  5. Order: the reports of one domain are returned in the order of the
//     events that caused them (Decision.Cause.At is non-decreasing per
//     domain). Hence a DEFINED arriving while a stop is pending is held (one
//     slot, the last one wins) and reported right after the stop's outcome.
//  6. Bounded memory: one fixed-size record per tracked domain, the heap
//     holds at most one entry per domain (Pending()+RebootsHeld() <= Len():
//     a domain has a pending stop or a held REBOOT burst, never both), and a domain
//     is forgotten on UNDEFINED (after its pending stop settled), when a
//     check answers StateGone, or when a
//     Resync listing lacks it. Nothing grows with the number of events.
//  7. Tokens: each OpCheckState carries a fresh token (strictly increasing);
//     Resolve with any other token than the domain's outstanding one is
//     ignored (counted in Counters.ChecksStale), so an answer about an
//     older incarnation of the stop can never settle a newer one.
//  8. One rebooted per reboot: a guest reset makes libvirt send 2–4 REBOOT
//     events (measured 32 ms apart); they are held as one burst and
//     reported as one rebooted (reboot-event) whose Decision.RebootEvents
//     is their number. Every REBOOT is counted in exactly one report, at
//     most Config.Window after it was observed: the burst is reported
//     RebootBurstGap (2 s) after its last REBOOT, capped at Window after
//     its first. A domain that only resets gets at most one reboot-event
//     report per Window, so a reset loop (measured ~10 REBOOT events/s)
//     stays visible as one rebooted per Window carrying the count
//     (RebootEvents > RebootEventsPerReset: several resets in one report).
//     A held burst is reported early, right before any other report of the
//     domain or a stop beginning (invariant 5), which may bring two
//     reboot-event reports closer than Window when the domain also did
//     something else in between.
//
// # Semantics and edge cases
//
//   - STOPPED and CRASHED are stop-like and open a pending stop. SHUTDOWN
//     means "going down, still alive": it only annotates the next stop
//     (Decision.Shutdown: "GUEST" = ACPI/guest, "HOST" = destroy).
//   - While a stop is pending: STARTED cancels it (rebooted,
//     started-within-window); RESUMED cancels it (resumed-within-window) and
//     the STARTED real QEMU sends right after is folded into that reboot;
//     REBOOT cancels it and opens a REBOOT burst whose report (reboot-event,
//     Cause = the stop's first event) counts the REBOOTs that follow:
//     on_crash=restart sends SUSPENDED, CRASHED, REBOOT, RESUMED, REBOOT and
//     is one rebooted with RebootEvents 2; SUSPENDED/PMSUSPENDED prove a live
//     QEMU process too, so they cancel it (suspended-within-window) and are
//     then reported themselves. UNDEFINED does not end it: Nova's hard
//     reboot on the libvirt driver is destroy, undefine, define, start
//     (measured, test/e2e/openstack), so the undefine is held; a later
//     DEFINED voids it, a start cancels the stop as usual, and if the
//     domain stays away the check finds it gone (or off) and the stop is
//     reported, then the undefine.
//   - A check answering StateShutdown (still has a live process, but is
//     going down), an unclassified state or an error is inconclusive: the
//     domain is checked again after RecheckInterval. An unanswered check
//     times out after CheckTimeout and counts as a failed attempt.
//   - After a check finds the domain alive, its start events are late and
//     still to come: the RESUMED (redundant while running) and the STARTED
//     that follow are absorbed, not reported as a new start. Any other
//     lifecycle event ends this absorption.
//   - From off (stop reported), RESUMED+STARTED is one started, reported on
//     the RESUMED (QEMU sends RESUMED first) so a lost or late STARTED does
//     not delay it. For a domain never placed (first seen by an event, no
//     resync yet) RESUMED is reported as resumed, and a following STARTED as
//     started: without history hvguard does not guess.
//   - REBOOT (a guest reset; no lifecycle event comes with it) is reported
//     as rebooted, reboot-event, once per burst (invariant 8). Events that
//     change nothing (a RESUMED while running, a SHUTDOWN) do not end a
//     burst; every other event of the domain reports it first.
//   - DEFINED is reported as defined; DEFINED/ADDED or DEFINED/RENAMED of
//     an unknown domain places it off (defined, not running; libvirt
//     renames inactive domains only, after an UNDEFINED/RENAMED that
//     forgot the old name: left unplaced, the next listing would report
//     a stop of a domain that never ran). UNDEFINED of a domain never
//     tracked is reported but not learnt.
//   - Window 0 is pass-through: stops are reported at once, unchecked
//     (reason pass-through, state shutoff or crashed), still once; every
//     REBOOT event is reported at once on its own (RebootEvents 1).
//   - Resync (after events may have been lost) reports an unknown domain as
//     defined (reason resync, State = listed state) so consumers learn each
//     domain once. The listing races the events: an event delivered after
//     the listing may predate it. A domain learnt off this way (or seeded
//     off) whose STOPPED/CRASHED arrives afterwards stopped while the
//     listing was taken (no STOPPED comes for a domain that did not run
//     since the events were registered): the stop goes through the window
//     and is reported once (Counters.StopsOfLearnedOff); a domain merely
//     off that never runs gets its defined and nothing else. Resync also
//     sends a domain listed off but believed alive through the
//     normal window/check path; reports started/suspended/resumed/
//     pmsuspended for other listed changes; leaves pending stops alone (their
//     check reads the state anyway); reports a missing domain undefined
//     (after its pending stop, if any) and forgets it.
//   - The window is measured from when the event is observed (now), not from
//     Event.At: a STOPPED delivered late still gets its full window to be
//     cancelled by start events that are equally late.
//
// A domain really off at window end is a correct stop for this core even
// if Nova is in the middle of rebooting it (a reboot with a long off time):
// telling those apart needs Nova's task state and belongs to a later layer.
package lifecycle
