package classify

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const sec = time.Second

func v(from time.Duration, vm VMState, task TaskState, p PowerState) timedView {
	return timedView{from: from, present: true, s: Server{VMState: vm, TaskState: task, PowerState: p}}
}

func gone(from time.Duration) timedView { return timedView{from: from} }

// The stop of "a" begins at 0 (Began = t0); the debouncer hands it over at
// 15 s (its window). Nova answers after 100 ms unless said otherwise.
func TestTable(t *testing.T) {
	userStop := func(at time.Duration) []Action {
		return []Action{{Name: "start", UserID: "u1", Start: t0.Add(-time.Hour)}, {Name: ActionStop, UserID: "u1", Start: t0.Add(at)}}
	}
	novaStop := func(at time.Duration) []Action {
		return []Action{{Name: ActionStop, UserID: "", Start: t0.Add(at)}, {Name: "reboot", UserID: "u1", Start: t0.Add(-time.Hour)}}
	}
	for _, c := range []struct {
		name    string
		views   []timedView
		actions []Action
		detail  Detail
		add     time.Duration // default 15 s
		alive   time.Duration // 0: never
		down    func(time.Duration) bool
		latency time.Duration
		want    string        // the report
		held    time.Duration // when the report comes, after the hand-over (±0.1 s)
		holds   int
	}{
		{name: "virsh destroy: Nova has not noticed", views: []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning)}, detail: DetailDestroyed,
			want: "report stopped-unexpectedly no-operation detail=destroyed vm=active", held: 100 * time.Millisecond},
		{name: "guest powered off, Nova synced power_state only", views: []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning), v(14*sec, VMActive, TaskNone, PowerShutdown)}, detail: DetailShutdown,
			want: "report stopped-unexpectedly no-operation detail=shutdown-by-guest vm=active", held: 100 * time.Millisecond},
		{name: "soft reboot completes while held", detail: DetailShutdown,
			views: []timedView{v(-sec, VMActive, TaskRebooting, PowerRunning), v(-sec/2, VMActive, TaskRebootStarted, PowerRunning), v(20*sec, VMActive, TaskNone, PowerRunning)},
			want:  "report rebooted operation-completed detail=shutdown-by-guest task=reboot_started vm=active", held: 6400 * time.Millisecond, holds: 1},
		{name: "hard reboot, domain off 51 s, libvirt sees the start", detail: DetailDestroyed, alive: 51 * sec,
			views: []timedView{v(-sec, VMActive, TaskRebootStartedHard, PowerRunning), v(53*sec, VMActive, TaskNone, PowerRunning)},
			want:  "report rebooted started-during-operation detail=destroyed task=reboot_started_hard vm=active", held: 36 * sec, holds: 1},
		{name: "reboot never ends: held too long", detail: DetailDestroyed,
			views: []timedView{v(-sec, VMActive, TaskRebootStartedHard, PowerShutdown)},
			want:  "report stopped-by-nova held-too-long detail=destroyed task=reboot_started_hard vm=active", held: DefaultMaxHold + 100*time.Millisecond, holds: 1},
		{name: "reboot fails, domain left off", detail: DetailDestroyed,
			views: []timedView{v(-sec, VMActive, TaskRebootStartedHard, PowerRunning), v(25*sec, VMActive, TaskNone, PowerShutdown)},
			want:  "report stopped-unexpectedly operation-left-domain-off detail=destroyed task=reboot_started_hard vm=active", held: 10600 * time.Millisecond, holds: 1},
		{name: "reboot fails into error", detail: DetailDestroyed,
			views: []timedView{v(-sec, VMActive, TaskRebootStartedHard, PowerRunning), v(25*sec, VMError, TaskNone, PowerShutdown)},
			want:  "report stopped-unexpectedly nova-error detail=destroyed task=reboot_started_hard vm=error", held: 10600 * time.Millisecond, holds: 1},
		{name: "stop API: powering-off then stopped", detail: DetailShutdown, actions: userStop(-2 * sec),
			views: []timedView{v(-2*sec, VMActive, TaskPoweringOff, PowerRunning), v(17*sec, VMStopped, TaskNone, PowerShutdown)},
			want:  "report stopped-by-nova stop-requested detail=shutdown-by-guest task=powering-off vm=stopped", held: 2300 * time.Millisecond, holds: 1},
		{name: "stop API finished", detail: DetailShutdown, actions: userStop(-2 * sec),
			views: []timedView{v(-2*sec, VMActive, TaskPoweringOff, PowerRunning), v(3*sec, VMStopped, TaskNone, PowerShutdown)},
			want:  "report stopped-by-nova stop-requested detail=shutdown-by-guest vm=stopped", held: 200 * time.Millisecond},
		{name: "Nova's sync stopping it (powering-off, no user)", detail: DetailDestroyed, actions: novaStop(15 * sec),
			views: []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning), v(15*sec, VMActive, TaskPoweringOff, PowerShutdown)},
			add:   16 * sec, want: "report stopped-unexpectedly nova-synced-stop detail=destroyed vm=active", held: 200 * time.Millisecond},
		{name: "Nova's sync stopped it", detail: DetailDestroyed, actions: novaStop(15 * sec),
			views: []timedView{v(-time.Hour, VMActive, TaskNone, PowerRunning), v(16*sec, VMStopped, TaskNone, PowerShutdown)},
			add:   17 * sec, want: "report stopped-unexpectedly nova-synced-stop detail=destroyed vm=stopped", held: 200 * time.Millisecond},
		{name: "a user's stop request after the stop", detail: DetailCrashed, actions: userStop(12 * sec),
			views: []timedView{v(12*sec, VMStopped, TaskNone, PowerShutdown)},
			want:  "report stopped-unexpectedly nova-synced-stop detail=crashed vm=stopped", held: 200 * time.Millisecond},
		{name: "stop request within clock skew", detail: DetailShutdown, actions: userStop(4 * sec),
			views: []timedView{v(5*sec, VMStopped, TaskNone, PowerShutdown)},
			want:  "report stopped-by-nova stop-requested detail=shutdown-by-guest vm=stopped", held: 200 * time.Millisecond},
		{name: "stopped with no stop action at all", detail: DetailShutdown, actions: []Action{{Name: "create", UserID: "u", Start: t0.Add(-time.Hour)}},
			views: []timedView{v(5*sec, VMStopped, TaskNone, PowerShutdown)},
			want:  "report stopped-unexpectedly nova-synced-stop detail=shutdown-by-guest vm=stopped", held: 200 * time.Millisecond},
		{name: "shelved", detail: DetailShutdown, views: []timedView{v(-sec, VMActive, TaskShelving, PowerRunning), v(10*sec, VMShelved, TaskNone, PowerShutdown)},
			want: "report stopped-by-nova nova-vm-state detail=shutdown-by-guest vm=shelved", held: 100 * time.Millisecond},
		{name: "suspended (managed save)", detail: DetailSaved, views: []timedView{v(5*sec, VMSuspended, TaskNone, PowerSuspended)},
			want: "report stopped-by-nova nova-vm-state detail=saved vm=suspended", held: 100 * time.Millisecond},
		{name: "not listed on this host", detail: DetailMigrated, views: []timedView{gone(0)},
			want: "report stopped-by-nova not-on-host detail=migrated", held: 100 * time.Millisecond},
		{name: "deleting, then gone", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, TaskDeleting, PowerRunning), gone(16 * sec)},
			want: "report stopped-by-nova not-on-host detail=destroyed task=deleting", held: 2100 * time.Millisecond, holds: 1},
		{name: "resize away: resize_migrating then on the other host", detail: DetailShutdown,
			views: []timedView{v(-sec, VMActive, TaskResizeMigrating, PowerRunning), gone(40 * sec)},
			want:  "report stopped-by-nova not-on-host detail=shutdown-by-guest task=resize_migrating", held: 25300 * time.Millisecond, holds: 1},
		{name: "an unknown task state is held", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, "frobnicating", PowerRunning), v(20*sec, VMActive, TaskNone, PowerRunning)},
			want: "report rebooted operation-completed detail=destroyed task=frobnicating vm=active", held: 6400 * time.Millisecond, holds: 1},
		{name: "pausing does not explain a stop", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, TaskPausing, PowerRunning)},
			want: "report stopped-unexpectedly no-operation detail=destroyed vm=active", held: 100 * time.Millisecond},
		{name: "paused in Nova, off in libvirt", detail: DetailDestroyed, views: []timedView{v(-sec, VMPaused, TaskNone, PowerPaused)},
			want: "report stopped-unexpectedly vm-state-mismatch detail=destroyed vm=paused", held: 100 * time.Millisecond},
		{name: "Nova unreachable", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, TaskRebootStarted, PowerRunning)},
			down: func(time.Duration) bool { return true },
			want: "report unknown nova-unavailable detail=destroyed", held: 100 * time.Millisecond},
		{name: "Nova slow", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, TaskRebootStarted, PowerRunning)},
			latency: DefaultQueryTimeout + 5*sec, want: "report unknown nova-slow detail=destroyed", held: DefaultQueryTimeout},
		// make e2e's storm (load 43-46): servers/detail answered in up to
		// 5.1 s; with the former 3 s timeout this reboot was an unknown stop.
		{name: "Nova answering in 5.1 s under load, a reboot", detail: DetailDestroyed, alive: 40 * sec,
			views:   []timedView{v(-sec, VMActive, TaskRebootStarted, PowerRunning), v(45*sec, VMActive, TaskNone, PowerRunning)},
			latency: 5100 * time.Millisecond,
			want:    "report rebooted started-during-operation detail=destroyed task=reboot_started vm=active", held: 25 * sec, holds: 1},
		{name: "Nova lost while held", detail: DetailDestroyed, views: []timedView{v(-sec, VMActive, TaskRebootStarted, PowerRunning)},
			down: func(t time.Duration) bool { return t > 16*sec },
			want: "report unknown nova-lost-while-held detail=destroyed task=reboot_started vm=active", held: DefaultNovaLostAfter + 100*time.Millisecond, holds: 1},
		{name: "Nova lost while held, the reboot completes", detail: DetailDestroyed, alive: 30 * sec,
			views: []timedView{v(-sec, VMActive, TaskRebootStarted, PowerRunning)},
			down:  func(t time.Duration) bool { return t > 16*sec },
			want:  "report rebooted started-during-operation detail=destroyed task=reboot_started vm=active", held: 15 * sec, holds: 1},
		{name: "started before Nova answered", detail: DetailDestroyed, alive: 15*sec + 500*time.Millisecond, latency: 2 * sec,
			views: []timedView{v(-sec, VMActive, TaskNone, PowerRunning)},
			want:  "report rebooted started-before-classified detail=destroyed", held: 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := &novaModel{views: map[string][]timedView{"a": c.views}, actions: map[string][]Action{"a": c.actions}, down: c.down}
			if c.latency > 0 {
				n.latency = func(time.Duration) time.Duration { return c.latency }
			}
			add := c.add
			if add == 0 {
				add = 15 * sec
			}
			in := []input{{at: add, stop: &Stop{UUID: "a", Detail: c.detail, Began: t0}}}
			if c.alive > 0 {
				in = append(in, input{at: c.alive, alive: "a"})
			}
			s := newSim(t, Config{}, n, in)
			s.run(time.Hour)
			r, ok := s.reports["a"]
			if !ok {
				t.Fatalf("no report:\n%s", strings.Join(s.log, "\n"))
			}
			if r.String() != c.want {
				t.Errorf("got  %s\nwant %s\n%s", r, c.want, strings.Join(s.log, "\n"))
			}
			if d := r.Held - c.held; d < -100*time.Millisecond || d > 100*time.Millisecond {
				t.Errorf("reported %v after the hand-over, want %v\n%s", r.Held, c.held, strings.Join(s.log, "\n"))
			}
			if got := s.c.Counters().Holds; got != uint64(c.holds) {
				t.Errorf("%d holds, want %d", got, c.holds)
			}
			if s.c.Pending() != 0 {
				t.Errorf("%d still pending", s.c.Pending())
			}
		})
	}
}

