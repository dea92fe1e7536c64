package controller_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestHiddenWithdrawalMissingBeaconNATS (S), through a Runner on a real
// nats-server with the shipped permissions (signed records, beacons):
// compute-3 withdraws in order (its guests run on) while the
// controller's watch connection is cut (its watch restarts past the
// withdrawal, which compute-1 — compromised — overwrote with garbage
// meanwhile: a watch skip), and its withdrawal beacon is lost on the way
// (not published here: a route dropping it). The controller's beacon
// connection stays up: its loss counters see nothing. The same loss took
// the beacon of compute-2's renewal. The runner's BeaconsMissing finds
// compute-2's beacon missing BeaconExpectWindow after the watch
// delivered that renewal and refuses compute-3 (OnBeaconsLost names both);
// compute-3, due ~3 s after its last renewal at ×0.1 timing, is held by
// HiddenWriteWait meanwhile and never declared.
//
// "companion-hidden" (reviewer X28's hole): compute-1 overwrites
// compute-2's beacon-less renewal too, before the watch delivers it, so
// no record expects a beacon; compute-2's next beacon names the lost one
// as its Prev (the chain, Tracker.BeaconChain): compute-3 is refused.
func TestHiddenWithdrawalMissingBeaconNATS(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		hidden, noPrev bool
	}{
		// Agents from before Beacon.Prev: only the missing beacon of the
		// delivered renewal tells (BeaconsMissing).
		{"companion-delivered/no-prev", false, true},
		{"companion-delivered", false, false},
		{"companion-hidden", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			hiddenWithdrawalMissingBeaconNATS(t, false, c.hidden, c.noPrev)
		})
	}
}

// TestHiddenWithdrawalMissingBeaconMutationNATS: with beaconMissMutation
// and beaconChainMutation the same run declares compute-3 (the hole the
// test shows).
func TestHiddenWithdrawalMissingBeaconMutationNATS(t *testing.T) {
	defer controller.SetBeaconMissMutation(true)()
	defer controller.SetBeaconChainMutation(true)()
	hiddenWithdrawalMissingBeaconNATS(t, true, true, false)
}

