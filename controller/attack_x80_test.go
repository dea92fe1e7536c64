package controller_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestX80ReflectionSpendsVictimBudgetNATS (reviewer X80; at 43d42eb
// ~22 000 of the answers were shed as compute-3's, yet 8 of its ~30
// genuine beacons got a token and one vouched — the declaration held, the
// budget did not). The
// verification budget (run.go, beaconBudget) is keyed by the beacon
// subject's host, on the premise that "with the shipped permissions only
// that host publishes on its subject". Not so: an agent may still have
// the server publish a JetStream API answer (a message get of the lease
// stream) on ANY subject of the agents' account — reflection, reviewer
// X12, documented. compute-1 reflects message-get answers onto
// compute-3's beacon subject (never verified: shed before decoding), so
// compute-3's budget is spent and its genuine beacons are shed. The
// delete loop of TestX75FloodPastLaterValuesNATS (compute-1 deletes
// compute-3's key after each of its writes: each of compute-3's writes is
// a create that only its beacon can vouch for) with the controller
// started under it: the try — compute-3's creates never vouched, the dead
// compute-3 never declared (X75's open (c) with ~4 000 reflected answers
// a second in place of the own-subject flood). Control ("no-reflection"):
// declared within seconds. Fixed (run.go: a beacon is charged only once
// decoded as its subject host's; a message get's answer is JSON of
// another shape): none of the reflected answers is charged to compute-3
// ("reflection"); with chargeFirstMutation thousands are
// ("reflection/chargeFirstMutation").
func TestX80ReflectionSpendsVictimBudgetNATS(t *testing.T) {
	t.Run("reflection", func(t *testing.T) { x80ReflectLoopNATS(t, x80Loop{flood: true}) })
	t.Run("reflection/chargeFirstMutation", func(t *testing.T) {
		t.Cleanup(controller.SetChargeFirstMutation(true))
		x80ReflectLoopNATS(t, x80Loop{flood: true, mutation: true})
	})
}

// x80Loop: flood: compute-1 reflects answers onto compute-3's beacon
// subject all along (~4 000/s); burst: that many once, a second after the
// controller started; garbage: values compute-1 puts after each create.
type x80Loop struct {
	flood, mutation bool
	burst, garbage  int
}

func x80ReflectLoopNATS(t *testing.T, o x80Loop) {
	reflect := o.flood || o.burst > 0
	const attacker, victim = loopAttacker, loopVictim
	ctx, srvURL, hosts, f, sims, vkey := newLoopRig(t)
	var mu sync.Mutex
	looping := false
	renew := func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Seq = s.seq
		res, _, _ := loopRenew(ctx, s, f, rec)
		if res.Outcome != fencing.RenewAcked {
			return
		}
		if h == victim && looping {
			a := sims[attacker].st.KV
			if err := a.Delete(ctx, vkey); err != nil {
				t.Errorf("compute-1's delete: %v", err)
			}
			for i := range o.garbage {
				_, _ = a.Put(ctx, vkey, fmt.Appendf(nil, "garbage %d", i))
			}
			if o.garbage > 0 {
				_ = a.Delete(ctx, vkey)
			}
			s.rev = 0
		}
	}
	renewEvery(ctx, &mu, hosts, sims, renew)
	mu.Lock()
	looping = true
	mu.Unlock()

	var reflected atomic.Int64
	var reflectBurst func(n int)
	if reflect {
		// compute-1's reflection flood onto compute-3's beacon subject:
		// one value parked in a key it may write, then message gets of it
		// with compute-3's beacon subject as the reply (the server
		// publishes the answers there with its own rights).
		_, anc := permStore(t, srvURL, "agent:"+attacker, f, attacker)
		if _, err := sims[attacker].st.KV.Put(ctx, reflectKey, []byte("x80")); err != nil {
			t.Fatalf("compute-1's put: %v", err)
		}
		subj, err := proto.BeaconSubject(victim)
		if err != nil {
			t.Fatal(err)
		}
		msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
		body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
		reflectBurst = func(n int) {
			for range n {
				_ = anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body})
			}
			_ = anc.Flush()
			reflected.Add(int64(n))
		}
		if o.flood {
			go func() {
				for ctx.Err() == nil {
					reflectBurst(40)
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
	}
	time.Sleep(time.Second)

	cst, bnc, cjs, tr := vouchingController(ctx, t, srvURL, f, victim)
	var cmu sync.Mutex
	var declared time.Time
	var losses []string
	var vouched, victimBeacons, victimShed, victimRejected int
	said := map[string]string{}
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: cjs,
		OnBeacon: func(host string, b fencing.Beacon, err error) {
			if host != victim {
				return
			}
			cmu.Lock()
			defer cmu.Unlock()
			switch {
			case errors.Is(err, controller.ErrBeaconShed):
				victimShed++
			case err == nil:
				victimBeacons++
			default:
				victimRejected++
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
			case d.Op == controller.OpDeclare && d.Host != victim:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare && err == nil && declared.IsZero():
				declared = time.Now()
			}
		}}
	go r.Run(ctx)
	if o.burst > 0 {
		time.Sleep(time.Second)
		reflectBurst(o.burst) // once
		time.Sleep(3 * time.Second)
	} else {
		time.Sleep(4 * time.Second) // the loop runs on under the started controller
	}

	mu.Lock()
	sims[victim].stop = true // power loss
	at := time.Now()
	mu.Unlock()
	wait := 20*time.Second + controller.HiddenWriteWait
	if o.mutation {
		wait = 0 // the charge is the hole shown
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
	t.Logf("%+v: reflected %d answers onto %s's beacon subject; its beacons: verified %d, shed %d, rejected %d; vouched %d; loss windows %d %q; decisions %q",
		o, reflected.Load(), victim, victimBeacons, victimShed, victimRejected, vouched, len(losses), losses, said)
	switch {
	case o.mutation && victimShed == 0:
		t.Fatalf("chargeFirstMutation: none of the %d reflected answers charged to %s: the case does not show the hole", reflected.Load(), victim)
	case o.mutation:
		return
	case reflect && victimShed > 0:
		t.Errorf("%d of compute-1's reflected answers charged to %s's verification budget (shed as its beacons)", victimShed, victim)
	}
	if declared.IsZero() {
		t.Fatalf("the dead %s not declared within %s of its death (%+v): compute-1 spent its beacon verification budget by reflection (%d messages on its subject shed)", victim, wait, o, victimShed)
	}
	t.Logf("declared %s after its death", declared.Sub(at).Round(10*time.Millisecond))
}

// TestX80ReflectedBurstThenHiddenWriteNATS ((c), reviewer X80): no loop,
// no flood. Three hosts renewing (signed, chained beacons), the controller
// running (its watch through a proxy, beacons direct). compute-1 reflects
// ONE burst of 1 000 message-get answers onto compute-3's beacon subject
// (shipped permissions allow it: reflection); the runner sheds ~800 of
// them against compute-3's budget (Tracker.BeaconsShed: a shed window for
// compute-3, open, never closed). Seconds later compute-3 dies; compute-1
// overwrites its key twice while the controller's watch is cut (a watch
// skip: compute-3's last value a hidden write). The control ("no-burst")
// declares the dead compute-3 within HiddenWriteWait (its own missing
// beacon's window does not count for it: lossWindow.by); after the burst,
// compute-3's own shed window covers its hidden write for ever: refused-
// due, never declared. The shed window is the "shedding host's own (c)"
// of the change — but compute-1, not compute-3, did the shedding.
//
// Fixed (the answers are not charged): declared. With chargeFirstMutation
// it fails (checked by hand, 2026-12-05; not a subtest: it waits 32 s).
func TestX80ReflectedBurstThenHiddenWriteNATS(t *testing.T) {
	x80BurstHiddenNATS(t, 1000)
}

func x80BurstHiddenNATS(t *testing.T, burst int) {
	const attacker, victim = loopAttacker, loopVictim
	ctx, srvURL, hosts, f, sims, vkey := newLoopRig(t)
	var mu sync.Mutex
	renewEvery(ctx, &mu, hosts, sims, func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Seq = s.seq
		loopRenew(ctx, s, f, rec)
	})
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
	said := map[string]string{}
	var victimShed, victimOK int
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc,
		Receipts: receiptsOf(ctx, t, &natslease.Store{NC: bnc, Keys: cst.Keys}),
		OnBeacon: func(host string, b fencing.Beacon, err error) {
			if host != victim {
				return
			}
			cmu.Lock()
			defer cmu.Unlock()
			if errors.Is(err, controller.ErrBeaconShed) {
				victimShed++
			} else if err == nil {
				victimOK++
			}
		},
		OnBeaconsLost: func(why string, _ []string) {
			cmu.Lock()
			lost = append(lost, why)
			cmu.Unlock()
		},
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if d.Host == victim && d.Op != controller.OpInvalid {
				said[d.Op.String()] = d.Reason
			}
			if d.Op == controller.OpDeclare && d.Host != victim {
				t.Errorf("declared the live %s", d.Host)
			}
			if d.Op == controller.OpDeclare && err == nil && d.Host == victim && declared.IsZero() {
				declared = time.Now()
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing, beacons binding every host
	if burst > 0 {
		_, anc := permStore(t, srvURL, "agent:"+attacker, f, attacker)
		if _, err := sims[attacker].st.KV.Put(ctx, reflectKey, []byte("x80")); err != nil {
			t.Fatal(err)
		}
		subj, _ := proto.BeaconSubject(victim)
		msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
		body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
		for range burst {
			_ = anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body})
		}
		_ = anc.Flush()
	}
	time.Sleep(3 * time.Second) // compute-3's budget refilled; it renews, vouched by its beacons

	mu.Lock()
	sims[victim].stop = true // power loss
	died := time.Now()
	proxy.Reset() // the watch cut: compute-1's two writes, the first superseded
	for i := range 2 {
		if _, err := sims[attacker].st.KV.Put(ctx, vkey, fmt.Appendf(nil, "not a record %d", i)); err != nil {
			mu.Unlock()
			t.Fatal(err)
		}
	}
	mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); !(wnc.IsConnected() && wnc.Stats().Reconnects > 0); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the controller's watch connection not back within 10 s")
		}
	}
	wait := 10*time.Second + controller.HiddenWriteWait
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
	t.Logf("burst %d: %s's subject: %d shed, %d verified; losses %q; %s's decisions %q", burst, victim, victimShed, victimOK, lost, victim, said)
	if declared.IsZero() {
		t.Fatalf("the dead %s not declared within %s of its death: one burst of %d reflected answers onto its beacon subject, by compute-1, seconds before, gave it an open shed window that refuses its hidden write for ever", victim, wait, burst)
	}
	t.Logf("declared %s after its death", declared.Sub(died).Round(10*time.Millisecond))
}

