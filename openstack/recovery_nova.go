package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"hvguard/reconcile"
)

// Service is a nova-compute service as GET /os-services answers at
// ServicesMicroversion.
type Service struct {
	ID             string    // UUID (2.53+)
	Host           string    // the service's host (Nova's CONF.host)
	Zone           string    // availability zone
	Status         string    // "enabled" or "disabled"
	State          string    // "up" or "down" (forced down, or no report within service_down_time)
	ForcedDown     bool      // forced_down
	DisabledReason string    // "" when null
	UpdatedAt      time.Time // last report (zero when null)
}

// Up reports whether Nova considers the service up.
func (s Service) Up() bool { return s.State == "up" }

// Errors of the Nova recovery calls (wrapped in *Error; test with errors.Is).
var (
	// ErrDoneEvacuations: Nova refused to clear forced_down because
	// evacuations from the host are still `done` (they turn `completed`
	// only when the host's nova-compute restarts). Nova answers 400; the
	// adapter confirms by listing them (the message is translated).
	ErrDoneEvacuations = errors.New("nova refuses to clear forced_down while `done` evacuations from the host remain: restart the host's nova-compute (it turns them `completed`), then release it again")
	// ErrSourceHostUp: Nova refused an evacuation because the server's
	// host still looks up (400 "Compute service of <host> is still in
	// use"): force it down first.
	ErrSourceHostUp = errors.New("nova refuses to evacuate: the source compute service is not down")
	// ErrNoComputeService: no nova-compute service has this host name.
	ErrNoComputeService = errors.New("no nova-compute service on this host")
)

// Service returns host's nova-compute service: GET /os-services?
// binary=nova-compute&host=<host> at ServicesMicroversion. None is an
// error of KindNotFound wrapping ErrNoComputeService; more than one is
// malformed.
func (r *Recovery) Service(ctx context.Context, host string) (Service, error) {
	op := "get the nova-compute service of " + host
	if !reconcile.ValidHostName(host) {
		return Service{}, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("invalid host name %q", host)}
	}
	sc, err := r.computeAt(ctx, ServicesMicroversion)
	if err != nil {
		return Service{}, err
	}
	q := url.Values{"binary": {"nova-compute"}, "host": {host}}
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodGet, url: sc.ServiceURL("os-services") + "?" + q.Encode(),
		ok: []int{http.StatusOK}, max: maxServicesBytes})
	if err != nil {
		return Service{}, err
	}
	ss, err := decodeServices(body)
	if err != nil {
		return Service{}, &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	var out []Service
	for _, s := range ss {
		if strings.EqualFold(s.Host, host) {
			out = append(out, s)
		}
	}
	switch {
	case len(out) == 0 && len(ss) > 0:
		return Service{}, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("the host filter was not applied: %d services, none on %s", len(ss), host)}
	case len(out) == 0:
		return Service{}, &Error{Kind: KindNotFound, Op: op, Err: ErrNoComputeService}
	case len(out) > 1:
		return Service{}, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("%d nova-compute services on %s", len(out), host)}
	}
	return out[0], nil
}

// ForceDown sets (down=true) or clears (down=false) the forced_down flag
// of host's nova-compute service: PUT /os-services/{uuid} {"forced_down":
// down} at ServicesMicroversion. Forcing down needs no RPC to the compute
// and takes effect at once (Nova then evacuates from it); setting
// `status: disabled` instead would make nova-api call the dead compute and
// wait rpc_response_timeout (60 s here). Idempotent.
//
// Clearing it fails with an error wrapping ErrDoneEvacuations while
// evacuations from the host are `done` (Nova's 400; confirmed by listing
// them, since the message is translated).
func (r *Recovery) ForceDown(ctx context.Context, host string, down bool) error {
	op := fmt.Sprintf("set forced_down=%v on %s", down, host)
	svc, err := r.Service(ctx, host)
	if err != nil {
		return err
	}
	sc, err := r.computeAt(ctx, ServicesMicroversion)
	if err != nil {
		return err
	}
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodPut, url: sc.ServiceURL("os-services", svc.ID),
		body: map[string]any{"forced_down": down}, ok: []int{http.StatusOK}, max: maxSmallBytes})
	if err != nil {
		var e *Error
		if !down && errors.As(err, &e) && e.Status == http.StatusBadRequest {
			if done, lerr := r.doneEvacuations(ctx, host); lerr == nil && len(done) > 0 {
				return &Error{Kind: KindConflict, Op: op, Status: e.Status,
					Err: fmt.Errorf("%w (%d: %s): %v", ErrDoneEvacuations, len(done), strings.Join(done, ", "), e.Err)}
			}
		}
		return err
	}
	got, err := decodeServiceUpdate(body)
	if err != nil {
		return &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	if got.ForcedDown != down || got.ID != svc.ID {
		return &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("Nova answered service %s forced_down=%v", got.ID, got.ForcedDown)}
	}
	return nil
}

