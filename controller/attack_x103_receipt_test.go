package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// TestX103ReceiptStopsItToo: the runner's second layer against reviewer
// X103's copies. The tracker alone, its X103 rules switched off, declared
// the withdrawn h3 (TestX103HiddenWithdrawalProcessFirstRecordCopy,
// TestX103HiddenNextRecordCopySparedOverWithdrawal); the runner asks the
// host's withdrawal receipt before it writes a declaration
// (Runner.checkReceipt), and the receipt of boot-2's withdrawal W is
// SealedBefore the trusted copy (sealed for a revision below W): the
// declaration waits. So in the daemon the two holes also needed W's
// receipt missing from the stream (its write failed), where an unreadable
// one makes the declaration wait too.
func TestX103ReceiptStopsItToo(t *testing.T) {
	for _, c := range []struct {
		name string
		muts []*bool
		run  func(*testing.T) (string, time.Duration, bool)
	}{
		{"withdrawalProcessCopy", []*bool{&sealedBeforeWithdrawalMutation, &withdrawalProcessOlderMutation}, x103WithdrawalProcessCopy},
		{"hiddenNextCopy", []*bool{&sealedBeforeWithdrawalMutation, &otherProcessOlderActiveMutation},
			func(t *testing.T) (string, time.Duration, bool) { return x103HiddenNext(t, 100) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, m := range c.muts {
				x32Mutate(t, m)
			}
			var tr *Tracker
			var wRev uint64
			x103ProbeHook = func(got *Tracker, w uint64) { tr, wRev = got, w }
			t.Cleanup(func() { x103ProbeHook = nil })
			host, after, trusted := c.run(t)
			if host == "" || !trusted || tr == nil {
				t.Fatalf("rig: the tracker alone declared %q (copy trusted %t): the mutations no longer reach X103's hole", host, trusted)
			}
			rc := fencing.Beacon{Host: "h3", BootID: "boot-2", State: fencing.LeaseWithdrawn, Revision: wRev, Epoch: 2, Incarnation: 200, Seq: 4}
			if !tr.SealedBefore("h3", rc) {
				h := tr.hosts["h3"]
				t.Errorf("W's receipt (revision %d) does not stop the declaration %s after the copy (trusted %s/%d seq %d sealed for %d)", wRev, after, h.rec.BootID, h.rec.Incarnation, h.rec.Seq, h.rec.PrevRev)
			}
		})
	}
}
