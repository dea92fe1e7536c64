package controller_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestX62OversizeReflectionFillsIngestNATS (reviewer X62, idea 1): a
// compromised compute-1 reflects message-get answers of a big lease
// value of its own onto compute-3's receipt subject. Each answer is
// larger than the stream's MaxMsgSize (4096), so it is refused at
// storing — after it passed the stream's ingest queue. If the server
// answers faster than compute-3's stream refuses, the queue fills, and
// compute-3's receipt is refused (429) while nothing is stored: the
// stream vouches, holds no junk, and lacks the receipt.
func TestX62OversizeReflectionFillsIngestNATS(t *testing.T) {
	for _, c := range []struct {
		name  string
		size  int
		conns int
	}{
		{name: "control-2KB-stored", size: 2000, conns: 3},
		{name: "3.2KB", size: 3200, conns: 3},
		{name: "64KB", size: 64 << 10, conns: 3},
		{name: "900KB", size: 900 << 10, conns: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			const (
				attacker = "compute-1.example.org"
				victim   = "compute-3.example.org"
			)
			srvURL := natspermtest.StartServer(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ra := newReceiptAttack(ctx, t, srvURL)
			ast, _ := permStore(t, srvURL, "agent:"+attacker, ra.f, attacker)
			// compute-3's earlier receipt (an earlier orderly stop), stored.
			if _, err := ra.vjs.PublishMsg(ctx, ra.receipt(t, 7, 1000)); err != nil {
				t.Fatal(err)
			}
			if _, err := ast.KV.Put(ctx, reflectKey, []byte(strings.Repeat("x", c.size))); err != nil {
				t.Fatal(err)
			}
			vsubj, _ := proto.WithdrawnSubject(victim)
			msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
			body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent atomic.Int64
			for range c.conns {
				anc := natspermtest.Connect(t, srvURL, "agent:"+attacker, nats.ReconnectBufSize(-1))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if err := anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: vsubj, Data: body}); err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						sent.Add(1)
						if i%200 == 199 {
							anc.Flush()
						}
					}
				}()
			}
			time.Sleep(time.Second)
			refused, other, stored := 0, 0, 0
			refusedRev := uint64(0)
			const tries = 30
			for i := range tries {
				m := ra.receipt(t, uint64(8+i), uint64(1234+i))
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := ra.vjs.PublishMsg(pctx, m)
				pcancel()
				switch {
				case err == nil:
					stored++
				case strings.Contains(err.Error(), "too many requests"):
					refused++
					refusedRev = uint64(1234 + i)
				default:
					other++
					t.Logf("receipt %d: %v", i, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			time.Sleep(500 * time.Millisecond)
			info, _ := ra.rs.Info(ctx)
			t.Logf("compute-1 sent %d message gets (value %d bytes); compute-3's receipts: %d stored, %d refused (429), %d other; stream last seq %d msgs %d", sent.Load(), c.size, stored, refused, other, info.State.LastSeq, info.State.Msgs)
			rr, err := natslease.ReadHostReceipts(ctx, ra.cjs, victim)
			if err != nil {
				t.Fatal(err)
			}
			junk := 0
			for _, m := range rr.Msgs {
				if m.Err != nil {
					junk++
				}
			}
			t.Logf("controller reads %d msgs (%d junk), unsound=%v", len(rr.Msgs), junk, rr.Unsound)
			if refused > 0 && rr.Unsound == nil && junk == 0 {
				t.Errorf("compute-3's receipt (revision %d) refused (429) during compute-1's oversize reflection flood; the stream vouches and holds no junk (%d msgs)", refusedRev, len(rr.Msgs))
			}
		})
	}
}

