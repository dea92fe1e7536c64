package fencing

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"
)

// testKey derives a deterministic key pair from a name.
func testKey(name string) (Signer, PublicKey) {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, name)
	priv := ed25519.NewKeyFromSeed(seed)
	id := "K" + name
	return Signer{ID: id, Key: priv}, PublicKey{ID: id, Key: priv.Public().(ed25519.PublicKey)}
}

func testKeyring(mode SigningMode) (*Keyring, map[string]Signer) {
	signers := map[string]Signer{}
	k := &Keyring{Mode: mode, Hosts: map[string][]PublicKey{}}
	for _, n := range []string{"h0", "h1"} {
		s, p := testKey(n)
		signers[n] = s
		k.Hosts[n] = []PublicKey{p}
	}
	s, p := testKey("ctl")
	signers["ctl"] = s
	k.Controllers = []PublicKey{p}
	return k, signers
}

func signedRecord(host string, st LeaseState) LeaseRecord {
	return LeaseRecord{Schema: RecordSchema, Host: host, BootID: "b", Epoch: 2, State: st, Incarnation: 3, Seq: 9,
		FencingEnabled: true, Action: ActionPause, Backstop: BackstopWatchdog, Timing: DefaultTiming(), Guard: &GuardVersion{Version: 4, Threshold: 2}}
}

func TestVerifyRecordRoles(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	cases := []struct {
		host   string
		state  LeaseState
		signer string
		ok     bool
	}{
		{"h0", LeaseActive, "h0", true},
		{"h0", LeaseWithdrawn, "h0", true},
		{"h0", LeaseExpired, "h0", true},  // self-declaration
		{"h0", LeaseReleased, "h0", true}, // --unfence on the host
		{"h0", LeaseExpired, "ctl", true},
		{"h0", LeaseReleased, "ctl", true},
		{"h0", LeaseActive, "ctl", false},
		{"h0", LeaseWithdrawn, "ctl", false},
		{"h0", LeaseActive, "h1", false}, // another host's key
		{"h0", LeaseExpired, "h1", false},
		{"h0", LeaseReleased, "h1", false},
		{"h0", LeaseWithdrawn, "h1", false},
	}
	for _, c := range cases {
		r := s[c.signer].Seal(signedRecord(c.host, c.state), 17)
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeVerified(b, k)
		if (err == nil) != c.ok {
			t.Errorf("%s record of %s signed by %s: err %v, want ok %t", c.state, c.host, c.signer, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("error %v does not wrap ErrInvalidRecord", err)
		}
		if forged := c.signer != c.host && !c.ok; forged != errors.Is(err, ErrForgedRecord) {
			t.Errorf("%s record of %s signed by %s: %v: forged %t", c.state, c.host, c.signer, err, forged)
		}
		if b2, _ := got.Encode(); err == nil && (string(b2) != string(b) || got.PrevRev != 17) {
			t.Errorf("round trip changed the record: %+v", got)
		}
	}
}

func TestVerifyRecordTamperAndModes(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	r := s["h0"].Seal(signedRecord("h0", LeaseActive), 5)
	for name, mut := range map[string]func(*LeaseRecord){
		"state":    func(r *LeaseRecord) { r.State = LeaseExpired },
		"epoch":    func(r *LeaseRecord) { r.Epoch++ },
		"prev_rev": func(r *LeaseRecord) { r.PrevRev = 99 },
		"ttl":      func(r *LeaseRecord) { r.Timing.LeaseTTL *= 4 },
		"host":     func(r *LeaseRecord) { r.Host = "h1" },
		"signer":   func(r *LeaseRecord) { r.Signer = "Kh1" },
		"sig":      func(r *LeaseRecord) { r.Sig = strings.Repeat("A", len(r.Sig)) },
		"unsigned": func(r *LeaseRecord) { r.Sig, r.Signer = "", "" },
	} {
		m := r
		mut(&m)
		if err := k.VerifyRecord(m); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("%s changed: verified (%v)", name, err)
		}
	}
	opt := *k
	opt.Mode = SigningOptional
	u := signedRecord("h0", LeaseExpired)
	if err := opt.VerifyRecord(u); err != nil {
		t.Errorf("optional: unsigned refused: %v", err)
	}
	bad := r
	bad.Epoch++
	if err := opt.VerifyRecord(bad); err == nil {
		t.Error("optional: a signed record with a bad signature verified")
	}
	var off *Keyring
	if err := off.VerifyRecord(bad); err != nil {
		t.Errorf("nil keyring verified something: %v", err)
	}
}

