package natslease_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestAnchoredCreate: on nats-server, an agent's create over a delete
// marker (Renew on revision 0) is sealed for the marker's revision and
// written by a compare-and-set on it: its stored header equals its
// prev_rev, so a controller verifies it written fresh
// (fencing.Written.Fresh) as it does a renewal — no beacon needed to vouch
// for it (controller/vouch.go). A copy of it put back over a later marker
// (the delete loop's replay) is not fresh, and is a replay by revision
// (fencing.StaleRecord). A create on a key that never held a message
// stays a plain create (header 0 = prev_rev 0: fresh already). With
// AnchorMutation (a create sealed for 0, as before) the create over the
// marker is not verifiable: the hole the vouching had to cover.
func TestAnchoredCreate(t *testing.T) {
	for _, mut := range []bool{false, true} {
		name := "anchored"
		if mut {
			name = "AnchorMutation"
		}
		t.Run(name, func(t *testing.T) {
			if mut {
				natslease.AnchorMutation = true
				t.Cleanup(func() { natslease.AnchorMutation = false })
			}
			st, _, ring, ctx := signedStore(t)
			kv := st.KV
			const to = 2 * time.Second
			fresh := func(what string, rev uint64) (fencing.LeaseRecord, bool) {
				t.Helper()
				rec, crev, err := st.Read(ctx, "h0")
				if err != nil || crev != rev {
					t.Fatalf("%s: read %+v at %d: %v, want revision %d", what, rec, crev, err, rev)
				}
				w, err := st.WrittenOn(ctx, "h0", rev, time.Second)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				ok, why := w.Fresh(*rec)
				t.Logf("%s at %d: prev_rev %d, %+v: fresh %t %s", what, rev, rec.PrevRev, w, ok, why)
				return *rec, ok
			}

			// A key that never held a message: a plain create, fresh.
			res := st.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("first create: %+v", res)
			}
			if rec, ok := fresh("first create", res.Revision); !ok || rec.PrevRev != 0 {
				t.Errorf("first create: prev_rev %d, fresh %t; want 0, fresh", rec.PrevRev, ok)
			}
			// Deleted (the loop): the next write is a create over the marker.
			if err := kv.Delete(ctx, "h0"); err != nil {
				t.Fatal(err)
			}
			marker := res.Revision + 1
			res = st.Renew(ctx, fencing.RenewRequest{Seq: 2, Revision: res.Revision, Record: activeRecord("h0", 2)}, to)
			if res.Outcome != fencing.RenewConflict || res.Current != nil {
				t.Fatalf("CAS after the delete: %+v, want a conflict with no record", res)
			}
			res = st.Renew(ctx, fencing.RenewRequest{Seq: 3, Record: activeRecord("h0", 3)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("create over the marker: %+v", res)
			}
			created, ok := fresh("create over the marker", res.Revision)
			if want := !mut; ok != want || mut == (created.PrevRev == marker) {
				t.Errorf("create over the marker at %d: prev_rev %d, fresh %t; want prev_rev %d (the marker), fresh %t", res.Revision, created.PrevRev, ok, map[bool]uint64{false: marker, true: 0}[mut], want)
			}
			if err := ring.VerifyRecord(created); err != nil {
				t.Errorf("the anchored create does not verify: %v", err)
			}
			// Its next renewal is a compare-and-set on it, as always.
			res = st.Renew(ctx, fencing.RenewRequest{Seq: 4, Revision: res.Revision, Record: activeRecord("h0", 4)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("renewal after the create: %+v", res)
			}
			if _, ok := fresh("renewal", res.Revision); !ok {
				t.Error("the renewal after the anchored create is not fresh")
			}
			if mut {
				return
			}
			// A copy of the anchored create put back over a later marker
			// (the delete loop's replay): not fresh, and stale by revision.
			last := res.Revision
			if err := kv.Delete(ctx, "h0"); err != nil {
				t.Fatal(err)
			}
			b, err := created.Encode()
			if err != nil {
				t.Fatal(err)
			}
			copyRev, err := kv.Create(ctx, "h0", b)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := fresh("copy over a later marker", copyRev); ok {
				t.Error("a copy of the anchored create put back over a later marker verified fresh")
			}
			if !fencing.StaleRecord(created, copyRev, last) {
				t.Errorf("the copy (prev_rev %d) at %d after revision %d is not stale", created.PrevRev, copyRev, last)
			}
		})
	}
}

// signedStore returns h0's Store (signing required, reads on the stream
// API) on a fresh embedded JetStream, its JetStream and keyring.
func signedStore(t *testing.T) (*natslease.Store, jetstream.JetStream, *fencing.Keyring, context.Context) {
	t.Helper()
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	keys, ring := fleetKeys(t, "h0")
	return &natslease.Store{KV: kv, NC: nc, Signer: keys["h0"], Keys: ring}, js, ring, ctx
}

// TestRelayedCreateAnchoredNATS: on nats-server, h0's key deleted while h0
// is cut off. A peer's relay of h0's renewal conflicts with no record, and
// the conflict names the delete marker (Store.absentAt): the answer h0
// gets says "key absent at m". h0 seals its next renewal for m, and the
// relay writes it by a compare-and-set on m: an anchored create whose
// stored header equals its prev_rev, verified fresh (fencing.Written.Fresh)
// with no beacon. With AbsentMarkerMutation the conflict names 0, h0
// seals a create for 0, and the relayed create is not verifiable — the
// open item relayed creates left (docs/security.md, "Anchored creates").
func TestRelayedCreateAnchoredNATS(t *testing.T) {
	for _, mut := range []bool{false, true} {
		name := "anchored"
		if mut {
			name = "AbsentMarkerMutation"
		}
		t.Run(name, func(t *testing.T) {
			if mut {
				natslease.AbsentMarkerMutation = true
				t.Cleanup(func() { natslease.AbsentMarkerMutation = false })
			}
			own, relayer, keys, ctx := relayStores(t)
			kv := own.KV
			const to = 2 * time.Second

			res := own.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, to)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("create: %+v", res)
			}
			last := res.Revision
			if err := kv.Delete(ctx, "h0"); err != nil {
				t.Fatal(err)
			}
			marker := last + 1
			relay := func(seq, rev uint64) fencing.RenewResult {
				rec := keys["h0"].Seal(activeRecord("h0", seq), rev)
				return relayer.Relay(ctx, fencing.RenewRequest{Seq: seq, Revision: rev, Record: rec}, to)
			}
			res = relay(2, last)
			t.Logf("relay on %d after the delete: %+v", last, res)
			if res.Outcome != fencing.RenewConflict || res.Current != nil || res.Invalid != "" {
				t.Fatalf("relay after the delete: %+v, want a conflict with no record", res)
			}
			if named := res.Revision == marker; named == mut {
				t.Fatalf("the conflict names revision %d, the marker is at %d: named %t, want %t", res.Revision, marker, named, !mut)
			}
			res = relay(3, res.Revision)
			if res.Outcome != fencing.RenewAcked {
				t.Fatalf("relayed create: %+v", res)
			}
			rec, crev, err := own.Read(ctx, "h0")
			if err != nil || crev != res.Revision || rec.Seq != 3 {
				t.Fatalf("read: %+v at %d: %v", rec, crev, err)
			}
			w, err := own.WrittenOn(ctx, "h0", crev, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			ok, why := w.Fresh(*rec)
			t.Logf("relayed create at %d: prev_rev %d, %+v: fresh %t %s", crev, rec.PrevRev, w, ok, why)
			if ok == mut {
				t.Errorf("relayed create over the marker: prev_rev %d, fresh %t, want fresh %t", rec.PrevRev, ok, !mut)
			}
		})
	}
}

// relayStores returns h0's Store and its peer h1's (the relayer), signing
// required, on a fresh embedded JetStream, with the fleet's signers.
func relayStores(t *testing.T) (own, relayer *natslease.Store, keys map[string]fencing.Signer, ctx context.Context) {
	t.Helper()
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	keys, ring := fleetKeys(t, "h0", "h1")
	own = &natslease.Store{KV: kv, NC: nc, Signer: keys["h0"], Keys: ring}
	relayer = &natslease.Store{KV: kv, NC: nc, Signer: keys["h1"], Keys: ring}
	return own, relayer, keys, ctx
}
