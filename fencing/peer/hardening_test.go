package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

// recorder keeps the last request a Client sent (body and signature).
type recorder struct {
	body []byte
	sig  string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	r.body, r.sig = b, req.Header.Get(SignatureHeader)
	req.Body = io.NopCloser(bytes.NewReader(b))
	return http.DefaultTransport.RoundTrip(req)
}

// A request captured on the wire and sent again within the acceptance
// window (so its timestamp is still fresh) is refused: the first is
// relayed, the copy is not, and the refusal is reported as "replay".
func TestReplayedRequestRefused(t *testing.T) {
	view := fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}
	rel := &fakeRelayer{res: fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: 10}}
	var refused []string
	h := &Handler{Host: "h1", Secret: []byte("0123456789abcdef-fleet"), Relayer: rel,
		View:    func() (fencing.PeerView, time.Time) { return view, t0.Add(time.Second) },
		Refused: func(r string) { refused = append(refused, r) }}
	srv := httptest.NewServer(h)
	defer srv.Close()
	rec := &recorder{}
	c := &Client{Host: "h0", Secret: []byte("0123456789abcdef-fleet"), HTTP: &http.Client{Transport: rec},
		URL: func(string) string { return srv.URL + Path }}
	rd := fencing.PeerRound{ID: 7, Peers: []string{"h1"}, Renewal: fencing.RenewRequest{Seq: 3, Revision: 9,
		Record: fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive}}}
	if ans, err := c.Ask(context.Background(), "h1", rd); err != nil || ans.Kind != fencing.PeerRelayed {
		t.Fatalf("first request: %+v %v", ans, err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+Path, bytes.NewReader(rec.body))
	req.Header.Set(SignatureHeader, rec.sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || rel.calls != 1 {
		t.Fatalf("replayed request: status %s, relays %d (want 403 and 1)", resp.Status, rel.calls)
	}
	if len(refused) != 1 || refused[0] != "replay" {
		t.Fatalf("refusals %q, want [replay]", refused)
	}
	// A new request (same round, new nonce) is answered.
	if ans, err := c.Ask(context.Background(), "h1", rd); err != nil || ans.Kind != fencing.PeerRelayed || rel.calls != 2 {
		t.Fatalf("second request: %+v %v relays %d", ans, err, rel.calls)
	}
}

// The replay cache forgets a request once it left the acceptance window
// (its timestamp alone refuses it then) and evicts the oldest entry when
// full, so its memory is bounded.
func TestReplayCacheBounded(t *testing.T) {
	c := NewReplayCache(3)
	k := func(i byte) [32]byte { return [32]byte{i} }
	if !c.First(k(1), t0.Add(MaxSkew), t0) || c.First(k(1), t0.Add(MaxSkew), t0.Add(time.Second)) {
		t.Fatal("a repeat within the window must be refused")
	}
	if !c.First(k(1), t0.Add(2*MaxSkew), t0.Add(MaxSkew)) {
		t.Fatal("an entry past its expiry must be forgotten")
	}
	for i := byte(2); i < 10; i++ {
		c.First(k(i), t0.Add(time.Hour), t0.Add(MaxSkew))
	}
	if n := c.Len(); n != 3 {
		t.Fatalf("%d entries, want at most 3", n)
	}
}

// secretsFile builds a Handler and a Client for host from the content of
// its peer secret file.
func fromFile(t *testing.T, host, file string, url func(string) string) (*Handler, *Client) {
	t.Helper()
	sign, acc, err := ParseSecrets([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return &Handler{Host: host, Secret: sign, Accepted: acc},
		&Client{Host: host, Secret: sign, Accepted: acc, URL: url}
}

// A rotation of the peer secret in three rolling steps (docs/security.md):
// 1. append the new secret as a second line on every host, 2. swap the
// lines on every host, 3. remove the old line. While any step rolls out,
// hosts are one step apart; every pair of hosts must be able to ask each
// other in both directions at every such moment: no gap. (Two hosts two
// steps apart — old only and new only — cannot, which is why the steps go
// fleet-wide one after the other.)
func TestSecretRotationWithoutGap(t *testing.T) {
	const old, new = "old-fleet-secret-0123", "new-fleet-secret-4567"
	steps := []string{old + "\n", old + "\n" + new + "\n", new + "\n" + old + "\n", new + "\n"}
	view := fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}
	ask := func(a, b string) error {
		var hb *Handler
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hb.ServeHTTP(w, r) }))
		defer srv.Close()
		url := func(string) string { return srv.URL + Path }
		hb, _ = fromFile(t, "b", b, url)
		hb.View = func() (fencing.PeerView, time.Time) { return view, t0.Add(6 * time.Second) }
		_, ca := fromFile(t, "a", a, url)
		rd := fencing.PeerRound{ID: 1, Renewal: fencing.RenewRequest{Record: fencing.LeaseRecord{Schema: 1, Host: "a", State: fencing.LeaseActive}}}
		ans, err := ca.Ask(context.Background(), "b", rd)
		if err == nil && ans.Kind != fencing.PeerCannotRenew {
			t.Fatalf("answer %+v", ans)
		}
		return err
	}
	for k := range steps {
		for _, next := range []int{k, min(k+1, len(steps)-1)} {
			if err := ask(steps[k], steps[next]); err != nil {
				t.Errorf("step %d asking step %d: %v", k, next, err)
			}
			if err := ask(steps[next], steps[k]); err != nil {
				t.Errorf("step %d asking step %d: %v", next, k, err)
			}
		}
	}
	if err := ask(steps[0], steps[3]); err == nil {
		t.Error("old-only and new-only hosts must not accept each other")
	}
}

