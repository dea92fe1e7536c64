package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestWithdrawalReceiptStopsDeclarationNATS (S; docs/security.md,
// "Withdrawal receipts"), through a Runner on a real nats-server with the
// shipped permissions: compute-3 withdraws in order (its guests run on)
// while the controller's watch connection is cut, and compute-1
// (compromised) overwrites the withdrawal with garbage before the watch
// is back (a watch skip). compute-3's withdrawal beacon is lost on the
// way — and only it (a leaf node serving compute-3 alone closed as a slow
// consumer): the hole docs/security.md listed as "a loss the counters do
// not see that drops only the withdrawing host's beacon". In this rig the
// runner's own loss machinery still refuses compute-3 (the watch's
// reconnection counts as a loss); a loss no counter sees is modelled by
// switching that machinery off (beaconLossMutation) in every case, so the
// receipt alone decides.
//   - "receipt": compute-3's agent stored its withdrawal receipt
//     (natslease.ReceiptMsg, a JetStream publish under its own user): the
//     leader reads it before it writes the declaration, and compute-3 is
//     not declared (OpWithdrawn said, the declaration reported with
//     ErrWithdrawalReceipt);
//   - "receipt/receiptMutation": the same with no receipt read: declared;
//   - "no-receipt": the receipt not stored (the hole, as before):
//     declared;
//   - "old-receipt" (c side): compute-3 withdrew and stored its receipt,
//     renewed again since, and then died without withdrawing: the old
//     receipt names a revision before its last trusted record — declared.
//
// Reviewer X58's other hole: a stream that cannot vouch for its receipts
// (an older release's, capturing hvguard.v1.*.withdrawn with a
// stream-wide limit: a flood fills it, it refuses the receipt, the flood
// shrinks it — TestX58FullStreamShrunkAfterRefusal), or none at all: the
// absence of a receipt is then no evidence, and compute-3, whose key
// holds compute-1's garbage (it may hide a write), waits
// (ErrReceiptsUnsound):
//   - "no-receipt/older-stream", "no-receipt/no-stream": not declared;
//     with receiptUnsoundMutation declared;
//   - "receipt/older-stream": a receipt it did store still stops the
//     declaration (the withdrawal said).
//
// Reviewer X60's: the previous release's stream, shared by every host
// (each host's subject named), whose ingest queue compute-1 fills with
// publishes on its own receipt subject so that the server refuses
// compute-3's receipt (TestX60IngestFloodRefusesReceiptNATS): it vouches
// for no host, and neither does a cluster whose hosts' own streams are
// missing (deleted, never provisioned):
//   - "no-receipt/shared-stream", "no-receipt/deleted-streams": not
//     declared; with receiptUnsoundMutation declared;
//   - "receipt/shared-stream": the receipt stored there still stops the
//     declaration.
//
// compute-1 cannot store a receipt in compute-3's name: the shipped
// permissions refuse the publish (checked in every case).
func TestWithdrawalReceiptStopsDeclarationNATS(t *testing.T) {
	for _, c := range []struct {
		name                   string
		receipt, mut, old      bool
		older, noStream, mutU  bool
		shared, deleted        bool
		wantDeclared, wantWarn bool
	}{
		{name: "receipt", receipt: true, wantWarn: true},
		{name: "receipt/receiptMutation", receipt: true, mut: true, wantDeclared: true},
		{name: "no-receipt", wantDeclared: true},
		{name: "old-receipt", receipt: true, old: true, wantDeclared: true},
		{name: "no-receipt/older-stream", older: true},
		{name: "no-receipt/older-stream/receiptUnsoundMutation", older: true, mutU: true, wantDeclared: true},
		{name: "no-receipt/no-stream", noStream: true},
		{name: "no-receipt/no-stream/receiptUnsoundMutation", noStream: true, mutU: true, wantDeclared: true},
		{name: "receipt/older-stream", receipt: true, older: true, wantWarn: true},
		{name: "no-receipt/shared-stream", shared: true},
		{name: "no-receipt/shared-stream/receiptUnsoundMutation", shared: true, mutU: true, wantDeclared: true},
		{name: "receipt/shared-stream", receipt: true, shared: true, wantWarn: true},
		{name: "no-receipt/deleted-streams", deleted: true},
		{name: "no-receipt/deleted-streams/receiptUnsoundMutation", deleted: true, mutU: true, wantDeclared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer controller.SetBeaconLossMutation(true)()
			if c.mut {
				defer controller.SetReceiptMutation(true)()
			}
			if c.mutU {
				defer controller.SetReceiptUnsoundMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: c.receipt, old: c.old, older: c.older, noStream: c.noStream, shared: c.shared, deleted: c.deleted, wantDeclared: c.wantDeclared, wantWithdrawn: c.wantWarn})
		})
	}
}

