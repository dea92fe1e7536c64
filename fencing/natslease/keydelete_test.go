package natslease_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
)

// newStore returns a Store on a fresh embedded JetStream.
func newStore(t *testing.T) *natslease.Store {
	t.Helper()
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := natslease.EnsureBucket(context.Background(), js, true)
	if err != nil {
		t.Fatal(err)
	}
	return &natslease.Store{KV: kv}
}

func activeRecord(host string, seq uint64) fencing.LeaseRecord {
	return fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: host, BootID: "b", State: fencing.LeaseActive, Seq: seq,
		FencingEnabled: true, Action: fencing.ActionPause, Backstop: fencing.BackstopWatchdog, Timing: fencing.DefaultTiming()}
}

// TestRenewAndRelayRecoverFromDeleteAndPurge: against a real KV, a key
// deleted by an operator leaves a marker (a purge is refused: the bucket
// forbids rollups); a renewal (or relay) on
// the old revision conflicts with no current record, and one on revision 0
// (create) lands over the marker — own renewals and relays alike. A create
// never lands over a record. Before the fix, the create was an Update on
// revision 0, which the marker rejected forever (the host fenced itself and
// stayed fenced).
func TestRenewAndRelayRecoverFromDeleteAndPurge(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	const to = 2 * time.Second
	for _, tc := range []struct {
		name  string
		erase func(key string) error
		relay bool
	}{
		{"delete", func(k string) error { return st.KV.Delete(ctx, k) }, false},
		{"purge", func(k string) error { return st.KV.Purge(ctx, k) }, false},
		{"delete-relay", func(k string) error { return st.KV.Delete(ctx, k) }, true},
		{"purge-relay", func(k string) error { return st.KV.Purge(ctx, k) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := "node-" + tc.name
			write := st.Renew
			if tc.relay {
				write = st.Relay
			}
			res := write(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord(host, 1)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("create: %+v", res)
			}
			rev := res.Revision
			if err := tc.erase(host); strings.HasPrefix(tc.name, "purge") {
				// The bucket forbids rollups (CreateBucket): a KV purge
				// is a rollup, refused by the server.
				if err == nil || !strings.Contains(err.Error(), "10111") {
					t.Fatalf("purge of a lease key: %v, want refused (10111: rollup not permitted)", err)
				}
				return
			} else if err != nil {
				t.Fatal(err)
			}
			if _, _, err := st.Read(ctx, host); err == nil {
				t.Fatal("read after the erase found a record")
			}
			res = write(ctx, fencing.RenewRequest{Seq: 2, Revision: rev, Record: activeRecord(host, 2)}, to)
			if res.Outcome != fencing.RenewConflict || res.Current != nil {
				t.Fatalf("CAS on the old revision after %s: %+v, want a conflict with no current record", tc.name, res)
			}
			res = write(ctx, fencing.RenewRequest{Seq: 3, Revision: 0, Record: activeRecord(host, 3)}, to)
			if res.Outcome != fencing.RenewAcked || res.Revision <= rev {
				t.Fatalf("create over the %s marker: %+v (before the fix: a conflict, forever)", tc.name, res)
			}
			cur, crev, err := st.Read(ctx, host)
			if err != nil || cur.Seq != 3 || crev != res.Revision {
				t.Fatalf("read: %+v %d %v", cur, crev, err)
			}
			if tc.relay {
				return // the relay contract retries over the asker's own active record
			}
			// A create never lands over a record.
			again := write(ctx, fencing.RenewRequest{Seq: 4, Revision: 0, Record: activeRecord(host, 4)}, to)
			if again.Outcome != fencing.RenewConflict || again.Current == nil || again.Current.Seq != 3 || again.Revision != crev {
				t.Fatalf("create over a record: %+v", again)
			}
		})
	}
}

