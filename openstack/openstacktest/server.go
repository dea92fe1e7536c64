// Package openstacktest is a contract-test double of keystone and Nova: an
// httptest server that replays responses recorded from a real Nova 26.2.2
// (openstack/testdata) and can inject faults (5xx, dropped connections,
// hangs, an expired token). It is the fast tier beside the real harness in
// test/e2e/openstack; the responses are Nova's own, byte for byte.
package openstacktest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Recorded is one recorded HTTP response.
type Recorded struct {
	Status int
	Header http.Header
	Body   []byte
}

// TestdataDir is openstack/testdata (the recorded responses).
func TestdataDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// Load reads a recorded response: name.http (a raw HTTP/1.1 response as
// `curl -i` prints it) or name.json (test/e2e/openstack's recorder format:
// {"status", "headers", "body"}; a null body is an empty one).
func Load(name string) (Recorded, error) {
	dir := TestdataDir()
	if b, err := os.ReadFile(filepath.Join(dir, name+".http")); err == nil {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(fixCRLF(b))), nil)
		if err != nil {
			return Recorded{}, fmt.Errorf("%s.http: %w", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if len(body) == 0 {
			// curl -i output after tr -d '\r' has no Content-Length framing
			// problems; the body is what follows the blank line.
			if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
				body = b[i+2:]
			}
		}
		return Recorded{Status: resp.StatusCode, Header: resp.Header, Body: bytes.TrimRight(body, "\n")}, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		return Recorded{}, err
	}
	var rec struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    json.RawMessage   `json:"body"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return Recorded{}, fmt.Errorf("%s.json: %w", name, err)
	}
	h := http.Header{}
	for k, v := range rec.Headers {
		h.Set(k, v)
	}
	var compact bytes.Buffer
	if len(rec.Body) > 0 && !bytes.Equal(rec.Body, []byte("null")) { // null: an empty body
		if err := json.Compact(&compact, rec.Body); err != nil {
			return Recorded{}, err
		}
	}
	return Recorded{Status: rec.Status, Header: h, Body: compact.Bytes()}, nil
}

// fixCRLF turns a response saved without \r back into HTTP framing and
// drops Content-Length (the body may have lost its trailing newline).
func fixCRLF(b []byte) []byte {
	head, body, _ := bytes.Cut(b, []byte("\n\n"))
	var out bytes.Buffer
	for _, l := range strings.Split(string(head), "\n") {
		if strings.HasPrefix(strings.ToLower(l), "content-length:") {
			continue
		}
		out.WriteString(strings.TrimRight(l, "\r") + "\r\n")
	}
	fmt.Fprintf(&out, "Content-Length: %d\r\n\r\n", len(body))
	out.Write(body)
	return out.Bytes()
}

// MustLoad is Load or t.Fatal.
func MustLoad(t testing.TB, name string) Recorded {
	t.Helper()
	r, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Fault is what a route does instead of answering normally.
type Fault int

// Faults.
const (
	FaultNone Fault = iota
	Fault500        // HTTP 500 with Nova's computeFault body
	FaultDrop       // close the connection without an answer
	FaultHang       // never answer (until the server closes)
	Fault401        // HTTP 401 (an expired token)
	Fault503        // HTTP 503 from a proxy (HTML body)
)

// Server is the fake keystone + Nova.
type Server struct {
	*httptest.Server
	t testing.TB

	mu            sync.Mutex
	routes        map[string]Recorded // "path?sorted-query" → response
	faults        map[int]Fault       // n-th Nova request (1-based) → fault
	always        Fault               // fault for every Nova request
	failFrom      int
	failFromFault Fault
	keystoneDown  bool
	requests      []string
	captured      []Request

	novaRequests  atomic.Int64
	tokens        atomic.Int64
	serviceTokens atomic.Int64
	tokenTTL      atomic.Int64 // token lifetime in ns; 0 = an hour
	hang          chan struct{}
}

// Catalog paths of the fake Cinder v3 and Masakari (project p1).
const (
	VolumePath   = "/volume/v3/p1"
	MasakariPath = "/instance-ha/v1/p1"
)

// ServiceTokens returns the number of tokens issued to ServiceUser.
func (s *Server) ServiceTokens() int { return int(s.serviceTokens.Load()) }

// SetTokenLife sets the lifetime of the tokens issued from now on.
func (s *Server) SetTokenLife(d time.Duration) { s.tokenTTL.Store(int64(d)) }

func (s *Server) tokenLife() time.Duration {
	if d := time.Duration(s.tokenTTL.Load()); d > 0 {
		return d
	}
	return time.Hour
}

// New starts a server. Its keystone issues tokens whose catalog points to
// its Nova at /v2.1.
func New(t testing.TB) *Server {
	s := &Server{t: t, routes: map[string]Recorded{}, faults: map[int]Fault{}, hang: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		close(s.hang)
		s.Server.CloseClientConnections()
		s.Server.Close()
	})
	return s
}

// key normalises a request target: path and query sorted by key.
func key(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// Route answers GET path?query (query in any order) with rec.
func (s *Server) Route(pathAndQuery string, rec Recorded) {
	s.RouteMethod(http.MethodGet, pathAndQuery, rec)
}

// RouteMethod answers method path?query with rec.
func (s *Server) RouteMethod(method, pathAndQuery string, rec Recorded) {
	u, err := url.Parse(pathAndQuery)
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[routeKey(method, key(u.Path, u.Query()))] = rec
}

// routeKey is the routes map's key: GET routes are the bare target.
func routeKey(method, target string) string {
	if method == http.MethodGet || method == "" {
		return target
	}
	return method + " " + target
}

// Request is a request the fake served (keystone's excluded).
type Request struct {
	Method, Target string
	Header         http.Header
	Body           []byte
}

// Captured returns the requests served so far (not keystone's), in order.
func (s *Server) Captured() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.captured...)
}

// RouteFile is Route with a recorded response from testdata.
func (s *Server) RouteFile(pathAndQuery, name string) { s.Route(pathAndQuery, MustLoad(s.t, name)) }

// FailNth makes the n-th Nova request (1-based, counted from now on) fail.
func (s *Server) FailNth(n int, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[int(s.novaRequests.Load())+n] = f
}

// FailFrom makes the n-th Nova request (1-based, counted from now on) and
// every later one fail (a Nova that went away and stays away; net/http
// retries an idempotent request once on a dropped keep-alive connection).
func (s *Server) FailFrom(n int, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failFrom, s.failFromFault = int(s.novaRequests.Load())+n, f
}

// FailAll makes every Nova request fail with f (FaultNone clears it).
func (s *Server) FailAll(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.always = f
}

// KeystoneDown makes keystone refuse every authentication (401).
func (s *Server) KeystoneDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keystoneDown = down
}

// NovaRequests returns the number of Nova requests served so far.
func (s *Server) NovaRequests() int { return int(s.novaRequests.Load()) }

// Tokens returns the number of tokens issued.
func (s *Server) Tokens() int { return int(s.tokens.Load()) }

// Requests returns the Nova request targets seen, in order.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// ServiceUser is the user name of the clouds.yaml entry "service": its
// tokens are "svc-token-N" with the role service.
const ServiceUser = "hvg-service"

// CloudsYAML writes a clouds.yaml for cloud "test" (admin) and cloud
// "service" (ServiceUser) pointing at s and returns its path.
func (s *Server) CloudsYAML(t testing.TB) string {
	p := filepath.Join(t.TempDir(), "clouds.yaml")
	y := fmt.Sprintf(`clouds:
  test:
    auth:
      auth_url: %s/v3
      username: admin
      password: secret
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: public
    identity_api_version: 3
  service:
    auth:
      auth_url: %s/v3
      username: %s
      password: secret
      project_name: service
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: public
    identity_api_version: 3
