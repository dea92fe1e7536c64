// Package peer is the small authenticated endpoint agents use to ask each
// other whether they can renew their lease, and to relay a renewal
// (docs/fencing.md, "Peers"). Requests and answers are JSON, signed with
// HMAC-SHA256 over the body with a secret shared by the fleet (several
// during a rotation: Handler.Accepted, Client.Accepted), and carry the
// sender, the addressee, a random nonce and a wall-clock timestamp checked
// against MaxSkew; a request already seen within that window is refused
// (ReplayCache), so a captured request can be replayed neither later, nor
// to another host, nor again. Anything that fails (network, status,
// signature, decoding) is PeerUnreachable to the asker: an answer that
// cannot be trusted counts for nothing. Serve runs the endpoint with the
// timeouts and connection limits of limits.go.
package peer

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"hvguard/fencing"
)

const (
	// Path is the endpoint's URL path.
	Path = "/v1/fencing/peer"
	// SignatureHeader carries hex(HMAC-SHA256(secret, body)).
	SignatureHeader = "X-Hvguard-Signature"
	// MaxSkew bounds the difference between a request's timestamp and the
	// receiver's wall clock (and an answer's and the asker's): a replay
	// window, not a timing input (nothing in the protocol uses wall time).
	MaxSkew = 30 * time.Second
	// MaxBody bounds request and answer bodies.
	MaxBody = 64 << 10
	// MinSecretLen is the shortest accepted shared secret.
	MinSecretLen = 16
)

// Request is a peer question.
type Request struct {
	From    string               `json:"from"`
	To      string               `json:"to"`
	Round   uint64               `json:"round"`
	Renewal fencing.RenewRequest `json:"renewal"`
	SentAt  time.Time            `json:"sent_at"`
	// Nonce is random per request: no two requests have the same body,
	// so the receiver's replay cache (keyed by the body's digest) refuses
	// only replays. Requests of older agents have none and are still
	// unique by their nanosecond SentAt.
	Nonce string `json:"nonce,omitempty"`
}

// Answer is a peer's answer.
type Answer struct {
	From     string                 `json:"from"`
	To       string                 `json:"to"`
	Round    uint64                 `json:"round"`
	Kind     fencing.PeerAnswerKind `json:"kind"`
	Revision uint64                 `json:"revision,omitempty"`
	Current  *fencing.LeaseRecord   `json:"current,omitempty"`
	// KeyAbsent: the relay was rejected because the asker's key holds no
	// record (deleted or purged): fencing.PeerAnswer.KeyAbsent.
	KeyAbsent bool      `json:"key_absent,omitempty"`
	SentAt    time.Time `json:"sent_at"`
}

// RefuseReasons are the reasons Handler.Refused is told: not a POST, an
// unreadable body, a bad signature, an undecodable request, addressed to
// another host, sent outside the replay window (stale), a relay of
// another host's record, a request already answered (replay).
var RefuseReasons = []string{"method", "body", "signature", "decode", "addressee", "stale", "relay-host", "replay"}

// Relayer performs a relayed renewal (natslease.Store.Relay).
type Relayer interface {
	Relay(ctx context.Context, req fencing.RenewRequest, timeout time.Duration) fencing.RenewResult
}

func sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// verify reports whether sig is the HMAC of body under one of secrets
// (secrets shorter than MinSecretLen never verify).
func verify(secrets [][]byte, body []byte, sig string) bool {
	want, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	ok := false
	for _, s := range secrets {
		if len(s) < MinSecretLen {
			continue
		}
		m := hmac.New(sha256.New, s)
		m.Write(body)
		ok = hmac.Equal(m.Sum(nil), want) || ok
	}
	return ok
}

// keys returns the signing secret followed by the other accepted ones.
func keys(sign []byte, accepted [][]byte) [][]byte {
	return append([][]byte{sign}, accepted...)
}

func fresh(at, now time.Time) bool {
	d := now.Sub(at)
	return d < MaxSkew && d > -MaxSkew
}

