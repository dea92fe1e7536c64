package lifecycle

import (
	"errors"
	"testing"
	"time"
)

// byteChooser draws choices from fuzz input; exhausted input yields 0.
type byteChooser struct{ b []byte }

func (c *byteChooser) intn(_ string, n int) int {
	if len(c.b) == 0 || n <= 1 {
		return 0
	}
	v := int(c.b[0]) % n
	c.b = c.b[1:]
	return v
}

var fuzzUUIDs = [...]string{"a", "b", "c", "d"}

// FuzzDebouncer drives the Debouncer with arbitrary, physically
// meaningless event streams, answers, resyncs and clock moves. It checks
// what must hold for any input: no panic, internal invariants (doc.go),
// a stop reported at most once until the domain is reported alive again,
// reports in event order, Len/Pending bounded, OpCheckState tokens
// strictly increasing, nothing pending forever once time moves on, and
// every REBOOT counted in one report within the window (rebootLedger).
func FuzzDebouncer(f *testing.F) {
	f.Add([]byte{0, 6, 0, 1, 15, 2, 0, 2})
	f.Add([]byte{1, 6, 1, 2, 1, 0, 5, 1, 3, 0, 10})
	f.Add([]byte{0, 9, 0, 0, 2, 3, 1, 0, 4, 2, 0, 15, 4, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &byteChooser{b: data}
		cfg := DefaultConfig()
		cfg.MaxChecks = 3
		if c.intn("cfg", 2) == 1 {
			cfg.Window = 0
		}
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		bel := newBelief()
		rb := newRebootLedger(cfg.Window, false)
		now := t0
		var lastCheck uint64
		tokens := map[string]uint64{}
		var out []Decision
		handle := func(ds []Decision) {
			for _, dc := range ds {
				if err := bel.apply(dc); err != nil {
					t.Fatal(err)
				}
				if err := rb.apply(dc, now); err != nil {
					t.Fatal(err)
				}
				if dc.Op == OpCheckState {
					if dc.Check <= lastCheck {
						t.Fatalf("token %d not above %d", dc.Check, lastCheck)
					}
					lastCheck = dc.Check
					tokens[dc.UUID] = dc.Check
				}
			}
			if err := d.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			if d.Len() > len(fuzzUUIDs) || d.Pending() > d.Len() {
				t.Fatalf("Len %d Pending %d", d.Len(), d.Pending())
			}
			if _, ok := d.NextDeadline(); ok != (d.Pending()+d.RebootsHeld() > 0) {
				t.Fatalf("NextDeadline ok=%v with %d pending, %d reboot bursts held", ok, d.Pending(), d.RebootsHeld())
			}
		}
		for len(c.b) > 0 {
			u := fuzzUUIDs[c.intn("uuid", len(fuzzUUIDs))]
			switch c.intn("op", 4) {
			case 0, 1:
				k := Kind(c.intn("kind", int(KindReboot)+2))
				ev := Event{UUID: u, Kind: k, Event: k.String(), Detail: []string{"", "ADDED", "X", "Y"}[c.intn("detail", 4)], At: now}
				rb.observed(ev, now)
				handle(d.AppendObserve(out[:0], ev, now))
			case 2:
				now = now.Add(time.Duration(c.intn("dt", 64)) * 500 * time.Millisecond)
				handle(d.AppendTick(out[:0], now))
			case 3:
				switch c.intn("what", 3) {
				case 0, 1:
					tok := tokens[u]
					if c.intn("stale", 4) == 0 {
						tok--
					}
					var err error
					if c.intn("err", 4) == 0 {
						err = errors.New("fuzz")
					}
					handle(d.AppendResolve(out[:0], u, tok, State(c.intn("state", 11)), err, now))
				case 2:
					var snap []DomainSnapshot
					for _, v := range fuzzUUIDs {
						if c.intn("listed", 2) == 1 {
							snap = append(snap, DomainSnapshot{UUID: v, State: State(c.intn("state", 11))})
						}
					}
					rb.resynced()
					handle(d.AppendResync(out[:0], snap, now))
				}
			}
		}
		// Never held forever: driven by its timer alone (no answers), every
		// stop is reported by Window + MaxChecks*(CheckTimeout+RecheckInterval)
		// after it began.
		limit := now.Add(cfg.Window + time.Duration(cfg.MaxChecks)*(cfg.CheckTimeout+cfg.RecheckInterval))
		for {
			dl, ok := d.NextDeadline()
			if !ok {
				break
			}
			if dl.After(limit) {
				t.Fatalf("deadline %v beyond the bound %v", dl, limit)
			}
			if dl.After(now) {
				now = dl
			}
			handle(d.AppendTick(out[:0], now))
		}
		if err := rb.settled(); err != nil {
			t.Fatal(err)
		}
	})
}
