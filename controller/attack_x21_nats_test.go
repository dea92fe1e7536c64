package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestX21WatchAcrossRollbackNATS checks the model behind reviewer X21's
// TestX21PinLaunderedByRollbackWhileRunning and
// TestX21RollbackBelowTrustedRevIgnoresWithdrawalBeacon on a real
// nats-server: a controller's natslease.Store.Watch that runs while the
// lease stream is rolled back (the server restarted on a store directory
// restored from an older copy, same port: the client reconnects) never
// delivers the revisions the rollback hands out again up to L (the last
// it delivered), and delivers L+1 as L's successor — Skipped false, no
// revision below L (no revision-regressed). This test PASSES: it is the
// rig's realism check, not a hole.
func TestX21WatchAcrossRollbackNATS(t *testing.T) {
	// Not parallel: it restarts nats-server on the same port, which a
	// parallel test's socket may take meanwhile (seen under load).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, dir, port := controllertest.RollbackServer(t)
	nc, kv := x21Conn(t, ctx, srv, 100*time.Millisecond)
	a, _ := proto.HostToken("x21-a.example.org") // h3
	b, _ := proto.HostToken("x21-b.example.org")
	put := func(k, v string) uint64 {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			pctx, c := context.WithTimeout(ctx, time.Second)
			r, err := kv.Put(pctx, k, []byte(v))
			c()
			if err == nil {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %s: %v", k, err)
			}
		}
	}
	put(a, "a1")
	put(b, "b2")
	controllertest.Restart(t, &srv, dir, "", port)
	backup := controllertest.StreamCopy(t, dir) // the lease stream at revision 2
	controllertest.Restart(t, &srv, dir, "", port)

	st := &natslease.Store{KV: kv, NC: nc}
	out := make(chan natslease.Update, 1024)
	go func() { _ = st.Watch(ctx, out, make(chan struct{})) }()
	next := func(what string, timeout time.Duration) (natslease.Update, bool) {
		select {
		case u := <-out:
			return u, true
		case <-time.After(timeout):
			return natslease.Update{}, false
		}
	}
	// The watch's listing done first (its Listed marker), as a running
	// controller's: the marker came after the rollback when the puts below
	// raced the listing (seen 1 run in 6 on a quiet machine).
	for deadline := time.Now().Add(20 * time.Second); ; {
		u, ok := next("listing", time.Until(deadline))
		if !ok {
			t.Fatal("the watch never finished its first listing")
		}
		if u.Listed {
			break
		}
	}
	// C1 is delivered a@3 (the host's renewal: trusted at T), b@4, b@5: L = 5.
	put(a, "a3")
	put(b, "b4")
	last := put(b, "b5")
	for deadline := time.Now().Add(60 * time.Second); ; {
		u, ok := next("pre", time.Until(deadline))
		if !ok {
			t.Fatalf("the watch never delivered revision %d before the rollback", last)
		}
		t.Logf("before the rollback: %s rev %d skipped %v listed %v", u.Host, u.Revision, u.Skipped, u.Listed)
		if u.Revision == last {
			break
		}
	}

	controllertest.Restart(t, &srv, dir, backup, port) // the lease stream rolls back to revision 2
	w := put(a, "withdrawn")                           // reused: 3 (h3's orderly stop)
	put(b, "b4'")                                      // reused: 4
	if r := put(b, "b5'"); r != last {                 // reused: 5 = L
		t.Fatalf("padding ended at %d, want L %d: the stream did not roll back", r, last)
	}
	g := put(a, "garbage") // L+1: the compromised node
	t.Logf("after the rollback: withdrawal at %d, garbage at %d (L %d)", w, g, last)
	for deadline := time.Now().Add(90 * time.Second); ; {
		u, ok := next("post", time.Until(deadline))
		if !ok {
			t.Fatalf("the watch delivered nothing up to revision %d within 90 s after the rollback", g)
		}
		t.Logf("after the rollback: %s rev %d skipped %v listed %v stored %s", u.Host, u.Revision, u.Skipped, u.Listed, u.Stored.Format(time.RFC3339Nano))
		if u.Listed || u.Revision <= last {
			t.Fatalf("the watch delivered revision %d (listed %v) after the rollback: the rig's model (nothing up to L delivered) is wrong", u.Revision, u.Listed)
		}
		if u.Revision == g {
			if u.Skipped {
				t.Fatalf("L+1 delivered as Skipped: the rig's model (no skip) is wrong; the pin would not move along")
			}
			return
		}
	}
}

// x21Conn connects to srv, reconnecting for ever every wait, and opens
// the lease bucket.
func x21Conn(t *testing.T, ctx context.Context, srv *server.Server, wait time.Duration) (*nats.Conn, jetstream.KeyValue) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(wait), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	return nc, kv
}

