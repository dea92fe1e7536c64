package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX59StaleReceiptAfterBucketRecreateBlocksDeclarationNATS (c;
// reviewer X59): receipts were compared by lease-stream revision alone,
// and the receipts stream outlives the lease bucket. compute-3 withdrew
// (maintenance) at revision 100000 of the old lease bucket and stored its
// receipt; the lease bucket was then re-created (or rolled back:
// revisions restart low). compute-3 came back (a new incarnation) and
// renews at small revisions, then really dies (no withdrawal). Its stale
// receipt names revision 100000 > every trusted revision, so checkReceipt
// took it as "news" and the dead host was never declared (until its key
// passed revision 100000). Closed: a receipt is stale when the host's
// trusted record is its own, newer than the withdrawal, and stored more
// than ReceiptStaleMargin (1 s here) after the receipt
// (Tracker.ReceiptStale): declared; with receiptStaleMutation it is not
// (stopped by the receipt).
func TestX59StaleReceiptAfterBucketRecreateBlocksDeclarationNATS(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(map[bool]string{false: "fixed", true: "receiptStaleMutation"}[mut], func(t *testing.T) {
			defer controller.SetReceiptStaleMargin(time.Second)()
			if mut {
				defer controller.SetReceiptStaleMutation(true)()
			}
			x59StaleReceipt(t, mut)
		})
	}
}

func x59StaleReceipt(t *testing.T, mut bool) {
	const dead = "compute-3.example.org"
	hosts := []string{"compute-1.example.org", "compute-2.example.org", dead}
	srvURL := natspermtest.StartServer(t)
	f := newFleetOf(t, hosts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sims := natsSims(t, srvURL, f, hosts)

	// The receipts streams are provisioned (natspermtest.StartServer).
	cst, _, bnc, _ := proxiedController(t, srvURL, f)
	cjs, _ := jetstream.New(bnc)
	// compute-3's genuine receipt from the previous lease bucket's life.
	{
		rec := controllertest.HostRecord(dead)
		rec.State, rec.Incarnation, rec.Seq = fencing.LeaseWithdrawn, 1, 5
		m, err := natslease.ReceiptMsg(f.signers[dead], rec, 100000, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(sims[dead].nc)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	renewEvery(ctx, &mu, hosts, sims, func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Incarnation, rec.Seq = 2, s.seq // compute-3: back since its withdrawal
		res := s.renewRec(ctx, rec)
		if res.Outcome != fencing.RenewAcked {
			return
		}
		s.rev = res.Revision
		if m, err := natslease.BeaconMsg(f.signers[h], rec, res.Revision, 0, time.Now()); err == nil {
			_ = s.nc.PublishMsg(m)
		}
	})
	cfg := controller.DefaultConfig()
	cfg.GuardShare = 0.5
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cmu sync.Mutex
	var declared, stopped bool
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: cjs,
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			switch {
			case d.Op == controller.OpDeclare && d.Host != dead:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare && errors.Is(err, controller.ErrWithdrawalReceipt):
				stopped = true
			case d.Op == controller.OpDeclare && err == nil:
				declared = true
			}
		}}
	go r.Run(ctx)
	time.Sleep(3 * time.Second)
	mu.Lock()
	sims[dead].stop = true // real death: no withdrawal, no receipt
	mu.Unlock()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		d, st := declared, stopped
		cmu.Unlock()
		if d || mut && st {
			break
		}
	}
	cmu.Lock()
	defer cmu.Unlock()
	switch {
	case mut && declared:
		t.Fatalf("%s declared with receiptStaleMutation: the test no longer shows the hole", dead)
	case mut && !stopped:
		t.Fatalf("%s neither declared nor stopped by its stale receipt within 30 s", dead)
	case mut:
		t.Logf("with receiptStaleMutation the stale receipt stopped the declaration of the dead %s", dead)
	case !declared:
		t.Fatalf("%s died (no withdrawal) but was not declared within 30 s: a stale receipt from the previous lease bucket (revision 100000) stopped its declaration (stopped by receipt: %t)", dead, stopped)
	}
}
