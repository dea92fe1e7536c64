package instancerecovery

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testConfig() Config {
	c := DefaultConfig()
	c.ID = "ctl-a"
	return c
}

// haServer is an active, running, protected server on node3.
func haServer() Server {
	return Server{Project: "p1", Host: "node3", Status: "ACTIVE", VMState: "active", PowerState: PowerRunning,
		Metadata: map[string]string{"HA_Enabled": "True"}}
}

// crash: the domain stops (libvirt detail), Nova's sync marks it stopped
// after sync, the agent reports the start the controller caused.
func TestCrashRecovered(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.nova["u1"].PowerState = 4 // off, Nova not synced yet
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(10 * time.Second)
	if len(w.acts) != 0 {
		t.Fatalf("acted before Nova settled: %+v", w.acts)
	}
	w.novaStopped("u1")
	w.advance(3 * time.Second)
	if len(w.acts) != 1 || w.acts[0].action != ActionStart {
		t.Fatalf("want one os-start once Nova shows SHUTOFF with no task, got %+v", w.acts)
	}
	w.advance(5 * time.Second)
	if st := w.last("u1").Step; st == StepRecovered {
		t.Fatalf("recovered without the agent's running event")
	}
	w.event("u1", "started", "", "")
	w.advance(3 * time.Second)
	want := []string{"waiting/nova-settling", "acting/nova-stopped", "recovered/active-and-running"}
	if got := w.steps("u1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("reports %v, want %v", got, want)
	}
	r := w.last("u1")
	if r.Took < 18*time.Second || r.Took > 22*time.Second {
		t.Errorf("took %v, want the stop report → ACTIVE and running (~21 s)", r.Took)
	}
	e := w.kv["u1"].rec.Stops
	if len(e) != 1 || e[0].Outcome != StepRecovered || e[0].Action != ActionStart {
		t.Errorf("record %+v", e)
	}
}

// TestScreen: which stops are never recovered, from the event alone.
func TestScreen(t *testing.T) {
	cases := []struct {
		name, transition, class, detail string
		cfg                             func(*Config)
		want                            string
	}{
		{"rebooted event", "rebooted", "rebooted", "", nil, ""},
		{"stop classified rebooted", "stopped", "rebooted", DetailDestroyed, nil, "skipped/rebooted"},
		{"stop API", "stopped", "stopped-by-nova", DetailShutdown, nil, "skipped/stopped-by-nova"},
		{"nova held too long", "stopped", "stopped-by-nova", DetailDestroyed, nil, "skipped/stopped-by-nova"},
		{"unclassified", "stopped", "", DetailFailed, nil, "skipped/not-classified"},
		{"guest poweroff, default", "stopped", "stopped-unexpectedly", DetailShutdown, nil, "skipped/detail-not-recovered"},
		{"guest poweroff, enabled", "stopped", "stopped-unexpectedly", DetailShutdown,
			func(c *Config) { c.Details = append(c.Details, DetailShutdown) }, "acting/nova-stopped"},
		{"crashed", "stopped", "stopped-unexpectedly", DetailCrashed, nil, "acting/nova-stopped"},
		{"failed", "stopped", "stopped-unexpectedly", DetailFailed, nil, "acting/nova-stopped"},
		{"destroyed", "stopped", "stopped-unexpectedly", DetailDestroyed, nil, "acting/nova-stopped"},
		{"destroyed, not listed", "stopped", "stopped-unexpectedly", DetailDestroyed,
			func(c *Config) { c.Details = []string{DetailCrashed} }, "skipped/detail-not-recovered"},
		{"saved", "stopped", "stopped-unexpectedly", "saved", nil, "skipped/detail-not-recovered"},
		{"unknown", "stopped", "unknown", DetailDestroyed, nil, "acting/nova-stopped"},
		{"unknown off", "stopped", "unknown", DetailDestroyed, func(c *Config) { c.Unknown = false }, "skipped/unknown-not-recovered"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			w := newWorld(t, cfg)
			w.server("u1", haServer())
			w.novaStopped("u1")
			w.event("u1", tc.transition, tc.class, tc.detail)
			w.advance(time.Second)
			got := ""
			if s := w.steps("u1"); len(s) > 0 {
				got = s[0]
			}
			if got != tc.want {
				t.Fatalf("first report %q, want %q (all: %v)", got, tc.want, w.steps("u1"))
			}
			if acted := len(w.acts) > 0; acted != strings.HasPrefix(tc.want, "acting") {
				t.Fatalf("acts %+v", w.acts)
			}
		})
	}
}