// Stops whose windows end in the same tick share one listing; stops ending
// within CacheTTL of an answer use it.
func TestBatching(t *testing.T) {
	views := map[string][]timedView{}
	var in []input
	for i := range 30 {
		u := fmt.Sprintf("vm-%02d", i)
		views[u] = []timedView{v(-sec, VMActive, TaskRebootStartedHard, PowerRunning), v(20*sec+time.Duration(i)*sec, VMActive, TaskNone, PowerRunning)}
		at := 15 * sec
		if i >= 20 { // these end 0.5 s later: served from the cache
			at += 500 * time.Millisecond
		}
		in = append(in, input{at: at, stop: &Stop{UUID: u, Detail: DetailDestroyed, Began: t0}})
	}
	s := newSim(t, Config{}, &novaModel{views: views}, in)
	s.run(time.Hour)
	c := s.c.Counters()
	if len(s.reports) != 30 || c.Reports[Rebooted] != 30 {
		t.Fatalf("reports %v", c.Reports)
	}
	if c.FromCache != 10 {
		t.Errorf("from cache %d, want 10", c.FromCache)
	}
	// 1 first listing, then one poll per PollInterval until the last
	// reboot completes at 49 s: (49-15)/2 + 1 ≈ 18.
	if c.ServerQueries > 20 {
		t.Errorf("%d listings for 30 stops; want one per tick/poll (≤ 20)\n%s", c.ServerQueries, strings.Join(s.log, "\n"))
	}
	t.Logf("30 held reboots: %d listings, %d from cache", c.ServerQueries, c.FromCache)
}

