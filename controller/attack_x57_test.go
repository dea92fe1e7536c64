package controller_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
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

// TestX57ReflectedJunkShadowsReceiptNATS (S; reviewer X57). The receipt
// stream captures hvguard.v1.*.withdrawn in the agents' account, and the
// JetStream API "reflection" (reviewer X12: a message get on the lease
// stream naming another host's subject as its reply; the server publishes
// the JSON answer there with its own rights) stores a message on ANY
// host's receipt subject. LastReceipt reads only the subject's LAST
// message; junk is "not evidence of a withdrawal": logged, and the
// declaration proceeds. So the compromised compute-1, which hid
// compute-3's withdrawn record (the very hole the receipts close: the
// rig of TestWithdrawalReceiptStopsDeclarationNATS, its beacon lost),
// reflects ONE message get answer onto compute-3's receipt subject after
// compute-3 stored its receipt: the receipt is no longer the last
// message (4 reflections evict it: MaxMsgsPerSubject 4, DiscardOld) and
// the withdrawn compute-3, guests running, is declared.
//   - "control": no reflection: not declared (the receipt stops it);
//   - "reflect-1": one reflected answer: declared (FAILS today);
//   - "reflect-4": four: the receipt is gone from the stream: declared.
//
// Closed: every message kept on the subject is read (the newest that
// verifies decides: reflect-1), and junk after it makes the declaration
// of a host whose key may hide a write wait (reflect-4: the receipt
// evicted, only junk left); with receiptJunkMutation reflect-4 is
// declared.
func TestX57ReflectedJunkShadowsReceiptNATS(t *testing.T) {
	for _, c := range []struct {
		name    string
		reflect int
		mut     bool
	}{
		{name: "control"},
		{name: "reflect-1", reflect: 1},
		{name: "reflect-4", reflect: 4},
		{name: "reflect-4/receiptJunkMutation", reflect: 4, mut: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer controller.SetBeaconLossMutation(true)()
			if c.mut {
				defer controller.SetReceiptJunkMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, reflect: c.reflect, wantDeclared: c.mut, wantWithdrawn: c.reflect == 0})
		})
	}
}