func hiddenWithdrawalMissingBeaconNATS(t *testing.T, mutation, companionHidden, noPrev bool) {
	const (
		attacker  = "compute-1.example.org"
		companion = "compute-2.example.org"
		withdrawn = "compute-3.example.org"
	)
	srvURL := natspermtest.StartServer(t)
	hosts := []string{attacker, companion, withdrawn}
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The simulated agents: a signed renewal every 200 ms, each followed
	// by its beacon unless lose says otherwise.
	var mu sync.Mutex
	sims := natsSims(t, srvURL, f, hosts)
	renew := func(h string, st fencing.LeaseState, beacon bool) uint64 {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.State, rec.Seq = st, s.seq
		res := s.renewRec(ctx, rec)
		if res.Outcome != fencing.RenewAcked {
			if ctx.Err() == nil {
				// Not the test ending (its context cancelled while the
				// background loop renewed: a failed renewal then is no
				// finding — it failed CI once so).
				t.Errorf("%s: renewal %s: %+v", h, st, res)
			}
			return 0
		}
		s.rev = res.Revision
		if beacon {
			prev := s.prev
			if noPrev {
				prev = 0
			}
			m, err := natslease.BeaconMsg(f.signers[h], rec, res.Revision, prev, time.Now())
			if err != nil {
				t.Error(err)
				return 0
			}
			if err := s.nc.PublishMsg(m); err != nil {
				t.Error(err)
			}
		}
		// Published, or lost on the way (a route dropped it): the next
		// beacon names it either way.
		s.prev = res.Revision
		return res.Revision
	}
	renewEvery(ctx, &mu, hosts, sims, func(h string) { renew(h, fencing.LeaseActive, true) })

	// The controller: its watch through the proxy, its beacons direct.
	cst, wnc, bnc, proxy := proxiedController(t, srvURL, f)
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cmu sync.Mutex
	var declared time.Time
	var lost []string
	refused := map[string]bool{} // named by OnBeaconsLost, or refused-due
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc,
		Receipts: receiptsOf(ctx, t, &natslease.Store{NC: bnc, Keys: cst.Keys}), // provisioned
		OnBeaconsLost: func(why string, notDeclared []string) {
			cmu.Lock()
			defer cmu.Unlock()
			lost = append(lost, why)
			for _, h := range notDeclared {
				refused[h] = true
			}
		},
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if d.Op == controller.OpDeclare && err == nil && d.Host == withdrawn && declared.IsZero() {
				declared = time.Now()
			}
			if d.Op == controller.OpDeclare && d.Host != withdrawn {
				t.Errorf("declared the live %s", d.Host)
			}
			if d.Op == controller.OpRefusedDue {
				refused[d.Host] = true
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing, beacons binding every host

	// The watch connection cut; meanwhile compute-3 withdraws (its beacon
	// lost) and compute-1 overwrites the withdrawal.
	mu.Lock()
	proxy.Reset()
	sims[withdrawn].stop = true
	withdrawnAt := time.Now()
	wrev := renew(withdrawn, fencing.LeaseWithdrawn, false)
	tok := strings.ReplaceAll(withdrawn, ".", "_")
	grev, err := sims[attacker].st.KV.Put(ctx, tok, []byte("not a record"))
	if err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	if companionHidden {
		// compute-2's renewal, its beacon lost with compute-3's, and
		// compute-1's garbage over it: the watch never delivers it.
		renew(companion, fencing.LeaseActive, false)
		g2, err := sims[attacker].st.KV.Put(ctx, strings.ReplaceAll(companion, ".", "_"), []byte("not a record"))
		if err != nil {
			mu.Unlock()
			t.Fatal(err)
		}
		// compute-2's agent renews over the garbage (as after a CAS
		// conflict).
		sims[companion].rev = g2
	}
	mu.Unlock()
	t.Logf("withdrawal at revision %d, garbage at %d", wrev, grev)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if wnc.IsConnected() && wnc.Stats().Reconnects > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the controller's watch connection not back within 10 s")
		}
	}
	time.Sleep(500 * time.Millisecond) // the watch past the withdrawal
	if !companionHidden {
		// compute-2's next renewal's beacon is lost too (the same route).
		mu.Lock()
		renew(companion, fencing.LeaseActive, false)
		mu.Unlock()
	}

	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		done := refused[withdrawn] || !declared.IsZero()
		cmu.Unlock()
		if done {
			break
		}
	}
	time.Sleep(time.Second)
	// Another host's missing beacon (the attacker's own renewals, renewing
	// every 200 ms beside the cut) may refuse the withdrawn host first:
	// give the companion's missing beacon its window too.
	for deadline := time.Now().Add(controller.BeaconExpectWindow + 2*time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		named := slices.ContainsFunc(lost, func(s string) bool { return strings.Contains(s, companion) })
		cmu.Unlock()
		if named || mutation {
			break
		}
	}
	cmu.Lock()
	defer cmu.Unlock()
	switch {
	case mutation && declared.IsZero():
		t.Fatalf("with beaconMissMutation %s was not declared: the test shows nothing; losses said: %q", withdrawn, lost)
	case mutation:
		t.Logf("with beaconMissMutation: %s declared %s after its withdrawal", withdrawn, declared.Sub(withdrawnAt).Round(10*time.Millisecond))
	case !declared.IsZero():
		t.Fatalf("the withdrawn %s (withdrawal hidden, beacon lost on a route) declared %s after its withdrawal; losses said: %q", withdrawn, declared.Sub(withdrawnAt).Round(10*time.Millisecond), lost)
	case !refused[withdrawn]:
		t.Fatalf("%s neither declared nor refused within 20 s: losses said %q", withdrawn, lost)
	case !slices.ContainsFunc(lost, func(s string) bool { return strings.Contains(s, companion) }):
		t.Fatalf("no loss named %s: %q", companion, lost)
	case noPrev && !slices.ContainsFunc(lost, func(s string) bool { return strings.Contains(s, "no beacon came") }):
		t.Fatalf("beacons without Prev: no missing beacon said: %q", lost)
	default:
		t.Logf("refused %s; losses said: %q", withdrawn, lost)
	}
}