// After a failed listing, stops needing a first view are reported unknown at
// once for RetryBackoff, without a query each.
func TestBackoff(t *testing.T) {
	views := map[string][]timedView{}
	var in []input
	for i := range 10 {
		u := fmt.Sprintf("vm-%02d", i)
		views[u] = []timedView{v(-sec, VMActive, TaskNone, PowerRunning)}
		in = append(in, input{at: 15*sec + time.Duration(i)*300*time.Millisecond, stop: &Stop{UUID: u, Detail: DetailDestroyed, Began: t0}})
	}
	s := newSim(t, Config{}, &novaModel{views: views, down: func(time.Duration) bool { return true }}, in)
	s.run(time.Hour)
	c := s.c.Counters()
	if c.Reports[Unknown] != 10 || c.ServerQueries != 1 {
		t.Fatalf("unknown %d, listings %d; want 10, 1\n%s", c.Reports[Unknown], c.ServerQueries, strings.Join(s.log, "\n"))
	}
	for u, r := range s.reports {
		if r.Held > 200*time.Millisecond {
			t.Errorf("%s reported %v after the window", u, r.Held)
		}
	}
}

// A listing requested before a stop began is never used for it.
func TestViewMustFollowStop(t *testing.T) {
	c, _ := New(Config{})
	ds := c.Add(Stop{UUID: "a", Began: t0}, t0.Add(15*sec))
	if len(ds) != 1 || ds[0].Op != OpQueryServers {
		t.Fatalf("%v", ds)
	}
	// b began after the listing was sent (window 0 in a test, say)
	ds = c.Add(Stop{UUID: "b", Began: t0.Add(15*sec + 10*time.Millisecond)}, t0.Add(15*sec+20*time.Millisecond))
	if len(ds) != 0 {
		t.Fatalf("b must wait for a later listing: %v", ds)
	}
	ds = c.ServersResult(1, []Server{{UUID: "a", VMState: VMActive}, {UUID: "b", VMState: VMActive}}, nil, t0.Add(15*sec+100*time.Millisecond))
	var ops []string
	for _, d := range ds {
		ops = append(ops, d.Op.String()+" "+d.UUID)
	}
	if strings.Join(ops, ",") != "report a,query-servers " {
		t.Fatalf("got %v", ops)
	}
	// stale and unknown tokens are ignored
	if ds := c.ServersResult(1, nil, nil, t0.Add(16*sec)); len(ds) != 0 || c.Counters().StaleAnswers != 1 {
		t.Fatalf("stale answer used: %v", ds)
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{MaxHold: -1}); err == nil {
		t.Fatal("negative accepted")
	}
	if _, err := New(Config{QueryTimeout: time.Minute}); err == nil {
		t.Fatal("query timeout above nova_lost_after accepted")
	}
	c, _ := New(Config{})
	if c.Config() != DefaultConfig() {
		t.Fatalf("%+v", c.Config())
	}
}

