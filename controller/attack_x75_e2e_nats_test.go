package controller_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX75CopyLoopAcrossStartNATS ((c), reviewer X75): reviewer X65's
// delete loop across a controller start (x65DeleteLoopStartNATS: shipped
// permissions, the controller starting while the loop runs), where
// compute-1, besides deleting compute-3's key right after each of its
// writes, puts a COPY of that write back (a plain KV put of the bytes it
// read with a message get) and deletes it again; and floods its OWN
// beacon subject (validly signed by its own key, paced: no drop) so that
// the runner, verifying beacons one at a time on NATS's goroutine,
// handled compute-3's beacons after the copies. The copy, an unfresh
// value of compute-3's own, took the place of the kept create
// (keepUnfresh); the create's beacon vouched for nothing; compute-3
// died: never declared. Fixed: a later vouchable value waits beside the
// kept one (vouch.go, a candidate); the tracker tests
// (attack_x75_test.go) carry the mutation cases. Here: declared (within
// 20 s of its death), on a real nats-server with the shipped
// permissions, under the flood. (x75CopyLoopNATS with copy=false is the
// flood-only control.)
func TestX75CopyLoopAcrossStartNATS(t *testing.T) {
	x75CopyLoopNATS(t, x75Loop{copy: true})
}

// TestX75OrderlyRestartCopyLoopNATS ((c), reviewer X75): no controller
// restart: a running controller trusts compute-3; compute-3's agent
// restarts in order (an upgrade: its withdrawal, then a new incarnation);
// compute-1 deletes the withdrawal (the new process's first write is a
// create over the marker) and runs the loop of
// TestX75CopyLoopAcrossStartNATS (delete, copy, delete after each create;
// bursts on its own beacon subject). The new process was never trusted,
// the controller judged compute-3 by its withdrawal: dead, never
// declared. Fixed (see TestX75CopyLoopAcrossStartNATS): declared. (The
// sim stores no withdrawal receipt.)
func TestX75OrderlyRestartCopyLoopNATS(t *testing.T) {
	x75CopyLoopNATS(t, x75Loop{copy: true, restart: true})
}

// TestX75FloodPastLaterValuesNATS (reviewer X75's open (c), closed by
// the beacon verification budget, run.go): the loop of
// TestX75CopyLoopAcrossStartNATS without copies, where compute-1 puts
// x75Garbage values (more than maxLaterValues) into compute-3's key
// after each of its creates, while flooding its own beacon subject. The
// runner verified beacons one at a time in arrival order, so compute-3's
// beacon came after every garbage value: its create was dropped
// (maxLaterValues), never vouched, and the dead compute-3 never declared
// (beaconBudgetMutation). With the budget compute-1's flood is shed
// unverified, compute-3's beacon comes in milliseconds and vouches for
// its create: declared, and no loss window opens for the shedding.
func TestX75FloodPastLaterValuesNATS(t *testing.T) {
	t.Run("budget", func(t *testing.T) { x75CopyLoopNATS(t, x75Loop{garbage: x75Garbage, flood: x75Flood}) })
	t.Run("mutation", func(t *testing.T) {
		t.Cleanup(controller.SetBeaconBudgetMutation(true))
		t.Cleanup(controller.SetLaterCompactMutation(true))
		x75CopyLoopNATS(t, x75Loop{garbage: x75Garbage, flood: x75Flood, mutation: true})
	})
}

// x75Garbage: the values compute-1 puts after each create — past
// maxLaterValues.
const x75Garbage = controller.MaxLaterValues + 16

// x75Loop: what compute-1 does after each of compute-3's creates —
// delete it, and put a copy back (copy) and garbage values (garbage);
// restart: compute-3's agent restarts in order under a running
// controller; mutation: the case must fail (the victim not declared).
type x75Loop struct {
	copy, restart, mutation bool
	garbage                 int
	// flood: compute-1's beacons per burst (0: 4 000); junk: the burst
	// is of messages that do not decode as a beacon (reviewer X81).
	flood int
	junk  bool
}

