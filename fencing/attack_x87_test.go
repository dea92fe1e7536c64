package fencing

import (
	"fmt"
	"testing"
	"time"
)

// TestX87PutBackRecordReusesIncarnation (reviewer X87, (c), conditional on
// an agent restart with its durable state lost — X86's condition): the
// incarnation floor (boot clock in ms) does not stop reuse once the
// incarnations run above the boot clock, which they do after any reboot:
// the state_dir copy carries the previous boot's incarnation (30 days of
// uptime: ~2.6e9) into the new boot, and its processes then take
// consecutive incarnations N, N+1, ... (the floor is far below). P0 (N)
// renews; P1 (N+1, an agent upgrade) stops in order (its withdrawal,
// trusted). P1's successor P2 starts with its durable state lost; just
// before, compute-1 puts back a genuine active record of P0 (incarnation
// N) it saw earlier on the key. NewAgent takes "the newest of this boot's
// records in the key" as max(…, cur.Incarnation) + 1 = N+1 — P1's: seqs
// from 1, same epoch — and the controller's heldBack refuses every record
// of it as not newer than P1's withdrawal (controller
// TestX87PutBackReusedIncarnationNeverDeclared): the dead host is never
// declared.
//
// Fixed: the shell's floor is the wall clock in milliseconds (later than
// any earlier process's start). "boot-clock" floors (X86's fix) and
// Mutations.IncarnationFloorIgnored show the reuse.
func TestX87PutBackRecordReusesIncarnation(t *testing.T) {
	const wall0 = 1_764_000_000_000 // the wall clock in ms, a minute into boot-2
	for _, tc := range []struct {
		name            string
		f0, f1, f2      uint64
		ignored, reused bool
	}{
		{"wall-clock", wall0, wall0 + 540_000, wall0 + 3_540_000, false, false},
		{"boot-clock", 60_000, 600_000, 3_600_000, false, true},
		{"wall-clock/IncarnationFloorIgnored", wall0, wall0 + 540_000, wall0 + 3_540_000, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ignored {
				Mutations.IncarnationFloorIgnored = true
				t.Cleanup(func() { Mutations.IncarnationFloorIgnored = false })
			}
			p0, p1, p2 := x87Starts(t, tc.f0, tc.f1, tc.f2)
			t.Logf("incarnations: P0 %d, P1 %d (withdrew), P2 %d (state lost, P0's record put back)", p0, p1, p2)
			if reused := p2 <= p1; reused != tc.reused {
				t.Errorf("P2 took incarnation %d, P1's was %d: reused %t, want %t (a reused one restarts its seqs: a controller refuses them as held back after P1's withdrawal)", p2, p1, reused, tc.reused)
			}
		})
	}
}

// x87Starts: P0 starts in boot-2 with the previous boot's durable state
// (30 days up), P1 after it with state intact, P2 with its state lost and
// P0's record put back in the key; each with its incarnation floor. It
// returns their incarnations.
func x87Starts(t *testing.T, f0, f1, f2 uint64) (uint64, uint64, uint64) {
	cfg := testConfig()
	cfg.BootID = "boot-2"
	prev := &Durable{Host: cfg.Host, BootID: "boot-1", Incarnation: 2_592_000_000}
	cfg.IncarnationFloor = f0
	p0, _, err := NewAgent(cfg, prev, nil, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.IncarnationFloor = f1
	p1, _, err := NewAgent(cfg, &Durable{Host: cfg.Host, BootID: cfg.BootID, Incarnation: p0.incarnation}, nil, 0, t0.Add(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	put := &LeaseRecord{Host: cfg.Host, BootID: cfg.BootID, Incarnation: p0.incarnation, Seq: 40, State: LeaseActive,
		Signer: cfg.Host, Sig: "genuine", PrevRev: 480, Timing: cfg.Timing}
	cfg.IncarnationFloor = f2
	p2, _, err := NewAgent(cfg, nil, put, 530, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return p0.incarnation, p1.incarnation, p2.incarnation
}

// TestX87LiarKeyAbsentNeedsCorroboration (reviewer X87's side note): one
// peer's "key absent" reset the cut-off asker's revision to 0 at once, so
// its next relayed renewal was a create sealed for 0 (the legacy kind the
// controller can verify only through beacons) that the liar could hold.
// Now "key absent" is a revision claim like "invalid record at R": acted
// on once more than lying_peers peers report it. With
// Mutations.PeerRevisionTrusted one liar suffices.
func TestX87LiarKeyAbsentNeedsCorroboration(t *testing.T) {
	for _, tc := range []struct {
		reports int
		mut     bool
		reset   bool
	}{{1, false, false}, {2, false, true}, {1, true, true}} {
		t.Run(fmt.Sprintf("reports=%d/PeerRevisionTrusted=%t", tc.reports, tc.mut), func(t *testing.T) {
			if tc.mut {
				Mutations.PeerRevisionTrusted = true
				t.Cleanup(func() { Mutations.PeerRevisionTrusted = false })
			}
			h := x85CutOff(t)
			rd := h.round
			if rd == nil || len(rd.Peers) < tc.reports {
				t.Fatalf("want a round asking %d peers: %+v", tc.reports, rd)
			}
			for _, p := range rd.Peers[:tc.reports] {
				// Naming a marker (reviewer X92: "key absent" naming no
				// marker, revision 0, is not acted on with lying_peers ≥ 1).
				h.take(h.a.PeerAnswered(h.now, rd.ID, p, PeerAnswer{Kind: PeerRelayFailed, Revision: h.rev + 1, KeyAbsent: true}))
			}
			for h.round.ID == rd.ID && h.now.Sub(t0) < time.Minute {
				h.advance(100 * time.Millisecond)
			}
			got := h.round.Renewal
			t.Logf("next round: renewal seq %d sealed for revision %d (key's last %d)", got.Seq, got.Revision, h.rev)
			if reset := got.Revision != h.rev; reset != tc.reset {
				t.Errorf("after %d \"key absent\" report(s): next relayed renewal sealed for revision %d: acted on %t, want %t", tc.reports, got.Revision, reset, tc.reset)
			}
		})
	}
}
