package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"hvguard/reconcile"
)

// Volume is a Cinder volume as GET /volumes/{id} answers at
// VolumeMicroversion.
type Volume struct {
	ID          string
	Status      string // available, in-use, reserved, attaching, detaching, error, ...
	Multiattach bool
	// Attachments are the volume's attachments in status attached (Cinder
	// lists no others here).
	Attachments []Attachment
}

// Attachment is one attachment of a volume.
type Attachment struct {
	ID       string // the attachment id (what RemoveAttachment takes)
	ServerID string // the Nova server, "" when null
	// Host is the attachment's host_name: the host of the connector Nova
	// attached with (nova-compute's CONF.host, as Nova's service host).
	// "" when Cinder does not say (null; non-admin credentials).
	Host       string
	Device     string    // mount point as Nova reported it, "" when null
	AttachedAt time.Time // zero when null
}

// Errors of the Cinder recovery calls (wrapped in *Error; errors.Is).
var (
	// ErrAttachmentOtherHost: RemoveAttachment refused: the attachment's
	// host is not the host the caller declared dead.
	ErrAttachmentOtherHost = errors.New("the attachment belongs to another host: not removed")
	// ErrAttachmentHostUnknown: RemoveAttachment refused: Cinder does not
	// say which host the attachment is on (host_name null, or the
	// attachment exists but is not in status attached).
	ErrAttachmentHostUnknown = errors.New("cinder does not say which host the attachment is on: not removed")
	// ErrServiceTokenRefused: Cinder did not accept the request as a
	// service's (409 from the OSSA-2023-003 check): the service_cloud
	// user lacks a role in Cinder's [keystone_authtoken]
	// service_token_roles, or Cinder does not require/see it.
	ErrServiceTokenRefused = errors.New("cinder refused to remove an attachment Nova uses: the X-Service-Token was not accepted as a service's (check the service_cloud user's role and Cinder's service_token_roles)")
)

// Volume returns a volume: GET /volumes/{id}. A 404 is KindNotFound.
func (r *Recovery) Volume(ctx context.Context, id string) (Volume, error) {
	op := "get volume " + id
	if !reconcile.ValidUUID(id) {
		return Volume{}, &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("%q is not a canonical UUID", id)}
	}
	sc, err := r.blockStorage(ctx)
	if err != nil {
		return Volume{}, err
	}
	_, body, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodGet, url: sc.ServiceURL("volumes", id),
		ok: []int{http.StatusOK}, max: maxSmallBytes})
	if err != nil {
		return Volume{}, err
	}
	v, err := decodeVolume(body, id)
	if err != nil {
		return Volume{}, &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	return v, nil
}

