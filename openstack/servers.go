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

	cls "hvguard/classify" // not "classify": errors.go's classify maps errors
	"hvguard/reconcile"
)

// Nova-aware stop classification (issue 6, package classify) reads two
// things: every server Nova places on this host, with its task, vm and
// power state (one listing shared by all stops whose windows end together),
// and, for the few servers whose vm_state is stopped or whose task is
// powering-off, who asked for the stop and when (instance actions).

// Caps of the classification calls. Beyond them a call fails
// (KindTooLarge or KindMalformed), never returns a partial list.
const (
	// MaxServersOnHost is the most servers ServersOnHost accepts for one
	// host. A compute runs tens to a few hundred instances.
	MaxServersOnHost = 5000
	// MaxActions is the most instance actions InstanceActions asks for and
	// accepts (the newest first).
	MaxActions = 50
	// maxServersPageBytes bounds one servers/detail page (a server with
	// addresses, metadata and flavor is 2–4 KiB; PageSize 500 → ~2 MiB).
	maxServersPageBytes = 8 << 20
	// maxActionsBytes bounds one os-instance-actions body (~400 bytes an
	// action).
	maxActionsBytes = 1 << 20
)

// Server attribute names used by the listing (besides attrHost,
// attrTaskState, attrVMState in decode.go).
const attrPowerState = "OS-EXT-STS:power_state"

// ServerState is Nova's view of one server, from GET /servers/detail.
type ServerState struct {
	ID         string // lower-case UUID
	Status     string // API status: ACTIVE, REBOOT, HARD_REBOOT, SHUTOFF, ...
	TaskState  string // OS-EXT-STS:task_state, "" when null (no operation in flight)
	VMState    string // OS-EXT-STS:vm_state
	PowerState int    // OS-EXT-STS:power_state (0 pending, 1 running, 3 paused, 4 shutdown, 6 crashed, 7 suspended)
	Host       string // OS-EXT-SRV-ATTR:host
}

// ServersOnHost returns every server (of every project) Nova places on
// host: GET /servers/detail?all_tenants=1&host=<host>&limit=PageSize,
// following Nova's servers_links next links (marker = the last server's
// id) until a page has none. Config.PageSize sets the page size (the same
// as for /os-migrations). Needs admin credentials (the host filter and
// OS-EXT-* attributes are admin-only: a listing without them is rejected,
// not read as "no servers").
//
// Every record is checked: a canonical UUID id, a status, the host
// attribute present and equal to host (the filter was applied: Nova drops
// admin-only filters silently for other users), task/vm/power state of the
// right types, no id twice. Any failure is an error: a partial list is
// never returned.
func (c *Client) ServersOnHost(ctx context.Context, host string) ([]ServerState, error) {
	return listPaged(ctx, c, "list servers on "+host, host, "servers/detail", "servers", "server",
		func(q url.Values) { q.Set("all_tenants", "1"); q.Set("host", host) },
		decodeServerState, func(s ServerState) (string, string) { return s.ID, s.Host }, MaxServersOnHost)
}

// serversPage is one decoded servers/detail page.
type serversPage struct {
	Servers    []ServerState
	Next       bool
	NextMarker string
}

// decodeServersPage decodes one GET /servers/detail body at Microversion.
func decodeServersPage(body []byte, limit int) (serversPage, error) {
	var p serversPage
	var err error
	p.Servers, p.Next, p.NextMarker, err = decodePage(body, "servers", "server", limit, decodeServerState)
	return p, err
}

// decodeServerState decodes one server of a servers/detail listing.
func decodeServerState(raw json.RawMessage) (ServerState, error) {
	var s ServerState
	o, err := object(raw)
	if err != nil {
		return s, err
	}
	if s.ID, err = reqString(o, "id"); err != nil {
		return s, err
	}
	s.ID = strings.ToLower(s.ID)
	if !reconcile.ValidUUID(s.ID) {
		return s, fmt.Errorf("id %q is not a UUID", s.ID)
	}
	if s.Status, err = reqString(o, "status"); err != nil {
		return s, err
	}
	if s.Status == "" {
		return s, errors.New("status is empty")
	}
	if s.Host, s.TaskState, err = hostAndTask(o); err != nil {
		return s, err
	}
	if s.VMState, err = reqString(o, attrVMState); err != nil {
		return s, err
	}
	if s.VMState == "" {
		return s, fmt.Errorf("field %q is empty", attrVMState)
	}
	praw, ok := o[attrPowerState]
	if !ok {
		return s, fmt.Errorf("field %q missing", attrPowerState)
	}
	if isNull(praw) || json.Unmarshal(praw, &s.PowerState) != nil || s.PowerState < 0 || s.PowerState > 7 {
		return s, fmt.Errorf("field %q: want an integer 0..7, got %s", attrPowerState, trimBody(praw))
	}
	return s, nil
}