func TestVerifyGuard(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	g := Guard{Count: 10, Share: 0.2, Window: 60 * time.Second, Members: 20, Version: 3, History: []GuardVersion{{Version: 3, Threshold: 4}}}
	sg := s["ctl"].SealGuard(g)
	b, _ := EncodeGuard(sg)
	got, err := DecodeGuard(b)
	if err != nil || k.VerifyGuard(got) != nil {
		t.Fatalf("controller guard: %v %v", err, k.VerifyGuard(got))
	}
	if err := k.VerifyGuard(s["h0"].SealGuard(g)); err == nil {
		t.Error("a guard signed by a host key verified")
	}
	got.Members = 1000
	if err := k.VerifyGuard(got); err == nil {
		t.Error("a tampered guard verified")
	}
	if err := k.VerifyGuard(g); err == nil {
		t.Error("an unsigned guard verified (required)")
	}
}

func TestCheckRelay(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	ok := s["h0"].Seal(signedRecord("h0", LeaseActive), 40)
	if err := k.CheckRelay(ok, 40); err != nil {
		t.Fatalf("a genuine relay refused: %v", err)
	}
	for name, c := range map[string]struct {
		r   LeaseRecord
		rev uint64
	}{
		"expired by the host":     {s["h0"].Seal(signedRecord("h0", LeaseExpired), 40), 40},
		"expired by a controller": {s["ctl"].Seal(signedRecord("h0", LeaseExpired), 40), 40},
		"withdrawn":               {s["h0"].Seal(signedRecord("h0", LeaseWithdrawn), 40), 40},
		"signed by another host":  {s["h1"].Seal(signedRecord("h0", LeaseActive), 40), 40},
		"on another revision":     {ok, 41},
		"unsigned":                {signedRecord("h0", LeaseActive), 40},
	} {
		if err := k.CheckRelay(c.r, c.rev); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("%s: relayed (%v)", name, err)
		}
	}
	var off *Keyring
	if err := off.CheckRelay(signedRecord("h0", LeaseExpired), 0); err == nil {
		t.Error("signing off: an expired record relayed")
	}
}

func TestStaleRecord(t *testing.T) {
	_, s := testKeyring(SigningRequired)
	r := s["h0"].Seal(signedRecord("h0", LeaseExpired), 10)
	if !StaleRecord(r, 30, 20) {
		t.Error("a record written on 10, found at 30 after 20 was in the key: not stale")
	}
	for _, c := range [][2]uint64{{30, 10}, {30, 5}, {30, 0}, {20, 20}} {
		if StaleRecord(r, c[0], c[1]) {
			t.Errorf("found at %d, last known %d: stale", c[0], c[1])
		}
	}
	if StaleRecord(signedRecord("h0", LeaseExpired), 30, 20) {
		t.Error("unsigned records cannot be told stale")
	}
}

