package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/utils"
)

// The recovery adapter: everything the controller's host recovery (issue
// 13) and instance recovery (issue 14) ask of Nova, Cinder and Masakari.
// Methods are small, each one HTTP exchange or a short fixed sequence;
// the decisions (which host, which server, when, how often) are the
// caller's. See doc.go for the calls, and docs/controller.md.

// Microversions of the recovery calls. Each is the lowest that carries
// what the call needs; every answer must echo the one asked for.
const (
	// ServicesMicroversion: from 2.53 services are addressed by UUID (PUT
	// /os-services/{uuid} {"forced_down": …}) and listed with forced_down.
	// Below it a host+binary body addresses them and ids are integers.
	ServicesMicroversion = "2.53"
	// EvacuateMinMicroversion: from 2.14 Nova detects shared storage itself
	// (no onSharedStorage) and answers 200 with an empty body (no
	// adminPass).
	EvacuateMinMicroversion = "2.14"
	// EvacuateMaxMicroversion: from 2.95 an evacuated instance is left
	// STOPPED on the destination whatever its state was; up to 2.94 Nova
	// keeps its prior power state (an ACTIVE server comes back ACTIVE, a
	// SHUTOFF one SHUTOFF), which is what host recovery promises. The
	// evacuation is sent at min(Nova's maximum, this); Debian 12's Nova 26
	// offers 2.93.
	EvacuateMaxMicroversion = "2.94"
	// VolumeMicroversion: the attachments API (DELETE /attachments/{id})
	// needs 3.27; 3.44 is what Nova itself uses for attachment calls
	// (attachment_delete, attachment_complete), so Cinder sees hvguard's
	// call exactly as it sees Nova's. Volume show at 3.44 carries
	// multiattach and the attachments with host_name.
	VolumeMicroversion = "3.44"
	// MasakariAPIVersion: Masakari's API 1.0. At 1.1+ GET
	// /notifications/{id} adds the recovery workflow details and answers
	// 500 on Debian 12's Masakari 14.0.2 without taskflow persistence
	// (shared/reference/openstack.md); nothing here needs 1.1.
	MasakariAPIVersion = "1.0"
)

// Caps of the recovery calls (KindTooLarge or KindMalformed beyond them).
const (
	// maxSmallBytes bounds one service, volume, attachment or notification
	// body (a few KiB each).
	maxSmallBytes = 1 << 20
	// maxServicesBytes bounds one /os-services listing (filtered to one
	// host and binary: one record; 1 MiB leaves room for odd deployments).
	maxServicesBytes = 1 << 20
	// maxNotificationsBytes bounds a Masakari notification listing (one
	// type, generated since a second: a handful, ~600 bytes each).
	maxNotificationsBytes = 4 << 20
)

// RecoveryConfig configures the recovery adapter: the admin cloud (Config:
// Nova, Cinder, Masakari calls) and the service-role user's cloud.
type RecoveryConfig struct {
	Config
	// ServiceCloud is the clouds.yaml entry of a user with the `service`
	// role (in the same clouds.yaml). Its token is sent only as
	// X-Service-Token on Cinder attachment deletes: Cinder (OSSA-2023-003)
	// deletes an attachment Nova still uses only for a request that
	// carries a service token. Empty: RemoveAttachment fails
	// (ErrNoServiceToken) and everything else works.
	ServiceCloud string
}

// Validate reports every invalid field.
func (c RecoveryConfig) Validate() error {
	return c.Config.Validate()
}

// Recovery is the adapter. It authenticates lazily (the first call; a
// keystone outage at controller start fails a call, not the start), shares
// one admin token and connection pool among Nova, Cinder and Masakari, and
// keeps a second token for the service user, renewed before it expires.
// Safe for concurrent use.
type Recovery struct {
	nova    *Client // admin: authentication, the 2.59 calls, the HTTP client
	log     *slog.Logger
	service *serviceToken // nil without ServiceCloud

	mu       sync.Mutex
	volume   *gophercloud.ServiceClient // block-storage v3, VolumeMicroversion
	masakari *gophercloud.ServiceClient // instance-ha, MasakariAPIVersion
	evacMV   string                     // negotiated evacuate microversion, "" until known
}

