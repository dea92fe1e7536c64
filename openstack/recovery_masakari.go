package openstack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"hvguard/reconcile"
)

// Masakari (service type instance-ha) at MasakariAPIVersion. gophercloud
// has no Masakari package: the requests are raw, through a gophercloud
// ServiceClient for the catalog's instance-ha endpoint (the admin token).

// Masakari notification types and payload values.
const (
	// MasakariEventLifecycle is the VM notification event masakari-monitors'
	// instance monitor sends for a libvirt lifecycle event.
	MasakariEventLifecycle = "LIFECYCLE"
	// Masakari's engine (14.0.2, engine/instance_events.py) recovers an
	// instance only for event LIFECYCLE with vir_domain_event
	// STOPPED_FAILED (a crash); other values are accepted and the
	// notification ends "ignored".
	MasakariDomainStoppedFailed    = "STOPPED_FAILED"
	MasakariDomainStoppedDestroyed = "STOPPED_DESTROYED"
	MasakariDomainStoppedShutdown  = "STOPPED_SHUTDOWN"
)

// Notification statuses (Masakari's NotificationStatus).
const (
	NotificationNew      = "new"
	NotificationRunning  = "running"
	NotificationError    = "error"
	NotificationFailed   = "failed"
	NotificationIgnored  = "ignored"
	NotificationFinished = "finished"
)

// Errors of the Masakari calls (wrapped in *Error of KindConflict; test
// with errors.Is). Masakari answers 409 for both; they are told apart by
// its message (English; a translated one reads as a duplicate).
var (
	// ErrDuplicateNotification: Masakari refused the notification as a
	// duplicate: one of the same type, host and payload generated at most
	// duplicate_notification_detection_interval (180 s) before it exists
	// (whatever its status). A retry with the same generation time meets
	// this; HostNotification and InstanceNotification then look the
	// existing one up and return its id, and return this error only when
	// that is not unambiguous.
	ErrDuplicateNotification = errors.New("masakari refused a duplicate notification")
	// ErrHostOnMaintenance: Masakari ignores notifications from a host it
	// has put on maintenance (its engine does so when it recovers a failed
	// host; an operator clears it).
	ErrHostOnMaintenance = errors.New("masakari refused the notification: the host is on maintenance")
)

// MasakariNotification is a notification as Masakari answers it.
type MasakariNotification struct {
	ID            string // notification_uuid
	Type          string // COMPUTE_HOST, VM, PROCESS
	Status        string // new, running, error, failed, ignored, finished
	GeneratedTime time.Time
	Payload       map[string]string
}

// Done reports whether Masakari has finished with the notification
// (finished, failed, ignored; error is retried by its engine).
func (n MasakariNotification) Done() bool {
	switch n.Status {
	case NotificationFinished, NotificationFailed, NotificationIgnored:
		return true
	}
	return false
}

// masakariTime is the generated_time format sent: RFC 3339, UTC, whole
// seconds (Masakari's database column keeps no fraction; what is sent is
// then exactly what a lookup finds).
const masakariTime = "2006-01-02T15:04:05Z"

// HostNotification hands a failed host to Masakari: POST /notifications
// {"notification": {"type": "COMPUTE_HOST", "hostname": host,
// "generated_time": at, "payload": {"event": "STOPPED", "host_status":
// "NORMAL", "cluster_status": "OFFLINE"}}} — what masakari-monitors'
// hostmonitor sends for a dead host (the engine ignores a host_status
// other than NORMAL). host must be a host of a Masakari segment (else 400).
// Returns the notification's id. Pass the declaration time as at: a retry
// with the same at is then refused as a duplicate (ErrDuplicateNotification)
// while the first is new or running, instead of starting a second recovery.
func (r *Recovery) HostNotification(ctx context.Context, host string, at time.Time) (string, error) {
	return r.notify(ctx, "notify Masakari that host "+host+" failed", "COMPUTE_HOST", host, at, map[string]string{
		"event": "STOPPED", "host_status": "NORMAL", "cluster_status": "OFFLINE"})
}

// VMNotification is a Masakari VM notification.
type VMNotification struct {
	Host        string    // the server's compute host (a host of a Masakari segment)
	ServerID    string    // instance_uuid
	Event       string    // MasakariEventLifecycle
	DomainEvent string    // vir_domain_event: MasakariDomainStoppedFailed, ...
	At          time.Time // generated_time
}

