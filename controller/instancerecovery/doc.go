// Package instancerecovery is the pure core of the controller's instance
// recovery (issue 14): it restarts instances whose domain stopped
// unexpectedly, as the agents classified the stop (docs/classification.md),
// and never one that Nova was rebooting or stopping.
//
// It imports only the standard library and never reads a clock: every
// input carries the time, and decisions are returned as values (Op) that a
// thin runner performs (controller.InstanceRecoveryRunner: NATS KV, Nova,
// Masakari), reporting each result back.
//
// Inputs: every lifecycle event the fleet view applied (Core.Event), the
// durable record of an instance (Loaded), Nova's view of a server
// (NovaAnswer), the result of a record write (Written) and of an action
// (Acted), and the leadership (Tick).
//
// Invariants (property-tested in core_test.go):
//
//  1. Never for a reboot or a stop Nova made: a stop classified `rebooted`
//     or `stopped-by-nova`, and an unclassified stop, never leads to an
//     action.
//  2. At most one action per stop event: a stop is identified by (host,
//     incarnation, seq); before any action the core writes its intent to
//     the instance's record by compare-and-set, and a stop with an intent
//     or an outcome in the record is never acted on again — after a
//     controller restart or a leader change the new leader verifies the
//     recorded action instead of repeating it.
//  3. `unknown` stops are acted on only after Nova confirmed the server
//     SHUTOFF (vm_state stopped) with no task in flight.
//  4. Only while leading: no OpLoad, OpQuery, OpWrite or OpAct is emitted
//     while the last Tick said the controller may not act (the runner
//     checks MayAct again immediately before each write and action).
//  5. Budget: at most Config.Budget actions per instance within
//     Config.BudgetWindow, the k-th (k ≥ 2) not before Backoff·2^(k-2)
//     after the previous one; beyond it the stop is reported over budget
//     and nothing is done.
package instancerecovery