// receiptCase: compute-3's withdrawal stores its receipt (receipt), or
// compute-3 withdrew and came back before and now dies (old); reflect:
// compute-1 then reflects that many message get answers onto compute-3's
// receipt subject (reviewer X57); the outcome wanted.
type receiptCase struct {
	receipt, old                bool
	reflect                     int
	wantDeclared, wantWithdrawn bool
	// withheld: compute-1 puts back, over the withdrawal, a renewal
	// compute-3 sealed for the withdrawal's prev_rev and asked it to relay
	// (withheld), in place of garbage (reviewer X58); beacon: the
	// withdrawal's beacon is not lost.
	withheld, beacon bool
	// older: the receipts stream is an older release's (a wildcard, a
	// stream-wide limit: it cannot vouch for its receipts); shared: the
	// previous release's, shared by every host (X60); deleted: no host has
	// its own stream; noStream: the controller reads none (no connection).
	older, noStream, shared, deleted bool
	// migrate (reviewer X62): the previous release's shared stream, and
	// the operator moves compute-3 to its own stream (docs/operations.md
	// "Upgrade", one by one) right after its withdrawal.
	migrate, moved bool
	// putAfterMove (reviewer X63): the operator moves compute-3 first,
	// compute-1 puts the withheld relay back only after (and, with
	// thenGarbage, overwrites it with garbage once the controller's watch
	// has trusted it).
	putAfterMove, thenGarbage bool
	// hideP (reviewer X64): while the watch is cut, compute-3 renews once
	// more (revision P, superseded by its withdrawal before the watch is
	// back: never seen), and the withheld relay is sealed for P;
	// pBeacon: P's beacon reaches the controller (else lost).
	hideP, pBeacon bool
}

