package peer

import (
	"context"
	"crypto/ed25519"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"hvguard/fencing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type fakeRelayer struct {
	res   fencing.RenewResult
	calls int
}

func (f *fakeRelayer) Relay(context.Context, fencing.RenewRequest, time.Duration) fencing.RenewResult {
	f.calls++
	return f.res
}

func setup(t *testing.T, view fencing.PeerView, now time.Time, rel *fakeRelayer, clientSecret string) (*Client, fencing.PeerRound) {
	t.Helper()
	h := &Handler{Host: "h1", Secret: []byte("0123456789abcdef-fleet"), Relayer: rel,
		View: func() (fencing.PeerView, time.Time) { return view, now }}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &Client{Host: "h0", Secret: []byte(clientSecret), URL: func(string) string { return srv.URL + Path }}
	rd := fencing.PeerRound{ID: 7, Peers: []string{"h1"}, Renewal: fencing.RenewRequest{Seq: 3, Revision: 9,
		Record: fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive}}}
	return c, rd
}

func TestRelayed(t *testing.T) {
	view := fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}
	rel := &fakeRelayer{res: fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: 10}}
	c, rd := setup(t, view, t0.Add(time.Second), rel, "0123456789abcdef-fleet")
	ans, err := c.Ask(context.Background(), "h1", rd)
	if err != nil || ans.Kind != fencing.PeerRelayed || ans.Revision != 10 || rel.calls != 1 {
		t.Fatalf("%+v %v calls=%d", ans, err, rel.calls)
	}
}

func TestAnswers(t *testing.T) {
	tm := fencing.DefaultTiming()
	for name, tc := range map[string]struct {
		view fencing.PeerView
		age  time.Duration
		want fencing.PeerAnswerKind
	}{
		"cannot renew":     {fencing.PeerView{Lease: true, LastAck: t0, Timing: tm}, 6 * time.Second, fencing.PeerCannotRenew},
		"lapsed":           {fencing.PeerView{Lease: true, LastAck: t0, Timing: tm}, 25 * time.Second, fencing.PeerLeaseLapsed},
		"held (any age)":   {fencing.PeerView{Lease: true, LastAck: t0, Held: true, Timing: tm}, 10 * time.Minute, fencing.PeerCannotRenew},
		"declared":         {fencing.PeerView{Lease: true, LastAck: t0, Declared: true, Timing: tm}, time.Second, fencing.PeerDeclared},
		"relay conflicted": {fencing.PeerView{Lease: true, LastAck: t0, Timing: tm}, time.Second, fencing.PeerRelayFailed},
	} {
		rel := &fakeRelayer{res: fencing.RenewResult{Outcome: fencing.RenewConflict, Revision: 12}}
		c, rd := setup(t, tc.view, t0.Add(tc.age), rel, "0123456789abcdef-fleet")
		ans, err := c.Ask(context.Background(), "h1", rd)
		if err != nil || ans.Kind != tc.want {
			t.Errorf("%s: %+v %v, want %d", name, ans, err, tc.want)
		}
	}
}

func TestBadSecretIsUnreachable(t *testing.T) {
	view := fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}
	rel := &fakeRelayer{}
	c, rd := setup(t, view, t0.Add(6*time.Second), rel, "another-secret-of-16")
	ans, err := c.Ask(context.Background(), "h1", rd)
	if ans.Kind != fencing.PeerUnreachable || err == nil || !strings.Contains(err.Error(), "401") || rel.calls != 0 {
		t.Fatalf("%+v %v", ans, err)
	}
}

func TestReplayAndMisaddressedRejected(t *testing.T) {
	view := fencing.PeerView{Lease: true, LastAck: t0, Timing: fencing.DefaultTiming()}
	rel := &fakeRelayer{res: fencing.RenewResult{Outcome: fencing.RenewAcked, Revision: 10}}
	c, rd := setup(t, view, t0.Add(time.Second), rel, "0123456789abcdef-fleet")
	c.Wall = func() time.Time { return time.Now().Add(-time.Minute) } // a replayed (old) request
	if ans, err := c.Ask(context.Background(), "h1", rd); ans.Kind != fencing.PeerUnreachable || err == nil {
		t.Fatalf("stale request answered: %+v", ans)
	}
	c.Wall = nil
	rd.Renewal.Record.Host = "h2" // asking h1 to renew someone else's lease
	if ans, err := c.Ask(context.Background(), "h1", rd); ans.Kind != fencing.PeerUnreachable || err == nil {
		t.Fatalf("relay for another host answered: %+v", ans)
	}
	if rel.calls != 0 {
		t.Fatalf("relayed %d times", rel.calls)
	}
}

// TestAnswerSignedByPeerHost (issue 11): every member holds the fleet's
// HMAC secret, so a compromised node (h1) can answer in h2's name — a
// "cannot renew" confirmation for a hold. With answers signed by the
// answering host's own key, an asker verifying them (Client.Keys) takes
// only h2's own answer; h1's answer in h2's name is unreachable. Without
// Keys it is taken (the hole).
func TestAnswerSignedByPeerHost(t *testing.T) {
	secret := []byte("0123456789abcdef-fleet")
	key := func(name string) (fencing.Signer, fencing.PublicKey) {
		seed := make([]byte, ed25519.SeedSize)
		copy(seed, name)
		priv := ed25519.NewKeyFromSeed(seed)
		return fencing.Signer{ID: "K" + name, Key: priv}, fencing.PublicKey{ID: "K" + name, Key: priv.Public().(ed25519.PublicKey)}
	}
	s1, p1 := key("h1")
	s2, p2 := key("h2")
	ring := &fencing.Keyring{Mode: fencing.SigningRequired, Hosts: map[string][]fencing.PublicKey{"h1": {p1}, "h2": {p2}}}
	cannot := func() (fencing.PeerView, time.Time) {
		now := time.Now()
		return fencing.PeerView{Lease: true, LastAck: now.Add(-5 * time.Second), Timing: fencing.DefaultTiming()}, now
	}
	serve := func(signer fencing.Signer) string {
		srv := httptest.NewServer(&Handler{Host: "h2", Secret: secret, View: cannot, Signer: signer})
		t.Cleanup(srv.Close)
		return srv.URL + Path
	}
	ask := func(url string, keys *fencing.Keyring) (fencing.PeerAnswer, error) {
		c := &Client{Host: "h0", Secret: secret, Keys: keys, URL: func(string) string { return url }}
		return c.Ask(context.Background(), "h2", fencing.PeerRound{ID: 1, Peers: []string{"h2"}, Renewal: fencing.RenewRequest{Record: fencing.LeaseRecord{Host: "h0"}}})
	}
	genuine, impostor := serve(s2), serve(s1)
	if ans, err := ask(genuine, ring); err != nil || ans.Kind != fencing.PeerCannotRenew {
		t.Fatalf("h2's own answer: %+v %v", ans, err)
	}
	if ans, err := ask(impostor, ring); err == nil || ans.Kind != fencing.PeerUnreachable {
		t.Fatalf("h1's answer in h2's name was taken: %+v %v", ans, err)
	}
	if ans, err := ask(serve(fencing.Signer{}), ring); err == nil || ans.Kind != fencing.PeerUnreachable {
		t.Fatalf("an unsigned answer was taken with signing required: %+v %v", ans, err)
	}
	if ans, _ := ask(impostor, nil); ans.Kind != fencing.PeerCannotRenew {
		t.Fatalf("without keys: %+v (the hole this closes: taken)", ans)
	}
}