// RemoveAttachment removes a dead host's attachment of a volume in Cinder
// — only if the attachment's host is expectHost — with Cinder's
// attachments API: DELETE /attachments/{id} at VolumeMicroversion, with
// the admin token and the service user's token as X-Service-Token.
//
// Why the attachments API and not os-force_detach: Cinder's
// attachment_delete terminates exactly that attachment's stored connector
// (the dead host's) on the backend and removes only that attachment; it
// is the call Nova itself makes for the same purpose (at 3.44), and the
// evacuation that follows finds Nova's BDM's attachment gone, which Nova
// tolerates (404 ignored) after creating the destination's attachment.
// os-force_detach calls terminate_connection with the connector given in
// the request body — none: a None connector, which several drivers read
// as "every host" — then the legacy detach. Both need the service token
// for an attachment Nova still uses (OSSA-2023-003): without it Cinder
// answers 409 (then the error wraps ErrServiceTokenRefused).
//
// Steps: GET the volume; the attachment must be listed with host_name
// equal to expectHost (case-insensitive, as Nova's host names compare in
// MariaDB), else the call refuses (ErrAttachmentOtherHost,
// ErrAttachmentHostUnknown) and removes nothing. An attachment that no
// longer exists (listed nowhere, GET /attachments/{id} 404) is success:
// the call is idempotent. A 401 with the service token renews it and
// retries once.
func (r *Recovery) RemoveAttachment(ctx context.Context, volumeID, attachmentID, expectHost string) error {
	op := fmt.Sprintf("remove attachment %s of volume %s (host %s)", attachmentID, volumeID, expectHost)
	switch {
	case !reconcile.ValidUUID(volumeID):
		return &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("volume id %q is not a canonical UUID", volumeID)}
	case !reconcile.ValidUUID(attachmentID):
		return &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("attachment id %q is not a canonical UUID", attachmentID)}
	case !reconcile.ValidHostName(expectHost):
		return &Error{Kind: KindConfig, Op: op, Err: fmt.Errorf("invalid host name %q", expectHost)}
	case r.service == nil:
		return &Error{Kind: KindConfig, Op: op, Err: ErrNoServiceToken}
	}
	v, err := r.Volume(ctx, volumeID)
	if err != nil {
		return err
	}
	var att *Attachment
	for i := range v.Attachments {
		if strings.EqualFold(v.Attachments[i].ID, attachmentID) {
			att = &v.Attachments[i]
		}
	}
	if att == nil {
		gone, status, err := r.attachmentGone(ctx, op, attachmentID)
		if err != nil {
			return err
		}
		if gone {
			r.log.Info("attachment already gone", "volume", volumeID, "attachment", attachmentID)
			return nil
		}
		return &Error{Kind: KindRejected, Op: op, Err: fmt.Errorf("%w (attachment status %q, not listed on the volume)", ErrAttachmentHostUnknown, status)}
	}
	switch {
	case att.Host == "":
		return &Error{Kind: KindRejected, Op: op, Err: fmt.Errorf("%w (host_name null)", ErrAttachmentHostUnknown)}
	case !strings.EqualFold(att.Host, expectHost):
		return &Error{Kind: KindRejected, Op: op, Err: fmt.Errorf("%w (attachment host %q, expected %q)", ErrAttachmentOtherHost, att.Host, expectHost)}
	}
	sc, err := r.blockStorage(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		tok, err := r.service.token(ctx, attempt > 0)
		if err != nil {
			return err
		}
		status, _, err := r.do(ctx, request{op: op, sc: sc, method: http.MethodDelete, url: sc.ServiceURL("attachments", attachmentID),
			ok: []int{http.StatusOK}, max: maxSmallBytes, empty: true, headers: []string{"X-Service-Token", tok}})
		var e *Error
		switch {
		case err == nil:
			r.log.Info("attachment removed", "volume", volumeID, "attachment", attachmentID, "host", att.Host, "server", att.ServerID, "status", status)
			return nil
		case errors.As(err, &e) && e.Kind == KindNotFound:
			return nil // removed meanwhile (by Nova or a previous try)
		case errors.As(err, &e) && e.Kind == KindAuth && attempt == 0:
			continue // the service token may have been revoked or expired early: renew once
		case errors.As(err, &e) && e.Kind == KindConflict:
			e.Err = fmt.Errorf("%w: %v", ErrServiceTokenRefused, e.Err)
		}
		return err
	}
}

// attachmentGone reports whether an attachment no longer exists: GET
// /attachments/{id} answers Cinder's itemNotFound 404. Otherwise it
// returns the attachment's status.
func (r *Recovery) attachmentGone(ctx context.Context, op, id string) (bool, string, error) {
	sc, err := r.blockStorage(ctx)
	if err != nil {
		return false, "", err
	}
	status, body, err := r.do(ctx, request{op: op + ": get attachment", sc: sc, method: http.MethodGet, url: sc.ServiceURL("attachments", id),
		ok: []int{http.StatusOK, http.StatusNotFound}, max: maxSmallBytes})
	if err != nil {
		return false, "", err
	}
	if status == http.StatusNotFound {
		if err := checkNotFound(body); err != nil {
			return false, "", &Error{Kind: KindNotFound, Op: op, Status: status, Err: err}
		}
		return true, "", nil
	}
	st, err := decodeAttachmentStatus(body, id)
	if err != nil {
		return false, "", &Error{Kind: KindMalformed, Op: op, Err: err}
	}
	return false, st, nil
}
