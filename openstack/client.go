package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
)

// Microversion is the compute API microversion every request pins.
//
// 2.59 is the lowest microversion at which /os-migrations (a) returns the
// migration uuid and pages with limit/marker and migrations_links, and (b)
// answers 400 to an unknown query parameter instead of ignoring it — so a
// filter this client sends is either applied or the request fails; below
// 2.59 a misspelt or unsupported filter silently widens the result. It also
// carries migration_type (2.23). Nova 17 (Queens) and later support it;
// Debian 12's Nova 26 (Zed) supports up to 2.93. Nothing this client reads
// changed between 2.59 and 2.93, so the lowest sufficient one is pinned.
// Every response must echo it (OpenStack-API-Version); one that does not
// is rejected as malformed.
const Microversion = "2.59"

// Caps. Beyond them a call fails (KindTooLarge or KindMalformed): a result
// is never silently cut short.
const (
	// PageSize is the limit asked for per /os-migrations page. Nova's
	// default max_limit is 1000; 500 keeps a page under ~0.5 MB.
	PageSize = 500
	// MaxEvacuations is the most evacuation records accepted for one host.
	// Records of deleted servers disappear, so a host accumulates only the
	// evacuations of servers that still exist: thousands would be a bug.
	MaxEvacuations = 5000
	// MaxLookups is the most servers ServerHosts looks up in one call;
	// candidates are local domains with an evacuation record.
	MaxLookups = 2000
	// maxPageBytes bounds one /os-migrations body (~700 bytes a record).
	maxPageBytes = 4 << 20
	// maxServerBytes bounds one GET /servers/{id} body (addresses, metadata
	// and tags included, a server is a few KiB).
	maxServerBytes = 1 << 20
	// lookupConcurrency bounds server GETs in flight: enough to look up 200
	// candidates in about a second, few enough not to load nova-api.
	lookupConcurrency = 4
	// tokenRenewBefore: re-authenticate this long before the token expires,
	// so a reconciliation does not first meet a 401 (gophercloud also
	// re-authenticates once on a 401, AllowReauth).
	tokenRenewBefore = 5 * time.Minute
)

// Client talks to Nova for reconciliation. It authenticates lazily, on the
// first call (so a keystone outage at agent start is a failed
// reconciliation, not a failed start), reuses its token, and re-
// authenticates on expiry. Safe for concurrent use.
type Client struct {
	cfg      Config
	cloud    loaded
	http     http.Client
	log      *slog.Logger
	calls    atomic.Uint64
	pageSize int // Config.PageSize

	mu sync.Mutex
	sc *gophercloud.ServiceClient // nil until authenticated
}

// New parses clouds.yaml (an error here is a configuration error) and
// returns a Client. It does not contact keystone or Nova.
func New(cfg Config, log *slog.Logger) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = PageSize
	}
	cl, err := cfg.load()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cl.tls != nil {
		tr.TLSClientConfig = cl.tls
	}
	tr.MaxIdleConnsPerHost = lookupConcurrency
	c := &Client{cfg: cfg, cloud: cl, log: log, pageSize: cfg.PageSize}
	c.http = http.Client{
		Transport:     countingTransport{next: tr, n: &c.calls},
		Timeout:       cfg.RequestTimeout, // backstop; requests also carry a context deadline
		CheckRedirect: stripTokensOffOrigin,
	}
	return c, nil
}

// Calls returns the number of HTTP requests made to keystone and Nova so
// far (authentication included).
func (c *Client) Calls() uint64 { return c.calls.Load() }

// tokenHeaders are the headers that carry keystone tokens.
var tokenHeaders = []string{"X-Auth-Token", "X-Service-Token"}

// stripTokensOffOrigin is the redirect policy: follow (net/http's limit of
// ten), but a request redirected to another origin (scheme, host, port)
// than the first goes without X-Auth-Token and X-Service-Token.
// gophercloud's own default policy strips only X-Auth-Token, and setting
// any policy replaces it; the service user's token must not travel to
// whatever host a Location header names either.
func stripTokensOffOrigin(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	for _, hop := range append(via[1:], req) {
		if !sameOrigin(via[0].URL, hop.URL) {
			for _, h := range tokenHeaders {
				req.Header.Del(h)
			}
			return nil
		}
	}
	return nil
}

func sameOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		return map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Uint64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.next.RoundTrip(r)
}

// Authenticate gets a token now (and finds the compute endpoint) instead
// of on the first request. Stop classification calls it at agent start so
// that the first stop's query does not also wait for keystone: Nova has ~1 s
// of the 16 s report target, and a cold keystone login took 1.3 s under a
// reboot storm (docs/BENCHMARKS.md, issue 6). Safe to call concurrently
// with requests; a no-op once authenticated.
func (c *Client) Authenticate(ctx context.Context) error {
	_, err := c.compute(ctx)
	return err
}

// compute returns the authenticated compute client, authenticating first
// if needed.
func (c *Client) compute(ctx context.Context) (*gophercloud.ServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sc != nil {
		return c.sc, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*c.cfg.RequestTimeout) // version discovery + token
	defer cancel()
	pc, err := gopenstack.NewClient(c.cloud.auth.IdentityEndpoint)
	if err != nil {
		return nil, &Error{Kind: KindConfig, Op: "authenticate", Err: err}
	}
	pc.HTTPClient = c.http
	pc.ReauthBeforeTokenExpiration = tokenRenewBefore
	if err := gopenstack.Authenticate(ctx, pc, c.cloud.auth); err != nil {
		e := classify("authenticate", err)
		if e.Status == 401 || e.Status == 403 {
			e.Kind = KindAuth
		}
		return nil, e
	}
	sc, err := gopenstack.NewComputeV2(pc, c.cloud.endpoint)
	if err != nil {
		return nil, &Error{Kind: KindConfig, Op: "find compute endpoint", Err: err}
	}
	sc.Microversion = Microversion
	c.sc = sc
	c.log.Debug("authenticated to keystone", "compute_endpoint", sc.Endpoint)
	return sc, nil
}

// get performs one GET on the compute API and returns the status and body
// (at most maxBytes). ok lists the statuses whose body the caller decodes;
// others become errors. The response must be JSON and echo Microversion.
func (c *Client) get(ctx context.Context, op, path string, ok []int, maxBytes int64) (int, []byte, error) {
	sc, err := c.compute(ctx)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	resp, err := sc.Request(ctx, http.MethodGet, sc.ServiceURL(path), &gophercloud.RequestOpts{
		OkCodes:          ok,
		KeepResponseBody: true,
	})
	if err != nil {
		return 0, nil, classify(op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return resp.StatusCode, nil, classify(op, err)
	}
	if int64(len(body)) > maxBytes {
		return resp.StatusCode, nil, &Error{Kind: KindTooLarge, Op: op, Status: resp.StatusCode, Err: fmt.Errorf("body larger than %d bytes", maxBytes)}
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return resp.StatusCode, nil, &Error{Kind: KindMalformed, Op: op, Status: resp.StatusCode, Err: fmt.Errorf("content type %q, not application/json", resp.Header.Get("Content-Type"))}
	}
	if err := checkMicroversion(resp.Header); err != nil {
		return resp.StatusCode, nil, &Error{Kind: KindMalformed, Op: op, Status: resp.StatusCode, Err: err}
	}
	return resp.StatusCode, body, nil
}

// checkMicroversion checks that Nova answered at Microversion. Nova sends
// "OpenStack-API-Version: compute 2.59" and the legacy
// "X-OpenStack-Nova-API-Version: 2.59"; at least one must be there, and
// every one there must match. A response without them comes from a Nova
// (or proxy) that ignored the pin, with other filter and paging semantics.
func checkMicroversion(h http.Header) error {
	seen := false
	for _, v := range h.Values("OpenStack-API-Version") {
		f := strings.Fields(v)
		if len(f) != 2 || !strings.EqualFold(f[0], "compute") || f[1] != Microversion {
			return fmt.Errorf("OpenStack-API-Version %q, want compute %s", v, Microversion)
		}
		seen = true
	}
	for _, v := range h.Values("X-OpenStack-Nova-API-Version") {
		if strings.TrimSpace(v) != Microversion {
			return fmt.Errorf("X-OpenStack-Nova-API-Version %q, want %s", v, Microversion)
		}
		seen = true
	}
	if !seen {
		return fmt.Errorf("no microversion header: the response is not at microversion %s", Microversion)
	}
	return nil
}