// doneEvacuations lists the instance UUIDs of host's `done` evacuations.
func (r *Recovery) doneEvacuations(ctx context.Context, host string) ([]string, error) {
	ms, err := r.nova.ListEvacuationsFrom(ctx, host)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if m.Status == "done" {
			out = append(out, m.InstanceUUID)
		}
	}
	return out, nil
}

// Server is a server as host and instance recovery read it (GET
// /servers/detail or /servers/{id} at Microversion).
type Server struct {
	ID         string // lower-case UUID
	Name       string
	ProjectID  string // tenant_id
	Status     string // ACTIVE, SHUTOFF, ERROR, REBUILD, ...
	VMState    string // OS-EXT-STS:vm_state: active, stopped, error, ...
	TaskState  string // OS-EXT-STS:task_state, "" when null
	PowerState int    // OS-EXT-STS:power_state: 0 pending, 1 running, 3 paused, 4 shutdown, 6 crashed, 7 suspended
	Host       string // OS-EXT-SRV-ATTR:host, "" when null
	Metadata   map[string]string
	// Volumes are the ids of the attached volumes
	// (os-extended-volumes:volumes_attached), the root volume included.
	Volumes []string
	// BootFromVolume: the server has no image (Nova answers image ""): its
	// root disk is a volume.
	BootFromVolume bool
}

// HostServers returns every server (all projects) Nova places on host:
// GET /servers/detail?all_tenants=1&host=<host>, paged like ServersOnHost
// and as strict (every record's host must be host; a partial list is
// never returned).
func (r *Recovery) HostServers(ctx context.Context, host string) ([]Server, error) {
	return listPaged(ctx, r.nova, "list servers on "+host, host, "servers/detail", "servers", "server",
		func(q url.Values) { q.Set("all_tenants", "1"); q.Set("host", host) },
		decodeServer2, func(s Server) (string, string) { return s.ID, s.Host }, MaxServersOnHost)
}

// Server returns one server: GET /servers/{id}. A 404 is an error of
// KindNotFound (the caller asked about a server it knows).
func (r *Recovery) Server(ctx context.Context, id string) (Server, error) {
	op := "get server " + id
	if !reconcile.ValidUUID(id) {
		return Server{}, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", id)}
	}
	status, body, err := r.nova.get(ctx, op, "servers/"+id, []int{http.StatusOK, http.StatusNotFound}, maxServerBytes)
	if err != nil {
		return Server{}, err
	}
	if status == http.StatusNotFound {
		if err := checkNotFound(body); err != nil {
			return Server{}, &Error{Kind: KindNotFound, Op: op, Status: status, Err: err}
		}
		return Server{}, &Error{Kind: KindNotFound, Op: op, Status: status, Err: errors.New("server not found")}
	}
	top, err := object(body)
	if err == nil {
		if raw, ok := top["server"]; ok {
			var s Server
			if s, err = decodeServer2(raw); err == nil {
				if s.ID != strings.ToLower(id) {
					err = fmt.Errorf("asked for server %s, got %s", id, s.ID)
				} else {
					return s, nil
				}
			}
		} else {
			err = errors.New(`field "server" missing`)
		}
	}
	return Server{}, &Error{Kind: KindMalformed, Op: op, Status: status, Err: err}
}

// Evacuate asks Nova to rebuild the server on another host (the scheduler
// chooses): POST /servers/{id}/action {"evacuate": {}} at the negotiated
// microversion (min(Nova's maximum, EvacuateMaxMicroversion), so the
// server keeps its prior power state; Nova answers 200 with an empty
// body). The server's host must be down (forced down): otherwise Nova
// answers 400 and the error wraps ErrSourceHostUp. A 409 (KindConflict)
// means the server's state forbids it now (a task in flight). The outcome
// is the evacuation migration's status (Migrations): done, or error
// (NoValidHost: the server stays on the source, ERROR) or failed.
func (r *Recovery) Evacuate(ctx context.Context, serverID string) error {
	op := "evacuate server " + serverID
	if !reconcile.ValidUUID(serverID) {
		return &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", serverID)}
	}
	mv, err := r.negotiateEvacuate(ctx)
	if err != nil {
		return err
	}
	sc, err := r.computeAt(ctx, mv)
	if err != nil {
		return err
	}
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodPost, url: sc.ServiceURL("servers", serverID, "action"),
		body: map[string]any{"evacuate": map[string]any{}}, ok: []int{http.StatusOK}, max: maxSmallBytes, empty: true})
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == http.StatusBadRequest && e.Err != nil && strings.Contains(e.Err.Error(), "is still in use") {
			e.Err = fmt.Errorf("%w: %v", ErrSourceHostUp, e.Err)
		}
		return err
	}
	if len(body) != 0 {
		// At 2.14+ the answer is empty; a body (adminPass) means another
		// microversion's semantics.
		return &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("evacuate answered a body at %s: %s", mv, trimBody(body))}
	}
	return nil
}