func withdrawalReceiptNATS(t *testing.T, c receiptCase) {
	if c.wantDeclared && c.withheld {
		// A mutation case of the receipt layer: the withheld relay is
		// sealed before the withdrawal, which the tracker refuses on its
		// own once the withdrawal's beacon came (reviewers X103, X104) —
		// switched off, so the case shows the receipt layer alone.
		defer controller.SetWithdrawalLayersMutation(true)()
	}
	receipt, old, wantDeclared, wantWithdrawn := c.receipt, c.old, c.wantDeclared, c.wantWithdrawn
	const (
		attacker  = "compute-1.example.org"
		companion = "compute-2.example.org"
		withdrawn = "compute-3.example.org"
	)
	var provision []func(context.Context, jetstream.JetStream) error
	switch {
	case c.older:
		provision = append(provision, natspermtest.OlderReceiptsStream)
	case c.shared:
		provision = append(provision, natspermtest.SharedReceiptsStream)
	case c.deleted:
		provision = append(provision, natspermtest.DeleteReceiptsStreams)
	}
	var srvURL string
	var aj jetstream.JetStream
	if c.migrate {
		srvURL, aj = x62StartServerWithAdmin(t)
		if _, err := aj.CreateStream(context.Background(), natspermtest.SharedReceiptsConfig()); err != nil {
			t.Fatal(err)
		}
	} else {
		srvURL = natspermtest.StartServer(t, provision...)
	}
	hosts := []string{attacker, companion, withdrawn}
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	sims := natsSims(t, srvURL, f, hosts)
	// renew writes h's record (state st) and publishes its beacon unless
	// lost; a withdrawal's receipt is stored when receipt is set.
	renew := func(h string, st fencing.LeaseState, beacon, storeReceipt bool) uint64 {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.State, rec.Seq = st, s.seq
		res := s.renewRec(ctx, rec)
		if res.Outcome != fencing.RenewAcked {
			// A live host's missed renewal under load: logged (a
			// declaration of it fails the test below).
			t.Logf("%s: renewal %s: %+v", h, st, res)
			return 0
		}
		s.rev = res.Revision
		if beacon {
			m, err := natslease.BeaconMsg(f.signers[h], rec, res.Revision, 0, time.Now())
			if err == nil {
				err = s.nc.PublishMsg(m)
			}
			if err != nil {
				t.Error(err)
			}
		}
		if storeReceipt {
			m, err := natslease.ReceiptMsg(f.signers[h], rec, res.Revision, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			js, _ := jetstream.New(s.nc)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Errorf("%s: its withdrawal receipt not stored under its own user: %v", h, err)
			}
		}
		return res.Revision
	}
	// The compromised compute-1 publishes a receipt in compute-3's name:
	// the shipped permissions refuse it (no stream would ack it).
	{
		rec := controllertest.HostRecord(withdrawn)
		rec.State = fencing.LeaseWithdrawn
		m, err := natslease.ReceiptMsg(f.signers[attacker], rec, 999, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(sims[attacker].nc)
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err = js.PublishMsg(pctx, m)
		pcancel()
		if err == nil {
			t.Fatalf("%s stored a withdrawal receipt in %s's name", attacker, withdrawn)
		}
	}
	if old {
		// compute-3 withdrew once (a maintenance) and came back.
		renew(withdrawn, fencing.LeaseActive, true, false)
		renew(withdrawn, fencing.LeaseWithdrawn, true, true)
	}
	renewEvery(ctx, &mu, hosts, sims, func(h string) { renew(h, fencing.LeaseActive, true, false) })

	// The controller: its watch through the proxy, its beacons direct.
	cst, wnc, bnc, proxy := proxiedController(t, srvURL, f)
	cjs, _ := jetstream.New(bnc)
	// Provisioned: the controller only reads.
	if u := natslease.StreamOfReceiptsUnsound(ctx, cjs, withdrawn); (u != nil) != (c.older || c.shared || c.deleted || c.migrate) {
		t.Fatalf("rig: the receipts stream (older %t, shared %t, deleted %t) vouches: %v", c.older, c.shared, c.deleted, u)
	}
	rs := cjs
	if c.noStream {
		rs = nil
	}
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cmu sync.Mutex
	var declared time.Time
	var stopped, withdrawnSaid bool
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: rs,
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if c.thenGarbage && d.Host == withdrawn && (d.Op != controller.OpDeclare || err == nil || !stopped) {
				t.Logf("decision %s rev %d record %s seq %d err %v", d.Op, d.Revision, d.Record.State, d.Record.Seq, err)
			}
			switch {
			case d.Op == controller.OpDeclare && d.Host != withdrawn:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare && (errors.Is(err, controller.ErrWithdrawalReceipt) || errors.Is(err, controller.ErrReceiptsTampered) || errors.Is(err, controller.ErrReceiptAfterSeal) || errors.Is(err, controller.ErrReceiptsUnsound)):
				stopped = true
			case d.Op == controller.OpDeclare && err == nil && declared.IsZero():
				declared = time.Now()
			case d.Op == controller.OpWithdrawn && d.Host == withdrawn:
				withdrawnSaid = true
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing, beacons binding every host

	// The watch connection cut; meanwhile compute-3 withdraws (its beacon
	// lost: only its own) — or, "old", dies — and compute-1 overwrites
	// its key.
	mu.Lock()
	proxy.Reset()
	sims[withdrawn].stop = true
	at := time.Now()
	val := []byte("not a record")
	if c.hideP {
		// compute-3's last renewal, while the watch is cut: superseded
		// by its withdrawal before the watch is back.
		if renew(withdrawn, fencing.LeaseActive, c.pBeacon, false) == 0 {
			mu.Unlock()
			t.Fatal("rig: compute-3's renewal P failed")
		}
	}
	if c.withheld {
		v := sims[withdrawn]
		v.seq++
		held := controllertest.HostRecord(withdrawn)
		held.Seq = v.seq
		b, err := f.signers[withdrawn].Seal(held, v.rev).Encode()
		if err != nil {
			mu.Unlock()
			t.Fatal(err)
		}
		val = b
	}
	if !old {
		renew(withdrawn, fencing.LeaseWithdrawn, c.beacon, receipt)
	}
	if c.putAfterMove && c.migrate && c.moved {
		x62MoveToOwnStream(ctx, t, aj, withdrawn)
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := sims[attacker].st.KV.Put(ctx, strings.ReplaceAll(withdrawn, ".", "_"), val); err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	if c.migrate && c.moved && !c.putAfterMove {
		x62MoveToOwnStream(ctx, t, aj, withdrawn)
	}
	if c.reflect > 0 {
		// compute-1's own user, shipped permissions: a message get of the
		// garbage it just wrote into compute-3's lease key, answered on
		// compute-3's receipt subject (the JetStream API's reflection).
		subj, _ := proto.WithdrawnSubject(withdrawn)
		msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
		body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + strings.ReplaceAll(withdrawn, ".", "_") + `"}`)
		for range c.reflect {
			if err := sims[attacker].nc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body}); err != nil {
				mu.Unlock()
				t.Fatal(err)
			}
		}
		if err := sims[attacker].nc.Flush(); err != nil {
			mu.Unlock()
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		rr, err := natslease.ReadHostReceipts(ctx, cjs, withdrawn)
		if err != nil || len(rr.Msgs) == 0 || rr.Msgs[len(rr.Msgs)-1].Err == nil {
			mu.Unlock()
			t.Fatalf("rig: the reflection did not land on compute-3's receipt subject: %+v, %v", rr, err)
		}
		t.Logf("compute-3's receipt subject after %d reflection(s): %d messages, the last: %v", c.reflect, len(rr.Msgs), rr.Msgs[len(rr.Msgs)-1].Err)
	}
	mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); !(wnc.IsConnected() && wnc.Stats().Reconnects > 0); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the controller's watch connection not back within 10 s")
		}
	}
	if c.thenGarbage {
		time.Sleep(time.Second) // the watch, back, trusts the put-back record
		grev, err := sims[attacker].st.KV.Put(ctx, strings.ReplaceAll(withdrawn, ".", "_"), []byte("not a record"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("garbage over the put-back relay at revision %d, %s after the withdrawal", grev, time.Since(at).Round(10*time.Millisecond))
	}
	// Due ~3 s after its last renewal at ×0.1 timing (+ HiddenWriteWait
	// for the garbage after a skip): 30 s is ample.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		done := !declared.IsZero() || stopped
		cmu.Unlock()
		if done {
			break
		}
	}
	time.Sleep(2 * time.Second) // a declaration after the receipt stopped one
	cmu.Lock()
	defer cmu.Unlock()
	switch {
	case wantDeclared && declared.IsZero():
		t.Fatalf("%s not declared within 30 s (stopped by a receipt: %t): the test no longer shows the hole", withdrawn, stopped)
	case wantDeclared:
		t.Logf("%s declared %s after it stopped", withdrawn, declared.Sub(at).Round(10*time.Millisecond))
	case !declared.IsZero():
		t.Fatalf("the withdrawn %s (withdrawal hidden, its beacon lost, its receipt stored) declared %s after its withdrawal", withdrawn, declared.Sub(at).Round(10*time.Millisecond))
	case !stopped || withdrawnSaid != wantWithdrawn:
		t.Fatalf("%s not declared, but the receipt's stop was not reported (stopped %t, withdrawn said %t)", withdrawn, stopped, withdrawnSaid)
	default:
		t.Logf("%s not declared: its declaration stopped by its withdrawal receipt, or waiting on its tampered receipt subject", withdrawn)
	}
}

