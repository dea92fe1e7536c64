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
// stream kept every host's last 4 receipts inside ONE stream-wide limit
// (MaxBytes 256 MiB, DiscardOld) and captured hvguard.v1.*.withdrawn —
// any token, not only the fleet's hosts. A compromised compute-1 (shipped
// permissions) reflected message get answers (a ~2.8 KB lease value of
// its own: ~4 KB answers, under MaxMsgSize) onto ~70 000 fresh subjects
// hvguard.v1.x57-<i>.withdrawn: the stream reached MaxBytes and discarded
// its OLDEST messages — compute-3's genuine receipt among them — and the
// withdrawn compute-3 was declared. First closed with DiscardNew (it
// refused instead, and said full), which reviewer X58 defeated (a full
// stream shrunk after it refused a receipt); now each host has its own
// stream, capturing its subject only, without a stream-wide limit
// (natslease.WithdrawalStreamConfig): the same flood stores nothing, a
// flood on another host's subject keeps its last 4 in that host's
// stream, and compute-3's receipt stays.
func TestX57ReflectionFloodEvictsReceiptNATS(t *testing.T) {
	const (
		attacker  = "compute-1.example.org"
		companion = "compute-2.example.org"
		victim    = "compute-3.example.org"
	)
	srvURL := natspermtest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ra := newReceiptAttack(ctx, t, srvURL)
	rs, vjs := ra.rs, ra.vjs
	ast, anc := permStore(t, srvURL, "agent:"+attacker, ra.f, attacker)
	// compute-3's genuine receipt (its orderly stop), stored.
	if _, err := vjs.PublishMsg(ctx, ra.receipt(t, 7, 1234)); err != nil {
		t.Fatal(err)
	}
	if rr, err := natslease.ReadReceipts(ctx, rs, victim); err != nil || len(rr.Msgs) != 1 || rr.Unsound != nil {
		t.Fatalf("the receipt not readable before the flood: %+v, %v", rr, err)
	}
	// The flood: a message get of compute-1's own lease key, its answer on
	// fresh withdrawn subjects, then on compute-2's.
	if _, err := ast.KV.Put(ctx, reflectKey, []byte(strings.Repeat("x", 2800))); err != nil {
		t.Fatal(err)
	}
	msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
	body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
	csubj, _ := proto.WithdrawnSubject(companion)
	const fresh, onCompanion = 20000, 2000
	start := time.Now()
	for i := range fresh + onCompanion {
		reply := "hvguard.v1.x57-" + strconv.Itoa(i) + ".withdrawn"
		if i >= fresh {
			reply = csubj
		}
		if err := anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: reply, Data: body}); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			if err := anc.Flush(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the server's JetStream API queue is bounded
		}
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Wait for compute-2's subject to fill (the answers are asynchronous).
	cs, err := natslease.OpenReceipts(ctx, ra.cjs, companion)
	if err != nil || cs == nil {
		t.Fatalf("compute-2's receipts stream: %v", err)
	}
	var info, cinfo *jetstream.StreamInfo
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cinfo, err = cs.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if cinfo.State.LastSeq >= onCompanion/2 || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Second)
	if info, err = rs.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if cinfo, err = cs.Info(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("after %d reflections on fresh subjects and %d on compute-2's in %s: compute-3's stream %d msgs, %d bytes; compute-2's %d msgs, last seq %d", fresh, onCompanion, time.Since(start).Round(time.Second), info.State.Msgs, info.State.Bytes, cinfo.State.Msgs, cinfo.State.LastSeq)
	if cinfo.State.LastSeq < 1 {
		t.Fatal("rig: no reflected answer reached compute-2's subject")
	}
	if info.State.Msgs != 1 || cinfo.State.Msgs > proto.WithdrawalReceiptsKept {
		t.Fatalf("after the flood compute-3's stream holds %d messages (want its receipt), compute-2's %d (want at most its last %d)", info.State.Msgs, cinfo.State.Msgs, proto.WithdrawalReceiptsKept)
	}
	rr, err := natslease.ReadReceipts(ctx, rs, victim)
	if err != nil {
		t.Fatalf("compute-3's receipt unreadable after the flood: %v", err)
	}
	if len(rr.Msgs) != 1 || rr.Msgs[0].Err != nil || rr.Unsound != nil {
		t.Fatalf("compute-3's genuine withdrawal receipt lost to a reflection flood of a compromised node, or the stream no longer vouches for it: %+v, %v", rr.Msgs, rr.Unsound)
	}
	// And a receipt after the flood is stored.
	if _, err := vjs.PublishMsg(ctx, ra.receipt(t, 8, 1300)); err != nil {
		t.Fatalf("a receipt after the flood refused: %v", err)
	}
}

// x57SlowReceipts is a connection whose receipts stream takes delay to
// open (a slow or lossy NATS — the conditions under which a leader's
// lock lapses) and then holds no receipt; at its start the leader's lock
// validity ends lapseAfter later (onRead).
type x57SlowReceipts struct {
	jetstream.JetStream
	delay  time.Duration
	onRead func()
}

func (s x57SlowReceipts) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s.onRead != nil {
		s.onRead()
	}
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	host, _ := strings.CutPrefix(name, proto.WithdrawalStreamPrefix)
	cfg, err := natslease.WithdrawalStreamConfig(1, strings.ReplaceAll(host, "_", "."))
	return x57EmptyStream{info: &jetstream.StreamInfo{Config: cfg}}, err
}

// x57EmptyStream: a receipts stream without a receipt.
type x57EmptyStream struct {
	jetstream.Stream
	info *jetstream.StreamInfo
}

func (s x57EmptyStream) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return s.info, nil
}

func (s x57EmptyStream) CachedInfo() *jetstream.StreamInfo { return s.info }

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
	sims := map[string]*natsSim{}
	for _, h := range hosts {
		st, _ := permStore(t, srvURL, "agent:"+h, f, h)
		sims[h] = &natsSim{st: st}
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
				res := s.renewRec(ctx, rec)
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