// Handler answers peer questions for host.
type Handler struct {
	Host string
	// Secret signs the answers and verifies requests; Accepted are further
	// secrets requests may be signed with (a rotation: docs/security.md,
	// "Peer endpoint").
	Secret   []byte
	Accepted [][]byte
	// View returns the agent's current PeerView (stored by its loop) and
	// the current time on the agent's clock.
	View    func() (fencing.PeerView, time.Time)
	Relayer Relayer
	// Wall is the wall clock for the replay window (time.Now if nil).
	Wall func() time.Time
	// Replays remembers the requests seen within the acceptance window
	// (created on first use).
	Replays *ReplayCache
	once    sync.Once
	// Refused, if set, is told why a request was refused (a metric/log
	// hook), one of RefuseReasons.
	Refused func(reason string)
	// Signer, if set, signs every answer with this host's key too
	// (HostSignatureHeader): the asker then knows which host answered
	// (signed lease records, docs/security.md).
	Signer fencing.Signer
}

// HostSignatureHeader carries fencing.Signer.SignAnswer of the answer's
// body: "<key id> <signature>".
const HostSignatureHeader = "X-Hvguard-Host-Signature"

func (h *Handler) refuse(w http.ResponseWriter, reason, msg string, code int) {
	if h.Refused != nil {
		h.Refused(reason)
	}
	http.Error(w, msg, code)
}