// receiptAttack is the rig of the attacks on the receipts stream itself
// (reviewers X57, X60): a nats-server with the shipped permissions at
// url, the fleet compute-1 … compute-3 (compute-1 compromised: permStore
// it), compute-3's JetStream under its own user, and compute-3's receipts
// stream as the controller ctl-1 opens it (provisioned).
type receiptAttack struct {
	f   fleet
	vjs jetstream.JetStream
	cjs jetstream.JetStream
	rs  jetstream.Stream
}

func newReceiptAttack(ctx context.Context, t *testing.T, url string) receiptAttack {
	t.Helper()
	a := receiptAttack{f: newFleetOf(t, natspermtest.Agents)}
	a.vjs, _ = jetstream.New(natspermtest.Connect(t, url, "agent:compute-3.example.org"))
	a.cjs, _ = jetstream.New(natspermtest.Connect(t, url, "controller:ctl-1"))
	var err error
	if a.rs, err = natslease.OpenReceipts(ctx, a.cjs, "compute-3.example.org"); err != nil || a.rs == nil {
		t.Fatalf("compute-3's receipts stream: %v", err)
	}
	return a
}

// receipt is compute-3's withdrawal receipt of seq at rev (its orderly
// stop).
func (a receiptAttack) receipt(t *testing.T, seq, rev uint64) *nats.Msg {
	t.Helper()
	rec := controllertest.HostRecord("compute-3.example.org")
	rec.State, rec.Seq = fencing.LeaseWithdrawn, seq
	m, err := natslease.ReceiptMsg(a.f.signers["compute-3.example.org"], rec, rev, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return m
}
