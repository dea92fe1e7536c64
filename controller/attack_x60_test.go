package controller_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// TestX60IngestFloodRefusesReceiptNATS (reviewer X60): the receipts
// stream has no stream-wide limit, but nats-server bounds every stream's
// INGEST queue (stream.go queueInbound: 100 000 msgs / 128 MiB; beyond,
// "429 Too Many Requests", the message dropped). A compromised compute-1
// may publish on its OWN receipt subject (shipped permissions), which the
// stream shared by every host captured: a flood there kept the queue
// full, and compute-3's receipt was refused (3 runs of 4). The stream
// stayed "sound" (ReceiptsUnsound nil) and held no receipt of compute-3:
// the controller, its withdrawn record hidden, declared it.
//
// Closed: each host has its own stream (proto.WithdrawalStreamOf), whose
// ingest queue no other host's publishes reach — "shipped": compute-3's
// receipts are stored throughout compute-1's flood —, and the shared
// stream vouches for no host — "shared": a refusal there leaves
// ReadHostReceipts saying Unsound, and the declaration waits
// (TestWithdrawalReceiptStopsDeclarationNATS, "no-receipt/shared-stream").
func TestX60IngestFloodRefusesReceiptNATS(t *testing.T) {
	for _, c := range []struct {
		name   string
		size   int
		conns  int
		shared bool
	}{
		{name: "shipped", size: 4000, conns: 4},
		{name: "shared", size: 4000, conns: 4, shared: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			const (
				attacker = "compute-1.example.org"
				victim   = "compute-3.example.org"
			)
			var provision []func(context.Context, jetstream.JetStream) error
			if c.shared {
				provision = append(provision, natspermtest.SharedReceiptsStream)
			}
			srvURL := natspermtest.StartServer(t, provision...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ra := newReceiptAttack(ctx, t, srvURL)
			rs, vjs := ra.rs, ra.vjs
			asubj, _ := proto.WithdrawnSubject(attacker)
			junk := []byte(strings.Repeat("x", c.size))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var sent atomic.Int64
			var too atomic.Int64
			inbox := proto.AgentInboxPrefix(attacker) + ".x60"
			for k := range c.conns {
				anc := natspermtest.Connect(t, srvURL, "agent:"+attacker, nats.ReconnectBufSize(-1))
				reply := ""
				if k == 0 {
					reply = inbox
					if _, err := anc.Subscribe(inbox, func(m *nats.Msg) {
						if m.Header.Get("Status") == "429" {
							too.Add(1)
						}
					}); err != nil {
						t.Fatal(err)
					}
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := anc.PublishMsg(&nats.Msg{Subject: asubj, Reply: reply, Data: junk}); err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						sent.Add(1)
					}
				}()
			}
			time.Sleep(time.Second)
			refused, refusedRev := 0, uint64(0)
			const tries = 20
			for i := range tries {
				if refused > 0 {
					break
				}
				m := ra.receipt(t, uint64(7+i), uint64(1234+i))
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second) // agent receiptTimeout
				_, err := vjs.PublishMsg(pctx, m)
				pcancel()
				if err != nil && !strings.Contains(err.Error(), "too many requests") {
					t.Logf("receipt %d: %v (not a refusal: may be stored late)", i, err)
				} else if err != nil {
					refused++
					refusedRev = uint64(1234 + i)
					t.Logf("receipt %d refused during compute-1's flood on its own subject: %v", i, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			t.Logf("compute-1 published %d messages of %d bytes; 429s seen by compute-1: %d", sent.Load(), c.size, too.Load())
			time.Sleep(500 * time.Millisecond)
			rr, err := natslease.ReadHostReceipts(ctx, ra.cjs, victim)
			if err != nil {
				t.Fatal(err)
			}
			if info, err := rs.Info(ctx); err == nil {
				t.Logf("stream %s: last seq %d (stored of the flood), msgs %d", info.Config.Name, info.State.LastSeq, info.State.Msgs)
			}
			t.Logf("controller reads compute-3: %d receipts, unsound=%v", len(rr.Msgs), rr.Unsound)
			if !c.shared && (refused > 0 || len(rr.Msgs) == 0) {
				t.Errorf("compute-3's own stream: %d receipt(s) refused, %d stored, during compute-1's flood on its own subject", refused, len(rr.Msgs))
			}
			if refused > 0 && rr.Unsound == nil {
				for _, m := range rr.Msgs {
					if m.Err == nil && m.Beacon.Revision >= refusedRev {
						t.Fatalf("rig: the refused receipt (revision %d) was stored", refusedRev)
					}
				}
				t.Errorf("compute-3's withdrawal receipt of revision %d refused (flood by compute-1 on its OWN receipt subject: the stream's ingest queue full), not in the stream, and the stream still vouches: a controller whose view of compute-3's key is hidden declares it", refusedRev)
			}
		})
	}
}

// TestX60ReflectOntoReceiptsStreamAPINATS: compute-1 reflects a message
// get's answer and a PubAck of its own lease put onto the receipts
// stream's JetStream API subjects (delete, purge, update, msg delete):
// the stream must survive unchanged with compute-3's receipt.
func TestX60ReflectOntoReceiptsStreamAPINATS(t *testing.T) {
	const (
		attacker = "compute-1.example.org"
		victim   = "compute-3.example.org"
	)
	srvURL := natspermtest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ra := newReceiptAttack(ctx, t, srvURL)
	rs := ra.rs
	ast, anc := permStore(t, srvURL, "agent:"+attacker, ra.f, attacker)
	if _, err := ra.vjs.PublishMsg(ctx, ra.receipt(t, 7, 1234)); err != nil {
		t.Fatal(err)
	}
	if _, err := ast.KV.Put(ctx, reflectKey, []byte(`{"seq":1}`)); err != nil {
		t.Fatal(err)
	}
	msgGet := "$JS.API.STREAM.MSG.GET." + natslease.StreamName
	body := []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.` + reflectKey + `"}`)
	for _, api := range []string{"STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE", "STREAM.UPDATE"} {
		subj := "$JS.API." + api + "." + rs.CachedInfo().Config.Name
		if err := anc.PublishMsg(&nats.Msg{Subject: msgGet, Reply: subj, Data: body}); err != nil {
			t.Fatal(err)
		}
		// The PubAck of its own lease put, reflected.
		if err := anc.PublishMsg(&nats.Msg{Subject: "$KV." + fencing.Bucket + "." + reflectKey, Reply: subj, Data: []byte(`{"seq":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	anc.Flush()
	time.Sleep(time.Second)
	info, err := rs.Info(ctx)
	if err != nil {
		t.Fatalf("receipts stream gone after reflections onto its API: %v", err)
	}
	rr, err := natslease.ReadReceipts(ctx, rs, victim)
	if err != nil || len(rr.Msgs) != 1 || rr.Unsound != nil {
		t.Fatalf("receipts changed: %+v %v (msgs %d)", rr, err, info.State.Msgs)
	}
	t.Logf("held: stream %d msgs, config subjects %v", info.State.Msgs, info.Config.Subjects)
}