// TestX57ReflectionFloodEvictsReceiptNATS (S; reviewer X57): the receipt
// stream keeps every host's last 4 receipts inside ONE stream-wide limit
// (MaxBytes 256 MiB, DiscardOld) and captures hvguard.v1.*.withdrawn —
// any token, not only the fleet's hosts. A compromised compute-1 (shipped
// permissions) reflects message get answers (a ~2.8 KB lease value of its
// own: ~4 KB answers, under MaxMsgSize) onto ~70 000 fresh subjects
// hvguard.v1.x57-<i>.withdrawn: the stream reaches MaxBytes and discards
// its OLDEST messages — compute-3's genuine receipt among them.
// LastReceipt then says ErrNoReceipt, and checkReceipt lets the
// declaration of the withdrawn compute-3 proceed (as
// TestWithdrawalReceiptStopsDeclarationNATS/no-receipt shows). This also
// defeats a fix of TestX57ReflectedJunkShadowsReceiptNATS that only
// treats a junk LAST message as "wait". Fails today: the receipt is gone.
func TestX57ReflectionFloodEvictsReceiptNATS(t *testing.T) {
	const (
		attacker = "compute-1.example.org"
		victim   = "compute-3.example.org"
	)
	srvURL := natspermtest.StartServer(t)
	hosts := []string{attacker, "compute-2.example.org", victim}
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ast, anc := permStore(t, srvURL, "agent:"+attacker, f, attacker)
	_, vnc := permStore(t, srvURL, "agent:"+victim, f, victim)
	bnc := natspermtest.Connect(t, srvURL, "controller:ctl-1")
	cjs, _ := jetstream.New(bnc)
	rs, err := natslease.EnsureWithdrawalStream(ctx, cjs)
	if err != nil {
		t.Fatal(err)
	}
	// compute-3's genuine receipt (its orderly stop), stored.
	rec := controllertest.HostRecord(victim)
	rec.State, rec.Seq = fencing.LeaseWithdrawn, 7
	m, err := natslease.ReceiptMsg(f.signers[victim], rec, 1234, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	vjs, _ := jetstream.New(vnc)
	if _, err := vjs.PublishMsg(ctx, m, jetstream.WithExpectStream(proto.WithdrawalStream)); err != nil {
		t.Fatal(err)
	}
	if rr, err := natslease.ReadReceipts(ctx, rs, victim); err != nil || len(rr.Msgs) != 1 || rr.Full {
		t.Fatalf("the receipt not readable before the flood: %+v, %v", rr, err)
	}
	// The flood: a message get of compute-1's own lease key, its answer on
	// fresh withdrawn subjects.
	if _, err := ast.KV.Put(ctx, reflectKey, []byte(strings.Repeat("x", 2800))); err != nil {
		t.Fatal(err)
	}
	msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
	body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
	start := time.Now()
	sent := 0
	for ctx.Err() == nil {
		for i := 0; i < 2000; i++ {
			sent++
			if err := anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: "hvguard.v1.x57-" + strconv.Itoa(sent) + ".withdrawn", Data: body}); err != nil {
				t.Fatal(err)
			}
		}
		if err := anc.Flush(); err != nil {
			t.Fatal(err)
		}
		// pace on the stream (the server's JetStream API queue is bounded)
		var info *jetstream.StreamInfo
		for j := 0; j < 100; j++ {
			if info, err = rs.Info(ctx); err != nil {
				t.Fatal(err)
			}
			if info.State.LastSeq+50 >= uint64(sent) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if info.State.FirstSeq > 1 || info.State.LastSeq+50 < uint64(sent) || sent > 120000 {
			// Evicting (DiscardOld), or refusing (DiscardNew: full).
			t.Logf("after %d reflections in %s: stream %d msgs, %d MiB, first seq %d", sent, time.Since(start).Round(time.Second), info.State.Msgs, info.State.Bytes>>20, info.State.FirstSeq)
			break
		}
	}
	rr, err := natslease.ReadReceipts(ctx, rs, victim)
	if err != nil {
		t.Fatalf("compute-3's receipt unreadable after the flood: %v", err)
	}
	if len(rr.Msgs) != 1 || rr.Msgs[0].Err != nil {
		t.Fatalf("compute-3's genuine withdrawal receipt EVICTED by a reflection flood of a compromised node (%d reflected answers): %+v — checkReceipt lets the withdrawn host's declaration proceed", sent, rr.Msgs)
	}
	if !rr.Full {
		t.Fatalf("after the flood the stream refuses new receipts but ReadReceipts does not say it is full: a withdrawal's receipt refused now would go unnoticed")
	}
	t.Logf("the receipt kept, the stream said full (declarations of hosts whose key may hide a write wait: ErrReceiptsFull)")
}

// x57SlowReceipts is a receipts stream whose message get takes delay (a
// slow or lossy NATS — the conditions under which a leader's lock lapses)
// and then finds no receipt; at its start the leader's lock validity ends
// lapseAfter later (onRead).
type x57SlowReceipts struct {
	jetstream.Stream
	delay  time.Duration
	onRead func()
}

func (s x57SlowReceipts) Info(ctx context.Context, _ ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	if s.onRead != nil {
		s.onRead()
	}
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &jetstream.StreamInfo{Config: natslease.WithdrawalStreamConfig(1)}, nil // no receipt
}