// TestX80ReflectionHidesCompanionLossNATS ((S), reviewer X80): the rig
// of TestHiddenWithdrawalMissingBeaconNATS — compute-3 withdraws while
// the controller's watch is cut, compute-1 overwrites the withdrawal
// (hidden), compute-3's withdrawal beacon and compute-2's renewal's
// beacon are lost on a route — where compute-1 ALSO reflects one burst of
// message-get answers onto compute-2's beacon subject right after
// compute-2's lost beacon. The runner sheds them against compute-2's
// budget, so compute-2's next beacon carries afterShed: its chain gap is
// taken as the runner's own doing (BeaconChainShed: no window, chain
// restarted), and its missing beacon is "explained" by the shedding
// (shedExplains): no loss window at all. compute-3's hidden withdrawal is
// covered by nothing: the withdrawn host (guests running) is declared.
// (The sim stores no withdrawal receipt, as the rig it copies; with a
// receipt stored the receipts check holds it — this removes the beacon
// layer that covers a withdrawal whose receipt was not stored.)
// Fixed (the answers are not charged to compute-2): refused, as without
// the burst. With chargeFirstMutation it fails (checked by hand,
// 2026-12-05). The reviewer's held variants (compute-2's renewal hidden
// too; the controls without a burst) are not kept: they assert what
// TestHiddenWithdrawalMissingBeaconNATS does.
func TestX80ReflectionHidesCompanionLossNATS(t *testing.T) {
	for _, c := range []struct {
		name   string
		hidden bool
		burst  int
	}{
		{"companion-delivered/burst", false, 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			x80HiddenWithdrawalNATS(t, c.hidden, c.burst)
		})
	}
}