// ClassifyServers is a ServersOnHost listing as package classify's values
// (classify is stdlib-only: the mapping lives with the client).
func ClassifyServers(ss []ServerState) []cls.Server {
	out := make([]cls.Server, len(ss))
	for i, s := range ss {
		out[i] = cls.Server{UUID: s.ID, VMState: cls.VMState(s.VMState), TaskState: cls.TaskState(s.TaskState),
			PowerState: cls.PowerState(s.PowerState)}
	}
	return out
}

// ClassifyActions is an InstanceActions answer as package classify's values.
func ClassifyActions(as []InstanceAction) []cls.Action {
	out := make([]cls.Action, len(as))
	for i, a := range as {
		out[i] = cls.Action{Name: a.Action, UserID: a.UserID, Start: a.StartTime}
	}
	return out
}

// InstanceAction is one entry of GET /servers/{id}/os-instance-actions.
type InstanceAction struct {
	Action    string    // "stop", "reboot", "start", "create", ...
	UserID    string    // "" when null: Nova itself (its power-state sync calls the stop API with an admin context without a user)
	RequestID string    // req-...
	StartTime time.Time // UTC
}

// InstanceActions returns the newest instance actions of server uuid (at
// most MaxActions, newest first, as Nova orders them): GET
// /servers/{uuid}/os-instance-actions?limit=MaxActions (limit needs 2.58,
// Microversion is 2.59). A 404 is an error (KindNotFound): the caller
// asked about a server it had just listed. Strict decoding as everywhere.
func (c *Client) InstanceActions(ctx context.Context, uuid string) ([]InstanceAction, error) {
	op := "list instance actions of " + uuid
	if !reconcile.ValidUUID(uuid) {
		return nil, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", uuid)}
	}
	status, body, err := c.get(ctx, op, fmt.Sprintf("servers/%s/os-instance-actions?limit=%d", uuid, MaxActions),
		[]int{http.StatusOK, http.StatusNotFound}, maxActionsBytes)
	if err != nil {
		return nil, err
	}
	if status == http.StatusNotFound {
		if err := checkNotFound(body); err != nil {
			return nil, &Error{Kind: KindNotFound, Op: op, Status: status, Err: err}
		}
		return nil, &Error{Kind: KindNotFound, Op: op, Status: status, Err: errors.New("server not found")}
	}
	as, err := decodeInstanceActions(body, uuid)
	if err != nil {
		return nil, &Error{Kind: KindMalformed, Op: op, Status: status, Err: err}
	}
	return as, nil
}

// decodeInstanceActions decodes an os-instance-actions body for server uuid.
func decodeInstanceActions(body []byte, uuid string) ([]InstanceAction, error) {
	top, err := object(body)
	if err != nil {
		return nil, err
	}
	raw, ok := top["instanceActions"]
	if !ok {
		return nil, errors.New(`field "instanceActions" missing`)
	}
	var items []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &items) != nil {
		return nil, fmt.Errorf(`field "instanceActions": want an array, got %s`, kindOf(raw))
	}
	if len(items) > MaxActions {
		return nil, fmt.Errorf("%d actions, more than the limit %d asked for", len(items), MaxActions)
	}
	out := make([]InstanceAction, 0, len(items))
	for i, it := range items {
		o, err := object(it)
		if err != nil {
			return nil, fmt.Errorf("action %d: %w", i, err)
		}
		var a InstanceAction
		var inst, start string
		if err := readStrings(o, strField{"action", &a.Action, false}, strField{"instance_uuid", &inst, false},
			strField{"request_id", &a.RequestID, false}, strField{"user_id", &a.UserID, true}, strField{"start_time", &start, false}); err != nil {
			return nil, fmt.Errorf("action %d: %w", i, err)
		}
		if a.Action == "" {
			return nil, fmt.Errorf("action %d: action is empty", i)
		}
		if !strings.EqualFold(inst, uuid) {
			return nil, fmt.Errorf("action %d is about server %s, asked for %s", i, inst, uuid)
		}
		if a.StartTime, err = novaTime(start); err != nil {
			return nil, fmt.Errorf("action %d: start_time: %w", i, err)
		}
		out = append(out, a)
	}
	return out, nil
}