// Migrations returns the evacuations from sourceHost created at or after
// since (zero: all): ListEvacuationsFrom (GET /os-migrations?
// source_compute=<host>&migration_type=evacuation at 2.59, every page,
// newest first), filtered by created_at. Statuses: accepted,
// pre-migrating, migrating, done (evacuated; completed once the source's
// nova-compute restarted), error (not scheduled, NoValidHost: the server
// stays on the source), failed (the rebuild failed on the destination).
// Evacuations of deleted servers are not listed by Nova.
func (r *Recovery) Migrations(ctx context.Context, sourceHost string, since time.Time) ([]reconcile.Migration, error) {
	ms, err := r.nova.ListEvacuationsFrom(ctx, sourceHost)
	if err != nil {
		return nil, err
	}
	out := ms[:0]
	for _, m := range ms {
		if !m.CreatedAt.Before(since) {
			out = append(out, m)
		}
	}
	return out, nil
}

// Start starts a stopped server: POST /servers/{id}/action {"os-start":
// null} → 202. A server not in vm_state stopped (or with a task in
// flight) is KindConflict (Nova's 409).
func (r *Recovery) Start(ctx context.Context, id string) error {
	return r.serverAction(ctx, "start server "+id, id, map[string]any{"os-start": nil})
}

// HardReboot hard-reboots a server: POST /servers/{id}/action {"reboot":
// {"type": "HARD"}} → 202 (Nova accepts it from more states than start:
// active, stopped, error, paused, suspended). KindConflict on Nova's 409.
func (r *Recovery) HardReboot(ctx context.Context, id string) error {
	return r.serverAction(ctx, "hard-reboot server "+id, id, map[string]any{"reboot": map[string]any{"type": "HARD"}})
}

func (r *Recovery) serverAction(ctx context.Context, op, id string, action map[string]any) error {
	if !reconcile.ValidUUID(id) {
		return &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", id)}
	}
	sc, err := r.computeAt(ctx, Microversion)
	if err != nil {
		return err
	}
	_, _, err = r.do(ctx, request{op: op, sc: sc, method: http.MethodPost, url: sc.ServiceURL("servers", id, "action"),
		body: action, ok: []int{http.StatusAccepted}, max: maxSmallBytes, empty: true})
	return err
}

// listPaged lists a paged Nova collection at Microversion: GET
// path?<filters>&limit=<page size>[&marker=], following the next links,
// checking every record's host (hostOf returns its id and host) and that
// no id repeats. A partial list is never returned.
func listPaged[T any](ctx context.Context, c *Client, op, host, path, field, what string, filters func(url.Values),
	decode func(json.RawMessage) (T, error), hostOf func(T) (string, string), maxItems int) ([]T, error) {
	if !reconcile.ValidHostName(host) {
		return nil, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("invalid host name %q", host)}
	}
	var out []T
	seen := make(map[string]bool)
	marker := ""
	for page := 0; ; page++ {
		q := url.Values{}
		filters(q)
		q.Set("limit", fmt.Sprint(c.pageSize))
		if marker != "" {
			q.Set("marker", marker)
		}
		_, body, err := c.get(ctx, op, path+"?"+q.Encode(), []int{http.StatusOK}, maxServersPageBytes)
		if err != nil {
			return nil, err
		}
		items, next, nextMarker, err := decodePage(body, field, what, c.pageSize, decode)
		if err != nil {
			return nil, &Error{Kind: KindMalformed, Op: fmt.Sprintf("%s (page %d)", op, page+1), Err: err}
		}
		for _, it := range items {
			id, h := hostOf(it)
			switch {
			case !strings.EqualFold(h, host):
				return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("%s %s has host %q: the host filter was not applied", what, id, h)}
			case seen[id]:
				return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("%s %s listed twice: paging is inconsistent", what, id)}
			}
			seen[id] = true
		}
		out = append(out, items...)
		if len(out) > maxItems {
			return nil, &Error{Kind: KindTooLarge, Op: op, Err: fmt.Errorf("more than %d %ss", maxItems, what)}
		}
		if !next {
			return out, nil
		}
		if len(items) == 0 {
			return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("page %d is empty but has a next link", page+1)}
		}
		last, _ := hostOf(items[len(items)-1])
		if !strings.EqualFold(nextMarker, last) {
			return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("next link marker %q is not the last %s %q", nextMarker, what, last)}
		}
		marker = last
	}
}

// InstanceActions is Client.InstanceActions (newest first, at most
// MaxActions; a null user_id is Nova itself) for instance recovery's
// confirmation of who stopped a server.
func (r *Recovery) InstanceActions(ctx context.Context, id string) ([]InstanceAction, error) {
	return r.nova.InstanceActions(ctx, id)
}