// NewRecovery parses clouds.yaml (both entries; an error is a
// configuration error) and returns the adapter. It contacts nothing.
func NewRecovery(cfg RecoveryConfig, log *slog.Logger) (*Recovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nova, err := New(cfg.Config, log)
	if err != nil {
		return nil, err
	}
	r := &Recovery{nova: nova, log: log}
	if strings.TrimSpace(cfg.ServiceCloud) != "" {
		sc := cfg.Config
		sc.Cloud = cfg.ServiceCloud
		cl, err := sc.load()
		if err != nil {
			return nil, err
		}
		r.service = &serviceToken{cloud: cl, http: &nova.http, log: log}
	}
	return r, nil
}

// Calls returns the number of HTTP requests made so far (keystone, Nova,
// Cinder, Masakari; both users).
func (r *Recovery) Calls() uint64 { return r.nova.Calls() }

// Authenticate gets the admin token (and, with a service cloud, the
// service token) now, so that the first recovery does not wait for
// keystone. A no-op once authenticated.
func (r *Recovery) Authenticate(ctx context.Context) error {
	if _, err := r.nova.compute(ctx); err != nil {
		return err
	}
	if r.service != nil {
		if _, err := r.service.token(ctx, false); err != nil {
			return err
		}
	}
	return nil
}

// computeAt returns a compute client pinned at microversion mv (a shallow
// copy: the provider, hence the token, is shared).
func (r *Recovery) computeAt(ctx context.Context, mv string) (*gophercloud.ServiceClient, error) {
	sc, err := r.nova.compute(ctx)
	if err != nil {
		return nil, err
	}
	cp := *sc
	cp.Microversion = mv
	return &cp, nil
}

// blockStorage returns the Cinder v3 client (VolumeMicroversion).
func (r *Recovery) blockStorage(ctx context.Context) (*gophercloud.ServiceClient, error) {
	return r.serviceClient(ctx, &r.volume, "block-storage", VolumeMicroversion, func(pc *gophercloud.ProviderClient) (*gophercloud.ServiceClient, error) {
		return gopenstack.NewBlockStorageV3(pc, r.nova.cloud.endpoint)
	})
}

// instanceHA returns the Masakari client (MasakariAPIVersion). gophercloud
// has no Masakari package: the endpoint comes from the catalog (service
// type instance-ha) through the provider's own EndpointLocator, and the
// requests are raw.
func (r *Recovery) instanceHA(ctx context.Context) (*gophercloud.ServiceClient, error) {
	return r.serviceClient(ctx, &r.masakari, "Masakari (instance-ha)", MasakariAPIVersion, func(pc *gophercloud.ProviderClient) (*gophercloud.ServiceClient, error) {
		eo := r.nova.cloud.endpoint
		eo.ApplyDefaults("instance-ha")
		url, err := pc.EndpointLocator(eo)
		if err != nil {
			return nil, err
		}
		return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: url, Type: "instance-ha"}, nil
	})
}

func (r *Recovery) serviceClient(ctx context.Context, slot **gophercloud.ServiceClient, what, mv string,
	mk func(*gophercloud.ProviderClient) (*gophercloud.ServiceClient, error)) (*gophercloud.ServiceClient, error) {
	compute, err := r.nova.compute(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if *slot != nil {
		return *slot, nil
	}
	sc, err := mk(compute.ProviderClient)
	if err != nil {
		return nil, &Error{Kind: KindConfig, Op: "find " + what + " endpoint", Err: err}
	}
	sc.Microversion = mv
	*slot = sc
	return sc, nil
}

// request is one recovery HTTP exchange.
type request struct {
	op      string
	sc      *gophercloud.ServiceClient // Microversion set
	method  string
	url     string
	body    any      // JSON request body, nil for none
	ok      []int    // statuses whose body the caller reads; others are errors
	max     int64    // body cap
	empty   bool     // an empty body is allowed (actions answering 202/200 without one)
	headers []string // extra request headers, name, value, name, value…
	// anyVersion: the answer need not echo a microversion (version
	// documents).
	anyVersion bool
}

// do performs q and returns the status and body. The answer must echo the
// microversion asked for, and a non-empty body must be JSON.
func (r *Recovery) do(ctx context.Context, q request) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.nova.cfg.RequestTimeout)
	defer cancel()
	opts := &gophercloud.RequestOpts{OkCodes: q.ok, KeepResponseBody: true}
	if q.body != nil {
		opts.JSONBody = q.body
	}
	if len(q.headers) > 0 {
		opts.MoreHeaders = map[string]string{}
		for i := 0; i+1 < len(q.headers); i += 2 {
			opts.MoreHeaders[q.headers[i]] = q.headers[i+1]
		}
	}
	resp, err := q.sc.Request(ctx, q.method, q.url, opts)
	if err != nil {
		return 0, nil, classify(q.op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, q.max+1))
	if err != nil {
		return resp.StatusCode, nil, classify(q.op, err)
	}
	if int64(len(body)) > q.max {
		return resp.StatusCode, nil, &Error{Kind: KindTooLarge, Op: q.op, Status: resp.StatusCode, Err: fmt.Errorf("body larger than %d bytes", q.max)}
	}
	if len(strings.TrimSpace(string(body))) == 0 && q.empty {
		body = nil
	} else if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return resp.StatusCode, nil, &Error{Kind: KindMalformed, Op: q.op, Status: resp.StatusCode, Err: fmt.Errorf("content type %q, not application/json", resp.Header.Get("Content-Type"))}
	}
	if err := checkAPIVersion(resp.Header, q.sc); err != nil && !q.anyVersion {
		return resp.StatusCode, nil, &Error{Kind: KindMalformed, Op: q.op, Status: resp.StatusCode, Err: err}
	}
	return resp.StatusCode, body, nil
}

