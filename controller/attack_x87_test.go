package controller

import (
	"fmt"
	"os"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX87PutBackReusedIncarnationNeverDeclared (reviewer X87, (c),
// conditional on an agent restart with its durable state lost): the
// controller side of fencing TestX87PutBackRecordReusesIncarnation.
// compute-3's boot-1 processes: P0 (incarnation 1), P1 (incarnation 2,
// seqs 1..11 trusted) — consecutive, as after any reboot the state_dir
// copy carries incarnations above the boot clock. P1 stops in order (its
// withdrawal, beaconed). compute-1 puts back P0's genuine renewal on the
// key (a raw put); P2 starts with its durable state lost, reads it and
// takes incarnation 2 again (NewAgent: max(…, cur.Incarnation) + 1), epoch
// the put-back's, seqs from 1. Its renewals (CAS over the put-back value,
// then over each other; written fresh, beaconed) are refused by heldBack as
// "not newer than the trusted withdrawal" of (boot-1, 2). It dies: never
// declared.
//
// Closed agent-side (the incarnation floor is the wall clock: fencing
// TestX87PutBackRecordReusesIncarnation); open for agents that reuse an
// incarnation (earlier releases, a wall clock stepped back), as
// TestX86StateLostAfterWithdrawalNeverDeclared: HVG_X86=1 runs it.
func TestX87PutBackReusedIncarnationNeverDeclared(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("heldBackMutation=%t", mut), func(t *testing.T) {
			if !mut && os.Getenv("HVG_X86") == "" {
				t.Skip("open for agents that reuse an incarnation (docs/security.md); HVG_X86=1 runs it")
			}
			if mut {
				x32Mutate(t, &heldBackMutation) // control: declared
			}
			x87PutBackReused(t)
		})
	}
}

func x87PutBackReused(t *testing.T) {
	x := x85Renewing(t) // incarnation 2, seqs 1..11 trusted
	p0 := *x.r
	p0.Incarnation, p0.Seq, p0.PrevRev = 1, 40, 90 // P0's renewal, seen earlier
	x85Withdraw(x)
	x.keep(x.tr.Tick(x.now))
	// compute-1 puts back P0's renewal (raw put: no expected header).
	x.now = x.now.Add(time.Second)
	x.rev++
	x.value(x.rev, p0, fencing.Written{Known: true})
	x.keep(x.tr.Tick(x.now))
	// P2: state lost, read P0's record: incarnation 2, seqs from 1.
	x.r.Seq, x.r.Epoch = 0, p0.Epoch
	died, declared := x86RenewThenDie(t, x, 6)
	if !declared {
		t.Errorf("compute-3, restarted (state lost, P0's record put back) after an orderly stop and renewing 6 times, died at %s: never declared in 5 min", died.Sub(t0))
	}
}
