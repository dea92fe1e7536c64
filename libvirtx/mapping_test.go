package libvirtx

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"hvguard/lifecycle"
)

func TestMapLifecycle(t *testing.T) {
	type want struct {
		kind          lifecycle.Kind
		event, detail string
	}
	// Every event and detail number of libvirt-domain.h (libvirt 11.x).
	tests := map[[2]int]want{
		{0, 0}: {lifecycle.KindDefined, "DEFINED", "ADDED"},
		{0, 1}: {lifecycle.KindDefined, "DEFINED", "UPDATED"},
		{0, 2}: {lifecycle.KindDefined, "DEFINED", "RENAMED"},
		{0, 3}: {lifecycle.KindDefined, "DEFINED", "FROM_SNAPSHOT"},
		{1, 0}: {lifecycle.KindUndefined, "UNDEFINED", "REMOVED"},
		{1, 1}: {lifecycle.KindUndefined, "UNDEFINED", "RENAMED"},
		{2, 0}: {lifecycle.KindStarted, "STARTED", "BOOTED"},
		{2, 1}: {lifecycle.KindStarted, "STARTED", "MIGRATED"},
		{2, 2}: {lifecycle.KindStarted, "STARTED", "RESTORED"},
		{2, 3}: {lifecycle.KindStarted, "STARTED", "FROM_SNAPSHOT"},
		{2, 4}: {lifecycle.KindStarted, "STARTED", "WAKEUP"},
		{2, 5}: {lifecycle.KindStarted, "STARTED", "RECREATED"},
		{3, 0}: {lifecycle.KindSuspended, "SUSPENDED", "PAUSED"},
		{3, 1}: {lifecycle.KindSuspended, "SUSPENDED", "MIGRATED"},
		{3, 2}: {lifecycle.KindSuspended, "SUSPENDED", "IOERROR"},
		{3, 3}: {lifecycle.KindSuspended, "SUSPENDED", "WATCHDOG"},
		{3, 4}: {lifecycle.KindSuspended, "SUSPENDED", "RESTORED"},
		{3, 5}: {lifecycle.KindSuspended, "SUSPENDED", "FROM_SNAPSHOT"},
		{3, 6}: {lifecycle.KindSuspended, "SUSPENDED", "API_ERROR"},
		{3, 7}: {lifecycle.KindSuspended, "SUSPENDED", "POSTCOPY"},
		{3, 8}: {lifecycle.KindSuspended, "SUSPENDED", "POSTCOPY_FAILED"},
		{3, 9}: {lifecycle.KindSuspended, "SUSPENDED", "GUEST_SHUTDOWN"},
		{4, 0}: {lifecycle.KindResumed, "RESUMED", "UNPAUSED"},
		{4, 1}: {lifecycle.KindResumed, "RESUMED", "MIGRATED"},
		{4, 2}: {lifecycle.KindResumed, "RESUMED", "FROM_SNAPSHOT"},
		{4, 3}: {lifecycle.KindResumed, "RESUMED", "POSTCOPY"},
		{4, 4}: {lifecycle.KindResumed, "RESUMED", "POSTCOPY_FAILED"},
		{5, 0}: {lifecycle.KindStopped, "STOPPED", "SHUTDOWN"},
		{5, 1}: {lifecycle.KindStopped, "STOPPED", "DESTROYED"},
		{5, 2}: {lifecycle.KindStopped, "STOPPED", "CRASHED"},
		{5, 3}: {lifecycle.KindStopped, "STOPPED", "MIGRATED"},
		{5, 4}: {lifecycle.KindStopped, "STOPPED", "SAVED"},
		{5, 5}: {lifecycle.KindStopped, "STOPPED", "FAILED"},
		{5, 6}: {lifecycle.KindStopped, "STOPPED", "FROM_SNAPSHOT"},
		{5, 7}: {lifecycle.KindStopped, "STOPPED", "RECREATED"},
		{6, 0}: {lifecycle.KindShutdown, "SHUTDOWN", "FINISHED"},
		{6, 1}: {lifecycle.KindShutdown, "SHUTDOWN", "GUEST"},
		{6, 2}: {lifecycle.KindShutdown, "SHUTDOWN", "HOST"},
		{7, 0}: {lifecycle.KindPMSuspended, "PMSUSPENDED", "MEMORY"},
		{7, 1}: {lifecycle.KindPMSuspended, "PMSUSPENDED", "DISK"},
		{8, 0}: {lifecycle.KindCrashed, "CRASHED", "PANICKED"},
		{8, 1}: {lifecycle.KindCrashed, "CRASHED", "CRASHLOADED"},
		// Unknown numbers: never a panic, names carry the number.
		{0, 4}:             {lifecycle.KindDefined, "DEFINED", "DETAIL_4"},
		{6, 3}:             {lifecycle.KindShutdown, "SHUTDOWN", "DETAIL_3"},
		{8, 2}:             {lifecycle.KindCrashed, "CRASHED", "DETAIL_2"},
		{5, -1}:            {lifecycle.KindStopped, "STOPPED", "DETAIL_-1"},
		{9, 0}:             {lifecycle.KindUnknown, "EVENT_9", "DETAIL_0"},
		{17, 9}:            {lifecycle.KindUnknown, "EVENT_17", "DETAIL_9"},
		{-1, 0}:            {lifecycle.KindUnknown, "EVENT_-1", "DETAIL_0"},
		{1 << 30, 1 << 30}: {lifecycle.KindUnknown, fmt.Sprintf("EVENT_%d", 1<<30), fmt.Sprintf("DETAIL_%d", 1<<30)},
	}
	for in, w := range tests {
		t.Run(fmt.Sprintf("%d/%d", in[0], in[1]), func(t *testing.T) {
			kind, event, detail := mapLifecycle(in[0], in[1])
			if kind != w.kind || event != w.event || detail != w.detail {
				t.Errorf("mapLifecycle(%d, %d) = %v %q %q, want %v %q %q", in[0], in[1], kind, event, detail, w.kind, w.event, w.detail)
			}
		})
	}
	// The table above covers every known detail of every known event.
	for ev, e := range lifecycleEvents {
		for d := range e.details {
			if _, ok := tests[[2]int{ev, d}]; !ok {
				t.Errorf("event %d detail %d (%s/%s) not covered by the table", ev, d, e.name, e.details[d])
			}
		}
	}
}