// TestSelfDeclarationOverMarkerThenRelease: the record a fenced agent
// writes after finding its key deleted (an expired record, created over the
// marker) is an ordinary declaration for the release path: the operator's
// release CAS on its revision lands, the agent's renewals (creates) do not
// overwrite it.
func TestSelfDeclarationOverMarkerThenRelease(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	res := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, time.Second)
	if res.Outcome != fencing.RenewAcked {
		t.Fatal(res)
	}
	if err := st.KV.Delete(ctx, "h0"); err != nil {
		t.Fatal(err)
	}
	decl := activeRecord("h0", 2)
	decl.State, decl.Epoch = fencing.LeaseExpired, 1
	res = st.Renew(ctx, fencing.RenewRequest{Seq: 2, Record: decl}, time.Second)
	if res.Outcome != fencing.RenewAcked {
		t.Fatalf("self-declaration over the purge marker: %+v", res)
	}
	renew := st.Renew(ctx, fencing.RenewRequest{Seq: 3, Record: activeRecord("h0", 3)}, time.Second)
	if renew.Outcome != fencing.RenewConflict || renew.Current == nil || renew.Current.State != fencing.LeaseExpired {
		t.Fatalf("a create over the self-declaration: %+v", renew)
	}
	rel := decl
	rel.State = fencing.LeaseReleased
	if _, err := st.Write(ctx, "h0", res.Revision, rel, time.Second); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestKeyDeletedHealthyAgentKeepsRenewing: the pure agent on a real KV (the
// partition rig, timing ×0.1): its key is deleted, then purged, while it
// is healthy: it re-creates the key and keeps renewing; nothing is paused.
// Before the fix its creates (Update on revision 0) failed on the marker
// forever: it fenced itself ~1 s later and stayed fenced.
func TestKeyDeletedHealthyAgentKeepsRenewing(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var deleted, purged bool
	r.run(ctx, func(el time.Duration) {
		switch {
		case !deleted && el > 2*time.Second:
			deleted = true
			r.logf("DELETE h0")
			if err := r.ctrlKV.KV.Delete(ctx, "h0"); err != nil {
				t.Error(err)
			}
		case !purged && el > 4*time.Second:
			purged = true
			r.logf("DELETE h0 again")
			if err := r.ctrlKV.KV.Delete(ctx, "h0"); err != nil {
				t.Error(err)
			}
		case el > 7*time.Second:
			cancel()
		}
	})
	if !r.fencedAt.IsZero() || r.agent.State() != fencing.StateHealthy {
		t.Fatalf("state %s, fenced at %v\n%s", r.agent.State(), r.fencedAt, r.dump())
	}
	rec, _, err := r.ctrlKV.Read(context.Background(), "h0")
	if err != nil || rec.State != fencing.LeaseActive {
		t.Fatalf("record %+v %v\n%s", rec, err, r.dump())
	}
	t.Logf("\n%s", r.dump())
}

// TestKeyDeletedFencedAgentStaysFenced: the agent is cut off and fences;
// its key is deleted (which may erase a declaration) and the link heals:
// it does not rejoin or resume, it writes an expired record of its own
// (epoch 1) over the marker and waits for the release.
func TestKeyDeletedFencedAgentStaysFenced(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cut, healed bool
	var healedAt time.Time
	r.run(ctx, func(el time.Duration) {
		switch {
		case !cut && el > 2*time.Second:
			cut = true
			r.logf("CUT")
			r.prx.Blackhole(true)
		case cut && !healed && !r.fencedAt.IsZero():
			healed, healedAt = true, time.Now()
			r.logf("DELETE h0, HEAL")
			if err := r.ctrlKV.KV.Delete(ctx, "h0"); err != nil {
				t.Error(err)
			}
			r.prx.Blackhole(false)
		case healed && time.Since(healedAt) > 3*time.Second:
			cancel()
		}
	})
	if r.agent.State() != fencing.StateAwaitingRelease || !r.resumed.IsZero() {
		t.Fatalf("state %s, resumed %v\n%s", r.agent.State(), r.resumed, r.dump())
	}
	rec, _, err := r.ctrlKV.Read(context.Background(), "h0")
	if err != nil || rec.State != fencing.LeaseExpired || rec.Epoch != 1 {
		t.Fatalf("record %+v %v: want the agent's own expired record of epoch 1\n%s", rec, err, r.dump())
	}
	t.Logf("\n%s", r.dump())
}

// TestRelayThroughPeerEndpointAfterDelete: a healthy peer (the real
// peer.Handler over HTTP, relaying with a real Store) is asked to relay for
// h0 after h0's key was purged: the relay on h0's old revision is rejected
// and the answer says the key holds no record (key_absent), which makes
// h0's next renewal a create; that one is relayed and lands over the
// marker.
func TestRelayThroughPeerEndpointAfterDelete(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	res := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, time.Second)
	if res.Outcome != fencing.RenewAcked {
		t.Fatal(res)
	}
	if err := st.KV.Delete(ctx, "h0"); err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef-fleet")
	h := &peer.Handler{Host: "h1", Secret: secret, Relayer: st, View: func() (fencing.PeerView, time.Time) {
		now := time.Now()
		return fencing.PeerView{Lease: true, LastAck: now, Timing: fencing.DefaultTiming()}, now
	}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := &peer.Client{Host: "h0", Secret: secret, URL: func(string) string { return srv.URL + peer.Path }}
	ask := func(rev, seq uint64) fencing.PeerAnswer {
		rd := fencing.PeerRound{ID: seq, Peers: []string{"h1"}, Renewal: fencing.RenewRequest{Seq: seq, Revision: rev, Record: activeRecord("h0", seq)}}
		ans, err := c.Ask(ctx, "h1", rd)
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	if ans := ask(res.Revision, 2); ans.Kind != fencing.PeerRelayFailed || !ans.KeyAbsent || ans.Current != nil {
		t.Fatalf("relay on the old revision after a purge: %+v, want relay-failed with key_absent", ans)
	}
	if ans := ask(0, 3); ans.Kind != fencing.PeerRelayed || ans.Revision <= res.Revision {
		t.Fatalf("relayed create over the marker: %+v", ans)
	}
	if cur, _, err := st.Read(ctx, "h0"); err != nil || cur.Seq != 3 {
		t.Fatalf("read %+v %v", cur, err)
	}
}
