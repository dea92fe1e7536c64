package openstack

import (
	"strings"
	"testing"
	"time"

	"hvguard/classify"
	"hvguard/lifecycle"
)

// The libvirt events hvguard's libvirtx delivered during Nova's reboots of
// real guests on the libvirt-driver compute node3 (TestLibvirtNovaReboots,
// 2026-11-29, offsets from the reboot request):
//
//	soft: +0.32 SHUTDOWN/GUEST, +2.15 STOPPED/SHUTDOWN, +3.44 RESUMED/UNPAUSED, +3.45 STARTED/BOOTED
//	hard: +1.84 SHUTDOWN/HOST, +1.87 STOPPED/DESTROYED, +1.89 UNDEFINED/REMOVED,
//	      +2.24 DEFINED/ADDED, +2.65 RESUMED/UNPAUSED, +2.65 STARTED/BOOTED
//
// Nova 26's hard reboot undefines and redefines the domain (the libvirt
// driver's _hard_reboot destroys it with destroy_disks=False, which
// undefines, then creates it again), so the debouncer — which reports a
// pending stop at once when the domain is undefined — reports every Nova
// hard reboot as a stop without waiting for its window. The classifier,
// fed that stop, sees Nova's reboot_started_hard and holds it until libvirt
// shows the domain running again: rebooted.
type recEvent struct {
	at            time.Duration
	kind          lifecycle.Kind
	event, detail string
}

var (
	novaSoftReboot = []recEvent{
		{320 * time.Millisecond, lifecycle.KindShutdown, "SHUTDOWN", "GUEST"},
		{2150 * time.Millisecond, lifecycle.KindStopped, "STOPPED", "SHUTDOWN"},
		{3440 * time.Millisecond, lifecycle.KindResumed, "RESUMED", "UNPAUSED"},
		{3450 * time.Millisecond, lifecycle.KindStarted, "STARTED", "BOOTED"},
	}
	novaHardReboot = []recEvent{
		{1840 * time.Millisecond, lifecycle.KindShutdown, "SHUTDOWN", "HOST"},
		{1870 * time.Millisecond, lifecycle.KindStopped, "STOPPED", "DESTROYED"},
		{1890 * time.Millisecond, lifecycle.KindUndefined, "UNDEFINED", "REMOVED"},
		{2240 * time.Millisecond, lifecycle.KindDefined, "DEFINED", "ADDED"},
		{2650 * time.Millisecond, lifecycle.KindResumed, "RESUMED", "UNPAUSED"},
		{2650 * time.Millisecond, lifecycle.KindStarted, "STARTED", "BOOTED"},
	}
)

func TestNovaRebootEventsThroughDebouncerAndClassifier(t *testing.T) {
	const uuid = "d8553759-69a7-46cf-9afc-b632d3384aff"
	t0 := time.Date(2026, 11, 29, 20, 19, 0, 0, time.UTC)
	for _, c := range []struct {
		name      string
		evs       []recEvent
		debouncer string // the debouncer's reports (the stop handed to the classifier)
		classify  string // the classifier's report, "" if no stop reached it
	}{
		{"soft", novaSoftReboot, "rebooted resumed-within-window", ""},
		// The undefine is held behind the pending stop, so the redefine
		// and start make it a reboot before any stop reaches the classifier.
		{"hard", novaHardReboot, "rebooted resumed-within-window,defined event", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			deb, err := lifecycle.New(lifecycle.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			// the domain is known and running
			deb.Resync([]lifecycle.DomainSnapshot{{UUID: uuid, Name: "instance-000000dd", State: lifecycle.StateRunning}}, t0)
			cls, _ := classify.New(classify.Config{})
			var reports []string
			var got string
			for _, e := range c.evs {
				now := t0.Add(e.at)
				for _, d := range deb.Observe(lifecycle.Event{UUID: uuid, Kind: e.kind, Event: e.event, Detail: e.detail, At: now}, now) {
					if d.Op != lifecycle.OpReport {
						continue
					}
					reports = append(reports, string(d.Transition)+" "+string(d.Reason))
					var ds []classify.Decision
					switch {
					case d.Transition == lifecycle.TransitionStopped:
						ds = cls.Add(classify.Stop{UUID: uuid, Detail: classify.ParseDetail(d.Cause.Detail), Began: d.Cause.At}, now)
						// Nova's answer 0.1 s later: the hard reboot in flight
						ds = cls.ServersResult(ds[0].Token, []classify.Server{{UUID: uuid, VMState: classify.VMActive,
							TaskState: classify.TaskRebootStartedHard, PowerState: classify.PowerRunning}}, nil, now.Add(100*time.Millisecond))
					case d.Transition == lifecycle.TransitionStarted || d.Transition == lifecycle.TransitionResumed:
						ds = cls.Alive(uuid, now)
					}
					for _, x := range ds {
						if x.Op == classify.OpReport {
							got = x.String()
						}
					}
				}
			}
			if s := strings.Join(reports, ","); s != c.debouncer {
				t.Errorf("debouncer reported %q, want %q", s, c.debouncer)
			}
			if got != c.classify {
				t.Errorf("classifier reported %q, want %q", got, c.classify)
			}
		})
	}
}
