package openstack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"hvguard/reconcile"
)

// Strict decoding. Nova's answers decide whether a domain is destroyed, so
// they are decoded field by field: a required field missing, null where a
// value is needed, of another type, a duplicate key, or trailing data is an
// error (KindMalformed), never a default. Unknown fields are ignored (the
// pinned microversion fixes the shape; a deployment's extensions may add
// fields).

// object decodes one JSON object into its fields, rejecting duplicate keys
// and trailing data.
func object(raw []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, got %s", kindOf(raw))
	}
	out := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("object key is not a string")
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		out[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object")
	}
	return out, nil
}

func kindOf(raw []byte) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	switch t[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '{':
		return "an object"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// reqString returns the non-null string field key.
func reqString(o map[string]json.RawMessage, key string) (string, error) {
	raw, ok := o[key]
	if !ok {
		return "", fmt.Errorf("field %q missing", key)
	}
	if isNull(raw) {
		return "", fmt.Errorf("field %q is null", key)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("field %q: want a string, got %s", key, kindOf(raw))
	}
	return s, nil
}

// optString returns the string field key, "" when null. The key must be
// present (present-but-null and absent mean different things in Nova: an
// absent admin attribute means the policy hid it).
func optString(o map[string]json.RawMessage, key string) (string, error) {
	raw, ok := o[key]
	if !ok {
		return "", fmt.Errorf("field %q missing", key)
	}
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("field %q: want a string or null, got %s", key, kindOf(raw))
	}
	return s, nil
}

// novaTime parses Nova's timestamps: "2026-11-29T18:00:01.000000" (UTC, no
// zone, as /os-migrations writes them) or RFC 3339 with a zone.
func novaTime(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02T15:04:05.999999999", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("time %q is not in Nova's format", s)
}

// migrationsPage is one decoded /os-migrations page.
type migrationsPage struct {
	Migrations []reconcile.Migration
	Next       bool   // a rel=next link is present
	NextMarker string // the marker in that link
}

// decodeMigrationsPage decodes one /os-migrations body at Microversion.
func decodeMigrationsPage(body []byte, limit int) (migrationsPage, error) {
	var p migrationsPage
	var err error
	p.Migrations, p.Next, p.NextMarker, err = decodePage(body, "migrations", "migration", limit, decodeMigration)
	return p, err
}

// decodePage decodes one page of a paged Nova listing: the array under
// field (at most limit items, each decoded strictly by item; what names one
// item in errors) and the rel=next link under field+"_links".
func decodePage[T any](body []byte, field, what string, limit int, item func(json.RawMessage) (T, error)) (out []T, next bool, marker string, err error) {
	top, err := object(body)
	if err != nil {
		return nil, false, "", err
	}
	raw, ok := top[field]
	if !ok {
		return nil, false, "", fmt.Errorf("field %q missing", field)
	}
	var items []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &items) != nil {
		return nil, false, "", fmt.Errorf("field %q: want an array, got %s", field, kindOf(raw))
	}
	if len(items) > limit {
		return nil, false, "", fmt.Errorf("page has %d %ss, more than the limit %d asked for", len(items), what, limit)
	}
	out = make([]T, 0, len(items))
	for i, it := range items {
		v, err := item(it)
		if err != nil {
			return nil, false, "", fmt.Errorf("%s %d: %w", what, i, err)
		}
		out = append(out, v)
	}
	if raw, ok := top[field+"_links"]; ok {
		next, marker, err = decodeLinks(raw)
		if err != nil {
			return nil, false, "", fmt.Errorf("%s_links: %w", field, err)
		}
	}
	return out, next, marker, nil
}

func decodeLinks(raw json.RawMessage) (next bool, marker string, err error) {
	var links []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &links) != nil {
		return false, "", fmt.Errorf("want an array, got %s", kindOf(raw))
	}
	for _, l := range links {
		o, err := object(l)
		if err != nil {
			return false, "", err
		}
		rel, err := reqString(o, "rel")
		if err != nil {
			return false, "", err
		}
		href, err := reqString(o, "href")
		if err != nil {
			return false, "", err
		}
		if rel != "next" {
			continue
		}
		if next {
			return false, "", errors.New("two next links")
		}
		u, err := url.Parse(href)
		if err != nil {
			return false, "", fmt.Errorf("next href: %w", err)
		}
		next, marker = true, u.Query().Get("marker")
		if marker == "" {
			return false, "", fmt.Errorf("next href %q has no marker", href)
		}
	}
	return next, marker, nil
}