func TestParseDetail(t *testing.T) {
	for in, want := range map[string]Detail{"SHUTDOWN": DetailShutdown, "DESTROYED": DetailDestroyed, "CRASHED": DetailCrashed,
		"PANICKED+CRASHED": DetailCrashed, "SHUTDOWN+CRASHED": DetailCrashed, "FAILED": DetailFailed, "SAVED": DetailSaved,
		"MIGRATED": DetailMigrated, "FROM_SNAPSHOT": DetailFromSnapshot, "": DetailUnknown, "destroyed": DetailDestroyed} {
		if got := ParseDetail(in); got != want {
			t.Errorf("%q: %s, want %s", in, got, want)
		}
	}
}

func TestTaskStates(t *testing.T) {
	for _, ts := range []TaskState{TaskPausing, TaskUnpausing, TaskUpdatingPassword, TaskNone} {
		if ts.Explains() {
			t.Errorf("%q explains a stop", ts)
		}
	}
	if !TaskState("future_op").Explains() || TaskState("future_op").Known() {
		t.Error("unknown task states must be held")
	}
	n := 0
	for ts := range taskExplains {
		if ts.Explains() {
			n++
		}
	}
	if len(taskExplains) != 42 || n != 39 {
		t.Errorf("%d task states (Nova 26 has 42), %d explaining", len(taskExplains), n)
	}
}