`, s.URL, s.URL, ServiceUser)
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v3") {
		s.keystone(w, r)
		return
	}
	n := int(s.novaRequests.Add(1))
	reqBody, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, key(r.URL.Path, r.URL.Query()))
	s.captured = append(s.captured, Request{Method: r.Method, Target: key(r.URL.Path, r.URL.Query()), Header: r.Header.Clone(), Body: reqBody})
	f := s.faults[n]
	if f == FaultNone && s.failFrom > 0 && n >= s.failFrom {
		f = s.failFromFault
	}
	if f == FaultNone {
		f = s.always
	}
	rec, ok := s.routes[routeKey(r.Method, key(r.URL.Path, r.URL.Query()))]
	s.mu.Unlock()
	switch f {
	case Fault500:
		writeJSON(w, 500, "2.59", `{"computeFault": {"code": 500, "message": "Unexpected API Error."}}`)
		return
	case Fault503:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(503)
		io.WriteString(w, "<html><body>503 Service Unavailable</body></html>")
		return
	case Fault401:
		writeJSON(w, 401, "", `{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}`)
		return
	case FaultDrop:
		if hj, ok := w.(http.Hijacker); ok {
			c, _, _ := hj.Hijack()
			c.Close()
		}
		return
	case FaultHang:
		select {
		case <-s.hang:
		case <-r.Context().Done():
		}
		return
	}
	if r.Header.Get("X-Auth-Token") == "" {
		writeJSON(w, 401, "", `{"error": {"code": 401}}`)
		return
	}
	if !ok {
		s.t.Logf("openstacktest: no route for %s", routeKey(r.Method, key(r.URL.Path, r.URL.Query())))
		writeJSON(w, 404, "2.59", `{"itemNotFound": {"code": 404, "message": "no route in openstacktest"}}`)
		return
	}
	for k, vs := range rec.Header {
		if strings.EqualFold(k, "Content-Length") || strings.EqualFold(k, "Date") {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(rec.Status)
	w.Write(rec.Body)
}

func writeJSON(w http.ResponseWriter, status int, mv, body string) {
	w.Header().Set("Content-Type", "application/json")
	if mv != "" {
		w.Header().Set("OpenStack-API-Version", "compute "+mv)
		w.Header().Set("X-OpenStack-Nova-API-Version", mv)
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// keystone serves POST /v3/auth/tokens with a minimal, valid v3 token and a
// catalog with one compute endpoint (this server's /v2.1).
func (s *Server) keystone(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v3/auth/tokens" {
		writeJSON(w, 404, "", `{"error": {"code": 404}}`)
		return
	}
	s.mu.Lock()
	down := s.keystoneDown
	s.mu.Unlock()
	if down {
		writeJSON(w, 401, "", `{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}`)
		return
	}
	n := s.tokens.Add(1)
	var auth struct {
		Auth struct {
			Identity struct {
				Password struct {
					User struct {
						Name string `json:"name"`
					} `json:"user"`
				} `json:"password"`
			} `json:"identity"`
		} `json:"auth"`
	}
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &auth)
	user, role, prefix := "admin", "admin", "token"
	if auth.Auth.Identity.Password.User.Name == ServiceUser {
		user, role, prefix = ServiceUser, "service", "svc-token"
		s.serviceTokens.Add(1)
	}
	exp := time.Now().Add(s.tokenLife()).UTC().Format("2006-01-02T15:04:05.000000Z")
	ep := func(id, typ, name, url string) string {
		return fmt.Sprintf(`{"endpoints": [{"id": %q, "interface": "public", "region_id": "RegionOne", "url": %q, "region": "RegionOne"}], "id": "s-%s", "type": %q, "name": %q}`, id, url, id, typ, name)
	}
	body := fmt.Sprintf(`{"token": {"methods": ["password"], "user": {"domain": {"id": "default", "name": "Default"}, "id": "u-%s", "name": %q, "password_expires_at": null},
 "audit_ids": ["a"], "expires_at": %q, "issued_at": %q,
 "project": {"domain": {"id": "default", "name": "Default"}, "id": "p1", "name": "admin"}, "is_domain": false,
 "roles": [{"id": "r1", "name": %q}],
 "catalog": [%s, %s, %s]}}`,
		user, user, exp, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"), role,
		ep("e1", "compute", "nova", s.URL+"/v2.1"), ep("e2", "volumev3", "cinderv3", s.URL+VolumePath), ep("e3", "instance-ha", "masakari", s.URL+MasakariPath))
	w.Header().Set("X-Subject-Token", fmt.Sprintf("%s-%d", prefix, n))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(201)
	io.WriteString(w, body)
}

// Migration is a synthetic migration record for generated pages.
type Migration struct {
	ID                          int
	UUID, Instance, Source      string
	Dest, Status, Type, Created string
}

// MigrationsPage renders a /os-migrations body at 2.59 with a next link
// (marker = last uuid) when next is true, as Nova does.
func MigrationsPage(ms []Migration, next bool, base string, limit int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"migrations": [`)
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"id": %d, "uuid": %q, "source_compute": %q, "dest_compute": %q, "source_node": %q, "dest_node": %q, "dest_host": "192.168.0.1", "old_instance_type_id": null, "new_instance_type_id": null, "instance_uuid": %q, "status": %q, "migration_type": %q, "created_at": %q, "updated_at": %q}`,
			m.ID, m.UUID, m.Source, m.Dest, m.Source, m.Dest, m.Instance, m.Status, m.Type, m.Created, m.Created)
	}
	b.WriteString("]")
	if next && len(ms) > 0 {
		fmt.Fprintf(&b, `, "migrations_links": [{"rel": "next", "href": "%s/v2.1/os-migrations?limit=%d&marker=%s"}]`, base, limit, ms[len(ms)-1].UUID)
	}
	b.WriteString("}")
	return b.Bytes()
}

// NovaHeader is the header of a Nova 2.59 JSON answer.
func NovaHeader() http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("OpenStack-API-Version", "compute 2.59")
	h.Set("X-OpenStack-Nova-API-Version", "2.59")
	return h
}

// ServerBody renders a GET /servers/{id} body at 2.59 (the fields hvguard
// reads plus a few others, as Nova writes them). host "" is null.
func ServerBody(id, host, status, task string) []byte {
	return []byte(`{"server": ` + serverJSON(id, host, status, task) + `}`)
}

// serverJSON renders one server object as Nova 2.59 writes it in
// GET /servers/{id} and in GET /servers/detail.
func serverJSON(id, host, status, task string) string {
	q := func(s string) string {
		if s == "" {
			return "null"
		}
		b, _ := json.Marshal(s)
		return string(b)
	}
	return fmt.Sprintf(`{"id": %q, "name": "vm", "status": %q, "tenant_id": "p1", "OS-EXT-SRV-ATTR:host": %s, "OS-EXT-SRV-ATTR:hypervisor_hostname": %s, "OS-EXT-STS:task_state": %s, "OS-EXT-STS:vm_state": "active", "OS-EXT-STS:power_state": 1, "addresses": {}, "metadata": {}}`,
		id, status, q(host), q(host), q(task))
}

// ServersDetailPage renders a GET /servers/detail body at 2.59 for servers
// (ids) ACTIVE on host without a task, with a next link (marker = the last
// id) when next is true, as Nova does.
func ServersDetailPage(ids []string, host string, next bool, base string, limit int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"servers": [`)
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(serverJSON(id, host, "ACTIVE", ""))
	}
	b.WriteString("]")
	if next && len(ids) > 0 {
		fmt.Fprintf(&b, `, "servers_links": [{"rel": "next", "href": "%s/v2.1/servers/detail?all_tenants=1&host=%s&limit=%d&marker=%s"}]`, base, host, limit, ids[len(ids)-1])
	}
	b.WriteString("}")
	return b.Bytes()
}

