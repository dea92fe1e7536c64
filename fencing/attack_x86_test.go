package fencing

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestX86LiarRelayedCorroboratedByHonestConflict (reviewer X86, (S)):
// relayReports is shared between relayed landings and the revisions
// conflicts show (adfb976), keyed by (seq, revision) only. h0 is cut off
// from NATS (or its own CAS keeps failing: compute-1 puts a value on h0's
// key once per round). compute-1 puts one unverifiable value on h0's key
// at revision R; an honest peer relays h0's renewal, its CAS conflicts,
// and it answers "relay failed: invalid record at R". The liar (compute-1)
// then answers "relayed at R". Both reports are (seq, R): two distinct
// peers > lying_peers 1, so the liar's relay is counted as a landing — h0
// counts a lease no controller saw. Round after round h0 never fences
// while the controller (seeing only compute-1's values: no renewal of
// h0) declares it and evacuates its running guests. With one liar and
// lying_peers 1 this must not happen. Without the liar (control), h0
// fences when its lease lapses; nor with Mutations.PeerRevisionTrusted
// (before adfb976: the honest conflict is not counted with landings).
func TestX86LiarRelayedCorroboratedByHonestConflict(t *testing.T) {
	// Fixed: two tallies (corroborated's kind). With Mutations.SharedTally
	// (one tally, adfb976) h0 never fences.
	for _, tc := range []struct{ liar, mut, shared bool }{{false, false, false}, {true, false, false}, {true, true, false}, {true, false, true}} {
		liar := tc.liar
		t.Run(fmt.Sprintf("liar=%t/PeerRevisionTrusted=%t/SharedTally=%t", liar, tc.mut, tc.shared), func(t *testing.T) {
			if tc.mut {
				Mutations.PeerRevisionTrusted = true
				t.Cleanup(func() { Mutations.PeerRevisionTrusted = false })
			}
			if tc.shared {
				Mutations.SharedTally = true
				t.Cleanup(func() { Mutations.SharedTally = false })
			}
			cfg := testConfig()
			cfg.LyingPeers = DefaultLyingPeers(SigningRequired)
			if cfg.LyingPeers != 1 {
				t.Fatalf("lying_peers %d", cfg.LyingPeers)
			}
			h := newHarness(t, cfg, 50, "d1")
			h.healthyFor(3 * time.Second)
			h.renew = nil
			cut := h.now
			R := h.rev + 10
			fenced := false
			var lastID uint64
			for h.now.Sub(cut) < 2*time.Minute && !fenced {
				h.advance(100 * time.Millisecond)
				h.renew = nil // its own writes never land (cut off, or compute-1's puts)
				if rd := h.round; rd != nil && rd.ID != lastID && len(rd.Peers) >= 2 {
					lastID = rd.ID
					R += 3 // compute-1's next put on h0's key
					honest, liarPeer := rd.Peers[0], rd.Peers[1]
					h.take(h.a.PeerAnswered(h.now, rd.ID, honest, PeerAnswer{Kind: PeerRelayFailed, Revision: R, Invalid: "unsigned record"}))
					if liar {
						h.take(h.a.PeerAnswered(h.now, rd.ID, liarPeer, PeerAnswer{Kind: PeerRelayed, Revision: R}))
					}
				}
				for _, l := range h.log {
					if strings.Contains(l, "Fencing") || strings.HasPrefix(l, "pause") || strings.HasPrefix(l, "destroy") {
						fenced = true
					}
				}
			}
			t.Logf("liar %t: fenced %t after %s, lease held %t, state %s", liar, fenced, h.now.Sub(cut), h.a.LeaseHeld(h.now), h.a.State())
			if tc.shared {
				if fenced {
					t.Error("SharedTally: h0 fenced — the test no longer shows the hole")
				}
				return
			}
			if !fenced {
				t.Errorf("h0: no renewal of it landed for %s (the controller declares it after lease_ttl + grace), yet it never fenced: the liar's \"relayed at R\" was corroborated by an honest peer's \"invalid record at R\"", h.now.Sub(cut))
			}
		})
	}
}

// TestX86IncarnationFloorAfterStateLoss: compute-3's agent restarts within
// its boot with its durable state lost while its key shows none of its
// records (deleted: reviewer X68's case). Without a floor it takes
// incarnation 1 again — the earlier process's, its seqs restarting, so
// its records are not newer than that process's and a controller refuses
// them after its withdrawal (controller
// TestX86StateLostAfterWithdrawalNeverDeclared). With a floor (the
// shell's Config.IncarnationFloor: the clock at start, in ms) the
// restarted process takes a higher one. Mutations.IncarnationFloorIgnored: reused.
func TestX86IncarnationFloorAfterStateLoss(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("IncarnationFloorIgnored=%t", mut), func(t *testing.T) {
			if mut {
				Mutations.IncarnationFloorIgnored = true
				t.Cleanup(func() { Mutations.IncarnationFloorIgnored = false })
			}
			cfg := testConfig()
			cfg.IncarnationFloor = 61_000 // a minute into the boot
			first, _, err := NewAgent(cfg, nil, nil, 0, t0)
			if err != nil {
				t.Fatal(err)
			}
			cfg.IncarnationFloor = 3_600_000 // restarted an hour later, state lost, key deleted
			second, _, err := NewAgent(cfg, nil, nil, 0, t0.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("incarnations: first %d, after the state loss %d", first.incarnation, second.incarnation)
			if reused := second.incarnation <= first.incarnation; reused != mut {
				t.Errorf("incarnation after the state loss %d, the earlier process's %d: reused %t, want %t", second.incarnation, first.incarnation, reused, mut)
			}
		})
	}
}
