package classify

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStormSimulated is the storm in the pure core, with the
// figures measured on this machine: 30 guests soft/hard-rebooted at once,
// domains off up to 51 s (beyond the 15 s window, so every one of these
// stops reaches the classifier), Nova's task cleared 0.5–3 s after the
// domain runs again and libvirt's start events delivered late for a third
// of them; one guest virsh-destroyed mid-storm (Nova's power sync makes it
// powering-off then stopped 34–41 s later, without a user); one stopped
// with the stop API; nova-api unreachable from 40 s to 70 s; listings take
// 1 s (a loaded Nova).
func TestStormSimulated(t *testing.T) {
	views := map[string][]timedView{}
	actions := map[string][]Action{}
	var in []input
	window := 15 * sec
	var reboots []string
	for i := range 30 {
		u := fmt.Sprintf("reboot-%02d", i)
		reboots = append(reboots, u)
		began := time.Duration(i%10) * sec         // the storm's stops begin over 10 s
		off := 16*sec + time.Duration(i*35/29)*sec // off 16–51 s
		task := TaskRebootStarted
		if i%2 == 1 {
			task = TaskRebootStartedHard
		}
		views[u] = []timedView{v(began-sec, VMActive, task, PowerRunning), v(began+off+time.Duration(500+i*100)*time.Millisecond, VMActive, TaskNone, PowerRunning)}
		in = append(in, input{at: began + window, stop: &Stop{UUID: u, Detail: DetailDestroyed, Began: t0.Add(began)}})
		if i%3 != 0 { // the others' start events are lost (Nova's view ends the hold)
			in = append(in, input{at: began + off + 200*time.Millisecond, alive: u})
		}
	}
	// virsh destroy at 20 s: Nova notices 35 s later and stops it itself.
	views["destroyed"] = []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning), v(55*sec, VMActive, TaskPoweringOff, PowerShutdown), v(57*sec, VMStopped, TaskNone, PowerShutdown)}
	actions["destroyed"] = []Action{{Name: ActionStop, Start: t0.Add(55 * sec)}}
	in = append(in, input{at: 20*sec + window, stop: &Stop{UUID: "destroyed", Detail: DetailDestroyed, Began: t0.Add(20 * sec)}})
	// the stop API at 5 s (the guest shuts down by ACPI ~2 s later)
	views["stop-api"] = []timedView{v(5*sec, VMActive, TaskPoweringOff, PowerRunning), v(8*sec, VMStopped, TaskNone, PowerShutdown)}
	actions["stop-api"] = []Action{{Name: ActionStop, UserID: "u1", Start: t0.Add(5 * sec)}}
	in = append(in, input{at: 7*sec + window, stop: &Stop{UUID: "stop-api", Detail: DetailShutdown, Began: t0.Add(7 * sec)}})
	// a guest that crashes while nova-api is down
	views["crash-in-outage"] = []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning)}
	in = append(in, input{at: 45*sec + window, stop: &Stop{UUID: "crash-in-outage", Detail: DetailCrashed, Began: t0.Add(45 * sec)}})

	n := &novaModel{views: views, actions: actions,
		down:    func(t time.Duration) bool { return t >= 40*sec && t < 70*sec },
		latency: func(time.Duration) time.Duration { return sec }}
	s := newSim(t, Config{}, n, in)
	s.run(time.Hour)
	log := strings.Join(s.log, "\n")
	for _, u := range reboots {
		r, ok := s.reports[u]
		if !ok {
			t.Fatalf("%s never reported\n%s", u, log)
		}
		if r.Classification != Rebooted && r.Classification != Unknown {
			t.Errorf("reboot %s reported %s\n%s", u, r, log)
		}
	}
	if r := s.reports["destroyed"]; r.Classification != StoppedUnexpectedly || r.Held > 2*sec {
		t.Errorf("destroy: %s after %v", r, r.Held)
	}
	if r := s.reports["stop-api"]; r.Classification != StoppedByNova || r.Reason != ReasonStopRequested {
		t.Errorf("stop API: %s", r)
	}
	if r := s.reports["crash-in-outage"]; r.Classification != Unknown || r.Held > DefaultQueryTimeout {
		t.Errorf("crash during the outage: %s after %v", r, r.Held)
	}
	c := s.c.Counters()
	t.Logf("reports %v; %d listings, %d action queries, %d holds, %d from cache", c.Reports, c.ServerQueries, c.ActionQueries, c.Holds, c.FromCache)
	if c.Reports[StoppedUnexpectedly] != 1 {
		t.Errorf("%d stopped-unexpectedly, want exactly the destroy", c.Reports[StoppedUnexpectedly])
	}
}