// InstanceNotification hands a stopped instance to Masakari: POST
// /notifications {"notification": {"type": "VM", "hostname": n.Host,
// "generated_time": n.At, "payload": {"instance_uuid", "vir_domain_event",
// "event"}}}. Masakari's payload schema allows exactly these three keys
// (a reason field is refused with 400): hvguard's classification goes
// into its own events, and the caller maps it onto vir_domain_event.
// Returns the notification's id.
func (r *Recovery) InstanceNotification(ctx context.Context, n VMNotification) (string, error) {
	op := "notify Masakari that server " + n.ServerID + " stopped"
	if !reconcile.ValidUUID(n.ServerID) {
		return "", &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", n.ServerID)}
	}
	if n.Event == "" || n.DomainEvent == "" || len(n.Event) > 255 || len(n.DomainEvent) > 255 {
		return "", &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("event %q and vir_domain_event %q must be 1-255 characters", n.Event, n.DomainEvent)}
	}
	return r.notify(ctx, op, "VM", n.Host, n.At, map[string]string{
		"instance_uuid": n.ServerID, "vir_domain_event": n.DomainEvent, "event": n.Event})
}

func (r *Recovery) notify(ctx context.Context, op, typ, host string, at time.Time, payload map[string]string) (string, error) {
	if !reconcile.ValidHostName(host) {
		return "", &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("invalid host name %q", host)}
	}
	if at.IsZero() {
		return "", &Error{Kind: KindConfig, Op: op, Err: errors.New("generated_time is zero")}
	}
	sc, err := r.instanceHA(ctx)
	if err != nil {
		return "", err
	}
	body := map[string]any{"notification": map[string]any{
		"type": typ, "hostname": host, "generated_time": at.UTC().Format(masakariTime), "payload": payload}}
	_, resp, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodPost, url: sc.ServiceURL("notifications"),
		body: body, ok: []int{http.StatusAccepted}, max: maxSmallBytes})
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindConflict {
			return "", err
		}
		if e.Err != nil && strings.Contains(e.Err.Error(), "maintenance") {
			e.Err = fmt.Errorf("%w: %v", ErrHostOnMaintenance, e.Err)
			return "", err
		}
		e.Err = fmt.Errorf("%w: %v", ErrDuplicateNotification, e.Err)
		id, lerr := r.findNotification(ctx, sc, op, typ, at, payload)
		if lerr != nil || id == "" {
			if lerr != nil {
				r.log.Warn("looking up the notification Masakari called a duplicate failed", "op", op, "err", lerr)
			}
			return "", err
		}
		r.log.Info("Masakari already has this notification", "op", op, "notification", id)
		return id, nil
	}
	n, err := decodeNotification(resp)
	if err != nil {
		return "", &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	if n.Type != typ {
		return "", &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("created a %s notification, asked for %s", n.Type, typ)}
	}
	return n.ID, nil
}

// Notification returns a notification: GET /notifications/{id} at API 1.0
// (1.1+ answers 500 on Debian 12's Masakari without taskflow persistence).
// A 404 is KindNotFound.
func (r *Recovery) Notification(ctx context.Context, id string) (MasakariNotification, error) {
	op := "get Masakari notification " + id
	if !reconcile.ValidUUID(id) {
		return MasakariNotification{}, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", id)}
	}
	sc, err := r.instanceHA(ctx)
	if err != nil {
		return MasakariNotification{}, err
	}
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodGet, url: sc.ServiceURL("notifications", id),
		ok: []int{http.StatusOK}, max: maxSmallBytes})
	if err != nil {
		return MasakariNotification{}, err
	}
	n, err := decodeNotification(body)
	if err != nil {
		return MasakariNotification{}, &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	if n.ID != id {
		return MasakariNotification{}, &Error{Kind: KindMalformed, Op: op, Err: fmt.Errorf("asked for notification %s, got %s", id, n.ID)}
	}
	return n, nil
}

// findNotification returns the id of the one notification of type typ
// generated at at (to the second) with exactly payload, "" if there is
// none or more than one (two hosts' COMPUTE_HOST notifications of the
// same second look alike: the list does not name the host).
func (r *Recovery) findNotification(ctx context.Context, sc *gophercloud.ServiceClient, op, typ string, at time.Time, payload map[string]string) (string, error) {
	q := url.Values{"type": {typ}, "generated-since": {at.UTC().Format(masakariTime)}}
	_, body, err := r.do(ctx, request{op: op + ": find the existing notification", sc: sc, method: http.MethodGet,
		url: sc.ServiceURL("notifications") + "?" + q.Encode(), ok: []int{http.StatusOK}, max: maxNotificationsBytes})
	if err != nil {
		return "", err
	}
	ns, err := decodeNotifications(body)
	if err != nil {
		return "", &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	id := ""
	for _, n := range ns {
		if n.Type == typ && n.GeneratedTime.Equal(at.UTC().Truncate(time.Second)) && maps.Equal(n.Payload, payload) {
			if id != "" {
				return "", nil
			}
			id = n.ID
		}
	}
	return id, nil
}
