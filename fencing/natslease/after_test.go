package natslease_test

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestWatchAfterNATS: on nats-server, Store.Watch's Update.After names a
// key's previous message when the watch delivered it live and every
// message of the bucket since: a value listed at the start has none, a
// key's first live message none, the next one its predecessor's revision
// whatever other keys were written between; a delete marker counts as a
// message. The anchored create after a delete is delivered with After =
// the marker, its prev_rev: fencing.Written{After} says it was written
// fresh with its stored message gone (reviewer X85's race).
func TestWatchAfterNATS(t *testing.T) {
	st, _, _, ctx := signedStore(t)
	const to = 2 * time.Second
	res := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, to)
	if res.Outcome != fencing.RenewAcked {
		t.Fatalf("create: %+v", res)
	}
	out := make(chan natslease.Update, 64)
	synced := make(chan struct{})
	go func() { _ = st.Watch(ctx, out, synced) }()
	next := func(what string) natslease.Update {
		t.Helper()
		for {
			select {
			case u := <-out:
				if u.Listed {
					continue
				}
				t.Logf("%s: %s at %d, after %d (skipped %t, record %t)", what, u.Host, u.Revision, u.After, u.Skipped, u.Record != nil)
				return u
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: no update", what)
			}
		}
	}
	if u := next("listed"); u.Revision != res.Revision || u.After != 0 {
		t.Fatalf("listed value: %+v, want revision %d with no After", u, res.Revision)
	}
	<-synced
	r2 := st.Renew(ctx, fencing.RenewRequest{Seq: 2, Revision: res.Revision, Record: activeRecord("h0", 2)}, to)
	if u := next("first live"); u.Revision != r2.Revision || u.After != 0 {
		t.Fatalf("first live value: %+v, want revision %d with no After (none of h0 delivered live before)", u, r2.Revision)
	}
	// Another key written between: h0's next still names its predecessor.
	if _, err := st.KV.Put(ctx, "h1", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if u := next("h1"); u.Host != "h1" || u.After != 0 {
		t.Fatalf("h1: %+v", u)
	}
	if err := st.KV.Delete(ctx, "h0"); err != nil {
		t.Fatal(err)
	}
	del := next("marker")
	if del.Record != nil || del.After != r2.Revision {
		t.Fatalf("h0's marker: %+v, want a delete after %d", del, r2.Revision)
	}
	c := st.Renew(ctx, fencing.RenewRequest{Seq: 3, Record: activeRecord("h0", 3)}, to)
	if c.Outcome != fencing.RenewAcked {
		t.Fatalf("anchored create: %+v", c)
	}
	u := next("anchored create")
	if u.Record == nil || u.Revision != c.Revision || u.After != del.Revision {
		t.Fatalf("anchored create: %+v, want revision %d after the marker %d", u, c.Revision, del.Revision)
	}
	if ok, why := (fencing.Written{After: u.After}).Fresh(*u.Record); !ok {
		t.Errorf("the anchored create, delivered after the marker it was sealed for (prev_rev %d), not fresh: %s", u.Record.PrevRev, why)
	}
}

// TestAdjacencySkips: Update.After in the cases nats-server cannot be made
// to show on demand. A skip anywhere in the bucket between a key's two
// deliveries (a value superseded before the watch reached it — it may
// have been this key's) leaves the second with no After; a skip before
// the first does not; another key's messages do not; the memory, full
// (made-up keys), is dropped rather than guessed.
func TestAdjacencySkips(t *testing.T) {
	var a natslease.Adjacency
	see := func(host string, rev uint64, skipped bool, want uint64) {
		t.Helper()
		if got := a.See(host, rev, skipped, true); got != want {
			t.Errorf("%s at %d (skipped %t): After %d, want %d", host, rev, skipped, got, want)
		}
	}
	a.See("h0", 10, true, false) // listed
	a.See("", 11, true, false)   // the guard, listed
	see("h0", 12, false, 0)      // first live: nothing live before
	see("h1", 13, false, 0)
	see("h0", 14, false, 12)
	see("", 15, false, 0)   // the guard
	see("h1", 17, true, 0)  // 16 skipped: maybe h1's
	see("h0", 18, false, 0) // 16 may have been h0's too
	see("h0", 19, false, 18)
	see("h2", 21, true, 0) // 20 skipped, after h0's 19
	see("h0", 22, false, 0)
	for i := range natslease.MaxWatchAfter {
		a.See(fmt.Sprintf("made-up-%d", i), uint64(23+i), false, true)
	}
	see("h0", uint64(23+natslease.MaxWatchAfter), false, 0) // forgotten, not guessed
}
