// Package recovery is the pure core of host recovery (issue 13): what the
// leading controller does for a host whose lease it declared expired —
// force its nova-compute service down, list its instances, remove the dead
// host's Cinder attachments of volume-backed instances whose volumes are
// not multiattach, evacuate with bounded concurrency, verify, retry with
// backoff, report what cannot be recovered, and keep the host forced down
// until its agent has rejoined and reconciled. See docs/controller.md,
// "Host recovery".
//
// The core imports only the standard library and never reads a clock: now
// (the controller's clock, for timers) and wall (wall-clock time, stamped
// into the durable record and compared with Nova's timestamps) are passed
// in; every decision is returned as a Step, which a thin runner
// (controller.RecoveryRunner) performs against NATS and OpenStack, then
// reports back with Done.
//
// Invariants (each guarded by a test in core_test.go):
//
//  1. No destructive step (force-down, attachment removal, evacuation,
//     Masakari notification) unless the host's lease is declared:
//     Confirm before a recovery starts — state expired, a controller's
//     declaration, the host's constants (backstop) accepted by this
//     controller, the mass-failure guard not holding, and this
//     controller's own tracker saw the host silent for lease_ttl + grace
//     — and Check right before every destructive call, on a fresh read of
//     the lease key: still expired, the same epoch and the same revision
//     the recovery recorded. A changed record (released, renewed,
//     withdrawn, deleted, declared again) stops the recovery's
//     destructive steps for good; a guard hold or a failed read pauses
//     them.
//  2. Intent is recorded durably before every mutating call and its
//     completion after: a restart or a new leader resumes from the
//     record, never repeats a completed step, and never evacuates an
//     instance again whose evacuation migration exists.
//  3. Only attachments whose host is the declared host are removed, and
//     never on a multiattach volume.
//  4. At most Config.MaxEvacuations evacuations are in flight, and at most
//     Config.MaxHosts hosts are being recovered at once.
//  5. The host stays forced down until its lease is back (active, the
//     agent healthy: it rejoined and reconciled); only then, with the
//     release policy on-rejoin, is forced_down cleared; Nova's refusal
//     (done evacuations until the host's nova-compute restarted) is
//     reported and retried.
package recovery
