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
		// boot: the trusted record's boot (the receipt's is "b1");
		// beacon: the host's beacon named the trusted record; bootMut:
		// receiptBootMutation (reviewer X67).
		boot            string
		beacon, bootMut bool
	}{
		{name: "came back on a re-created bucket", inc: 4, seq: 1, storedAfter: 10 * time.Minute, beacon: true, want: true},
		{name: "came back/receiptStaleMutation", inc: 4, seq: 1, storedAfter: 10 * time.Minute, beacon: true, mut: true},
		{name: "came back, its beacons lost (another incarnation: reviewer X68)", inc: 4, seq: 1, storedAfter: 10 * time.Minute},
		{name: "newer, stored before the receipt: a withdrawal after a lost state", inc: 4, seq: 1, storedAfter: -time.Minute},
		{name: "newer, stored within the margin", inc: 4, seq: 1, storedAfter: ReceiptStaleMargin - time.Second},
		{name: "older, stored later: a copy put back", inc: 3, seq: 49, storedAfter: time.Hour},
		{name: "the same record", inc: 3, seq: 50, storedAfter: time.Hour},
		{name: "not pinned (unsigned)", inc: 4, seq: 1, storedAfter: time.Hour, signer: "-"},
		{name: "receipt without identity", inc: 4, seq: 1, storedAfter: time.Hour, receiptSeq: 0},
		{name: "came back on a new boot, its beacon named the record", inc: 4, seq: 1, storedAfter: 10 * time.Minute, boot: "b2", beacon: true, want: true},
		{name: "an old boot's record, lower identity after a lost state, no beacon", inc: 4, seq: 1, storedAfter: 10 * time.Minute, boot: "b0"},
		{name: "an old boot's record/receiptBootMutation", inc: 4, seq: 1, storedAfter: 10 * time.Minute, boot: "b0", bootMut: true, want: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				receiptStaleMutation = true
				defer func() { receiptStaleMutation = false }()
			}
			if c.bootMut {
				receiptBootMutation = true
				defer func() { receiptBootMutation = false }()
			}
			tr := x10Tracker(t)
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Epoch, r.Incarnation, r.Seq = host+"-key", 2, c.inc, c.seq
			if c.boot != "" {
				r.BootID = c.boot
			}
			if c.signer == "-" {
				r.Signer = ""
			}
			tr.Stored(host, 7, t0.Add(c.storedAfter))
			tr.Observe(t0.Add(c.storedAfter), host, 7, r)
			if c.beacon {
				tr.ObserveBeacon(t0.Add(c.storedAfter), host, 7)
			}
			b := fencing.Beacon{Host: host, State: fencing.LeaseWithdrawn, Revision: 100000, Epoch: 2, Incarnation: 3, Seq: 50}
			if c.boot != "" {
				b.BootID = "b1"
			}
			if c.name == "receipt without identity" {
				b.Epoch, b.Incarnation, b.Seq = 0, 0, c.receiptSeq
			}
			if got := tr.ReceiptStale(host, b, t0); got != c.want {
				t.Fatalf("ReceiptStale = %t, want %t", got, c.want)
			}
		})
	}
}