// Scenario fills s with a generated Nova: n servers whose instances were on
// node1; those with evacuated[i] true were evacuated (status done) to node2
// and are on node2, the others are on node1. Pages of pageSize, for the
// evacuation listing and for node2's servers/detail listing alike.
func (s *Server) Scenario(uuids []string, evacuated []bool, pageSize int) {
	var ms []Migration
	var onNode2 []string
	id := 0
	for i, u := range uuids {
		host := "node1"
		if evacuated[i] {
			id++
			ms = append(ms, Migration{ID: id, UUID: fmt.Sprintf("bbbbbbbb-0000-4000-8000-%012d", id), Instance: u, Source: "node1",
				Dest: "node2", Status: "done", Type: "evacuation", Created: "2026-11-29T17:00:00.000000"})
			host = "node2"
			onNode2 = append(onNode2, u)
		}
		s.Route("/v2.1/servers/"+u, Recorded{Status: 200, Header: NovaHeader(), Body: ServerBody(u, host, "ACTIVE", "")})
	}
	s.routePages(len(onNode2), pageSize, func(start, end int, full bool) (url.Values, []byte) {
		page := onNode2[start:end]
		q := url.Values{"all_tenants": {"1"}, "host": {"node2"}, "limit": {fmt.Sprint(pageSize)}}
		if start > 0 {
			q.Set("marker", onNode2[start-1])
		}
		return q, ServersDetailPage(page, "node2", full, s.URL, pageSize)
	}, "/v2.1/servers/detail?")
	// Nova lists newest first at >= 2.59.
	sort.Slice(ms, func(a, b int) bool { return ms[a].ID > ms[b].ID })
	s.routePages(len(ms), pageSize, func(start, end int, full bool) (url.Values, []byte) {
		q := url.Values{"source_compute": {"node1"}, "migration_type": {"evacuation"}, "limit": {fmt.Sprint(pageSize)}}
		if start > 0 {
			q.Set("marker", ms[start-1].UUID)
		}
		return q, MigrationsPage(ms[start:end], full, s.URL, pageSize)
	}, "/v2.1/os-migrations?")
}

// routePages routes the pages of an n-item listing as Nova pages it: pages
// of pageSize, a next link on every full page, so the last page is short
// (empty when n is a multiple of pageSize). page renders the query and the
// body of items [start, end).
func (s *Server) routePages(n, pageSize int, page func(start, end int, full bool) (url.Values, []byte), prefix string) {
	for start := 0; ; start += pageSize {
		end := min(start+pageSize, n)
		full := end-start == pageSize
		q, body := page(start, end, full)
		s.Route(prefix+q.Encode(), Recorded{Status: 200, Header: NovaHeader(), Body: body})
		if !full {
			return
		}
	}
}
