//go:build realvirt

package realvirt

import (
	"context"
	"testing"
	"time"

	"hvguard/libvirtx"
	"hvguard/lifecycle"
)

// sysTestURI is the system libvirtd's daemon-side test driver, shared by all
// client processes.
const sysTestURI = "test+unix:///default"

// TestCrossProcessEvents drives a test-driver domain with virsh in a
// subprocess and checks that libvirtx, connected from this process,
// receives each lifecycle event with its mapped kind, names and UUID, and
// that State agrees afterwards. It uses its own uniquely named domain, so it
// does not disturb other users of the shared test driver.
func TestCrossProcessEvents(t *testing.T) {
	requireDaemon(t, sysTestURI)
	c := dial(t, libvirtx.DefaultConfig(sysTestURI))
	r := record(c)

	uuid := newUUID(t)
	name := "hvg-realvirt-xp-" + uuid[:8]
	xml := writeFile(t, "domain.xml", libvirtx.TestDomainXML(name, uuid))
	t.Cleanup(func() {
		_, _ = virsh(sysTestURI, 10*time.Second, "destroy", uuid)
		_, _ = virsh(sysTestURI, 10*time.Second, "undefine", uuid)
	})

	steps := []struct {
		args  []string
		kind  lifecycle.Kind
		key   string // EVENT/DETAIL
		state lifecycle.State
	}{
		{[]string{"define", xml}, lifecycle.KindDefined, "DEFINED/ADDED", lifecycle.StateShutoff},
		{[]string{"start", name}, lifecycle.KindStarted, "STARTED/BOOTED", lifecycle.StateRunning},
		{[]string{"suspend", name}, lifecycle.KindSuspended, "SUSPENDED/PAUSED", lifecycle.StatePaused},
		{[]string{"resume", name}, lifecycle.KindResumed, "RESUMED/UNPAUSED", lifecycle.StateRunning},
		{[]string{"destroy", name}, lifecycle.KindStopped, "STOPPED/DESTROYED", lifecycle.StateShutoff},
		{[]string{"start", name}, lifecycle.KindStarted, "STARTED/BOOTED", lifecycle.StateRunning},
		{[]string{"shutdown", name}, lifecycle.KindStopped, "STOPPED/SHUTDOWN", lifecycle.StateShutoff},
		{[]string{"undefine", name}, lifecycle.KindUndefined, "UNDEFINED/REMOVED", lifecycle.StateGone},
	}
	for _, st := range steps {
		m := r.mark()
		sent := time.Now()
		mustVirsh(t, sysTestURI, st.args...)
		evs := r.waitEvents(t, m, uuid, 10*time.Second, st.key, func(evs []lifecycle.Event) bool { return len(evs) > 0 })
		ev := evs[0]
		if key(ev) != st.key || ev.Kind != st.kind || ev.UUID != uuid || ev.Name != name {
			t.Errorf("virsh %s: got %+v, want %s kind %v uuid %s name %s", st.args[0], ev, st.key, st.kind, uuid, name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := c.State(ctx, uuid)
		cancel()
		if err != nil || got != st.state {
			t.Errorf("after virsh %s: State = %v, %v; want %v", st.args[0], got, err, st.state)
		}
		t.Logf("virsh %-8s → %s kind=%v, %v after the virsh process started", st.args[0], key(ev), ev.Kind, ev.At.Sub(sent).Round(time.Millisecond))
	}
	time.Sleep(200 * time.Millisecond)
	all := r.since(0, uuid)
	if len(all) != len(steps) {
		t.Errorf("want exactly %d events for the domain, got %d: %s", len(steps), len(all), format(all, time.Time{}))
	}
	if st := c.Status(); !st.Connected || st.Overflows != 0 || st.Reconnects != 0 {
		t.Errorf("status after the run: %+v", st)
	}
}
