package controller_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX60StorageFilledRefusesReceiptThenShrunkNATS (reviewer X60): X58's
// attack on the JetStream storage instead of the stream's limit. The lease
// bucket has no size limit and agents may put any key
// ($KV.hvguard-leases.*, values up to max_payload): compute-1 fills the
// server's JetStream storage with values on fresh keys, compute-3's
// withdrawal receipt is refused (insufficient resources), then compute-1
// overwrites its keys with tiny values (history 1: the big ones removed).
// The receipts stream is "sound", holds no receipt of compute-3: the
// controller declares it (its withdrawn record hidden).
//
// Reviewer X61's case "server-store": the shipped, uncapped account on a
// server whose JetStream storage is capped (max_file_store — every server
// has one): the receipt is refused ("insufficient resources") and
// AccountUnsound, which reads only the account's limits, vouches. Open
// (S, conditional): skipped. The shrink fails there (over the limit the
// server refuses every write, lease renewals included: loud, the guard
// holds); hidden only if the store comes back down without a write (the
// event stream aging out, other tenants) — docs/security.md, "Withdrawal
// receipts", Left.
func TestX60StorageFilledRefusesReceiptThenShrunkNATS(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(testing.TB) string
	}{
		{"account-capped", func(t testing.TB) string { return natspermtest.StartServerCapped(t, 64<<20) }},
		{"server-store", func(t testing.TB) string { return natspermtest.StartServerStoreCapped(t, 64<<20) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "server-store" {
				t.Skip("open (S, conditional; reviewer X61): a server's max_file_store reached through the lease bucket refuses a receipt while AccountUnsound vouches — docs/security.md, \"Withdrawal receipts\", Left")
			}
			x60StorageFilled(t, c.start(t))
		})
	}
}

func x60StorageFilled(t *testing.T, srvURL string) {
	const (
		attacker = "compute-1.example.org"
		victim   = "compute-3.example.org"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ra := newReceiptAttack(ctx, t, srvURL)
	f, rs, cjs := ra.f, ra.rs, ra.cjs
	ast, _ := permStore(t, srvURL, "agent:"+attacker, f, attacker)
	// Fill the account's storage, halving the value when a put is
	// refused, down to 300 bytes: the room left is less than a 300-byte
	// put (a receipt is bigger), more than a 1-byte one (most likely).
	var keys []string
	for size, i := 900*1000, 0; size >= 300 && i < 10000; i++ {
		k := "x60-fill-" + strconv.Itoa(i)
		if _, err := ast.KV.Put(ctx, k, []byte(strings.Repeat("x", size))); err != nil {
			size /= 2
			continue
		}
		keys = append(keys, k)
	}
	t.Logf("compute-1 filled the account with %d keys", len(keys))
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	_, perr := ra.vjs.PublishMsg(pctx, ra.receipt(t, 7, 1234))
	pcancel()
	t.Logf("compute-3's receipt publish: %v", perr)
	// Shrink: compute-1's keys overwritten with tiny values.
	shrunk := 0
	for _, k := range keys {
		if _, err := ast.KV.Put(ctx, k, []byte("x")); err == nil {
			shrunk++
		}
	}
	t.Logf("compute-1 shrank %d of %d keys to 1 byte", shrunk, len(keys))
	// And the stream takes receipts again.
	m2, _ := natslease.ReceiptMsg(f.signers["compute-2.example.org"], func() fencing.LeaseRecord {
		r := controllertest.HostRecord("compute-2.example.org")
		r.State, r.Seq = fencing.LeaseWithdrawn, 3
		return r
	}(), 99, time.Now())
	c2 := natspermtest.Connect(t, srvURL, "agent:compute-2.example.org")
	c2js, _ := jetstream.New(c2)
	if _, err := c2js.PublishMsg(ctx, m2); err != nil {
		t.Logf("a later receipt (compute-2's) refused too: %v", err)
	} else {
		t.Log("a later receipt (compute-2's) stored: nothing shows a receipt was ever refused")
	}
	rr, err := natslease.ReadReceipts(ctx, rs, victim)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Unsound == nil {
		// What the controller reads too (Runner.ReceiptsAccount), with
		// its own user under the shipped permissions.
		rr.Unsound = natslease.AccountUnsound(ctx, cjs)
	}
	t.Logf("controller reads compute-3: %d receipts, unsound=%v", len(rr.Msgs), rr.Unsound)
	if perr != nil && len(rr.Msgs) == 0 && rr.Unsound == nil {
		t.Errorf("compute-3's receipt refused while compute-1 filled the JetStream storage through the lease bucket; after it shrank its keys the receipts stream vouches (unsound nil) and holds no receipt: compute-3 would be declared")
	}
}
