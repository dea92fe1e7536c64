package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mut     func(*Config)
		wantErr []string // substrings: field name and value
	}{
		{"defaults", func(*Config) {}, nil},
		{"pass-through ignores other fields", func(c *Config) { *c = Config{} }, nil},
		{"negative window", func(c *Config) { c.Window = -time.Second }, []string{"Window", "-1s"}},
		{"window too long", func(c *Config) { c.Window = time.Hour }, []string{"Window", "1h0m0s", "MaxWindow"}},
		{"recheck too small", func(c *Config) { c.RecheckInterval = time.Millisecond }, []string{"RecheckInterval", "1ms"}},
		{"zero check timeout selects default", func(c *Config) { c.CheckTimeout = 0 }, nil},
		{"negative check timeout", func(c *Config) { c.CheckTimeout = -time.Millisecond }, []string{"CheckTimeout", "-1ms"}},
		{"zero max checks", func(c *Config) { c.MaxChecks = 0 }, []string{"MaxChecks", "0"}},
		{"too many checks", func(c *Config) { c.MaxChecks = 1000 }, []string{"MaxChecks", "1000"}},
		{"several fields at once", func(c *Config) { c.MaxChecks, c.CheckTimeout = -1, -time.Second }, []string{"MaxChecks -1", "CheckTimeout -1s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mut(&cfg)
			err := cfg.Validate()
			_, newErr := New(cfg)
			if tc.wantErr == nil {
				if err != nil || newErr != nil {
					t.Fatalf("Validate = %v, New = %v; want nil", err, newErr)
				}
				return
			}
			if err == nil || newErr == nil {
				t.Fatalf("Validate = %v, New = %v; want errors", err, newErr)
			}
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(newErr, ErrInvalidConfig) {
				t.Errorf("errors do not wrap ErrInvalidConfig: %v / %v", err, newErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestFirstEvent: what a single event does to a domain never seen before.
func TestFirstEvent(t *testing.T) {
	tests := []struct {
		kind    Kind
		detail  string
		want    string // decision string, "" = none
		pending int
		len     int
	}{
		{KindDefined, "ADDED", "report defined event state=shutoff", 0, 1},
		{KindDefined, "UPDATED", "report defined event state=unknown", 0, 1},
		{KindUndefined, "REMOVED", "report undefined event state=gone", 0, 0},
		{KindStarted, "BOOTED", "report started event state=running", 0, 1},
		{KindSuspended, "PAUSED", "report suspended event state=paused", 0, 1},
		{KindResumed, "UNPAUSED", "report resumed event state=running", 0, 1},
		{KindStopped, "DESTROYED", "", 1, 1},
		{KindCrashed, "PANICKED", "", 1, 1},
		{KindShutdown, "GUEST", "", 0, 1},
		{KindPMSuspended, "MEMORY", "report pmsuspended event state=pmsuspended", 0, 1},
		{KindReboot, "", "", 0, 1}, // held: the burst is reported by Tick
		{KindUnknown, "", "", 0, 0},
		{Kind(200), "", "", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.kind.String()+"/"+tc.detail, func(t *testing.T) {
			d, _ := New(DefaultConfig())
			out := d.AppendObserve(nil, Event{UUID: "u", Kind: tc.kind, Event: "X", Detail: tc.detail, At: t0}, t0)
			var got string
			if len(out) > 1 {
				t.Fatalf("more than one decision: %v", out)
			}
			if len(out) == 1 {
				got, _, _ = strings.Cut(out[0].String(), " cause=")
			}
			if got != tc.want || d.Pending() != tc.pending || d.Len() != tc.len {
				t.Fatalf("got %q pending=%d len=%d; want %q pending=%d len=%d", got, d.Pending(), d.Len(), tc.want, tc.pending, tc.len)
			}
		})
	}
}

func TestEmptyUUIDIgnored(t *testing.T) {
	d, _ := New(DefaultConfig())
	if out := d.AppendObserve(nil, Event{Kind: KindStopped}, t0); len(out) != 0 || d.Len() != 0 {
		t.Fatalf("got %v len %d", out, d.Len())
	}
	if c := d.Counters(); c.Ignored != 1 || c.Events != 1 {
		t.Fatalf("counters %+v", c)
	}
}

func TestNextDeadline(t *testing.T) {
	d, _ := New(DefaultConfig())
	if _, ok := d.NextDeadline(); ok {
		t.Fatal("deadline with nothing pending")
	}
	d.AppendObserve(nil, Event{UUID: "b", Kind: KindStopped}, t0.Add(2*time.Second))
	d.AppendObserve(nil, Event{UUID: "a", Kind: KindStopped}, t0)
	if dl, ok := d.NextDeadline(); !ok || !dl.Equal(t0.Add(DefaultWindow)) {
		t.Fatalf("deadline %v %v", dl, ok)
	}
	out := d.AppendTick(nil, t0.Add(DefaultWindow))
	if len(out) != 1 || out[0].UUID != "a" || out[0].Op != OpCheckState {
		t.Fatalf("tick: %v", out)
	}
	// a's check times out after CheckTimeout; b's window ends first.
	if dl, _ := d.NextDeadline(); !dl.Equal(t0.Add(2*time.Second + DefaultWindow)) {
		t.Fatalf("deadline %v", dl)
	}
	d.AppendObserve(nil, Event{UUID: "b", Kind: KindStarted}, t0.Add(3*time.Second))
	if dl, _ := d.NextDeadline(); !dl.Equal(t0.Add(DefaultWindow + DefaultCheckTimeout)) {
		t.Fatalf("deadline after cancel %v", dl)
	}
}

func TestCounters(t *testing.T) {
	d, _ := New(DefaultConfig())
	now := t0
	d.AppendObserve(nil, Event{UUID: "a", Kind: KindStopped}, now)
	d.AppendObserve(nil, Event{UUID: "a", Kind: KindResumed}, now) // suppressed by resumed
	d.AppendObserve(nil, Event{UUID: "a", Kind: KindStarted}, now) // folded
	d.AppendObserve(nil, Event{UUID: "b", Kind: KindStopped}, now) // will be off
	d.AppendObserve(nil, Event{UUID: "c", Kind: KindStopped}, now) // will be running
	d.AppendObserve(nil, Event{UUID: "c", Kind: KindCrashed}, now) // merged
	if c := d.Counters(); c.StopsPending != 2 || c.StopsBegun != 3 || c.StopsMerged != 1 {
		t.Fatalf("%+v", c)
	}
	now = now.Add(DefaultWindow)
	out := d.AppendTick(nil, now)
	for _, dc := range out {
		st := StateShutoff
		if dc.UUID == "c" {
			st = StateRunning
		}
		d.AppendResolve(nil, dc.UUID, dc.Check, st, nil, now)
	}
	d.AppendResolve(nil, "c", 999, StateRunning, nil, now)
	c := d.Counters()
	want := Counters{Events: 6, Folded: 1, StopsBegun: 3, StopsMerged: 1, StopsReported: 1, StopsOffAtWindowEnd: 1,
		SuppressedResumed: 1, SuppressedRunning: 1, ChecksIssued: 2, ChecksStale: 1}
	if c != want {
		t.Fatalf("counters\n got %+v\nwant %+v", c, want)
	}
}

// TestResolveStates: how each answer to a check is classified.
func TestResolveStates(t *testing.T) {
	errRPC := errors.New("rpc")
	tests := []struct {
		st   State
		err  error
		want string // "" = recheck scheduled
	}{
		{StateRunning, nil, "report rebooted running-at-window-end state=running"},
		{StateBlocked, nil, "report rebooted running-at-window-end state=blocked"},
		{StatePaused, nil, "report rebooted running-at-window-end state=paused"},
		{StatePMSuspended, nil, "report rebooted running-at-window-end state=pmsuspended"},
		{StateShutoff, nil, "report stopped off-at-window-end state=shutoff"},
		{StateCrashed, nil, "report stopped off-at-window-end state=crashed"},
		{StateGone, nil, "report stopped off-at-window-end state=gone"},
		{StateShutdown, nil, ""},
		{StateUnknown, nil, ""},
		{StateNoState, nil, ""},
		{State(99), nil, ""},
		{StateRunning, errRPC, ""},
		{StateShutoff, errRPC, ""},
	}
	for _, tc := range tests {
		t.Run(tc.st.String()+"/"+errString(tc.err), func(t *testing.T) {
			d, _ := New(DefaultConfig())
			d.AppendObserve(nil, Event{UUID: "u", Kind: KindStopped, Event: "STOPPED"}, t0)
			now := t0.Add(DefaultWindow)
			chk := d.AppendTick(nil, now)
			out := d.AppendResolve(nil, "u", chk[0].Check, tc.st, tc.err, now)
			if tc.want == "" {
				if len(out) != 0 || d.Pending() != 1 {
					t.Fatalf("want recheck, got %v pending=%d", out, d.Pending())
				}
				if dl, _ := d.NextDeadline(); !dl.Equal(now.Add(DefaultRecheckInterval)) {
					t.Fatalf("recheck at %v", dl)
				}
				return
			}
			if len(out) == 0 || !strings.HasPrefix(out[0].String(), tc.want+" ") {
				t.Fatalf("got %v, want %q", out, tc.want)
			}
			if d.Pending() != 0 {
				t.Fatalf("still pending")
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestAppendAPI: decisions are appended to dst, never overwriting it.
func TestAppendAPI(t *testing.T) {
	d, _ := New(DefaultConfig())
	dst := []Decision{{Op: OpReport, UUID: "keep"}}
	dst = d.AppendObserve(dst, Event{UUID: "a", Kind: KindStarted}, t0)
	if len(dst) != 2 || dst[0].UUID != "keep" || dst[1].UUID != "a" {
		t.Fatalf("%v", dst)
	}
}

// TestReusedSliceAPI: the non-append methods return a slice reused by the
// next call; copying it (as the agent loop does) keeps the decisions.
func TestReusedSliceAPI(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CheckTimeout = 0
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Config().CheckTimeout != DefaultCheckTimeout {
		t.Fatalf("CheckTimeout 0 not defaulted: %v", d.Config().CheckTimeout)
	}
	var ds []Decision
	ds = append(ds, d.Observe(Event{UUID: "a", Kind: KindStarted}, t0)...)
	ds = append(ds, d.Observe(Event{UUID: "b", Kind: KindStopped}, t0)...)
	ds = append(ds, d.Resync([]DomainSnapshot{{UUID: "a", State: StateRunning}, {UUID: "b", State: StateRunning}, {UUID: "c", State: StateShutoff}}, t0)...)
	now := t0.Add(DefaultWindow)
	chk := d.Tick(now)
	if len(chk) != 1 || chk[0].Op != OpCheckState || chk[0].UUID != "b" {
		t.Fatalf("tick %v", chk)
	}
	ds = append(ds, d.Resolve("b", chk[0].Check, StateRunning, nil, now)...)
	var got []string
	for _, dc := range ds {
		s, _, _ := strings.Cut(dc.String(), " cause=")
		got = append(got, dc.UUID+" "+s)
	}
	want := []string{"a report started event state=running", "c report defined resync state=shutoff", "b report rebooted running-at-window-end state=running"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	// Observe after Observe reuses the same backing array.
	a := d.Observe(Event{UUID: "a", Kind: KindSuspended}, now)
	b := d.Observe(Event{UUID: "a", Kind: KindResumed}, now)
	if &a[0] != &b[0] {
		t.Fatal("slice not reused")
	}
	// FlushReboots reports held bursts at once, in UUID order.
	d.Observe(Event{UUID: "c", Kind: KindReboot, Event: "REBOOT"}, now)
	d.Observe(Event{UUID: "a", Kind: KindReboot, Event: "REBOOT"}, now)
	d.Observe(Event{UUID: "a", Kind: KindReboot, Event: "REBOOT"}, now)
	if d.RebootsHeld() != 2 || d.Pending() != 0 {
		t.Fatalf("held %d pending %d", d.RebootsHeld(), d.Pending())
	}
	got = got[:0]
	for _, dc := range d.FlushReboots(now) {
		got = append(got, dc.UUID+" "+dc.String())
	}
	want = []string{"a report rebooted reboot-event state=running cause=REBOOT events=2", "c report rebooted reboot-event state=running cause=REBOOT events=1"}
	if strings.Join(got, "|") != strings.Join(want, "|") || d.RebootsHeld() != 0 {
		t.Fatalf("flush: got %q, %d held\nwant %q", got, d.RebootsHeld(), want)
	}
	if _, ok := d.NextDeadline(); ok {
		t.Fatal("a deadline left after the flush")
	}
}

func TestStringers(t *testing.T) {
	if OpReport.String() != "report" || OpCheckState.String() != "check" || Op(9).String() != "op(9)" {
		t.Fatal("Op.String")
	}
}
