package daemon

import (
	"errors"
	"testing"

	"hvguard/controller"
)

// TestDeclarationResults: a declaration stopped by the host's withdrawal
// receipt counts as declarations_total{result="withdrawal-receipt"}, not
// as a failed write; a failed write, a written one and one not acted on
// count as before.
func TestDeclarationResults(t *testing.T) {
	var c counters
	d := controller.Decision{Op: controller.OpDeclare, Host: "h1"}
	c.count(d, controller.ErrWithdrawalReceipt)
	c.count(d, errors.New("cas conflict"))
	c.count(d, nil)
	c.count(d, controller.ErrNotActing)
	if c.declareReceipt.Load() != 1 || c.declareFailed.Load() != 1 || c.declared.Load() != 1 || c.notActing.Load() != 1 {
		t.Fatalf("receipt %d, failed %d, written %d, not acting %d; want 1 each",
			c.declareReceipt.Load(), c.declareFailed.Load(), c.declared.Load(), c.notActing.Load())
	}
}
