package controller_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestX20RollbackPinNATS: reviewer X20's TestX20PinTakenAfterStreamRollback
// on a real nats-server whose lease stream really rolls back: its store
// directory is put back to a copy taken before its last writes (what a
// disk restored from a backup, or a replica that lost acknowledged
// writes, looks like), while the controllers' memory bucket keeps what
// the leader wrote since.
//
// Before the rollback: the dead host's signed active record (T), then
// another host's renewal (T+1) and a compromised node's garbage in the
// dead host's key (R1 = T+2); the leader's pin {record, T, R1, the
// stream's creation time, the garbage's stored time}. After it: the
// host's own withdrawal lands at T+1 and garbage again at R1. Measured
// here: the stream keeps its creation time and hands R1 out again, at
// another stored time. A controller started on it must not take the pin
// (its record would be declared: a withdrawn host, guests running);
// with storedMutation (the check off) it takes it — the hole.
func TestX20RollbackPinNATS(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		name := "stored-time-checked"
		if mutation {
			name = "storedMutation"
		}
		t.Run(name, func(t *testing.T) {
			const dead, other = "x20-dead.example.org", "x20-other.example.org"
			f := newFleetOf(t, []string{dead, other})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dir := t.TempDir()
			srv := deliverytest.StartJetStream(t, dir, -1)
			st, cb := x20Open(t, ctx, srv)
			rec := func(h string, seq uint64, state fencing.LeaseState) fencing.LeaseRecord {
				return fencing.LeaseRecord{Schema: 1, Host: h, State: state, FencingEnabled: true,
					Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: fencing.DefaultTiming(), Seq: seq}
			}
			renew := func(st *natslease.Store, h string, r fencing.LeaseRecord, rev uint64) uint64 {
				res := f.store(st, h, true, nil).Renew(ctx, fencing.RenewRequest{Seq: r.Seq, Record: r, Revision: rev}, 5*time.Second)
				if res.Outcome != fencing.RenewAcked {
					t.Fatalf("%s: %+v", h, res)
				}
				return res.Revision
			}
			active := rec(dead, 1, fencing.LeaseActive)
			trusted := renew(st, dead, active, 0)
			otherRev := renew(st, other, rec(other, 1, fencing.LeaseActive), 0)
			controllertest.Restart(t, &srv, dir, "", -1) // a copy of the lease stream as it is now
			backup := controllertest.StreamCopy(t, dir)
			st, cb = x20Open(t, ctx, srv)
			renew(st, other, rec(other, 2, fencing.LeaseActive), otherRev) // T+1
			tok, _ := proto.HostToken(dead)
			r1, err := st.KV.Put(ctx, tok, []byte("garbage")) // R1: the compromised node
			if err != nil {
				t.Fatal(err)
			}
			e, err := st.KV.Get(ctx, tok)
			if err != nil || e.Revision() != r1 {
				t.Fatalf("read the garbage back: %v (%v)", e, err)
			}
			before := e.Created()
			stream, err := controller.StreamID(ctx, st.KV)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(controller.Memory{Beacons: true, Pin: &controller.MemoryPin{Record: f.signers[dead].Seal(active, 0),
				TrustedRev: trusted, KeyRev: r1, Stream: stream, KeyStored: before.UnixNano()}})
			if _, err := cb.Memory.Put(ctx, tok, b); err != nil { // what the leader wrote
				t.Fatal(err)
			}

			controllertest.Restart(t, &srv, dir, backup, -1) // the lease stream rolls back; the memory does not
			st, cb = x20Open(t, ctx, srv)
			if id, err := controller.StreamID(ctx, st.KV); err != nil || id != stream {
				t.Fatalf("after the rollback the stream's creation time is %q (%v), before %q: the rig rolled back nothing like X20's", id, err, stream)
			}
			withdrawn := rec(dead, 2, fencing.LeaseWithdrawn)
			withdrawn.Reason = "orderly-stop"
			if rev := renew(st, dead, withdrawn, trusted); rev != r1-1 { // the host's orderly stop
				t.Fatalf("withdrawal at %d, want %d: the stream did not roll back", rev, r1-1)
			}
			again, err := st.KV.Put(ctx, tok, []byte("garbage"))
			if err != nil || again != r1 {
				t.Fatalf("garbage again at %d (%v), want R1 %d", again, err, r1)
			}
			if e, err = st.KV.Get(ctx, tok); err != nil || e.Created().Equal(before) {
				t.Fatalf("the reused revision %d stored at %v, before at %v (%v)", r1, e.Created(), before, err)
			}
			t.Logf("R1 %d: stored %s before the rollback, %s after; stream created %s both times", r1, before.Format(time.RFC3339Nano), e.Created().Format(time.RFC3339Nano), stream)

			defer controller.SetStoredMutation(mutation)()
			tr, err := controller.NewTracker(controller.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var restored []string
			r := &controller.Runner{Store: f.store(st, "ctl", true, nil), Tracker: tr, Memory: cb.Memory, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				OnDecision: func(d controller.Decision, _ error) {
					if d.Op == controller.OpInvalid && strings.Contains(d.Reason, "restored from the controllers' memory") {
						mu.Lock()
						restored = append(restored, d.Host)
						mu.Unlock()
					}
				},
			}
			runUntilListed(t, ctx, r, 2)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case !mutation && len(restored) > 0:
				t.Fatalf("the pin of %v was taken from the rolled-back stream's reused revision %d: the withdrawn host would be declared", restored, r1)
			case mutation && len(restored) == 0:
				t.Fatalf("with storedMutation the pin was not taken either: the rig does not reach X20's hole")
			}
		})
	}
}

// x20Open connects to srv and opens the lease bucket and the controllers'
// buckets (signing required).
func x20Open(t *testing.T, ctx context.Context, srv *server.Server) (*natslease.Store, controller.ControlBuckets) {
	t.Helper()
	st, nc := leaseBucket(ctx, t, srv.ClientURL())
	js, _ := jetstream.New(nc)
	cb, err := controller.EnsureControlBuckets(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return st, cb
}