// natsSimConn: a second connection of host's agent user.
func natsSimConn(t *testing.T, srvURL string, f fleet, host string) (*natslease.Store, *nats.Conn) {
	return permStore(t, srvURL, "agent:"+host, f, host)
}

func x80HiddenWithdrawalNATS(t *testing.T, companionHidden bool, burst int) {
	const mutation, noPrev = false, false
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
	// compute-1's reflection onto compute-2's beacon subject (X80).
	_, anc := natsSimConn(t, srvURL, f, attacker)
	if _, err := sims[attacker].st.KV.Put(ctx, reflectKey, []byte("x80")); err != nil {
		t.Fatal(err)
	}
	reflectOnto := func(host string) {
		if burst == 0 {
			return
		}
		subj, _ := proto.BeaconSubject(host)
		msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
		body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
		for range burst {
			_ = anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body})
		}
		_ = anc.Flush()
	}

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
	var shedAt []time.Time
	var lostAt, withdrawnAt time.Time
	said3 := map[string]string{}
	defer func() {
		cmu.Lock()
		defer cmu.Unlock()
		t.Logf("compute-3's decisions: %q", said3)
	}()
	var compAt []string
	defer func() {
		cmu.Lock()
		defer cmu.Unlock()
		if len(shedAt) > 0 {
			t.Logf("burst %d: %d shed, first %s last %s; compute-2's verified beacons %q", burst, len(shedAt), shedAt[0].Format("05.000"), shedAt[len(shedAt)-1].Format("05.000"), compAt[max(0, len(compAt)-8):])
		} else {
			t.Logf("burst %d: none shed", burst)
		}
	}()
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc,
		Receipts: receiptsOf(ctx, t, &natslease.Store{NC: bnc, Keys: cst.Keys}), // provisioned
		OnBeacon: func(host string, b fencing.Beacon, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if errors.Is(err, controller.ErrBeaconShed) {
				shedAt = append(shedAt, time.Now())
			} else if err == nil && host == companion {
				compAt = append(compAt, fmt.Sprintf("%s rev %d prev %d", time.Now().Format("05.000"), b.Revision, b.Prev))
			}
		},
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
			if d.Host == withdrawn && d.Op != controller.OpInvalid {
				said3[d.Op.String()] = fmt.Sprintf("%s (err %v) at +%s", d.Reason, err, time.Since(withdrawnAt).Round(100*time.Millisecond))
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing, beacons binding every host

	// The watch connection cut; meanwhile compute-3 withdraws (its beacon
	// lost) and compute-1 overwrites the withdrawal.
	mu.Lock()
	proxy.Reset()
	// X80: the withdrawal late in the cut (nats.go's reconnect wait: ~2 s),
	// so that compute-2's loss below falls within companionDelay (12 s) of
	// it.
	time.Sleep(1200 * time.Millisecond)
	sims[withdrawn].stop = true
	cmu.Lock()
	withdrawnAt = time.Now()
	cmu.Unlock()
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
		reflectOnto(companion)
		time.Sleep(150 * time.Millisecond)
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
	defer func() {
		if !lostAt.IsZero() {
			t.Logf("compute-2's lost beacon %s after compute-3's withdrawal", lostAt.Sub(withdrawnAt).Round(10*time.Millisecond))
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if wnc.IsConnected() && wnc.Stats().Reconnects > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the controller's watch connection not back within 10 s")
		}
	}
	back := time.Now()                 // the watch connection back
	time.Sleep(500 * time.Millisecond) // the watch past the withdrawal
	if !companionHidden {
		// X80: compute-2 renews on after the skip (beacons delivered: its
		// first post-skip record's hidden expectation, ownAfterSkip, is met
		// by its whole chain), then one renewal's beacon is lost (the same
		// route).
		// After BeaconExpectWindow past the watch's return (compute-2's
		// first post-skip record's hidden expectation checked: the chain
		// held): 10.3 s after the skip was delivered, ~11.5 s after the
		// withdrawal.
		time.Sleep(time.Until(back.Add(10300 * time.Millisecond)))
		mu.Lock()
		renew(companion, fencing.LeaseActive, false)
		lostAt = time.Now()
		reflectOnto(companion)
		time.Sleep(150 * time.Millisecond) // the answers land before compute-2's next beacon
		mu.Unlock()
	}

	for deadline := withdrawnAt.Add(120 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
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
		t.Fatalf("%s neither declared nor refused within 120 s of its withdrawal: losses said %q", withdrawn, lost)
	case !slices.ContainsFunc(lost, func(s string) bool { return strings.Contains(s, companion) }):
		t.Fatalf("no loss named %s: %q", companion, lost)
	case noPrev && !slices.ContainsFunc(lost, func(s string) bool { return strings.Contains(s, "no beacon came") }):
		t.Fatalf("beacons without Prev: no missing beacon said: %q", lost)
	default:
		t.Logf("refused %s; losses said: %q", withdrawn, lost)
	}
}