// checkAPIVersion checks that the answer is at the microversion sc asked
// for: "OpenStack-API-Version: <service> <mv>" (and, for Nova, the legacy
// X-OpenStack-Nova-API-Version; for Cinder, X-OpenStack-Volume-API-
// Version, if present). At least one header must be there.
func checkAPIVersion(h http.Header, sc *gophercloud.ServiceClient) error {
	service, alias, legacy := sc.Type, sc.Type, ""
	switch sc.Type {
	case "compute":
		legacy = "X-OpenStack-Nova-API-Version"
	case "block-storage", "block-store", "volume", "volumev3":
		service, alias, legacy = "volume", "volume", "X-OpenStack-Volume-API-Version"
	case "instance-ha":
		// Masakari 14.0.2 names itself "masakari" in successful answers
		// and "instance-ha" in errors.
		alias = "masakari"
	}
	seen := false
	for _, v := range h.Values("OpenStack-API-Version") {
		f := strings.Fields(v)
		if len(f) != 2 || (!strings.EqualFold(f[0], service) && !strings.EqualFold(f[0], alias)) || f[1] != sc.Microversion {
			return fmt.Errorf("OpenStack-API-Version %q, want %s %s", v, service, sc.Microversion)
		}
		seen = true
	}
	if legacy != "" {
		for _, v := range h.Values(legacy) {
			if strings.TrimSpace(v) != sc.Microversion {
				return fmt.Errorf("%s %q, want %s", legacy, v, sc.Microversion)
			}
			seen = true
		}
	}
	if !seen {
		return fmt.Errorf("no API version header: the answer is not at %s %s", service, sc.Microversion)
	}
	return nil
}

// negotiateEvacuate returns the evacuate microversion: min(Nova's maximum,
// EvacuateMaxMicroversion), at least EvacuateMinMicroversion. Nova's
// version document (GET on the compute endpoint) is read once.
func (r *Recovery) negotiateEvacuate(ctx context.Context) (string, error) {
	r.mu.Lock()
	mv := r.evacMV
	r.mu.Unlock()
	if mv != "" {
		return mv, nil
	}
	sc, err := r.nova.compute(ctx)
	if err != nil {
		return "", err
	}
	// Nova's version document: GET on the versioned endpoint (/v2.1/).
	// gophercloud's utils.GetSupportedMicroversions would turn a failed
	// GET into "no microversions" (an outage would read as an old Nova).
	op := "read Nova's microversions"
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodGet, url: sc.Endpoint, ok: []int{http.StatusOK},
		max: maxSmallBytes, anyVersion: true})
	if err != nil {
		return "", err
	}
	sup, err := decodeVersionDocument(body)
	if err != nil {
		return "", &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	mv, err = chooseEvacuateMicroversion(sup)
	if err != nil {
		return "", &Error{Kind: KindRejected, Op: "negotiate the evacuate microversion", Err: err}
	}
	r.mu.Lock()
	r.evacMV = mv
	r.mu.Unlock()
	r.log.Debug("evacuate microversion negotiated", "microversion", mv, "nova_max", fmt.Sprintf("%d.%d", sup.MaxMajor, sup.MaxMinor))
	return mv, nil
}

