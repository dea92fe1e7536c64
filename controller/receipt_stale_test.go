package controller

import (
	"testing"
	"time"

	"hvguard/fencing"
)

// TestReceiptStale (reviewer X59): a withdrawal receipt is stale — from
// before the record the host is judged by, although it names a later
// revision (a lease bucket re-created since) — only when that record is
// the host's own (pinned), newer than the withdrawal AND stored more than
// ReceiptStaleMargin after the receipt. Either alone is not enough: an
// agent that lost its state withdraws with an identity below an earlier
// record's (stored before the receipt), and a copy of an older record put
// back by a compromised node is stored late.
func TestReceiptStale(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC) // the receipt stored
	const host = "h1"
	for _, c := range []struct {
		name        string
		inc, seq    uint64
		storedAfter time.Duration
		signer      string
		receiptSeq  uint64
		mut         bool
		want        bool
	}{
		{name: "came back on a re-created bucket", inc: 4, seq: 1, storedAfter: 10 * time.Minute, want: true},
		{name: "came back/receiptStaleMutation", inc: 4, seq: 1, storedAfter: 10 * time.Minute, mut: true},
		{name: "newer, stored before the receipt: a withdrawal after a lost state", inc: 4, seq: 1, storedAfter: -time.Minute},
		{name: "newer, stored within the margin", inc: 4, seq: 1, storedAfter: ReceiptStaleMargin - time.Second},
		{name: "older, stored later: a copy put back", inc: 3, seq: 49, storedAfter: time.Hour},
		{name: "the same record", inc: 3, seq: 50, storedAfter: time.Hour},
		{name: "not pinned (unsigned)", inc: 4, seq: 1, storedAfter: time.Hour, signer: "-"},
		{name: "receipt without identity", inc: 4, seq: 1, storedAfter: time.Hour, receiptSeq: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				receiptStaleMutation = true
				defer func() { receiptStaleMutation = false }()
			}
			tr := x10Tracker(t)
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Epoch, r.Incarnation, r.Seq = host+"-key", 2, c.inc, c.seq
			if c.signer == "-" {
				r.Signer = ""
			}
			tr.Stored(host, 7, t0.Add(c.storedAfter))
			tr.Observe(t0.Add(c.storedAfter), host, 7, r)
			b := fencing.Beacon{Host: host, State: fencing.LeaseWithdrawn, Revision: 100000, Epoch: 2, Incarnation: 3, Seq: 50}
			if c.name == "receipt without identity" {
				b.Epoch, b.Incarnation, b.Seq = 0, 0, c.receiptSeq
			}
			if got := tr.ReceiptStale(host, b, t0); got != c.want {
				t.Fatalf("ReceiptStale = %t, want %t", got, c.want)
			}
		})
	}
}
