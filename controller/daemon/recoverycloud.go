package daemon

import (
	"context"
	"errors"
	"time"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/openstack"
)

// recoveryCloud is the openstack adapter as host recovery calls it: the
// core's types, and its errors classified for the core.
type recoveryCloud struct{ os *openstack.Recovery }

// classify maps the adapter's errors to the core's kinds: Nova's refusal
// to clear forced_down (done evacuations), Masakari's for a host on
// maintenance and every other rejection are refusals; a 409 is a conflict (a server busy, a duplicate Masakari
// notification); a 404 is not-found; anything else (unreachable, timeout,
// 5xx) leaves the outcome of a mutating call unknown.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var e *openstack.Error
	kind := recovery.ErrOther
	switch {
	case errors.Is(err, openstack.ErrDoneEvacuations), errors.Is(err, openstack.ErrHostOnMaintenance):
		// Masakari's 409 for a host on maintenance: it recovers nothing
		// (not a duplicate notification): a failed attempt, reported.
		kind = recovery.ErrRefused
	case errors.As(err, &e) && e.Kind == openstack.KindNotFound:
		kind = recovery.ErrNotFound
	case errors.As(err, &e) && e.Kind == openstack.KindConflict:
		kind = recovery.ErrConflict
	case errors.As(err, &e) && e.Kind == openstack.KindRejected:
		kind = recovery.ErrRefused
	}
	return &controller.RecoveryError{Kind: kind, Err: err}
}

func serverOf(s openstack.Server) recovery.Server {
	return recovery.Server{ID: s.ID, Name: s.Name, Status: s.Status, TaskState: s.TaskState, Host: s.Host,
		VolumeBacked: s.BootFromVolume, Volumes: append([]string(nil), s.Volumes...)}
}

func (c recoveryCloud) ForceDown(ctx context.Context, host string, down bool) error {
	return classify(c.os.ForceDown(ctx, host, down))
}

func (c recoveryCloud) HostServers(ctx context.Context, host string) ([]recovery.Server, error) {
	ss, err := c.os.HostServers(ctx, host)
	if err != nil {
		return nil, classify(err)
	}
	out := make([]recovery.Server, len(ss))
	for i, s := range ss {
		out[i] = serverOf(s)
	}
	return out, nil
}

func (c recoveryCloud) Server(ctx context.Context, id string) (recovery.Server, error) {
	s, err := c.os.Server(ctx, id)
	if err != nil {
		return recovery.Server{}, classify(err)
	}
	return serverOf(s), nil
}

func (c recoveryCloud) Volume(ctx context.Context, id string) (recovery.VolumeInfo, error) {
	v, err := c.os.Volume(ctx, id)
	if err != nil {
		return recovery.VolumeInfo{}, classify(err)
	}
	out := recovery.VolumeInfo{ID: v.ID, Multiattach: v.Multiattach}
	for _, a := range v.Attachments {
		out.Attachments = append(out.Attachments, recovery.AttachmentInfo{ID: a.ID, Server: a.ServerID, Host: a.Host})
	}
	return out, nil
}

func (c recoveryCloud) RemoveAttachment(ctx context.Context, volumeID, attachmentID, host string) error {
	return classify(c.os.RemoveAttachment(ctx, volumeID, attachmentID, host))
}

func (c recoveryCloud) Evacuate(ctx context.Context, serverID string) error {
	return classify(c.os.Evacuate(ctx, serverID))
}

func (c recoveryCloud) Migrations(ctx context.Context, host string, since time.Time) ([]recovery.Migration, error) {
	ms, err := c.os.Migrations(ctx, host, since)
	if err != nil {
		return nil, classify(err)
	}
	out := make([]recovery.Migration, len(ms))
	for i, m := range ms {
		out[i] = recovery.Migration{ID: m.ID, Instance: m.InstanceUUID, Source: m.SourceCompute, Dest: m.DestCompute,
			Status: m.Status, Type: m.Type, Created: m.CreatedAt}
	}
	return out, nil
}

func (c recoveryCloud) HostNotification(ctx context.Context, host string, at time.Time) (string, error) {
	id, err := c.os.HostNotification(ctx, host, at)
	return id, classify(err)
}

func (c recoveryCloud) Notification(ctx context.Context, id string) (string, error) {
	n, err := c.os.Notification(ctx, id)
	if err != nil {
		return "", classify(err)
	}
	return n.Status, nil
}
