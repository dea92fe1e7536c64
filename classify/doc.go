// Package classify tells, for a stop hvguard's debouncer confirmed (the
// domain was still off when its window ended), whether Nova caused it or
// is in the middle of it — so a recovery controller only ever sees
// unexpected stops (issue 6; docs/classification.md has the full table).
//
// Measured on a 2-core compute (shared/reference/openstack.md): Nova's own
// soft and hard reboots left domains off up to 30 s idle and 51 s under
// load, longer than any fixed debounce window. Nova survives that only
// because it re-reads the power state and skips instances whose task_state
// is set; this package does the same from Nova's API.
//
// # Shape (etcd-raft style, like lifecycle.Debouncer)
//
// The Classifier is a pure state machine: standard library only, time passed
// into every method, no I/O, no goroutines, one caller goroutine. Add hands
// over a stop; Alive says libvirt shows the domain running again; Tick
// advances time. Every call returns decisions: OpReport (publish the
// classified stop), OpHold (a hold began: log, count), OpQueryServers and
// OpQueryActions (the I/O the caller performs off the event path and
// answers with ServersResult / ActionsResult, passing the token back).
// NextDeadline says when to Tick.
//
// The batch planner: one servers listing (GET /servers/detail?all_tenants=1
// &host=<host>) serves every stop whose window ends while it is in flight
// and every stop ending within CacheTTL of its answer; held stops are
// re-polled together every PollInterval (polls due within half an interval
// join early, so they align). Instance actions are asked only for the few
// instances whose view is vm_state stopped or task powering-off.
//
// # Classification (first match)
//
//   - libvirt shows the domain alive again → rebooted.
//   - not listed on this host → stopped-by-nova (not-on-host).
//   - task_state explains the stop (every Nova task state but pausing,
//     unpausing, updating_password; unknown ones too) → hold, re-poll;
//     powering-off only if a user's stop request preceded the stop, else
//     stopped-unexpectedly (nova-synced-stop: Nova's power sync stopping an
//     instance that shut down by itself).
//   - vm_state active: after a hold and power_state running → rebooted;
//     after a hold, not running → stopped-unexpectedly
//     (operation-left-domain-off); without a hold → stopped-unexpectedly
//     (no-operation).
//   - vm_state stopped: stopped-by-nova (stop-requested) if the newest "stop"
//     action has a user and started no later than Began + ClockSkew, else
//     stopped-unexpectedly (nova-synced-stop).
//   - shelved, shelved_offloaded, suspended, soft-delete, deleted, resized →
//     stopped-by-nova (nova-vm-state); building → hold; error →
//     stopped-unexpectedly (nova-error); anything else →
//     stopped-unexpectedly (vm-state-mismatch).
//   - no usable answer → unknown (nova-unavailable, nova-slow,
//     nova-lost-while-held).
//
// # Invariants (what must always hold; property_test.go checks them)
//
//  1. Exactly once: every stop added is reported exactly once (OpReport),
//     then forgotten. A second Add for a domain being classified is ignored.
//  2. Never held forever: driven only by Tick at NextDeadline, a stop is
//     reported no later than 3*QueryTimeout + MaxHold after Add: at most
//     two listings (one in flight from before the stop began, then its own)
//     and one actions query before a hold begins, then MaxHold. A hold
//     whose Nova view is older than NovaLostAfter ends as unknown sooner.
//  3. Never stopped-unexpectedly while the Nova view it is based on shows an
//     operation that explains the stop — powering-off excepted when Nova
//     itself (no user) or a request after the stop is behind it.
//  4. Unknown iff no Nova view could be used: the reasons nova-unavailable,
//     nova-slow and nova-lost-while-held (and agent-stopping, from Drain
//     when the caller shuts down), and only they, give unknown; every
//     other report rests on a listing requested at or after the stop began
//     (or on libvirt showing the domain alive).
//  5. Fresh enough: a listing is used for a stop only if it was requested at
//     or after the stop began (Nova writes an operation's task_state before
//     it touches the domain, so such a listing shows any operation that
//     caused the stop) and, from the cache, answered within CacheTTL.
//  6. Bounded I/O: at most one listing in flight; after a failed or slow
//     listing no new one for RetryBackoff, and stops needing a first view
//     are reported unknown at once meanwhile (Nova down never costs every
//     stop a timeout). Answers with any token but the outstanding one are
//     ignored (Counters.StaleAnswers).
//  7. Deterministic: decisions do not depend on map order (pending stops
//     are visited by Began, then UUID).
//
// Nova's states are modelled as plain values (TaskState, VMState,
// PowerState, Action) whose strings and numbers are Nova's own
// (nova/objects/fields.py of Nova 26.2.2, Debian 12's python3-nova; see
// nova.go). The caller maps the OpenStack client's answers onto them.
package classify
