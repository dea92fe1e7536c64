package lifecycle

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

type rapidChooser struct{ t *rapid.T }

func (c rapidChooser) intn(label string, n int) int {
	return rapid.IntRange(0, n-1).Draw(c.t, label)
}

func runSim(t *rapid.T, lossy bool) *sim {
	cfg := DefaultConfig()
	cfg.Window = rapid.SampledFrom([]time.Duration{time.Second, 5 * time.Second, DefaultWindow}).Draw(t, "window")
	s, err := newSim(rapidChooser{t}, cfg, rapid.IntRange(1, 4).Draw(t, "domains"), lossy)
	if err != nil {
		t.Fatal(err)
	}
	steps := rapid.IntRange(1, 150).Draw(t, "steps")
	for range steps {
		s.step()
		if len(s.errs) > 0 {
			t.Fatalf("%v", s.errs)
		}
	}
	s.settle()
	if len(s.errs) > 0 {
		t.Fatalf("%v", s.errs)
	}
	return s
}

// TestPropertyNoFalseStop: with truthful state checks and no lost events,
// for any interleaving of reboots, stops, starts, suspends, crashes,
// (un)defines and resyncs, and any delay of the start events (longer than
// the window included):
//   - a stop is reported only for a domain really off at report time
//     (in particular never for one whose check found it alive);
//   - a stop is reported at most once until the domain is reported alive
//     again, and reports per domain follow event order;
//   - after everything is delivered and settled, the reports match reality:
//     a domain off at window end was reported stopped (exactly once), a
//     domain alive is not believed stopped;
//   - Len and Pending stay bounded by the number of domains.
func TestPropertyNoFalseStop(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := runSim(t, false)
		if err := s.consistent(); err != nil {
			t.Fatalf("after settling: %v", err)
		}
		s.resync()
		s.settle()
		if err := s.consistent(); err != nil {
			t.Fatalf("after resync: %v", err)
		}
		if len(s.errs) > 0 {
			t.Fatalf("%v", s.errs)
		}
	})
}

// TestPropertyLossy: events may be lost (start events never delivered);
// checks may fail, be lost or answer after CheckTimeout. A stop is still
// never reported for a domain whose check answered alive, never reported
// twice, never held forever; and a resync restores agreement with reality.
func TestPropertyLossy(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := runSim(t, true)
		if s.d.Pending() != 0 {
			t.Fatalf("stop held forever: %d pending after settling", s.d.Pending())
		}
		s.resync()
		s.settle()
		if err := s.consistent(); err != nil {
			t.Fatalf("after resync: %v", err)
		}
		if len(s.errs) > 0 {
			t.Fatalf("%v", s.errs)
		}
		if got, want := s.d.Len(), liveDomains(s); got != want {
			t.Fatalf("Len %d after resync, %d domains exist", got, want)
		}
	})
}

func liveDomains(s *sim) int {
	n := 0
	for _, sd := range s.doms {
		if sd.real != StateGone {
			n++
		}
	}
	return n
}