// decodeMigration decodes one migration record.
func decodeMigration(raw json.RawMessage) (reconcile.Migration, error) {
	var m reconcile.Migration
	o, err := object(raw)
	if err != nil {
		return m, err
	}
	idRaw, ok := o["id"]
	if !ok {
		return m, errors.New(`field "id" missing`)
	}
	if err := json.Unmarshal(idRaw, &m.ID); err != nil || isNull(idRaw) || m.ID <= 0 {
		return m, fmt.Errorf(`field "id": want a positive integer, got %s`, trimBody(idRaw))
	}
	var created, updated string
	if err = readStrings(o,
		strField{"uuid", &m.UUID, false},
		strField{"instance_uuid", &m.InstanceUUID, false},
		strField{"source_compute", &m.SourceCompute, false},
		strField{"dest_compute", &m.DestCompute, true},
		strField{"dest_host", &m.DestHost, true},
		strField{"source_node", &m.SourceNode, true},
		strField{"dest_node", &m.DestNode, true},
		strField{"status", &m.Status, false},
		strField{"migration_type", &m.Type, false},
		strField{"created_at", &created, false},
		strField{"updated_at", &updated, true},
	); err != nil {
		return m, err
	}
	m.UUID, m.InstanceUUID = strings.ToLower(m.UUID), strings.ToLower(m.InstanceUUID)
	if !reconcile.ValidUUID(m.UUID) {
		return m, fmt.Errorf("uuid %q is not a UUID", m.UUID)
	}
	if !reconcile.ValidUUID(m.InstanceUUID) {
		return m, fmt.Errorf("instance_uuid %q is not a UUID", m.InstanceUUID)
	}
	if m.Status == "" {
		return m, errors.New("status is empty")
	}
	if m.CreatedAt, err = novaTime(created); err != nil {
		return m, fmt.Errorf("created_at: %w", err)
	}
	if updated != "" {
		if m.UpdatedAt, err = novaTime(updated); err != nil {
			return m, fmt.Errorf("updated_at: %w", err)
		}
	}
	return m, nil
}

// Server attribute names (admin-visible extended attributes).
const (
	attrHost      = "OS-EXT-SRV-ATTR:host"
	attrTaskState = "OS-EXT-STS:task_state"
	attrVMState   = "OS-EXT-STS:vm_state"
)

// decodeServer decodes a GET /servers/{id} body for server uuid.
func decodeServer(body []byte, uuid string) (reconcile.ServerLookup, error) {
	var s reconcile.ServerLookup
	top, err := object(body)
	if err != nil {
		return s, err
	}
	raw, ok := top["server"]
	if !ok {
		return s, errors.New(`field "server" missing`)
	}
	o, err := object(raw)
	if err != nil {
		return s, fmt.Errorf("server: %w", err)
	}
	id, err := reqString(o, "id")
	if err != nil {
		return s, err
	}
	if !strings.EqualFold(id, uuid) {
		return s, fmt.Errorf("asked for server %s, got %s", uuid, id)
	}
	if s.Status, err = reqString(o, "status"); err != nil {
		return s, err
	}
	if s.Host, s.TaskState, err = hostAndTask(o); err != nil {
		return s, err
	}
	if s.VMState, err = optString(o, attrVMState); err != nil {
		return s, err
	}
	s.Found = true
	return s, nil
}

// checkNotFound checks that a 404 body is Nova's own "itemNotFound" answer,
// not a 404 from a wrong endpoint or a proxy (which must not be read as
// "this server does not exist").
func checkNotFound(body []byte) error {
	top, err := object(body)
	if err != nil {
		return err
	}
	raw, ok := top["itemNotFound"]
	if !ok {
		return errors.New(`404 without Nova's "itemNotFound": not an answer about the server`)
	}
	if _, err := object(raw); err != nil {
		return fmt.Errorf("itemNotFound: %w", err)
	}
	return nil
}

// hostAndTask reads a server's OS-EXT-SRV-ATTR:host and
// OS-EXT-STS:task_state ("" when null). The host attribute must be
// present: Nova omits it for credentials without the admin policy, and an
// absent host must never read as "no host".
func hostAndTask(o map[string]json.RawMessage) (host, task string, err error) {
	if _, ok := o[attrHost]; !ok {
		return "", "", fmt.Errorf("field %q missing: the credentials lack the policy to see a server's host (use an admin account)", attrHost)
	}
	if host, err = optString(o, attrHost); err != nil {
		return "", "", err
	}
	if task, err = optString(o, attrTaskState); err != nil {
		return "", "", err
	}
	return host, task, nil
}