func (h *Handler) wall() time.Time {
	if h.Wall != nil {
		return h.Wall()
	}
	return time.Now()
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.refuse(w, "method", "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody))
	if err != nil {
		h.refuse(w, "body", "read body", http.StatusBadRequest)
		return
	}
	if len(h.Secret) < MinSecretLen || !verify(keys(h.Secret, h.Accepted), body, r.Header.Get(SignatureHeader)) {
		h.refuse(w, "signature", "bad signature", http.StatusUnauthorized)
		return
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		h.refuse(w, "decode", "bad request", http.StatusBadRequest)
		return
	}
	now := h.wall()
	switch {
	case req.To != h.Host:
		h.refuse(w, "addressee", "wrong addressee", http.StatusForbidden)
		return
	case !fresh(req.SentAt, now):
		h.refuse(w, "stale", "stale request (sent_at outside the replay window)", http.StatusForbidden)
		return
	case req.Renewal.Record.Host != req.From:
		h.refuse(w, "relay-host", "relay for another host", http.StatusForbidden)
		return
	}
	h.once.Do(func() {
		if h.Replays == nil {
			h.Replays = NewReplayCache(DefaultReplayEntries)
		}
	})
	// Only a signed, fresh, addressed request is remembered (a forged one
	// must not fill the cache); it is remembered until it leaves the
	// acceptance window.
	if !h.Replays.First(sha256.Sum256(body), req.SentAt.Add(MaxSkew), now) {
		h.refuse(w, "replay", "replayed request", http.StatusForbidden)
		return
	}
	view, vnow := h.View()
	st := view.Status(vnow)
	ans := Answer{From: h.Host, To: req.From, Round: req.Round, Kind: st.Answer()}
	if ans.Kind == fencing.PeerRelayFailed && h.Relayer != nil {
		res := h.Relayer.Relay(r.Context(), req.Renewal, view.Timing.RenewTimeout)
		switch res.Outcome {
		case fencing.RenewAcked:
			ans.Kind, ans.Revision = fencing.PeerRelayed, res.Revision
		case fencing.RenewConflict:
			ans.Revision, ans.Current = res.Revision, res.Current
			ans.KeyAbsent = res.Current == nil
		}
	}
	ans.SentAt = h.wall()
	out, err := json.Marshal(ans)
	if err != nil {
		http.Error(w, "encode", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(SignatureHeader, sign(h.Secret, out))
	if hs := h.Signer.SignAnswer(out); hs != "" {
		w.Header().Set(HostSignatureHeader, hs)
	}
	w.Write(out)
}

// Client asks peers.
type Client struct {
	Host string
	// Secret signs the requests and verifies answers; Accepted are further
	// secrets answers may be signed with (a rotation).
	Secret   []byte
	Accepted [][]byte
	HTTP     *http.Client
	// URL returns the endpoint URL of peer (e.g. "https://"+peer+":9476"+Path).
	URL func(peer string) string
	// Wall is the wall clock for the replay window (time.Now if nil).
	Wall func() time.Time
	// Keys, if set, verifies that an answer is signed by the key of the
	// peer asked (HostSignatureHeader; fencing.Keyring.VerifyAnswer): an
	// answer another member wrote in its name counts for nothing.
	Keys *fencing.Keyring
}

func (c *Client) wall() time.Time {
	if c.Wall != nil {
		return c.Wall()
	}
	return time.Now()
}

// Ask asks peer about round rd (bounded by ctx, which the caller limits to
// the round's deadline). Any failure is PeerUnreachable, with the error
// for logging.
func (c *Client) Ask(ctx context.Context, peer string, rd fencing.PeerRound) (fencing.PeerAnswer, error) {
	unreachable := fencing.PeerAnswer{Kind: fencing.PeerUnreachable}
	if len(c.Secret) < MinSecretLen {
		return unreachable, errors.New("peer: shared secret too short")
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:]) // never fails (crypto/rand.Read)
	body, err := json.Marshal(Request{From: c.Host, To: peer, Round: rd.ID, Renewal: rd.Renewal, SentAt: c.wall(),
		Nonce: hex.EncodeToString(nonce[:])})
	if err != nil {
		return unreachable, fmt.Errorf("peer %s: encode: %w", peer, err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(peer), bytes.NewReader(body))
	if err != nil {
		return unreachable, fmt.Errorf("peer %s: %w", peer, err)
	}
	hr.Header.Set(SignatureHeader, sign(c.Secret, body))
	hr.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(hr)
	if err != nil {
		return unreachable, fmt.Errorf("peer %s: %w", peer, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil {
		return unreachable, fmt.Errorf("peer %s: read: %w", peer, err)
	}
	if resp.StatusCode != http.StatusOK {
		return unreachable, fmt.Errorf("peer %s: status %s", peer, resp.Status)
	}
	if !verify(keys(c.Secret, c.Accepted), out, resp.Header.Get(SignatureHeader)) {
		return unreachable, fmt.Errorf("peer %s: bad answer signature", peer)
	}
	if err := c.Keys.VerifyAnswer(peer, out, resp.Header.Get(HostSignatureHeader)); err != nil {
		return unreachable, fmt.Errorf("peer %s: %w", peer, err)
	}
	var ans Answer
	if err := json.Unmarshal(out, &ans); err != nil {
		return unreachable, fmt.Errorf("peer %s: decode: %w", peer, err)
	}
	if ans.From != peer || ans.To != c.Host || ans.Round != rd.ID || !fresh(ans.SentAt, c.wall()) {
		return unreachable, fmt.Errorf("peer %s: answer for another round, host or time", peer)
	}
	return fencing.PeerAnswer{Kind: ans.Kind, Revision: ans.Revision, Current: ans.Current, KeyAbsent: ans.KeyAbsent}, nil
}

// ParseSecrets parses a peer secret file: one secret per line (surrounding
// whitespace trimmed, empty lines ignored), each at least MinSecretLen
// bytes. The first signs; all of them are accepted (a rotation:
// docs/security.md, "Peer endpoint").
func ParseSecrets(data []byte) (sign []byte, accepted [][]byte, err error) {
	var all [][]byte
	for i, line := range bytes.Split(data, []byte("\n")) {
		s := bytes.TrimSpace(line)
		if len(s) == 0 {
			continue
		}
		if len(s) < MinSecretLen {
			return nil, nil, fmt.Errorf("line %d: secret must be at least %d bytes", i+1, MinSecretLen)
		}
		all = append(all, s)
	}
	if len(all) == 0 {
		return nil, nil, fmt.Errorf("no secret (want one per line, at least %d bytes each)", MinSecretLen)
	}
	return all[0], all[1:], nil
}
