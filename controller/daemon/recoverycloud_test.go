package daemon

import (
	"errors"
	"fmt"
	"testing"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/openstack"
)

// The adapter's errors reach the core with the kind it acts on: Nova's
// refusal to clear forced_down is a refusal (reported, retried), a 409 a
// conflict (follow the migrations), a timeout an unknown outcome (never a
// failure that would be retried at once).
func TestClassifyRecoveryErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want recovery.ErrKind
	}{
		{nil, recovery.ErrNone},
		{&openstack.Error{Kind: openstack.KindConflict, Status: 400, Err: fmt.Errorf("%w (1: x)", openstack.ErrDoneEvacuations)}, recovery.ErrRefused},
		{&openstack.Error{Kind: openstack.KindConflict, Status: 409}, recovery.ErrConflict},
		{&openstack.Error{Kind: openstack.KindNotFound, Status: 404}, recovery.ErrNotFound},
		{&openstack.Error{Kind: openstack.KindRejected, Status: 400, Err: openstack.ErrSourceHostUp}, recovery.ErrRefused},
		{&openstack.Error{Kind: openstack.KindTimeout}, recovery.ErrOther},
		{&openstack.Error{Kind: openstack.KindServer, Status: 503}, recovery.ErrOther},
		{errors.New("anything"), recovery.ErrOther},
	} {
		if got := controller.RecoveryKind(classify(c.err)); got != c.want {
			t.Errorf("%v: kind %d, want %d", c.err, got, c.want)
		}
	}
}

// Attack (reviewer X1): Masakari's 409 for a host it has on maintenance
// is a refusal — it will recover nothing — not a duplicate notification.
// Classified as a conflict, the core counts the host as handed to
// Masakari ("recovered", "outcome not followed") while nothing evacuates
// its servers, and never says NOT RECOVERED.
func TestAttackMasakariMaintenanceIsARefusal(t *testing.T) {
	err := &openstack.Error{Kind: openstack.KindConflict, Status: 409,
		Err: fmt.Errorf("%w: Notification received from host node1 of type COMPUTE_HOST is ignored as the host is already under maintenance", openstack.ErrHostOnMaintenance)}
	if got := controller.RecoveryKind(classify(err)); got != recovery.ErrRefused {
		t.Errorf("%v: kind %d, want refused (%d)", err, got, recovery.ErrRefused)
	}
}
