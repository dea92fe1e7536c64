package peer

import (
	"context"
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
