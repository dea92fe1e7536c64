package daemon

import (
	"context"
	"errors"
	"time"

	"hvguard/controller/instancerecovery"
	"hvguard/openstack"
)

// instanceCloud adapts the openstack recovery adapter to
// controller.InstanceCloud.
type instanceCloud struct{ os *openstack.Recovery }

func (c instanceCloud) Server(ctx context.Context, id string) (instancerecovery.Server, error) {
	s, err := c.os.Server(ctx, id)
	var oe *openstack.Error
	if errors.As(err, &oe) && oe.Kind == openstack.KindNotFound {
		return instancerecovery.Server{}, nil
	}
	if err != nil {
		return instancerecovery.Server{}, err
	}
	return instancerecovery.Server{Found: true, Project: s.ProjectID, Host: s.Host, Status: s.Status, VMState: s.VMState,
		TaskState: s.TaskState, PowerState: s.PowerState, Metadata: s.Metadata}, nil
}

// StopByUser: the newest `stop` action (Nova lists newest first) has a
// user; Nova's own power sync stops with user_id null.
func (c instanceCloud) StopByUser(ctx context.Context, id string) (bool, error) {
	as, err := c.os.InstanceActions(ctx, id)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if a.Action == "stop" {
			return a.UserID != "", nil
		}
	}
	return false, nil
}

func (c instanceCloud) Start(ctx context.Context, id string) error { return c.os.Start(ctx, id) }

func (c instanceCloud) HardReboot(ctx context.Context, id string) error {
	return c.os.HardReboot(ctx, id)
}

// MasakariVM sends what masakari-monitors' instance monitor sends for a
// QEMU that died: event LIFECYCLE, vir_domain_event STOPPED_FAILED — the
// only combination Masakari 14's engine recovers
// (masakari/engine/instance_events.py); hvguard's classification and the
// real libvirt detail are in its own progress event.
func (c instanceCloud) MasakariVM(ctx context.Context, id, host string, at time.Time) (string, error) {
	return c.os.InstanceNotification(ctx, openstack.VMNotification{Host: host, ServerID: id, Event: openstack.MasakariEventLifecycle,
		DomainEvent: openstack.MasakariDomainStoppedFailed, At: at})
}

// Refused: Nova or Masakari answered 4xx (409 conflict included): the
// action did not happen.
func (c instanceCloud) Refused(err error) bool {
	var oe *openstack.Error
	if !errors.As(err, &oe) {
		return false
	}
	switch oe.Kind {
	case openstack.KindRejected, openstack.KindNotFound, openstack.KindConflict, openstack.KindConfig:
		return true
	}
	return false
}
