package natslease_test

import (
	"context"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestRelayNeverOverwritesAnotherProcess (reviewer R2): a peer relays a
// question of the host's previous agent process (incarnation 1, asked
// before it crashed; questions are valid for 30 s) after the next process
// (incarnation 2, restarted with a longer lease_ttl) renewed on the same
// epoch. The relay's CAS conflicts with that record; the retry contract
// ("the asker's own active record of the same epoch") must not cover a
// record of another process: the retry wrote incarnation 1's stale record,
// with the old, shorter lease_ttl, over it. The controller then declares
// from the stale record's constants (L + 30.5 s) a host whose live agent
// counts its lease with lease_ttl 60 s (it fences at L + 55 s).
func TestRelayNeverOverwritesAnotherProcess(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	const to = 2 * time.Second
	p1 := activeRecord("h0", 7)
	p1.Incarnation = 1
	res := st.Renew(ctx, fencing.RenewRequest{Seq: 7, Record: p1}, to)
	if res.Outcome != fencing.RenewAcked {
		t.Fatalf("create: %+v", res)
	}
	p2 := activeRecord("h0", 1)
	p2.Incarnation = 2
	p2.Timing.LeaseTTL = 60 * time.Second
	r2 := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Revision: res.Revision, Record: p2}, to)
	if r2.Outcome != fencing.RenewAcked {
		t.Fatalf("process 2: %+v", r2)
	}
	stale := p1
	stale.Seq = 8
	rr := st.Relay(ctx, fencing.RenewRequest{Seq: 8, Revision: res.Revision, Record: stale}, to)
	cur, _, err := st.Read(ctx, "h0")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Incarnation != 2 || rr.Outcome == fencing.RenewAcked {
		t.Fatalf("the stale relay of incarnation 1 landed over incarnation 2's record: %+v; key now incarnation %d, lease_ttl %s",
			rr, cur.Incarnation, cur.Timing.LeaseTTL)
	}
}