// FuzzDecodeVerified: no input panics the decoder or the verifier, and
// whatever verifies under signing: required is a record of a known host
// signed by a key allowed to write its state (mutations of genuine signed
// records in the seed corpus).
func FuzzDecodeVerified(f *testing.F) {
	k, s := testKeyring(SigningRequired)
	for _, st := range []LeaseState{LeaseActive, LeaseExpired, LeaseReleased, LeaseWithdrawn} {
		for _, who := range []string{"h0", "ctl"} {
			b, _ := s[who].Seal(signedRecord("h0", st), 7).Encode()
			f.Add(b)
		}
	}
	b, _ := signedRecord("h1", LeaseActive).Encode()
	f.Add(b)
	f.Add([]byte(`{"schema":1,"host":"h0","state":"expired","signer":"Kctl","sig":""}`))
	f.Add([]byte(`{"schema":1,"host":"h0","state":"active","signer":"Kh0","sig":"!!"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeVerified(b, k)
		if err != nil {
			if !errors.Is(err, ErrInvalidRecord) {
				t.Fatalf("error %v does not wrap ErrInvalidRecord", err)
			}
			return
		}
		switch who := strings.TrimPrefix(r.Signer, "K"); {
		case who == r.Host:
		case who == "ctl" && (r.State == LeaseExpired || r.State == LeaseReleased):
		default:
			t.Fatalf("verified a %s record of %s signed by %q", r.State, r.Host, r.Signer)
		}
		// What verified re-encodes to something that still verifies.
		b2, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeVerified(b2, k); err != nil {
			t.Fatalf("re-encoded record no longer verifies: %v", err)
		}
		_ = k.CheckRelay(r, r.PrevRev)
		_ = StaleRecord(r, r.PrevRev+1, r.PrevRev)
	})
}

// TestBeaconPrevSigned: a beacon's Prev is signed by its host's key
// (PrevSig) beside Sig. A controller from before Prev checks Sig over
// the fields it knows (the beacon decoded into its struct, without prev
// and prev_sig): it still verifies — agents and controllers of
// neighbouring releases work together. A Prev changed, or added, without
// the key is refused.
func TestBeaconPrevSigned(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	b := s["h0"].SealBeacon(Beacon{Schema: BeaconSchema, Host: "h0", Revision: 42, Prev: 40, At: time.Unix(1000, 0).UTC()})
	if b.PrevSig == "" {
		t.Fatal("no prev_sig")
	}
	if err := k.VerifyBeacon(b); err != nil {
		t.Fatalf("genuine beacon with prev refused: %v", err)
	}
	// The old controller's view: the JSON round-tripped through a struct
	// without Prev and PrevSig.
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	old, err := DecodeBeacon(enc)
	if err != nil {
		t.Fatal(err)
	}
	old.Prev, old.PrevSig = 0, ""
	if err := k.VerifyBeacon(old); err != nil {
		t.Fatalf("the beacon without prev (a controller from before it) refused: %v", err)
	}
	forged := b
	forged.Prev = 41
	if err := k.VerifyBeacon(forged); err == nil || !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), "prev 41") {
		t.Fatalf("prev changed without the key: %v", err)
	}
	added := s["h0"].SealBeacon(Beacon{Schema: BeaconSchema, Host: "h0", Revision: 42, At: time.Unix(1000, 0).UTC()})
	added.Prev = 40
	if err := k.VerifyBeacon(added); err == nil {
		t.Fatal("prev added to a beacon signed without it: verified")
	}
	other := s["h1"].SealBeacon(Beacon{Schema: BeaconSchema, Host: "h0", Revision: 42, Prev: 40})
	if err := k.VerifyBeacon(other); err == nil {
		t.Fatal("a beacon of h0 signed by h1's key: verified")
	}
}

// TestBeaconRecordSigned: a beacon's Epoch and Seq (the written record's
// identity, reviewer X44) are signed by its host's key (RecSig) beside
// Sig: a controller from before them still verifies the beacon; either
// changed, or added, without the key is refused.
func TestBeaconRecordSigned(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	b := s["h0"].SealBeacon(Beacon{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 42, Prev: 40, Epoch: 2, Seq: 77, At: time.Unix(1000, 0).UTC()})
	if b.RecSig == "" {
		t.Fatal("no rec_sig")
	}
	if err := k.VerifyBeacon(b); err != nil {
		t.Fatalf("genuine beacon with its record's seq refused: %v", err)
	}
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(enc), `"seq":77`) || !strings.Contains(string(enc), `"epoch":2`) {
		t.Fatalf("encoded beacon lacks epoch/seq: %s", enc)
	}
	old, err := DecodeBeacon(enc)
	if err != nil {
		t.Fatal(err)
	}
	old.Epoch, old.Seq, old.RecSig = 0, 0, ""
	if err := k.VerifyBeacon(old); err != nil {
		t.Fatalf("the beacon without epoch/seq (a controller from before them) refused: %v", err)
	}
	for name, mod := range map[string]func(*Beacon){
		"seq raised":   func(b *Beacon) { b.Seq = 78 },
		"epoch raised": func(b *Beacon) { b.Epoch = 3 },
		"incarnation":  func(b *Beacon) { b.Incarnation = 4 },
		"sig dropped":  func(b *Beacon) { b.RecSig = "" },
		"prev changed": func(b *Beacon) { b.Prev = 41 },
		"revision":     func(b *Beacon) { b.Revision = 43 },
		"state added":  func(b *Beacon) { b.State = LeaseWithdrawn },
	} {
		f := b
		mod(&f)
		if err := k.VerifyBeacon(f); err == nil || !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("%s without the key: %v", name, err)
		}
	}
	added := s["h0"].SealBeacon(Beacon{Schema: BeaconSchema, Host: "h0", Revision: 42, At: time.Unix(1000, 0).UTC()})
	added.Seq = 99
	if err := k.VerifyBeacon(added); err == nil || !strings.Contains(err.Error(), "seq 99") {
		t.Fatalf("seq added to a beacon signed without it: %v", err)
	}
}

// BenchmarkVerifyBeacon: what a controller spends per beacon — an agent
// that names its record (one rec_sig over every field) against one from
// before it (Sig and, with Prev, PrevSig): the baseline, in the same run.
func BenchmarkVerifyBeacon(b *testing.B) {
	k, s := testKeyring(SigningRequired)
	for _, c := range []struct {
		name string
		bc   Beacon
	}{
		{"sig+prev_sig(older-agent)", Beacon{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 42, Prev: 40, At: time.Unix(1000, 0).UTC()}},
		{"rec_sig", Beacon{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 42, Prev: 40, Epoch: 2, Seq: 77, At: time.Unix(1000, 0).UTC()}},
	} {
		bc := s["h0"].SealBeacon(c.bc)
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := k.VerifyBeacon(bc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzVerifyBeacon: no beacon verifies (signing required) unless h0's key
// signed exactly its meaningful fields — host, revision, prev, state,
// incarnation, epoch, seq — as one of the genuine beacons the corpus
// starts from: rec_sig (every field) or sig + prev_sig (an older agent's,
// without epoch and seq). `go test -run '^$' -fuzz FuzzVerifyBeacon
// -fuzztime 20s ./fencing/` (make fuzz).
func FuzzVerifyBeacon(f *testing.F) {
	k, s := testKeyring(SigningRequired)
	type key struct {
		host                       string
		rev, prev, inc, epoch, seq uint64
		state                      LeaseState
	}
	keyOf := func(b Beacon) key {
		return key{b.Host, b.Revision, b.Prev, b.Incarnation, b.Epoch, b.Seq, b.State}
	}
	genuine := map[key]bool{}
	for _, bc := range []Beacon{
		{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 42, Prev: 40, Epoch: 2, Seq: 77, At: time.Unix(1000, 0).UTC()},
		{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 43, Prev: 42, Epoch: 2, Seq: 78, State: LeaseWithdrawn, At: time.Unix(1001, 0).UTC()},
		{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 44, Prev: 43, At: time.Unix(1002, 0).UTC()},
		{Schema: BeaconSchema, Host: "h0", Incarnation: 3, Revision: 45, At: time.Unix(1003, 0).UTC()},
	} {
		sealed := s["h0"].SealBeacon(bc)
		genuine[keyOf(sealed)] = true
		if bc.Seq != 0 { // what an older controller verifies of it
			old := sealed
			old.Epoch, old.Seq, old.RecSig = 0, 0, ""
			genuine[keyOf(old)] = true
			if old.Prev != 0 {
				old.Prev, old.PrevSig = 0, ""
				genuine[keyOf(old)] = true
			}
		} else if bc.Prev != 0 {
			old := sealed
			old.Prev, old.PrevSig = 0, ""
			genuine[keyOf(old)] = true
		}
		enc, _ := sealed.Encode()
		f.Add(enc)
	}
	f.Add([]byte(`{"schema":1,"host":"h0","revision":9,"seq":5,"signer":"Kh0","rec_sig":"!!"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBeacon(data)
		if err != nil {
			return
		}
		if err := k.VerifyBeacon(b); err != nil {
			if !errors.Is(err, ErrInvalidRecord) {
				t.Fatalf("error %v does not wrap ErrInvalidRecord", err)
			}
			return
		}
		if !genuine[keyOf(b)] {
			t.Fatalf("verified a beacon h0's key never signed: %+v", keyOf(b))
		}
	})
}