// TestSealedBeforeCreate: a trusted record of the host's that landed
// after its withdrawal receipt's revision was written over the withdrawal
// by someone else when the host sealed it for an earlier revision
// (prev_rev between: reviewer X58) — or, for a create (prev_rev 0, which
// a key deleted in between lets land anywhere), when the withdrawal is
// newer (epoch, incarnation, seq) than the record: the host sealed the
// record before it withdrew, so someone put it back (a compromised peer
// holding a create the host asked it to relay; docs/security.md,
// "Withdrawal receipts", the create gap). A create newer than the
// withdrawal is the host's comeback; a receipt after the record, an
// unsigned record or a receipt without identity says nothing.
func TestSealedBeforeCreate(t *testing.T) {
	const host = "h1"
	for _, c := range []struct {
		name          string
		prevRev       uint64
		inc, seq      uint64
		receiptRev    uint64
		unsigned, mut bool
		noIdentity    bool
		reusedMut     bool
		procMut       bool
		want          bool
	}{
		{name: "create put back over the withdrawal", inc: 3, seq: 10, receiptRev: 100, want: true},
		{name: "create put back/createSealedMutation", inc: 3, seq: 10, receiptRev: 100, mut: true, procMut: true},
		{name: "create of the same process newer than the withdrawal", inc: 3, seq: 60, receiptRev: 100},
		// Another process (incarnation 4): identities not ordered, it
		// waits until the host writes again (reviewer X69).
		{name: "create after the withdrawal: the host came back", inc: 4, seq: 1, receiptRev: 100, want: true},
		{name: "came back/reusedRevMutation", inc: 4, seq: 1, receiptRev: 100, reusedMut: true},
		// The receipt names the trusted record's own revision, another
		// record: a revision handed out again (reviewer X69).
		{name: "receipt at the trusted revision, another record", inc: 3, seq: 10, receiptRev: 120, want: true},
		{name: "receipt at the trusted revision/reusedRevMutation", inc: 3, seq: 10, receiptRev: 120, reusedMut: true},
		{name: "receipt after the create", inc: 3, seq: 10, receiptRev: 130},
		{name: "unsigned create", inc: 3, seq: 10, receiptRev: 100, unsigned: true},
		{name: "receipt without identity", inc: 3, seq: 10, receiptRev: 100, noIdentity: true},
		{name: "update sealed before the receipt (X58)", prevRev: 90, inc: 4, seq: 1, receiptRev: 100, want: true},
		// Sealed for a revision after the receipt's but older in its
		// process than the withdrawal: sealed before it (reviewer X89: a
		// revision chosen far ahead by liars).
		{name: "update sealed for a later revision, older than the withdrawal", prevRev: 110, inc: 3, seq: 10, receiptRev: 100, want: true},
		{name: "update sealed for a later revision/sealedProcMutation", prevRev: 110, inc: 3, seq: 10, receiptRev: 100, procMut: true},
		{name: "update sealed after the receipt, newer than the withdrawal", prevRev: 110, inc: 3, seq: 60, receiptRev: 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				createSealedMutation = true
				defer func() { createSealedMutation = false }()
			}
			if c.reusedMut {
				reusedRevMutation = true
				defer func() { reusedRevMutation = false }()
			}
			if c.procMut {
				sealedProcMutation = true
				defer func() { sealedProcMutation = false }()
			}
			tr := x10Tracker(t)
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Sig, r.Epoch, r.Incarnation, r.Seq, r.PrevRev = host+"-key", "sig", 2, c.inc, c.seq, c.prevRev
			if c.unsigned {
				r.Signer, r.Sig = "", ""
			}
			tr.Observe(time.Unix(1000, 0), host, 120, r)
			b := fencing.Beacon{Host: host, State: fencing.LeaseWithdrawn, Revision: c.receiptRev, Epoch: 2, Incarnation: 3, Seq: 50}
			if c.noIdentity {
				b.Epoch, b.Incarnation, b.Seq = 0, 0, 0
			}
			if got := tr.SealedBefore(host, b); got != c.want {
				t.Fatalf("SealedBefore = %t, want %t", got, c.want)
			}
		})
	}
}