// FuzzHandler feeds the endpoint arbitrary bodies, signed with the
// fleet's secret (so they get past the signature) or not. It must never
// panic, only answer 200 to a well-formed, addressed, fresh request for
// the sender's own record, relay only then, and never answer the same
// body twice.
func FuzzHandler(f *testing.F) {
	secret := []byte("0123456789abcdef-fleet")
	now := t0.Add(time.Second)
	good, _ := json.Marshal(Request{From: "h0", To: "h1", Round: 1, SentAt: now, Nonce: "00",
		Renewal: fencing.RenewRequest{Seq: 1, Record: fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive}}})
	f.Add(good, true)
	f.Add(good, false)
	f.Add([]byte(`{"from":"h0","to":"h1","sent_at":"2026-01-01T00:00:01Z","renewal":{"record":{"host":"h2"}}}`), true)
	f.Add([]byte(`{"to":"h1","sent_at":"1970-01-01T00:00:00Z"}`), true)
	f.Add([]byte(`[]`), true)
	f.Add([]byte{0xff, 0x00}, true)
	f.Fuzz(func(t *testing.T, body []byte, signed bool) {
		rel := &fakeRelayer{res: fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: 2}}
		h := &Handler{Host: "h1", Secret: secret, Relayer: rel, Wall: func() time.Time { return now },
			View: func() (fencing.PeerView, time.Time) {
				return fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}, t0.Add(time.Second)
			}}
		do := func() int {
			r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
			if signed {
				r.Header.Set(SignatureHeader, sign(secret, body))
			} else {
				r.Header.Set(SignatureHeader, strings.Repeat("0", 64))
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code == http.StatusOK && !verify([][]byte{secret}, w.Body.Bytes(), w.Header().Get(SignatureHeader)) {
				t.Fatal("answer not signed")
			}
			return w.Code
		}
		code := do()
		switch code {
		case http.StatusOK:
			var req Request
			if !signed || json.Unmarshal(body, &req) != nil || req.To != "h1" || req.Renewal.Record.Host != req.From || !fresh(req.SentAt, now) {
				t.Fatalf("answered %q (signed %v)", body, signed)
			}
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
			if rel.calls != 0 {
				t.Fatalf("refused (%d) but relayed", code)
			}
		default:
			t.Fatalf("status %d", code)
		}
		if again := do(); code == http.StatusOK && again != http.StatusForbidden {
			t.Fatalf("the same body answered twice (%d)", again)
		}
		if rel.calls > 1 {
			t.Fatalf("relayed %d times", rel.calls)
		}
	})
}