// TestX57ReceiptReadOutlivesActMargin (S, faults: a slow NATS that also
// lapses the leader's lock). perform checks MayAct "immediately before the
// write" (run.go), and the leader-lock safety argument (leader.go) holds
// only for actions whose effect lands within ActMargin (2 s = ONE KV
// write, WriteTimeout) of that check. checkReceipt now sits between the
// check and the write: up to ReceiptReadTimeout (2 s) of message get,
// THEN the write (up to 2 s). A leader whose lock validity ends during
// the read still writes the declaration afterwards — after a standby may
// have taken over and decided otherwise (it saw the host's withdrawal
// beacon; the CAS is on the key's current revision, a compromised node's
// garbage, so it does not protect the hidden-withdrawal case). Rig: a
// real nats-server, compute-3 stops renewing, the runner's MayAct is
// true until 50 ms after the receipt read starts, the read takes 1.9 s
// (no receipt; under ReceiptReadTimeout). Fails today: the write starts
// ~1.85 s after MayAct turned false, so with its own 2 s bound it may
// land ~3.85 s after — beyond ActMargin (2 s). Fix: check mayAct again after checkReceipt (or
// read the receipt before the MayAct check), so nothing but the write
// follows the last check.
//
// Closed: MayAct is checked again after the receipt read; with
// actRecheckMutation the declaration is written after MayAct turned
// false.
func TestX57ReceiptReadOutlivesActMargin(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("actRecheckMutation=%t", mut), func(t *testing.T) {
			if mut {
				defer controller.SetActRecheckMutation(true)()
			}
			x57ActMargin(t, mut)
		})
	}
}

func x57ActMargin(t *testing.T, mut bool) {
	const dead = "compute-3.example.org"
	srvURL := natspermtest.StartServer(t)
	hosts := []string{"compute-1.example.org", "compute-2.example.org", dead}
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type sim struct {
		st       *natslease.Store
		rev, seq uint64
	}
	sims := map[string]*sim{}
	for _, h := range hosts {
		st, _ := permStore(t, srvURL, "agent:"+h, f, h)
		sims[h] = &sim{st: st}
	}
	var mu sync.Mutex
	stopped := false
	go func() {
		for ctx.Err() == nil {
			mu.Lock()
			for _, h := range hosts {
				if h == dead && stopped {
					continue
				}
				s := sims[h]
				s.seq++
				rec := controllertest.HostRecord(h)
				rec.Seq = s.seq
				res := s.st.Renew(ctx, fencing.RenewRequest{Seq: s.seq, Revision: s.rev, Record: rec}, time.Second)
				if res.Outcome == fencing.RenewAcked {
					s.rev = res.Revision
				}
			}
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	cst, _ := permStore(t, srvURL, "controller:ctl-1", f, "ctl")
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var lmu sync.Mutex
	var lapse time.Time // zero: valid
	mayAct := func(time.Time) bool {
		lmu.Lock()
		defer lmu.Unlock()
		return lapse.IsZero() || time.Now().Before(lapse)
	}
	rs := x57SlowReceipts{delay: 1900 * time.Millisecond, onRead: func() {
		lmu.Lock()
		if lapse.IsZero() {
			lapse = time.Now().Add(50 * time.Millisecond)
		}
		lmu.Unlock()
	}}
	type written struct {
		at     time.Time
		mayAct bool
	}
	got := make(chan written, 4)
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Receipts: rs, MayAct: mayAct,
		OnDecision: func(d controller.Decision, err error) {
			if d.Op == controller.OpDeclare && err == nil {
				got <- written{time.Now(), mayAct(time.Now())}
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second)
	mu.Lock()
	stopped = true
	mu.Unlock()
	if !mut {
		select {
		case w := <-got:
			t.Fatalf("declaration written (MayAct %t at the write) although MayAct turned false during the receipt read", w.mayAct)
		case <-time.After(10 * time.Second):
			t.Logf("nothing written while MayAct is false")
		}
		return
	}
	select {
	case w := <-got:
		lmu.Lock()
		l := lapse
		lmu.Unlock()
		if !w.mayAct {
			t.Logf("with actRecheckMutation: written %s after MayAct turned false", w.at.Sub(l).Round(10*time.Millisecond))
			return
		}
		t.Fatal("with actRecheckMutation the declaration was written while MayAct was true: the test no longer shows the hole")
	case <-time.After(30 * time.Second):
		t.Fatal("no declaration written within 30 s")
	}
}
