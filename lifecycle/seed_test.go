package lifecycle

import (
	"testing"
	"time"
)

// A restart: the old debouncer's beliefs seed a new one; the first resync
// reports only what changed while nobody watched, and a domain that stopped
// meanwhile goes through the window and the real-state check.
func TestSeedThenResyncReportsOnlyChanges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	old, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	old.Resync([]DomainSnapshot{
		{UUID: "a", Name: "run-stays", State: StateRunning},
		{UUID: "b", Name: "run-stops", State: StateRunning},
		{UUID: "c", Name: "off-starts", State: StateShutoff},
		{UUID: "d", Name: "vanishes", State: StateRunning},
	}, t0)
	// A stop of "b" was pending when the agent died: not yet reported.
	old.Observe(Event{UUID: "b", Name: "run-stops", Kind: KindStopped, Event: "STOPPED", Detail: "DESTROYED"}, t0)
	known := old.Known()
	if len(known) != 4 || known[1].UUID != "b" || known[1].State != StateRunning {
		t.Fatalf("Known = %+v, want 4 rows with b still running (its stop was never reported)", known)
	}

	d, _ := New(DefaultConfig())
	if err := d.Seed(known); err != nil {
		t.Fatal(err)
	}
	if err := d.Seed(known); err == nil {
		t.Fatal("second Seed accepted")
	}
	t1 := t0.Add(time.Minute)
	ds := append([]Decision(nil), d.Resync([]DomainSnapshot{
		{UUID: "a", Name: "run-stays", State: StateRunning},
		{UUID: "b", Name: "run-stops", State: StateShutoff},
		{UUID: "c", Name: "off-starts", State: StateRunning},
		{UUID: "e", Name: "new", State: StateRunning},
	}, t1)...)
	got := map[string]string{}
	for _, x := range ds {
		got[x.UUID] += x.Op.String() + ":" + string(x.Transition) + " "
	}
	want := map[string]string{
		"c": "report:started ",
		"e": "report:defined ",
		"d": "report:undefined ",
	}
	for u, w := range want {
		if got[u] != w {
			t.Errorf("domain %s: decisions %q, want %q", u, got[u], w)
		}
	}
	if got["a"] != "" || got["b"] != "" {
		t.Errorf("unchanged a or still-in-window b reported: a=%q b=%q", got["a"], got["b"])
	}
	// b: the stop window runs, the check finds it off, it is reported once.
	ds = append(ds[:0], d.Tick(t1.Add(DefaultWindow))...)
	if len(ds) != 1 || ds[0].Op != OpCheckState || ds[0].UUID != "b" {
		t.Fatalf("Tick = %v, want one check of b", ds)
	}
	ds = append(ds[:0], d.Resolve("b", ds[0].Check, StateShutoff, nil, t1.Add(DefaultWindow))...)
	if len(ds) != 1 || ds[0].Transition != TransitionStopped {
		t.Fatalf("Resolve = %v, want b stopped", ds)
	}
}