// chooseEvacuateMicroversion picks min(sup's maximum, EvacuateMaxMicroversion)
// and refuses a Nova below EvacuateMinMicroversion or whose minimum is
// above the ceiling.
func chooseEvacuateMicroversion(sup utils.SupportedMicroversions) (string, error) {
	maj, minr, _ := utils.ParseMicroversion(EvacuateMaxMicroversion)
	if sup.MaxMajor < maj || (sup.MaxMajor == maj && sup.MaxMinor < minr) {
		maj, minr = sup.MaxMajor, sup.MaxMinor
	}
	lo, lominor, _ := utils.ParseMicroversion(EvacuateMinMicroversion)
	if maj != lo || minr < lominor {
		return "", fmt.Errorf("Nova offers microversions %d.%d–%d.%d; evacuation needs %s (no onSharedStorage, empty answer) up to %s (keeps the power state)",
			sup.MinMajor, sup.MinMinor, sup.MaxMajor, sup.MaxMinor, EvacuateMinMicroversion, EvacuateMaxMicroversion)
	}
	if sup.MinMajor > maj || (sup.MinMajor == maj && sup.MinMinor > minr) {
		return "", fmt.Errorf("Nova's minimum microversion %d.%d is above %d.%d", sup.MinMajor, sup.MinMinor, maj, minr)
	}
	return fmt.Sprintf("%d.%d", maj, minr), nil
}

// serviceToken is the service user's keystone token, sent as
// X-Service-Token. Its provider client never sends a request of its own
// except to keystone, so gophercloud's proactive renewal (which runs
// before a request) never fires for it: token() renews it itself
// tokenRenewBefore its expiry, and on demand after a 401.
type serviceToken struct {
	cloud loaded
	http  *http.Client
	log   *slog.Logger

	mu sync.Mutex
	pc *gophercloud.ProviderClient
}

// ErrNoServiceToken: RemoveAttachment needs a service cloud.
var ErrNoServiceToken = errors.New("no service_cloud configured: Cinder removes an attachment Nova still uses only with the X-Service-Token of a user with the service role")

// token returns a valid service token, authenticating or renewing it
// first if needed (renew: force a new one, after Cinder refused it).
func (s *serviceToken) token(ctx context.Context, renew bool) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*s.http.Timeout)
	defer cancel()
	if s.pc == nil {
		pc, err := gopenstack.NewClient(s.cloud.auth.IdentityEndpoint)
		if err != nil {
			return "", &Error{Kind: KindConfig, Op: "authenticate the service user", Err: err}
		}
		pc.HTTPClient = *s.http
		pc.ReauthBeforeTokenExpiration = tokenRenewBefore
		if err := gopenstack.Authenticate(ctx, pc, s.cloud.auth); err != nil {
			e := classify("authenticate the service user", err)
			if e.Status == 401 || e.Status == 403 {
				e.Kind = KindAuth
			}
			return "", e
		}
		s.pc = pc
		s.checkRoles()
		return pc.Token(), nil
	}
	exp := s.pc.TokenExpiry()
	if renew || (!exp.IsZero() && !time.Now().Add(tokenRenewBefore).Before(exp)) {
		if err := s.pc.Reauthenticate(ctx, s.pc.Token()); err != nil {
			e := classify("re-authenticate the service user", err)
			e.Kind = KindAuth
			return "", e
		}
		s.checkRoles()
	}
	return s.pc.Token(), nil
}

// checkRoles warns when the service user's token lacks the `service` role
// (Cinder's default service_token_roles): Cinder would then treat the
// request as a user's and refuse to delete an attachment in use (409).
func (s *serviceToken) checkRoles() {
	cr, ok := s.pc.GetAuthResult().(tokens.CreateResult)
	if !ok {
		return
	}
	roles, err := cr.ExtractRoles()
	if err != nil {
		return
	}
	var names []string
	for _, rl := range roles {
		if rl.Name == "service" {
			return
		}
		names = append(names, rl.Name)
	}
	s.log.Warn("the service_cloud user's token has no `service` role: Cinder will refuse to remove attachments unless its service_token_roles lists one of these",
		"roles", names)
}