// x62StartServerWithAdmin starts a nats-server with the shipped accounts
// file plus an admin user in each account (the operator, who provisions
// and migrates streams while the fleet runs), provisioned as
// natspermtest.StartServer does; it returns the URL and the operator's
// JetStream in the agents' account.
func x62StartServerWithAdmin(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	dir := t.TempDir()
	shipped, err := os.ReadFile(natspermtest.ShippedAccounts())
	if err != nil {
		t.Fatal(err)
	}
	conf := string(shipped)
	i := strings.Index(conf, "users: [\n")
	conf = conf[:i] + "users: [\n      {user: admin, password: x62admin}\n" + conf[i+len("users: [\n"):]
	j := strings.LastIndex(conf, "users: [\n")
	conf = conf[:j] + "users: [\n      {user: cadmin, password: x62admin}\n" + conf[j+len("users: [\n"):]
	if err := os.WriteFile(filepath.Join(dir, "hvguard-accounts.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(main, []byte(fmt.Sprintf("jetstream: {store_dir: %q}\ninclude ./hvguard-accounts.conf\n", filepath.Join(dir, "js"))), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatal(err)
	}
	o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	as := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, "x62admin"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		j, _ := jetstream.New(nc)
		return j
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	aj := as("admin")
	if _, err := aj.CreateStream(ctx, delivery.StreamConfig(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := natslease.CreateBucket(ctx, aj, 1); err != nil {
		t.Fatal(err)
	}
	cj := as("cadmin")
	if _, err := controller.EnsureControlBuckets(ctx, cj, true); err != nil {
		t.Fatal(err)
	}
	if _, err := controller.EnsureInstanceBucket(ctx, cj, true); err != nil {
		t.Fatal(err)
	}
	return s.ClientURL(), aj
}

// x62MoveToOwnStream moves host out of the shared receipts stream and
// adds its own, as docs/operations.md "Upgrade" says (the one-by-one
// way: nats stream edit hvguard-withdrawals, then nats stream add
// --config receipts/hvguard-withdrawals-<host>.json).
func x62MoveToOwnStream(ctx context.Context, t *testing.T, aj jetstream.JetStream, host string) {
	t.Helper()
	subj, _ := proto.WithdrawnSubject(host)
	st, err := aj.Stream(ctx, proto.WithdrawalStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Subjects = slices.DeleteFunc(slices.Clone(cfg.Subjects), func(s string) bool { return s == subj })
	if _, err := aj.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	own, err := natslease.WithdrawalStreamConfig(1, host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aj.CreateStream(ctx, own); err != nil {
		t.Fatal(err)
	}
}

// TestX62MigrationDropsSharedReceiptNATS (reviewer X62, idea 3): compute-3
// withdrew in order while its subject was in the previous release's
// shared stream; its receipt is stored there. The operator then moves
// compute-3 to its own stream as docs/operations.md "Upgrade" says (the
// one-by-one way, "if you want its receipts read while you move"). From
// then on the controller reads only compute-3's own stream (OpenReceipts
// falls back to the shared one only while the host has none): empty, and
// it vouches. The receipt still stored in the shared stream is evidence
// no one reads, and checkReceipt finds no receipt in a stream that
// vouches: the declaration proceeds.
func TestX62MigrationDropsSharedReceiptNATS(t *testing.T) {
	const victim = "compute-3.example.org"
	url, aj := x62StartServerWithAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The previous release's provisioning: the shared stream.
	if _, err := aj.CreateStream(ctx, natspermtest.SharedReceiptsConfig()); err != nil {
		t.Fatal(err)
	}
	f := newFleetOf(t, natspermtest.Agents)
	vjs, _ := jetstream.New(natspermtest.Connect(t, url, "agent:"+victim))
	cjs, _ := jetstream.New(natspermtest.Connect(t, url, "controller:ctl-1"))
	rec := controllertest.HostRecord(victim)
	rec.State, rec.Seq = fencing.LeaseWithdrawn, 7
	m, err := natslease.ReceiptMsg(f.signers[victim], rec, 1234, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ack, err := vjs.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	before, err := natslease.ReadHostReceipts(ctx, cjs, victim)
	if err != nil || len(before.Msgs) != 1 {
		t.Fatalf("rig: %+v %v", before, err)
	}
	t.Logf("before the move: receipt stored in %s (seq %d); controller reads %d receipt(s), unsound=%v", ack.Stream, ack.Sequence, len(before.Msgs), before.Unsound != nil)
	x62MoveToOwnStream(ctx, t, aj, victim)
	sh, _ := aj.Stream(ctx, proto.WithdrawalStream)
	shi, _ := sh.Info(ctx)
	after, err := natslease.ReadHostReceipts(ctx, cjs, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the move: the shared stream still holds %d message(s); controller reads %d receipt(s), unsound=%v, stream created %s (receipt stored %s)", shi.State.Msgs, len(after.Msgs), after.Unsound, after.Since.Format(time.RFC3339Nano), before.Msgs[0].Stored.Format(time.RFC3339Nano))
	// Closed: the read says when the stream was created — after the
	// receipt — and a controller takes it as vouching only for hosts
	// judged by a record stored after that (Tracker.ReceiptsCover;
	// TestX62MigrationDeclaresWithdrawnNATS).
	if shi.State.Msgs > 0 && len(after.Msgs) == 0 && after.Unsound == nil && !after.Since.After(before.Msgs[0].Stored) {
		t.Errorf("compute-3's withdrawal receipt (revision 1234) is still stored in %s, but the controller reads only compute-3's own stream, which holds none, vouches, and says it existed before the receipt: a host whose key may hide a write is declared", proto.WithdrawalStream)
	}
}

// TestX62MigrationDeclaresWithdrawnNATS (S, conditional on an operator
// following docs/operations.md "Upgrade" one by one while a host is
// withdrawn): the rig of TestWithdrawalReceiptStopsDeclarationNATS
// ("receipt/shared-stream": compute-3 withdraws, its receipt stored in
// the shared stream, compute-1 hides its withdrawn record, its beacon
// lost), and the operator moves compute-3 to its own stream before the
// controller decides it. Wanted: not declared. It was declared 3 s after
// its withdrawal (moved=true: the new stream, empty, vouched for a time
// before it existed). Closed: a stream vouches only for hosts judged by
// a record stored after its creation (Tracker.ReceiptsCover): moved, the
// declaration waits (ErrReceiptsUnsound; the receipt left in the shared
// stream is not read, so no withdrawal is said); with
// receiptSinceMutation it is declared.
func TestX62MigrationDeclaresWithdrawnNATS(t *testing.T) {
	for _, c := range []struct {
		moved, mut bool
	}{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("moved=%t/receiptSinceMutation=%t", c.moved, c.mut), func(t *testing.T) {
			defer controller.SetBeaconLossMutation(true)()
			if c.mut {
				defer controller.SetReceiptSinceMutation(true)()
			}
			withdrawalReceiptNATS(t, receiptCase{receipt: true, migrate: true, moved: c.moved, wantWithdrawn: !c.moved, wantDeclared: c.mut})
		})
	}
}

// TestX62RecreatedStreamVouchesForItsPastNATS (reviewer X62): the same
// hole as TestX62MigrationDropsSharedReceiptNATS, by the fix the
// controller's own message asks for: compute-3's own stream was
// provisioned with memory storage (ReceiptsUnsound: it cannot vouch);
// compute-3 withdraws and its receipt is stored there; the operator,
// told "render its own stream ... then nats stream add --config", must
// delete and re-add it (a stream's storage cannot be edited). The new
// stream is empty and vouches — for a time before it existed. Closed:
// ReceiptRead.Since, Tracker.ReceiptsCover.
func TestX62RecreatedStreamVouchesForItsPastNATS(t *testing.T) {
	const victim = "compute-3.example.org"
	url, aj := x62StartServerWithAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, _ := natslease.WithdrawalStreamConfig(1, victim)
	mem := cfg
	mem.Storage = jetstream.MemoryStorage
	if _, err := aj.CreateStream(ctx, mem); err != nil {
		t.Fatal(err)
	}
	f := newFleetOf(t, natspermtest.Agents)
	vjs, _ := jetstream.New(natspermtest.Connect(t, url, "agent:"+victim))
	cjs, _ := jetstream.New(natspermtest.Connect(t, url, "controller:ctl-1"))
	rec := controllertest.HostRecord(victim)
	rec.State, rec.Seq = fencing.LeaseWithdrawn, 7
	m, _ := natslease.ReceiptMsg(f.signers[victim], rec, 1234, time.Now())
	if _, err := vjs.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	before, err := natslease.ReadHostReceipts(ctx, cjs, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory-storage stream: %d receipt(s), unsound: %v", len(before.Msgs), before.Unsound)
	if err := aj.DeleteStream(ctx, cfg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := aj.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	after, err := natslease.ReadHostReceipts(ctx, cjs, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("re-created as shipped: %d receipt(s), unsound: %v, created %s", len(after.Msgs), after.Unsound, after.Since.Format(time.RFC3339Nano))
	// Closed as TestX62MigrationDropsSharedReceiptNATS: the read says the
	// stream was created after the receipt (ReceiptRead.Since).
	if len(before.Msgs) == 1 && len(after.Msgs) == 0 && after.Unsound == nil && !after.Since.After(before.Msgs[0].Stored) {
		t.Errorf("compute-3's own stream, re-created after its withdrawal receipt was stored, holds none, vouches, and says it existed before the receipt")
	}
}

// TestX62AgentCannotProvisionReceiptStreamsNATS (reviewer X62, idea 4,
// held): under the shipped permissions the compromised compute-1 can
// neither delete, update nor (re-)create compute-3's own receipts
// stream, nor create one for a host that has none.
func TestX62AgentCannotProvisionReceiptStreamsNATS(t *testing.T) {
	const victim = "compute-3.example.org"
	srvURL := natspermtest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ajs, _ := jetstream.New(natspermtest.Connect(t, srvURL, "agent:compute-1.example.org"))
	cfg, _ := natslease.WithdrawalStreamConfig(1, victim)
	bad := cfg
	bad.DenyDelete, bad.DenyPurge = false, false
	try := func(what string, f func(context.Context) error) {
		c, cc := context.WithTimeout(ctx, time.Second)
		defer cc()
		if err := f(c); err == nil {
			t.Errorf("compute-1 could %s", what)
		} else {
			t.Logf("compute-1 %s: %v", what, err)
		}
	}
	try("update compute-3's stream", func(c context.Context) error { _, err := ajs.UpdateStream(c, bad); return err })
	try("delete compute-3's stream", func(c context.Context) error { return ajs.DeleteStream(c, cfg.Name) })
	other, _ := natslease.WithdrawalStreamConfig(1, "compute-9.example.org")
	try("create compute-9's stream", func(c context.Context) error { _, err := ajs.CreateStream(c, other); return err })
	cjs, _ := jetstream.New(natspermtest.Connect(t, srvURL, "controller:ctl-1"))
	if err := natslease.StreamOfReceiptsUnsound(ctx, cjs, victim); err != nil {
		t.Errorf("compute-3's stream no longer vouches: %v", err)
	}
}