// TestRunnerStopsOnRollbackNATS: the runner's rollback check (rollback.go)
// on nats-server whose lease stream is rolled back while a real Runner
// runs (its store directory put back to an earlier copy; the server
// restarted on the same port, the runner's connection reconnects and its
// watch carries on without a skip: TestX21WatchAcrossRollbackNATS). The
// Runner must stop with ErrLeaseStreamRolledBack:
//   - "behind": it reconnects before anything is written again — the
//     stream's last revision is below the last one it was delivered;
//   - "refilled": another client (a compromised node, or the fleet's
//     renewals) writes the stream past that revision before the runner
//     reconnects (it retries every 2 s) — a reused revision holds another
//     message than the one delivered at it.
//
// With rollbackCheckMutation (no check; TestRunnerStopsOnRollbackMutationNATS,
// sequential: the mutation is a package variable) it runs on (the X21
// holes).
func TestRunnerStopsOnRollbackNATS(t *testing.T) {
	// Not parallel: it restarts nats-server on the same port, which a
	// parallel test's socket may take meanwhile (seen under load).
	runnerStopsOnRollbackNATS(t, false)
}

func TestRunnerStopsOnRollbackMutationNATS(t *testing.T) { runnerStopsOnRollbackNATS(t, true) }

func runnerStopsOnRollbackNATS(t *testing.T, mutation bool) {
	for _, c := range []struct {
		name     string
		refill   bool
		mutation bool
	}{{"behind", false, false}, {"refilled", true, false}, {"refilled/rollbackCheckMutation", true, true}} {
		if c.mutation != mutation {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if c.mutation { // only then: parallel tests read it
				defer controller.SetRollbackCheckMutation(true)()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv, dir, port := controllertest.RollbackServer(t)
			_, wkv := x21Conn(t, ctx, srv, 50*time.Millisecond) // the writer
			put := func(host string, seq uint64) uint64 {
				return x21Put(t, ctx, wkv, host, x21Rec(host, seq, fencing.LeaseActive))
			}
			hosts := []string{"x21-a.example.org", "x21-b.example.org", "x21-c.example.org"}
			for _, h := range hosts {
				put(h, 1)
			}
			controllertest.Restart(t, &srv, dir, "", port)
			backup := controllertest.StreamCopy(t, dir) // the stream at revision 3
			controllertest.Restart(t, &srv, dir, "", port)
			wait := 100 * time.Millisecond
			if c.refill {
				wait = 2 * time.Second
			}
			rnc, rkv := x21Conn(t, ctx, srv, wait)
			done := x21Run(t, ctx, rnc, rkv)
			var last uint64
			for i, h := range hosts { // revisions 4..6, delivered to the runner
				last = put(h, uint64(i)+2)
			}
			time.Sleep(time.Second) // delivered, and a check or two passed
			select {
			case err := <-done:
				t.Fatalf("the runner stopped before the rollback: %v", err)
			default:
			}
			controllertest.Restart(t, &srv, dir, backup, port) // rolled back to revision 3
			rolled := time.Now()
			if c.refill {
				var got uint64
				for i := range 5 { // reused 4..8: each host once (not superseded), then more
					got = put(hosts[i%3], uint64(i)+10)
				}
				if got <= last {
					t.Fatalf("refilled to %d, not past %d", got, last)
				}
			}
			select {
			case err := <-done:
				if c.mutation {
					t.Fatalf("with rollbackCheckMutation the runner stopped: %v", err)
				}
				if !errors.Is(err, controller.ErrLeaseStreamRolledBack) {
					t.Fatalf("the runner stopped with %v, want ErrLeaseStreamRolledBack", err)
				}
				t.Logf("stopped %s after the rollback: %v", time.Since(rolled).Round(10*time.Millisecond), err)
			case <-time.After(8 * time.Second):
				if !c.mutation {
					t.Fatalf("the runner ran on 8 s after its lease stream rolled back from revision %d to 3", last)
				}
			}
		})
	}
}

// x21Put puts data into host's key, retrying for 20 s (the server may be
// restarting), and returns its revision.
func x21Put(t *testing.T, ctx context.Context, kv jetstream.KeyValue, host string, data []byte) uint64 {
	t.Helper()
	tok, _ := proto.HostToken(host)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pctx, c := context.WithTimeout(ctx, time.Second)
		r, err := kv.Put(pctx, tok, data)
		c()
		if err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %s: %v", host, err)
		}
	}
}

// x21Rec is host's unsigned record in state st at seq.
func x21Rec(host string, seq uint64, st fencing.LeaseState) []byte {
	b, _ := fencing.LeaseRecord{Schema: 1, Host: host, State: st, FencingEnabled: true,
		Action: fencing.ActionPause, Backstop: fencing.BackstopReset, Timing: fencing.DefaultTiming(), Seq: seq}.Encode()
	return b
}

// x21Run runs a Runner (no signing, no memory) on nc and kv until ctx
// ends; its result comes on the channel.
func x21Run(t *testing.T, ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue) <-chan error {
	t.Helper()
	tr, err := controller.NewTracker(controller.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := &controller.Runner{Store: &natslease.Store{KV: kv, NC: nc}, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done
}
