package controller

import (
	"fmt"
	"testing"
	"time"
)

// TestWriteDeadlineWidensCompanionDelay: X33's slow companion on NATS
// servers whose routes and leaf nodes run write_deadline 20 s. The route
// carrying h3's and h5's beacons stalls at h3's withdrawal W for 18 s and
// is closed as a slow consumer, dropping W's beacon and h5's renewal R2,
// written 17 s after W (h5 renews every 20 s); a compromised node hides W
// with garbage. With the default Config.NATSWriteDeadline (10 s: the
// controller not told) companionsChecked waits for renewals written up to
// 12 s after W, finds R2's beacon missing too late and the withdrawn h3
// is declared; told (20 s), it waits 22 s and h3 is held.
func TestWriteDeadlineWidensCompanionDelay(t *testing.T) {
	for _, c := range []struct {
		name         string
		deadline     time.Duration
		wantDeclared bool
	}{
		{"servers-20s/controller-default-10s", 0, true},
		{"servers-20s/controller-told-20s", 20 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			const r2After = 17 * time.Second
			s := newX32Sim(t, func(time.Time) time.Duration { return 0 })
			if c.deadline != 0 {
				s.tr.cfg.NATSWriteDeadline = c.deadline
				if err := s.tr.cfg.Validate(); err != nil {
					t.Fatal(err)
				}
			}
			declared := x33SlowCompanion(t, s, 20*time.Second, 60*time.Second, r2After)
			s.verdict(declared, c.wantDeclared, "the withdrawal", fmt.Sprintf("h5 wrote the renewal lost with the withdrawal's beacon %s after it, within the servers' 20 s write_deadline: the controller was told %v", r2After, s.tr.companionDelay()-companionSlack))
		})
	}
}

// TestNATSWriteDeadlineValidated: the core refuses a write deadline
// outside [0, MaxNATSWriteDeadline], naming it.
func TestNATSWriteDeadlineValidated(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, MaxNATSWriteDeadline + time.Second} {
		c := DefaultConfig()
		c.NATSWriteDeadline = d
		if err := c.Validate(); err == nil {
			t.Errorf("NATSWriteDeadline %s accepted", d)
		}
	}
	c := DefaultConfig()
	if c.NATSWriteDeadline != DefaultNATSWriteDeadline || c.Validate() != nil {
		t.Fatalf("default %s: %v", c.NATSWriteDeadline, c.Validate())
	}
	tr, err := NewTracker(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.hiddenWriteWait(); got != HiddenWriteWait {
		t.Fatalf("hiddenWriteWait at the default deadline %s, HiddenWriteWait %s", got, HiddenWriteWait)
	}
}