// Drain reports every stop still being classified (waiting for Nova or
// held) as unknown agent-stopping, in order, and leaves nothing behind: a
// shutting-down agent loses no stop.
func TestDrain(t *testing.T) {
	c, _ := New(Config{})
	a, b := "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
	ds := c.Add(Stop{UUID: a, Detail: DetailDestroyed, Began: t0}, t0.Add(15*time.Second))
	tok := ds[0].Token
	c.Add(Stop{UUID: b, Detail: DetailShutdown, Began: t0.Add(time.Second)}, t0.Add(15*time.Second))
	ds = c.ServersResult(tok, []Server{{UUID: a, VMState: VMActive, TaskState: TaskRebootStartedHard, PowerState: PowerShutdown}}, nil, t0.Add(15*time.Second))
	if c.Pending() != 1 { // b: not listed → stopped-by-nova; a: held
		t.Fatalf("pending %d after %v", c.Pending(), ds)
	}
	c.Add(Stop{UUID: b, Detail: DetailShutdown, Began: t0.Add(20 * time.Second)}, t0.Add(35*time.Second))
	ds = c.Drain(t0.Add(36 * time.Second))
	var got []string
	for _, d := range ds {
		got = append(got, d.UUID[len(d.UUID)-1:]+" "+d.String())
	}
	want := []string{
		"a report unknown agent-stopping detail=destroyed task=reboot_started_hard vm=active",
		"b report unknown agent-stopping detail=shutdown-by-guest",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Drain:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c.Pending() != 0 {
		t.Fatalf("pending %d after Drain", c.Pending())
	}
	if _, ok := c.NextDeadline(); ok {
		t.Fatal("a deadline after Drain")
	}
}
