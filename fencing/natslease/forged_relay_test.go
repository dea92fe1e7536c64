package natslease_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/keyfile"
	"hvguard/fencing/natslease"
	"hvguard/fencing/peer"
)

// fleetKeys generates a key pair per name ("ctl": the controller) and the
// keyring every member trusts (signing: required).
func fleetKeys(t *testing.T, names ...string) (map[string]fencing.Signer, *fencing.Keyring) {
	t.Helper()
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{}}
	signers := map[string]fencing.Signer{}
	for _, n := range append(names, "ctl") {
		path := filepath.Join(t.TempDir(), n+".seed")
		pub, err := keyfile.Generate(path)
		if err != nil {
			t.Fatal(err)
		}
		s, err := keyfile.Signer(path)
		if err != nil {
			t.Fatal(err)
		}
		k, _ := keyfile.Public(pub)
		signers[n] = s
		if n == "ctl" {
			ring.Controllers = append(ring.Controllers, k)
		} else {
			ring.Hosts[n] = []fencing.PublicKey{k}
		}
	}
	return signers, ring
}

// TestForgedRelayRefused (issue 11): a compromised node (h1) holding the
// fleet's peer secret sends a healthy peer (h2) a question claiming to come
// from h0, carrying h0's record (read from the bucket) with state expired
// and revision 0. Before the fix, the create conflicted with h0's active
// record, the relay contract retried on its revision, and h0's key turned
// expired: h0 fenced itself at its next renewal and the controller counted
// it declared (failed on the merge base: "a forged relay turned h0's key
// expired (seq 6)"). Now a relay carries only active records; with signed
// records (signing: required), only those signed by the asker's own host
// key for the revision they are written on: a tampered record, one signed
// by the attacker's key, and a replay of an earlier genuine record are all
// refused and h0's key is unchanged; a genuine relay still lands.
func TestForgedRelayRefused(t *testing.T) {
	ctx := context.Background()
	secret := []byte("0123456789abcdef-fleet")
	ask := func(url string, rec fencing.LeaseRecord, rev uint64) (fencing.PeerAnswer, error) {
		// The attacker's client: the fleet secret, claiming to be h0.
		c := &peer.Client{Host: "h0", Secret: secret, URL: func(string) string { return url }}
		return c.Ask(ctx, "h2", fencing.PeerRound{ID: rec.Seq, Peers: []string{"h2"}, Renewal: fencing.RenewRequest{Seq: rec.Seq, Revision: rev, Record: rec}})
	}
	unchanged := func(t *testing.T, st *natslease.Store, what string, wantSeq uint64) {
		t.Helper()
		after, _, err := st.Read(ctx, "h0")
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if after.State != fencing.LeaseActive || after.Seq != wantSeq {
			t.Fatalf("%s: h0's key turned %s (seq %d)", what, after.State, after.Seq)
		}
	}

	t.Run("unsigned", func(t *testing.T) {
		st := newStore(t)
		res := st.Renew(ctx, fencing.RenewRequest{Seq: 5, Record: activeRecord("h0", 5)}, time.Second)
		if res.Outcome != fencing.RenewAcked {
			t.Fatal(res)
		}
		url := controllertest.PeerEndpoint(t, "h2", secret, st)
		cur, _, err := st.Read(ctx, "h0")
		if err != nil {
			t.Fatal(err)
		}
		forged := *cur
		forged.State = fencing.LeaseExpired
		forged.Seq++
		ans, err := ask(url, forged, 0)
		t.Logf("answer %+v, %v", ans, err)
		unchanged(t, st, "forged expired relay", 5)
	})

	t.Run("signed", func(t *testing.T) {
		keys, ring := fleetKeys(t, "h0", "h1", "h2")
		base := newStore(t)
		own := &natslease.Store{KV: base.KV, Signer: keys["h0"], Keys: ring}
		var refused []error
		relayer := &natslease.Store{KV: base.KV, Signer: keys["h2"], Keys: ring, OnInvalid: func(_ string, _ uint64, err error) { refused = append(refused, err) }}
		url := controllertest.PeerEndpoint(t, "h2", secret, relayer)
		r1 := own.Renew(ctx, fencing.RenewRequest{Seq: 1, Record: activeRecord("h0", 1)}, time.Second)
		r2 := own.Renew(ctx, fencing.RenewRequest{Seq: 2, Revision: r1.Revision, Record: activeRecord("h0", 2)}, time.Second)
		if r1.Outcome != fencing.RenewAcked || r2.Outcome != fencing.RenewAcked {
			t.Fatal(r1, r2)
		}
		cur, rev, err := relayer.Read(ctx, "h0")
		if err != nil {
			t.Fatal(err)
		}
		first := keys["h0"].Seal(activeRecord("h0", 1), 0) // h0's first record, as it was in the key

		tampered := *cur
		tampered.State = fencing.LeaseExpired
		byAttacker := keys["h1"].Seal(activeRecord("h0", 9), rev) // keeps a dead h0 "alive"
		expiredByAttacker := keys["h1"].Seal(fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseExpired, Epoch: 1}, rev)
		for _, c := range []struct {
			name string
			rec  fencing.LeaseRecord
			rev  uint64
		}{
			{"tampered (h0's signature, state expired)", tampered, 0},
			{"tampered on the current revision", tampered, rev},
			{"active record signed by the attacker", byAttacker, rev},
			{"expired record signed by the attacker", expiredByAttacker, rev},
			{"replay of h0's first record", first, 0},
			{"replay of h0's first record on the current revision", first, rev},
			{"h0's current record again", *cur, rev},
		} {
			ans, err := ask(url, c.rec, c.rev)
			if err != nil || ans.Kind == fencing.PeerRelayed {
				t.Errorf("%s: answer %+v, %v", c.name, ans, err)
			}
			unchanged(t, relayer, c.name, 2)
		}
		if len(refused) < 5 {
			t.Errorf("refusals reported: %d (%v)", len(refused), refused)
		}
		// A genuine relay: h0's next record sealed by h0 for the current
		// revision.
		ans, err := ask(url, keys["h0"].Seal(activeRecord("h0", 3), rev), rev)
		if err != nil || ans.Kind != fencing.PeerRelayed {
			t.Fatalf("genuine relay: %+v %v", ans, err)
		}
		unchanged(t, relayer, "genuine relay", 3)
	})
}