func TestMapState(t *testing.T) {
	want := []lifecycle.State{
		lifecycle.StateNoState, lifecycle.StateRunning, lifecycle.StateBlocked, lifecycle.StatePaused,
		lifecycle.StateShutdown, lifecycle.StateShutoff, lifecycle.StateCrashed, lifecycle.StatePMSuspended,
	}
	for n, w := range want {
		if got := mapState(n); got != w {
			t.Errorf("mapState(%d) = %v, want %v", n, got, w)
		}
	}
	for _, n := range []int{-1, 8, 99} {
		if got := mapState(n); got != lifecycle.StateUnknown {
			t.Errorf("mapState(%d) = %v, want unknown", n, got)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig("test:///default").Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // field=value must appear in the error
	}{
		{"empty uri", func(c *Config) { c.URI = "" }, `URI=""`},
		{"uri without scheme", func(c *Config) { c.URI = "localhost" }, `URI="localhost"`},
		{"keepalive zero", func(c *Config) { c.KeepAliveInterval = 0 }, "KeepAliveInterval=0s"},
		{"keepalive fraction", func(c *Config) { c.KeepAliveInterval = 1500 * time.Millisecond }, "KeepAliveInterval=1.5s"},
		{"keepalive count", func(c *Config) { c.KeepAliveCount = 0 }, "KeepAliveCount=0"},
		{"connect timeout", func(c *Config) { c.ConnectTimeout = -time.Second }, "ConnectTimeout=-1s"},
		{"reconnect min", func(c *Config) { c.ReconnectMin = 0 }, "ReconnectMin=0s"},
		{"reconnect max below min", func(c *Config) { c.ReconnectMax = 100 * time.Millisecond }, "ReconnectMax=100ms"},
		{"event buffer", func(c *Config) { c.EventBuffer = 0 }, "EventBuffer=0"},
		{"call timeout", func(c *Config) { c.CallTimeout = 0 }, "CallTimeout=0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig("test:///default")
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// All bad fields are reported at once.
	err := Config{}.Validate()
	for _, f := range []string{"URI", "KeepAliveInterval", "KeepAliveCount", "ConnectTimeout", "ReconnectMin", "EventBuffer", "CallTimeout"} {
		if err == nil || !strings.Contains(err.Error(), f+"=") {
			t.Errorf("Config{}.Validate() = %v, want it to name %s", err, f)
		}
	}
}

func TestBackoffDelay(t *testing.T) {
	lo := func(int64) int64 { return 0 }
	hi := func(n int64) int64 { return n - 1 }
	min, max := 500*time.Millisecond, 30*time.Second
	tests := []struct {
		attempt int
		lo, hi  time.Duration
	}{
		{0, 250 * time.Millisecond, 500 * time.Millisecond},
		{1, 500 * time.Millisecond, time.Second},
		{2, time.Second, 2 * time.Second},
		{5, 8 * time.Second, 16 * time.Second},
		{6, 15 * time.Second, 30 * time.Second},
		{100, 15 * time.Second, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := backoffDelay(tt.attempt, min, max, lo); got != tt.lo {
			t.Errorf("attempt %d low jitter: %v, want %v", tt.attempt, got, tt.lo)
		}
		if got := backoffDelay(tt.attempt, min, max, hi); got != tt.hi {
			t.Errorf("attempt %d high jitter: %v, want %v", tt.attempt, got, tt.hi)
		}
	}
}

func TestCloseReasonName(t *testing.T) {
	for r, want := range map[int]string{1: "end of file", 2: "keepalive", 7: "reason 7"} {
		if got := closeReasonName(r); !strings.Contains(got, want) {
			t.Errorf("closeReasonName(%d) = %q, want it to contain %q", r, got, want)
		}
	}
}

func TestTestDomainXMLEscapes(t *testing.T) {
	x := TestDomainXML(`a<b&"c'`, "00000000-0000-0000-0000-000000000001")
	if !strings.Contains(x, "<name>a&lt;b&amp;&quot;c&apos;</name>") {
		t.Errorf("name not escaped:\n%s", x)
	}
}
