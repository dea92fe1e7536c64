package osharness

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"hvguard/test/netcut"
)

// The harness's keystone and Nova endpoints (up.sh, osctl.py).
const (
	KeystoneURL = "http://127.0.0.1:5000"
	NovaAddr    = "127.0.0.1:8774"
)

// APIProxy puts cuttable links (test/netcut) between ONE client — an agent
// under test — and the real keystone and Nova, so the API can become
// unreachable for that client alone while the harness and Nova's own
// services keep working. The client's clouds.yaml (Clouds) points at the
// keystone side; its token answers have Nova's catalog URL rewritten to the
// Nova link, so every compute request goes through a link too.
type APIProxy struct {
	// Keystone and Nova are the links; Cut blackholes both.
	Keystone, Nova *netcut.Proxy
	url            string // the rewriting keystone front, http://127.0.0.1:port
}

// NewAPIProxy starts the links and the keystone front; they are closed when
// the test ends.
func NewAPIProxy(t testing.TB) *APIProxy {
	t.Helper()
	p := &APIProxy{Keystone: netcut.New(t, "127.0.0.1:5000"), Nova: netcut.New(t, NovaAddr)}
	p.url = KeystoneFront(t, p.Keystone.Addr(), p.Nova.Addr())
	return p
}

// Cut makes keystone and Nova unreachable for the client (true: every byte
// is held, requests hang until the client's timeout) or reachable again.
func (p *APIProxy) Cut(on bool) {
	p.Keystone.Blackhole(on)
	p.Nova.Blackhole(on)
}

// Clouds writes a copy of the harness's clouds.yaml whose auth_url is the
// proxy and returns its path.
func (p *APIProxy) Clouds(t testing.TB, workDir string) string {
	t.Helper()
	return CloudsVia(t, filepath.Join(workDir, "clouds.yaml"), p.url)
}

// KeystoneFront serves keystone (at keystoneAddr, host:port) on a new
// local port and rewrites Nova's address in its answers (the token's
// catalog) to novaAddr, so a client that authenticates through it sends
// every compute request to novaAddr. It returns the front's URL; it is
// closed when the test ends.
func KeystoneFront(t testing.TB, keystoneAddr, novaAddr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ks := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: keystoneAddr})
	ks.Transport = &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{}).DialContext}
	ks.ModifyResponse = func(r *http.Response) error {
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return err
		}
		b = bytes.ReplaceAll(b, []byte(NovaAddr), []byte(novaAddr))
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		r.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	}
	srv := &http.Server{Handler: ks}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// CloudsVia writes a copy of the clouds.yaml at path whose auth_url is
// keystoneURL (a KeystoneFront) and returns the copy's path.
func CloudsVia(t testing.TB, path, keystoneURL string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.ReplaceAll(b, []byte(KeystoneURL), []byte(keystoneURL))
	out := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
