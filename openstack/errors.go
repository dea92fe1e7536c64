package openstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/gophercloud/gophercloud/v2"

	"hvguard/reconcile"
)

// Kind classifies a failed call. The classification separates "Nova is not
// there" (unreachable, timeout, 5xx, authentication) from "Nova answered,
// and the answer is no or unusable".
type Kind uint8

// Kinds.
const (
	KindUnknown     Kind = iota
	KindUnreachable      // connection refused, DNS, TLS, reset: Nova or keystone not reachable
	KindTimeout          // no answer within the request timeout
	KindServer           // HTTP 5xx
	KindAuth             // keystone refused the credentials, or 401 after re-authentication
	KindRejected         // HTTP 4xx (400 bad filter, 403 policy, 406 microversion unsupported, …)
	KindNotFound         // HTTP 404 where a 404 is not an answer
	KindMalformed        // an answer of unexpected shape (JSON, fields, types, headers)
	KindTooLarge         // a body, page or listing beyond this package's caps
	KindConfig           // configuration: clouds.yaml, no compute endpoint in the catalog
	KindConflict         // HTTP 409: the resource's state forbids the request now (a task in flight, a wrong vm_state)
)

var kindNames = [...]string{
	KindUnknown:     "unknown",
	KindUnreachable: "unreachable",
	KindTimeout:     "timeout",
	KindServer:      "server-error",
	KindAuth:        "auth",
	KindRejected:    "rejected",
	KindNotFound:    "not-found",
	KindMalformed:   "malformed",
	KindTooLarge:    "too-large",
	KindConfig:      "config",
	KindConflict:    "conflict",
}

// String returns the kind's name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Unavailable reports whether the kind means Nova (or keystone) could not
// be asked: unreachable, timeout, 5xx, authentication.
func (k Kind) Unavailable() bool {
	switch k {
	case KindUnreachable, KindTimeout, KindServer, KindAuth, KindUnknown:
		return true
	}
	return false
}

// Error is every error this package returns from a call to OpenStack.
type Error struct {
	Kind   Kind
	Op     string // "list evacuations from node1", "get server <uuid>", "authenticate"
	Status int    // HTTP status, 0 if none
	Err    error
}

func (e *Error) Error() string {
	s := "openstack: " + e.Op + ": " + e.Kind.String()
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// ReconcileReason maps the error onto the reconciliation's global reasons
// (reconcile.Reasoner).
func (e *Error) ReconcileReason() reconcile.Reason {
	switch {
	case e.Kind.Unavailable():
		return reconcile.ReasonNovaUnavailable
	case e.Kind == KindMalformed:
		return reconcile.ReasonMalformedData
	case e.Kind == KindTooLarge:
		return reconcile.ReasonPartialData
	}
	return reconcile.ReasonNovaRejected
}

// IsUnavailable reports whether err means Nova or keystone could not be
// asked (as opposed to having answered no).
func IsUnavailable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind.Unavailable()
}

// classify wraps an error returned by gophercloud (or net/http) for op.
func classify(op string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	out := &Error{Op: op, Err: err}
	var code gophercloud.ErrUnexpectedResponseCode
	var codeP *gophercloud.ErrUnexpectedResponseCode
	var reauth *gophercloud.ErrUnableToReauthenticate
	var after *gophercloud.ErrErrorAfterReauthentication
	var nerr net.Error
	var uerr *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		out.Kind = KindTimeout
	case errors.Is(err, context.Canceled):
		out.Kind = KindUnreachable
	case errors.As(err, &reauth), errors.As(err, &after):
		out.Kind = KindAuth
		if errors.As(err, &code) {
			out.Status = code.Actual
		} else if errors.As(err, &codeP) {
			out.Status = codeP.Actual
		}
	case errors.As(err, &code):
		out.Kind, out.Status = kindOfStatus(code.Actual), code.Actual
		out.Err = fmt.Errorf("%s", trimBody(code.Body))
	case errors.As(err, &codeP):
		out.Kind, out.Status = kindOfStatus(codeP.Actual), codeP.Actual
		out.Err = fmt.Errorf("%s", trimBody(codeP.Body))
	case errors.As(err, &nerr) && nerr.Timeout():
		out.Kind = KindTimeout
	case errors.As(err, &uerr), errors.As(err, &nerr):
		out.Kind = KindUnreachable
	default:
		out.Kind = KindUnknown
	}
	return out
}

func kindOfStatus(status int) Kind {
	switch {
	case status == 401:
		return KindAuth
	case status == 404:
		return KindNotFound
	case status == 409:
		return KindConflict
	case status >= 500:
		return KindServer
	case status >= 400:
		return KindRejected
	}
	return KindMalformed
}

// trimBody shortens an error body for messages.
func trimBody(b []byte) string {
	const max = 300
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