// TestReceiptsCover (reviewer X62): a host's receipts stream vouches for
// its receipts only if it existed when the record the host is judged by
// was stored (created at least ReceiptStreamClockMargin before): one
// created after — the host moved to its own stream, or its stream
// re-added, after it withdrew — vouches for a time before it existed. A
// record whose stored time is unknown (restored from memory) is not
// covered, nor is a stream whose creation time is unknown.
func TestReceiptsCover(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC) // the record stored
	const host = "h1"
	defer func(m time.Duration) { receiptStreamClockMargin = m }(receiptStreamClockMargin)
	receiptStreamClockMargin = ReceiptStreamClockMargin // the production margin (export_test.go cuts it)
	for _, c := range []struct {
		name      string
		created   time.Time
		noStored  bool
		mut, want bool
	}{
		{name: "created long before", created: t0.Add(-time.Hour), want: true},
		{name: "created the margin before", created: t0.Add(-ReceiptStreamClockMargin), want: true},
		{name: "created within the margin", created: t0.Add(-ReceiptStreamClockMargin / 2)},
		{name: "created after: moved, or re-added", created: t0.Add(time.Minute)},
		{name: "created after/receiptSinceMutation", created: t0.Add(time.Minute), mut: true, want: true},
		{name: "stored time unknown", created: t0.Add(-time.Hour), noStored: true},
		{name: "creation unknown", created: time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.mut {
				receiptSinceMutation = true
				defer func() { receiptSinceMutation = false }()
			}
			tr := x10Tracker(t)
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Epoch, r.Incarnation, r.Seq = host+"-key", 2, 3, 10
			if !c.noStored {
				tr.Stored(host, 7, t0)
			}
			tr.Observe(t0, host, 7, r)
			if got := tr.ReceiptsCover(host, c.created); got != c.want {
				t.Fatalf("ReceiptsCover = %t, want %t", got, c.want)
			}
		})
	}
	if x10Tracker(t).ReceiptsCover("unknown", t0.Add(-time.Hour)) {
		t.Fatal("an unknown host is covered")
	}
}

// TestReceiptsMatterAndCoverFrom (reviewer X63): a trusted record put
// back over a hidden withdrawal is the key's last value, so MayHideWrite
// is false; the watch skipped the withdrawal's revision, between the
// record's PrevRev and its own: receipts matter (junk, soundness and
// coverage are checked). A record that follows the previous trusted one
// with no skip does not. Coverage counts from when the value the record
// replaced was stored (its PrevRev, the previous trusted record), not
// from the record's own stored time, which a put-back makes late.
func TestReceiptsMatterAndCoverFrom(t *testing.T) {
	defer func(m time.Duration) { receiptStreamClockMargin = m }(receiptStreamClockMargin)
	receiptStreamClockMargin = ReceiptStreamClockMargin
	t0 := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	const host = "h1"
	for _, c := range []struct {
		name              string
		skip              bool // the watch skipped the withdrawal's revision (11)
		spanMut, coverMut bool
		wantMatter        bool
		created           time.Time // the receipts stream's creation
		wantCover         bool
	}{
		{name: "renewal after renewal", created: t0.Add(-time.Hour), wantCover: true},
		{name: "put back over a skipped withdrawal", skip: true, wantMatter: true, created: t0.Add(-time.Hour), wantCover: true},
		{name: "put back/spanSkipMutation", skip: true, spanMut: true, created: t0.Add(-time.Hour), wantCover: true},
		{name: "stream created between the replaced value and the put-back", skip: true, wantMatter: true, created: t0.Add(30 * time.Second)},
		{name: "created between/coverFromMutation", skip: true, wantMatter: true, created: t0.Add(30 * time.Second), coverMut: true, wantCover: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			spanSkipMutation, coverFromMutation = c.spanMut, c.coverMut
			defer func() { spanSkipMutation, coverFromMutation = false, false }()
			tr := x10Tracker(t)
			r := rec(host, fencing.BackstopReset)
			r.Signer, r.Sig, r.Epoch, r.Incarnation, r.Seq, r.PrevRev = host+"-key", "sig", 2, 3, 10, 5
			tr.Stored(host, 10, t0)
			tr.Observe(t0, host, 10, r) // the host's renewal at 10, stored at t0
			// Its next record, sealed for 10 (a withheld relay, or its own
			// renewal), landing at 12 a minute later; the withdrawal at 11
			// was skipped or there was none.
			if c.skip {
				tr.Skipped(12)
			}
			r.Seq, r.PrevRev = 11, 10
			tr.Stored(host, 12, t0.Add(time.Minute))
			tr.Observe(t0.Add(time.Minute), host, 12, r)
			if got := tr.ReceiptsMatter(host); got != c.wantMatter {
				t.Fatalf("ReceiptsMatter = %t, want %t", got, c.wantMatter)
			}
			if got := tr.ReceiptsCover(host, c.created); got != c.wantCover {
				t.Fatalf("ReceiptsCover = %t, want %t", got, c.wantCover)
			}
		})
	}
}