// TestJudge: Nova's view → action, skip or wait.
func TestJudge(t *testing.T) {
	type tc struct {
		name   string
		class  string
		mode   Mode
		s      func(*Server)
		waited time.Duration
		want   string // action/reason or wait/reason
	}
	cases := []tc{
		{"not found", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.Found = false }, 0, "/not-in-nova"},
		{"other host", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.Host = "node1" }, 0, "/on-another-host"},
		{"fqdn same host", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.Host = "node3.example.org"; s.VMState = "stopped" }, 0, "start/nova-stopped"},
		{"no HA_Enabled", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.Metadata = nil }, 0, "/not-protected"},
		{"HA_Enabled false", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.Metadata = map[string]string{"HA_Enabled": "False"} }, 0, "/not-protected"},
		{"running in Nova (not synced yet)", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.PowerState = PowerRunning }, 0, "wait/nova-settling"},
		{"running in Nova after settle", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.PowerState = PowerRunning }, DefaultSettleTimeout, "hard-reboot/nova-not-synced"},
		{"powering-off", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.TaskState = "powering-off" }, 0, "wait/nova-settling"},
		{"task after settle", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.TaskState = "rebooting_hard" }, DefaultSettleTimeout, "/nova-task-in-flight"},
		{"unknown + reboot task", "unknown", ModeRestart, func(s *Server) { s.TaskState = "reboot_started_hard" }, 0, "wait/nova-settling"},
		{"stopped", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.VMState = "stopped" }, 0, "start/nova-stopped"},
		{"unknown stopped", "unknown", ModeRestart, func(s *Server) { s.VMState = "stopped" }, 0, "start/nova-stopped"},
		{"unknown stopped by a user", "unknown", ModeRestart, func(s *Server) { s.VMState = "stopped"; s.StopByUser = true }, 0, "/stop-requested"},
		{"active off, syncing", "stopped-unexpectedly", ModeRestart, nil, 0, "wait/nova-settling"},
		{"active off, never synced", "stopped-unexpectedly", ModeRestart, nil, DefaultSettleTimeout, "hard-reboot/nova-not-synced"},
		{"unknown active off", "unknown", ModeRestart, nil, 0, "wait/nova-settling"},
		{"unknown active off, settled", "unknown", ModeRestart, nil, DefaultSettleTimeout, "/unknown-not-confirmed"},
		{"error", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.VMState = "error" }, 0, "hard-reboot/nova-error"},
		{"unknown error", "unknown", ModeRestart, func(s *Server) { s.VMState = "error" }, 0, "/unknown-not-confirmed"},
		{"shelved", "stopped-unexpectedly", ModeRestart, func(s *Server) { s.VMState = "shelved_offloaded" }, 0, "/nova-vm-state"},
		{"masakari active", "stopped-unexpectedly", ModeMasakari, nil, 0, "wait/nova-settling"},
		{"masakari active, never synced", "stopped-unexpectedly", ModeMasakari, nil, DefaultSettleTimeout, "masakari/nova-not-synced"},
		{"masakari stopped", "stopped-unexpectedly", ModeMasakari, func(s *Server) { s.VMState = "stopped" }, 0, "masakari/nova-stopped"},
		{"masakari unknown active", "unknown", ModeMasakari, nil, 0, "wait/nova-settling"},
		{"notify", "stopped-unexpectedly", ModeNotify, func(s *Server) { s.VMState = "stopped" }, 0, "notify/nova-stopped"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Mode = c.mode
			core, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s := haServer()
			s.PowerState = 4
			s.Found = true
			if c.s != nil {
				c.s(&s)
			}
			j := &job{ev: Event{Host: "node3", Classification: c.class}, start: t0}
			act, r, wait := core.judge(t0.Add(c.waited), j, s)
			got := string(act) + "/" + string(r)
			if wait {
				got = "wait/" + string(r)
			}
			if got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

func TestProtectionPolicy(t *testing.T) {
	cfg := testConfig()
	cfg.Protect = ProtectNone
	cfg.Projects = map[string]Protect{"p-all": ProtectAll, "p-ha": ProtectHAEnabled}
	for _, c := range []struct {
		project string
		md      map[string]string
		want    bool
	}{
		{"p1", map[string]string{"HA_Enabled": "True"}, false},
		{"p-all", nil, true},
		{"p-ha", map[string]string{"HA_Enabled": "yes"}, true},
		{"p-ha", map[string]string{"HA_Enabled": "no"}, false},
	} {
		if got, _ := cfg.protected(c.project, c.md); got != c.want {
			t.Errorf("%s %v: %v, want %v", c.project, c.md, got, c.want)
		}
	}
	cfg.Protect = ProtectAll
	if got, _ := cfg.protected("p1", nil); !got {
		t.Error("protect all")
	}
}

// TestStopAPINeverRecovered: a stop Nova made stays stopped even though Nova
// shows SHUTOFF with no task (exactly what a crash looks like after the sync).
func TestStopAPINeverRecovered(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.novaStopped("u1")
	w.event("u1", "stopped", "stopped-by-nova", DetailShutdown)
	w.advance(10 * time.Minute)
	if len(w.acts) != 0 {
		t.Fatalf("acted on a stop-API stop: %+v", w.acts)
	}
}

// TestRebootNeverRecovered: a rebooted event, or a stop classified
// rebooted, never leads to an action — while Nova shows the reboot task
// and after.
func TestRebootNeverRecovered(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.nova["u1"].TaskState = "reboot_started_hard"
	w.nova["u1"].PowerState = 4
	w.event("u1", "rebooted", "rebooted", "")
	w.event("u1", "stopped", "rebooted", DetailDestroyed)
	w.advance(10 * time.Minute)
	if len(w.acts) != 0 || len(w.kv) != 0 {
		t.Fatalf("acts %+v kv %+v", w.acts, w.kv)
	}
}

// TestUnknownNeedsNovaConfirmation: an unknown stop during a hard reboot
// (Nova shows the task, then ACTIVE) is never acted on; once Nova shows
// SHUTOFF with no task it is.
func TestUnknownNeedsNovaConfirmation(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.nova["u1"].TaskState = "reboot_started_hard"
	w.nova["u1"].PowerState = 4
	w.event("u1", "stopped", "unknown", DetailDestroyed)
	w.advance(20 * time.Second)
	w.nova["u1"].TaskState = ""
	w.nova["u1"].PowerState = PowerRunning
	w.advance(5 * time.Second)
	w.event("u1", "started", "", "") // the agent sees the reboot's start
	w.advance(DefaultSettleTimeout)
	if len(w.acts) != 0 {
		t.Fatalf("acted on an unknown stop that was a reboot: %+v", w.acts)
	}
	if got := w.last("u1"); got.Reason != ReasonRunningAgain {
		t.Fatalf("last report %+v", got)
	}
	// an unknown stop Nova confirms
	w.server("u2", haServer())
	w.nova["u2"].PowerState = 4
	w.event("u2", "stopped", "unknown", DetailDestroyed)
	w.advance(DefaultSettleTimeout + time.Minute)
	if len(w.acts) != 0 {
		t.Fatalf("acted on an unknown stop Nova never confirmed (active, off): %+v", w.acts)
	}
	w.server("u3", haServer())
	w.novaStopped("u3")
	w.event("u3", "stopped", "unknown", DetailDestroyed)
	w.advance(time.Second)
	if len(w.acts) != 1 || w.acts[0].uuid != "u3" {
		t.Fatalf("unknown stop confirmed SHUTOFF by Nova: acts %+v", w.acts)
	}
}

// TestCrashLoopBudget: 3 actions per hour with backoff 30 s, 60 s; the 4th
// stop within the hour is over budget; after the window it is recovered again.
func TestCrashLoopBudget(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	crash := func() {
		w.nova["u1"].PowerState = 4
		w.event("u1", "stopped", "stopped-unexpectedly", DetailCrashed)
		w.novaStopped("u1")
	}
	var times []time.Time
	for i := range 5 {
		crash()
		n := len(w.acts)
		w.advance(2 * time.Minute)
		if len(w.acts) > n {
			times = append(times, w.acts[len(w.acts)-1].at)
			w.event("u1", "started", "", "")
			w.advance(3 * time.Second)
		}
		if i == 3 {
			if got := w.last("u1"); got.Step != StepOverBudget {
				t.Fatalf("4th crash: %+v", got)
			}
		}
	}
	if len(times) != 3 {
		t.Fatalf("%d actions, want 3 (budget)", len(times))
	}
	if d := times[1].Sub(times[0]); d < DefaultBackoff {
		t.Errorf("2nd action %v after the 1st, want ≥ %v", d, DefaultBackoff)
	}
	if d := times[2].Sub(times[1]); d < 2*DefaultBackoff {
		t.Errorf("3rd action %v after the 2nd, want ≥ %v", d, 2*DefaultBackoff)
	}
	w.advance(time.Hour)
	crash()
	w.advance(time.Minute)
	if len(w.acts) != 4 {
		t.Fatalf("after the window: %d actions, want 4", len(w.acts))
	}
}

// TestRestartMidRecovery: the intent is recorded and the start performed,
// then the controller restarts (the consumer replays the stream): the new
// core verifies the recorded action and never starts again.
func TestRestartMidRecovery(t *testing.T) {
	for _, when := range []string{"after-intent", "after-act", "after-act-started-seen"} {
		t.Run(when, func(t *testing.T) {
			w := newWorld(t, testConfig())
			w.server("u1", haServer())
			w.novaStopped("u1")
			if when == "after-intent" {
				w.actFault = nil
			}
			w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
			if len(w.acts) != 1 {
				t.Fatalf("acts %+v", w.acts)
			}
			if when == "after-intent" {
				// the crash came between the intent and the call: the
				// action is lost (never repeated), verification fails.
				w.acts = nil
				w.novaStopped("u1")
			}
			if when == "after-act-started-seen" {
				w.event("u1", "started", "", "")
			}
			w.restart()
			w.advance(5 * time.Second)
			if when == "after-act" {
				w.event("u1", "started", "", "")
			}
			w.advance(DefaultVerifyTimeout + time.Minute)
			if len(w.acts) > 1 || (when == "after-intent" && len(w.acts) != 0) {
				t.Fatalf("double start after a restart: %+v", w.acts)
			}
			got := w.kv["u1"].rec.Stops
			want := StepRecovered
			if when == "after-intent" {
				want = StepFailed
			}
			if len(got) != 1 || got[0].Outcome != want {
				t.Fatalf("record %+v, want outcome %s", got, want)
			}
		})
	}
}

// TestIntentWriteOutcomeUnknown: the intent write's answer is lost; the
// core reads the record again, recognises its own intent by its nonce and
// performs it once; if it did not land, it writes it again.
func TestIntentWriteOutcomeUnknown(t *testing.T) {
	for _, f := range []fault{fUnknownLand, fUnknownLost, fConflict} {
		w := newWorld(t, testConfig())
		w.server("u1", haServer())
		w.novaStopped("u1")
		w.writeFaults = []fault{f}
		w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
		w.advance(time.Minute)
		if len(w.acts) != 1 {
			t.Fatalf("fault %d: acts %+v (%v)", f, w.acts, w.steps("u1"))
		}
	}
}

// TestStandbyDoesNothing: a controller that may not act loads, queries,
// writes and acts nothing; once it leads it handles the stop.
func TestStandbyDoesNothing(t *testing.T) {
	w := newWorld(t, testConfig())
	w.setLeading(false)
	w.server("u1", haServer())
	w.novaStopped("u1")
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(time.Minute)
	if len(w.acts) != 0 || w.opsWhileNotLeading != 0 {
		t.Fatalf("standby: acts %+v, %d ops", w.acts, w.opsWhileNotLeading)
	}
	w.setLeading(true)
	w.advance(time.Second)
	if len(w.acts) != 1 {
		t.Fatalf("leader: acts %+v", w.acts)
	}
}

// TestRunningAgainBeforeAction: the instance came back (someone started it)
// while Nova settled: nothing is done, nothing recorded.
func TestRunningAgainBeforeAction(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.nova["u1"].PowerState = 4
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(5 * time.Second)
	w.event("u1", "started", "", "")
	w.novaStopped("u1")
	w.advance(time.Minute)
	if len(w.acts) != 0 || len(w.kv) != 0 {
		t.Fatalf("acts %+v kv %+v", w.acts, w.kv)
	}
	if got := w.last("u1"); got.Reason != ReasonRunningAgain {
		t.Fatalf("%+v", got)
	}
}

// TestTooOldReplay: stops reported longer than max_event_age before the
// core sees them (a controller replaying the stream) are not acted on.
func TestTooOldReplay(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.novaStopped("u1")
	w.setLeading(false)
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.now = w.now.Add(DefaultMaxEventAge + time.Second)
	w.leading = true
	w.restart()
	w.advance(time.Minute)
	if len(w.acts) != 0 {
		t.Fatalf("acted on a replayed old stop: %+v", w.acts)
	}
}

// TestActionRejected: Nova refuses the start (409): failed, reported, not
// retried for this stop.
func TestActionRejected(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.novaStopped("u1")
	w.actFault = errors.New("409 Conflict: Cannot 'start' instance while it is in task_state powering-on")
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(10 * time.Minute)
	if len(w.acts) != 1 || w.last("u1").Step != StepFailed {
		t.Fatalf("acts %+v last %+v", w.acts, w.last("u1"))
	}
}

func TestMasakariMode(t *testing.T) {
	cfg := testConfig()
	cfg.Mode = ModeMasakari
	w := newWorld(t, cfg)
	w.server("u1", haServer())
	w.nova["u1"].PowerState = 4
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(10 * time.Second)
	if len(w.acts) != 0 {
		t.Fatalf("notified Masakari before Nova's own sync: %+v", w.acts)
	}
	w.novaStopped("u1")
	w.advance(time.Minute)
	if len(w.acts) != 1 || w.acts[0].action != ActionMasakari || w.last("u1").Step != StepNotified {
		t.Fatalf("acts %+v last %+v", w.acts, w.last("u1"))
	}
	w.restart()
	w.advance(time.Minute)
	if len(w.acts) != 1 {
		t.Fatalf("notified twice: %+v", w.acts)
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Mode = "evacuate"
	c.Protect = "some"
	c.Details = []string{"crashed", "saved", "crashed"}
	c.Budget = 0
	c.PollInterval = time.Millisecond
	c.MaxEventAge = 2 * time.Hour
	c.Projects = map[string]Protect{"p": "x"}
	err := c.Validate()
	for _, want := range []string{`mode: "evacuate"`, `protect: "some"`, `details: "saved"`, `details: "crashed": listed twice`,
		"budget: 0", "poll_interval: 1ms", "max_event_age: 2h0m0s", `projects.p: "x"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestNovaPowerStateLags: Nova learns of a stop only at its own sync, ~15–17
// s after libvirt's STOPPED — after the agent's report (window 15 s). Its
// first answer still says active and running: the stop is not skipped, the
// start comes once Nova shows SHUTOFF. (Failed before: the core skipped it
// as nova-shows-running, found by TestControllerInstanceRecovery.)
func TestNovaPowerStateLags(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer()) // active, power running: Nova has not synced
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(5 * time.Second)
	if len(w.acts) != 0 || w.last("u1").Step != StepWaiting {
		t.Fatalf("acts %+v, last %+v", w.acts, w.last("u1"))
	}
	w.novaStopped("u1")
	w.advance(3 * time.Second)
	if len(w.acts) != 1 || w.acts[0].action != ActionStart {
		t.Fatalf("acts %+v (%v)", w.acts, w.steps("u1"))
	}
}

// TestRestartReplaysQueuedRecordedStop: the instance crashed twice; the
// previous controller recovered the first stop and recorded (and
// performed) the start of the second, then stopped. The new controller
// replays both stops and the events after them (Nova's start undefines,
// defines and starts the domain): the second stop is queued behind the
// first and must be verified from its record, not dropped as "undefined".
// (Failed before: skipped/undefined, the intent left open — seen in the
// e2e crash loop across a controller restart.)
func TestRestartReplaysQueuedRecordedStop(t *testing.T) {
	w := newWorld(t, testConfig())
	w.server("u1", haServer())
	w.novaStopped("u1")
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.event("u1", "undefined", "", "")
	w.event("u1", "defined", "", "")
	w.event("u1", "started", "", "")
	w.advance(DefaultBackoff)
	w.novaStopped("u1")
	w.event("u1", "stopped", "stopped-unexpectedly", DetailFailed)
	w.advance(time.Second)
	if len(w.acts) != 2 {
		t.Fatalf("acts %+v (%v)", w.acts, w.steps("u1"))
	}
	w.event("u1", "undefined", "", "")
	w.event("u1", "defined", "", "")
	w.event("u1", "started", "", "")
	// the second outcome is not written yet: restart now
	rec := w.kv["u1"].rec
	if e := rec.entry(w.acts[1].stop); e == nil || !e.open() {
		// the world verified it already: reopen it as if the controller
		// died before verifying
		for i := range rec.Stops {
			if rec.Stops[i].Stop == w.acts[1].stop {
				rec.Stops[i].Outcome, rec.Stops[i].Reason = "", ""
			}
		}
		w.rev++
		w.kv["u1"] = kvEntry{rec: rec, rev: w.rev}
	}
	w.reports = nil
	w.restart()
	w.advance(10 * time.Second)
	if len(w.acts) != 2 {
		t.Fatalf("started again after the restart: %+v", w.acts)
	}
	final := w.kv["u1"].rec
	got := final.entry(w.acts[1].stop)
	if got == nil || got.Outcome != StepRecovered {
		t.Fatalf("second stop after the restart: %+v (reports %v)", got, w.steps("u1"))
	}
}