func x75CopyLoopNATS(t *testing.T, o x75Loop) {
	// Legacy creates (sealed for 0, as before anchoring and as the
	// vouching still serves): an anchored create lands right after the
	// loop's marker and is verified by the watch's adjacency
	// (Tracker.adjacent) with no beacon, so these loops would no longer
	// reach the vouching they test (the mutation case declared).
	legacyCreates(t)
	copy, restart := o.copy, o.restart
	const attacker, companion, victim = loopAttacker, loopCompanion, loopVictim
	ctx, srvURL, hosts, f, sims, vkey := newLoopRig(t)
	var mu sync.Mutex
	creates, copies := 0, 0
	vinc := uint64(1)
	looping, flooding := false, false // under mu
	burst := 4000
	if o.flood > 0 {
		burst = o.flood
	}
	_, fnc := permStore(t, srvURL, "agent:"+attacker, f, attacker) // a second connection of compute-1's
	var flooded atomic.Int64
	renew := func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Seq = s.seq
		if h == victim {
			rec.Incarnation = vinc
		}
		res, created, m := loopRenew(ctx, s, f, rec)
		if res.Outcome != fencing.RenewAcked {
			return
		}
		if created && h == victim {
			creates++
		}
		if m != nil {
			if h == attacker && flooding {
				// compute-1's burst on its own beacon subject, right
				// before compute-3's write (it renews on a schedule
				// compute-1 reads off its key): copies of its own genuine
				// beacon (its renewals stay named: no loss window).
				fm := m
				if o.junk {
					fm = &nats.Msg{Subject: m.Subject, Data: x81Junk}
				}
				for range burst {
					_ = fnc.PublishMsg(fm)
				}
				flooded.Add(int64(burst))
			}
		}
		if h == victim && looping {
			a := sims[attacker].st.KV
			var val []byte
			if copy {
				if e, err := a.Get(ctx, vkey); err == nil {
					val = e.Value()
				}
			}
			if err := a.Delete(ctx, vkey); err != nil {
				t.Errorf("compute-1's delete: %v", err)
			}
			if val != nil {
				if _, err := a.Put(ctx, vkey, val); err == nil {
					copies++
				}
				_ = a.Delete(ctx, vkey)
			}
			for i := range o.garbage {
				_, _ = a.Put(ctx, vkey, fmt.Appendf(nil, "garbage %d", i))
			}
			if o.garbage > 0 {
				_ = a.Delete(ctx, vkey) // compute-3's next write is a create again
			}
			s.rev = 0
		}
	}
	renewEvery(ctx, &mu, hosts, sims, renew)
	if !restart {
		mu.Lock()
		looping, flooding = true, true
		mu.Unlock()
		time.Sleep(time.Second)
	}

	cst, bnc, cjs, tr := vouchingController(ctx, t, srvURL, f, victim)
	var cmu sync.Mutex
	var declared time.Time
	var losses []string
	var vouched, victimBeacons int
	var waits []string
	var started time.Time
	var maxDelay time.Duration
	var shed int
	said := map[string]string{} // the victim's decisions, the last reason of each
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: cjs,
		OnBeacon: func(host string, b fencing.Beacon, err error) {
			if errors.Is(err, controller.ErrBeaconShed) {
				cmu.Lock()
				shed++
				cmu.Unlock()
			}
			if host == victim && err == nil {
				cmu.Lock()
				victimBeacons++
				maxDelay = max(maxDelay, time.Since(b.At))
				cmu.Unlock()
			}
		},
		OnBeaconsLost: func(why string, _ []string) {
			cmu.Lock()
			losses = append(losses, why)
			cmu.Unlock()
		},
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if d.Host == victim && d.Op != controller.OpInvalid && d.Op != controller.OpLeaseDeleted {
				said[d.Op.String()] = d.Reason
			}
			switch {
			case d.Op == controller.OpVouched && d.Host == victim:
				vouched++
				t.Logf("vouched %s after the controller started: %s", time.Since(started).Round(time.Millisecond), d.Reason)
			case d.Host == victim && (d.Op == controller.OpRefusedDue || d.Op == controller.OpWithdrawn):
				if len(waits) < 3 {
					waits = append(waits, d.Op.String()+": "+d.Reason)
				}
			case d.Op == controller.OpDeclare && d.Host != victim:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare && err != nil:
				if len(waits) < 3 {
					waits = append(waits, err.Error())
				}
			case d.Op == controller.OpDeclare && declared.IsZero():
				declared = time.Now()
			}
		}}
	started = time.Now()
	go r.Run(ctx)
	if restart {
		time.Sleep(2 * time.Second) // the controller trusts every host
		mu.Lock()
		s := sims[victim]
		s.seq++
		w := controllertest.HostRecord(victim)
		w.Incarnation, w.Seq, w.State, w.Reason = vinc, s.seq, fencing.LeaseWithdrawn, "upgrade"
		res := s.st.Renew(ctx, fencing.RenewRequest{Seq: s.seq, Revision: s.rev, Record: w}, time.Second)
		if res.Outcome != fencing.RenewAcked {
			t.Fatalf("compute-3's withdrawal: %+v", res)
		}
		if m, err := natslease.BeaconMsg(f.signers[victim], w, res.Revision, 0, time.Now()); err == nil {
			_ = s.nc.PublishMsg(m)
		}
		if err := sims[attacker].st.KV.Delete(ctx, vkey); err != nil {
			t.Fatal(err)
		}
		vinc, s.seq, s.rev, s.prev = 2, 0, 0, 0 // the new process meets the marker
		looping, flooding = true, true
		mu.Unlock()
	}
	time.Sleep(4 * time.Second) // the loop runs on under the started controller

	mu.Lock()
	sims[victim].stop = true // power loss
	at := time.Now()
	n, c := creates, copies
	mu.Unlock()
	wait := 20 * time.Second
	switch {
	case o.mutation:
		// The hole is that no create was vouched (a host never trusted is
		// never declared); declared 3 s after its death with the budget.
		wait = 5 * time.Second
	case o.garbage > 0:
		// The garbage makes the watch skip (values superseded before it
		// reaches them): a dead host whose key was overwritten after a
		// skip waits HiddenWriteWait for a missing beacon's window.
		wait += controller.HiddenWriteWait
	}
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		done := !declared.IsZero()
		cmu.Unlock()
		if done {
			break
		}
	}
	cmu.Lock()
	defer cmu.Unlock()
	t.Logf("%+v: compute-3 created its key %d times, compute-1 put %d copies, flooded %d beacons (%d shed); compute-3's beacons handled %d (max delay %s); vouched %d; beacon-loss windows %d %q; declaration waits / refusals / withdrawn %q",
		o, n, c, flooded.Load(), shed, victimBeacons, maxDelay.Round(time.Millisecond), vouched, len(losses), losses, waits)
	switch {
	case o.mutation && (!declared.IsZero() || vouched > 0):
		t.Fatalf("mutation: the dead %s vouched %d times, declared %t: the case does not show the hole", victim, vouched, !declared.IsZero())
	case o.mutation:
		return
	case o.garbage > 0 && shed == 0 && !o.junk:
		t.Fatalf("none of compute-1's %d flooded beacons shed: the verification budget did not engage", flooded.Load())
	case o.garbage > 0 && slices.ContainsFunc(losses, func(why string) bool { return strings.Contains(why, attacker) }):
		// (The dead victim's own missing beacon for garbage after a skip
		// is a window by it, which does not count for it: by design.)
		t.Errorf("beacon-loss windows naming compute-1 %q: the runner's shedding must be counted against compute-1 alone", losses)
	case o.garbage > 0 && declared.IsZero() && slices.ContainsFunc(losses, func(why string) bool { return strings.Contains(why, "dropped") }):
		// A flood past what the loaded machine's connection reads (the
		// junk costs 55 µs a message, never charged): the subscription
		// dropped, and every host whose write may be hidden is refused —
		// the documented loud lever, not the vouching under test.
		t.Skipf("not declared: the flood overran the beacon subscription on this loaded machine (%d loss windows), the documented lever", len(losses))
	case o.garbage > 0 && declared.IsZero():
		t.Logf("%s's decisions: %q", victim, said)
		t.Fatalf("the dead %s not declared within %s of its death: %d values after each create, its beacons behind compute-1's flood (max delay %s)", victim, wait, o.garbage, maxDelay.Round(time.Millisecond))
	case declared.IsZero() && len(losses) > 0:
		// The flood on a loaded machine (CI's other shards, e2e beside
		// it) overran the beacon subscription: beacons were lost, and
		// beaconloss.go's fail-safe keeps every host whose write may be
		// hidden undeclared — X75's open (c), not this test's mechanism
		// (as x65DeleteLoopStartNATS skips).
		t.Skipf("not declared: beacons were lost under the flood on this loaded machine (%d loss windows), the documented open item, not the copies", len(losses))
	case !copy && declared.IsZero():
		t.Fatalf("control: the dead %s not declared within 20 s of its death with the flood alone", victim)
	case copy && declared.IsZero():
		t.Errorf("the dead %s not declared within 20 s of its death (declared 3 s after with the flood alone): a copy of each create, put back before its (flooded, delayed) beacon, kept it from being vouched", victim)
	default:
		t.Logf("declared %s after its death", declared.Sub(at).Round(10*time.Millisecond))
	}
}

// x75Flood: compute-1's beacons per burst in TestX75FloodPastLaterValuesNATS
// (env HVG_X75_FLOOD overrides, for measuring).
var x75Flood = func() int {
	if n, err := strconv.Atoi(os.Getenv("HVG_X75_FLOOD")); err == nil && n > 0 {
		return n
	}
	return 4000
}()
