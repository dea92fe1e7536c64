package natslease_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// receiptBenchHosts: the fleet of BenchmarkReceiptStreams.
const receiptBenchHosts = 1000

// receiptBenchSettle: idle time before the heap is read, past nats-server's
// file store cache expiry (10 s): the steady state of a fleet whose hosts
// stop rarely.
const receiptBenchSettle = 15 * time.Second

// BenchmarkReceiptStreams: the cost of one withdrawal receipts stream per
// host (reviewer X60's fix: proto.WithdrawalStreamOf) against its
// baseline, the previous release's one stream naming every host's
// subject, on an embedded nats-server (file storage, one replica), each
// host with one receipt stored: the heap the process holds per host once
// the streams exist (heap-B/host; the server runs in the process), the
// time to create them (create-µs/host), and one declaration's read of a
// host's receipts (ns/op: natslease.ReadHostReceipts for "own" — it opens
// the host's stream, then reads; natslease.ReadReceipts on the open
// shared stream for "shared", as the previous release read).
// `make bench` (HVG_BENCH_ONLY=receipts); docs/BENCHMARKS.md.
func BenchmarkReceiptStreams(b *testing.B) {
	for _, shape := range []string{"shared", "own"} {
		b.Run(shape, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			_, js, _ := deliverytest.JetStream(b, deliverytest.StartJetStream(b, b.TempDir(), -1))
			hosts := make([]string, receiptBenchHosts)
			for i := range hosts {
				hosts[i] = fmt.Sprintf("compute-%d.example.org", i)
			}
			before := heapInUse()
			start := time.Now()
			var shared jetstream.Stream
			if shape == "shared" {
				cfg, err := natslease.WithdrawalStreamConfig(1, hosts[0])
				if err != nil {
					b.Fatal(err)
				}
				cfg.Name, cfg.Subjects = proto.WithdrawalStream, nil
				for _, h := range hosts {
					s, _ := proto.WithdrawnSubject(h)
					cfg.Subjects = append(cfg.Subjects, s)
				}
				if shared, err = js.CreateStream(ctx, cfg); err != nil {
					b.Fatal(err)
				}
			} else {
				for _, h := range hosts {
					if _, err := natslease.EnsureWithdrawalStream(ctx, js, h); err != nil {
						b.Fatal(err)
					}
				}
			}
			created := time.Since(start)
			signer := benchSigner(b)
			for i, h := range hosts {
				rec := fencing.LeaseRecord{Host: h, State: fencing.LeaseWithdrawn, Epoch: 1, Incarnation: 1, Seq: uint64(i + 1), BootID: "b"}
				m, err := natslease.ReceiptMsg(signer, rec, uint64(i+1), time.Now())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := js.PublishMsg(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			time.Sleep(receiptBenchSettle) // the stores' write caches expire (nats-server: 10 s)
			after := heapInUse()
			for i := 0; b.Loop(); i++ {
				h := hosts[i%len(hosts)]
				var rr natslease.ReceiptRead
				var err error
				if shared != nil {
					rr, err = natslease.ReadReceipts(ctx, shared, h)
				} else {
					rr, err = natslease.ReadHostReceipts(ctx, js, h)
				}
				if err != nil || len(rr.Msgs) != 1 {
					b.Fatalf("%s: %d receipts, %v", h, len(rr.Msgs), err)
				}
			}
			// After the loop: b.Loop resets the timer and the metrics.
			b.ReportMetric(float64(after-before)/receiptBenchHosts, "heap-B/host")
			b.ReportMetric(float64(created.Microseconds())/receiptBenchHosts, "create-µs/host")
		})
	}
}

// heapInUse is the process's heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// benchSigner is a host signing key (the receipts are not verified here:
// the read's cost is the stream's).
func benchSigner(b *testing.B) fencing.Signer {
	b.Helper()
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	return fencing.Signer{ID: "bench", Key: key}
}
