package controller_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/controller"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestRunnerDeclaresSilentHost: against a real JetStream KV, three hosts
// renew; h0 stops; the runner declares it (by CAS, next epoch) after
// lease_ttl + grace and never declares the others; a refused host is
// never declared.
func TestRunnerDeclaresSilentHost(t *testing.T) {
	srv := deliverytest.StartJetStream(t, t.TempDir(), -1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	st := &natslease.Store{KV: kv}
	timing := fencing.DefaultTiming()
	timing.RenewInterval, timing.RenewTimeout, timing.PeerTimeout = 200*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond
	timing.FenceDeadline, timing.LeaseTTL = 500*time.Millisecond, 1500*time.Millisecond
	rec := func(h string, bs fencing.Backstop) fencing.LeaseRecord {
		return fencing.LeaseRecord{Schema: 1, Host: h, State: fencing.LeaseActive, FencingEnabled: true,
			Action: fencing.ActionPause, Backstop: bs, Timing: timing}
	}
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5                    // 4 hosts: threshold 2
	cfg.AcceptAgentDependentBackstop = true // the hosts here advertise reset
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []controller.Decision
	r := &controller.Runner{Store: st, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnDecision: func(d controller.Decision, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				got = append(got, d)
			}
		}}
	revs := map[string]uint64{}
	write := func(h string, bs fencing.Backstop) {
		if n, err := st.Write(ctx, h, revs[h], rec(h, bs), time.Second); err == nil {
			revs[h] = n
		}
	}
	for _, h := range []string{"h0", "h1", "h2"} {
		write(h, fencing.BackstopReset)
	}
	write("h3", fencing.BackstopNone)
	go r.Run(ctx)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		write("h1", fencing.BackstopReset)
		write("h2", fencing.BackstopReset)
		if time.Since(start) < time.Second {
			write("h0", fencing.BackstopReset)
		}
		time.Sleep(150 * time.Millisecond)
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	var declared []string
	refused := false
	for _, d := range got {
		switch d.Op {
		case controller.OpDeclare:
			declared = append(declared, d.Host)
		case controller.OpRefuse:
			refused = refused || d.Host == "h3"
		}
	}
	if len(declared) != 1 || declared[0] != "h0" || !refused {
		t.Fatalf("declared %v (want [h0]), h3 refused %v; decisions %v", declared, refused, got)
	}
	cur, _, err := st.Read(context.Background(), "h0")
	if err != nil || cur.State != fencing.LeaseExpired || cur.Epoch != 1 {
		t.Fatalf("h0 record %+v %v", cur, err)
	}
}
