package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

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

// ErrDuplicateNotification: Masakari refused the notification as a
// duplicate (409): an identical one (type, host, payload) generated within
// its duplicate_notification_detection_interval (180 s) is still new or
// running. A retry of a notification already created meets this.
var ErrDuplicateNotification = errors.New("masakari refused a duplicate of a notification still new or running")

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

// masakariTime is the generated_time format sent (RFC 3339, UTC, µs).
const masakariTime = "2006-01-02T15:04:05.000000Z"

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
		if errors.As(err, &e) && e.Kind == KindConflict {
			e.Err = fmt.Errorf("%w: %v", ErrDuplicateNotification, e.Err)
		}
		return "", err
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
