package openstack

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"hvguard/reconcile"
)

// ListEvacuationsFrom returns every evacuation migration whose
// source_compute is host: GET /os-migrations?source_compute=<host>&
// migration_type=evacuation&limit=PageSize, following the next links with
// marker = the last record's uuid until a page has none.
//
// It does not filter by status (Nova's status filter takes one value; a
// repeated one keeps only the last) nor use host= (it matches the source OR
// the destination and overrides source_compute): statuses are the caller's
// to judge. Every record is checked against the filters asked for. Any
// failure — transport, HTTP status, shape, a cap exceeded, an inconsistent
// next link, a record twice — is an error: a partial list is never
// returned.
func (c *Client) ListEvacuationsFrom(ctx context.Context, host string) ([]reconcile.Migration, error) {
	op := "list evacuations from " + host
	if !reconcile.ValidHostName(host) {
		return nil, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("invalid host name %q", host)}
	}
	var out []reconcile.Migration
	seen := make(map[string]bool)
	marker := ""
	for page := 0; ; page++ {
		q := url.Values{}
		q.Set("source_compute", host)
		q.Set("migration_type", reconcile.MigrationTypeEvacuation)
		q.Set("limit", fmt.Sprint(c.pageSize))
		if marker != "" {
			q.Set("marker", marker)
		}
		_, body, err := c.get(ctx, op, "os-migrations?"+q.Encode(), []int{http.StatusOK}, maxPageBytes)
		if err != nil {
			return nil, err
		}
		p, err := decodeMigrationsPage(body, c.pageSize)
		if err != nil {
			return nil, &Error{Kind: KindMalformed, Op: fmt.Sprintf("%s (page %d)", op, page+1), Err: err}
		}
		for _, m := range p.Migrations {
			switch {
			case !strings.EqualFold(m.SourceCompute, host):
				return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("migration %d has source_compute %q: the filter was not applied", m.ID, m.SourceCompute)}
			case m.Type != reconcile.MigrationTypeEvacuation:
				return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("migration %d has migration_type %q: the filter was not applied", m.ID, m.Type)}
			case seen[m.UUID]:
				return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("migration %s listed twice: paging is inconsistent", m.UUID)}
			}
			seen[m.UUID] = true
		}
		out = append(out, p.Migrations...)
		if len(out) > MaxEvacuations {
			return nil, &Error{Kind: KindTooLarge, Op: op, Err: fmt.Errorf("more than %d evacuation records", MaxEvacuations)}
		}
		if !p.Next {
			return out, nil
		}
		if len(p.Migrations) == 0 {
			return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("page %d is empty but has a next link", page+1)}
		}
		last := p.Migrations[len(p.Migrations)-1].UUID
		if !strings.EqualFold(p.NextMarker, last) {
			return nil, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("next link marker %q is not the last record %q", p.NextMarker, last)}
		}
		marker = last
	}
}

// ServerHosts looks up each server with GET /servers/{uuid}: one request
// per candidate (servers with an evacuation record from this host, not one
// per local domain). A 404 carrying Nova's itemNotFound is an answer
// (Found=false); every other failure fails the whole call, so the caller
// never decides from a partial set. Up to lookupConcurrency requests are
// in flight.
func (c *Client) ServerHosts(ctx context.Context, uuids []string) (map[string]reconcile.ServerLookup, error) {
	if len(uuids) > MaxLookups {
		return nil, &Error{Kind: KindTooLarge, Op: "look up servers", Err: fmt.Errorf("%d servers, more than %d", len(uuids), MaxLookups)}
	}
	for _, u := range uuids {
		if !reconcile.ValidUUID(u) {
			return nil, &Error{Kind: KindConfig, Op: "look up servers", Err: fmt.Errorf("%q is not a canonical UUID", u)}
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(map[string]reconcile.ServerLookup, len(uuids))
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, lookupConcurrency)
	for _, u := range uuids {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := c.server(ctx, u)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
					cancel()
				}
				return
			}
			out[u] = s
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = classify("look up servers", ctx.Err())
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// server looks up one server.
func (c *Client) server(ctx context.Context, uuid string) (reconcile.ServerLookup, error) {
	op := "get server " + uuid
	status, body, err := c.get(ctx, op, "servers/"+uuid, []int{http.StatusOK, http.StatusNotFound}, maxServerBytes)
	if err != nil {
		return reconcile.ServerLookup{}, err
	}
	if status == http.StatusNotFound {
		if err := checkNotFound(body); err != nil {
			return reconcile.ServerLookup{}, &Error{Kind: KindNotFound, Op: op, Status: status, Err: err}
		}
		return reconcile.ServerLookup{Found: false}, nil
	}
	s, err := decodeServer(body, uuid)
	if err != nil {
		return reconcile.ServerLookup{}, &Error{Kind: KindMalformed, Op: op, Status: status, Err: err}
	}
	return s, nil
}

// ServersOn lists every server Nova places on host (ServersOnHost: one
// paged GET /servers/detail?all_tenants=1&host=<host>) as lookups keyed by
// UUID. The reconcile runner uses it for a destination that received
// several of this host's evacuated instances: a server listed there carries
// the same OS-EXT-SRV-ATTR:host and task_state a GET /servers/{id} would
// return, so one listing replaces one request per server. Every listed
// server's host was checked to be host; any failure is an error, never a
// partial map.
func (c *Client) ServersOn(ctx context.Context, host string) (map[string]reconcile.ServerLookup, error) {
	ss, err := c.ServersOnHost(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make(map[string]reconcile.ServerLookup, len(ss))
	for _, s := range ss {
		out[s.ID] = reconcile.ServerLookup{Found: true, Host: s.Host, Status: s.Status, VMState: s.VMState, TaskState: s.TaskState}
	}
	return out, nil
}
