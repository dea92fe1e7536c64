package controller_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestX70CASRaceKeepsDeadHostUndeclaredNATS (reviewer X70; HELD): the
// controller declares a host by ONE compare-and-set on the revision its
// watch last delivered (Tracker.Tick: Decision.Revision = h.rev;
// Runner.perform: checkReceipt's reads, then Store.Write = KV.Update on
// that revision), and after a failure tries again only DeclareRetry (5 s)
// later. Any agent may put any lease key. Hypothesis: compute-1 puts
// garbage into the dead compute-3's key fast enough that the key's
// revision always moves between the delivery the tick used and the
// compare-and-set (after the receipt read's round trips), without making
// the watch skip. Measured on the embedded server (2 shared cores): at
// 700–3000 puts/s, 0 to 3 declarations in a row missed (revision
// mismatch), declared 3–18.5 s after the death instead of 3 s — each
// miss costs DeclareRetry; tight loops (11 000+ puts/s), and once 700/s
// under load, make the watch skip and beacons go missing: refused-due,
// the documented flood (c) (skipped as such). A delay geometric in the
// miss rate, not shown unbounded here; the window is a few round trips
// on loopback, wider on a clustered stream (not measured).
//
// A soak, not a check (it held; under load the flood turns into the
// documented refused-due and the case skips): run it with
// HVG_X70_CAS=1 go test -count=1 -v -run TestX70CASRace ./controller/
// (about 45 s of a loaded machine).
func TestX70CASRaceKeepsDeadHostUndeclaredNATS(t *testing.T) {
	if os.Getenv("HVG_X70_CAS") == "" {
		t.Skip("a soak: HVG_X70_CAS=1 runs it (docs/security.md, What is left)")
	}
	for _, c := range []struct {
		name    string
		putters int
		flood   time.Duration
	}{
		{"control", 0, 0},
		{"flood-1ms", 1, time.Millisecond},
		{"flood-300us", 1, 300 * time.Microsecond},
		// Tight loops (1 to 4 putters, 11 000–20 000 puts/s) make the
		// watch skip and the runner find beacons lost: refused-due, the
		// documented "flood that keeps the watch skipping" (c), not this
		// race — not run here.
	} {
		t.Run(c.name, func(t *testing.T) { x70CASRace(t, c.putters, c.flood) })
	}
}

func x70CASRace(t *testing.T, putters int, flood time.Duration) {
	const attacker, companion, victim = loopAttacker, loopCompanion, loopVictim
	ctx, srvURL, hosts, f, sims, vkey := newLoopRig(t)
	ctx, cancel := context.WithCancel(ctx) // stopped before the counts are read
	defer cancel()
	var mu sync.Mutex
	renew := func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Seq = s.seq
		res := s.renewRec(ctx, rec)
		if res.Outcome != fencing.RenewAcked {
			return
		}
		if m, err := natslease.BeaconMsg(f.signers[h], rec, res.Revision, 0, time.Now()); err == nil {
			_ = s.nc.PublishMsg(m)
		}
	}
	renewEvery(ctx, &mu, hosts, sims, renew)

	cst, bnc, cjs, tr := vouchingController(ctx, t, srvURL, f, victim)
	var cmu sync.Mutex
	var declared time.Time
	attempts, mismatches := 0, 0
	other := map[string]int{}
	lost := 0
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: cjs,
		OnBeaconsLost: func(string, []string) { cmu.Lock(); lost++; cmu.Unlock() },
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			switch {
			case d.Op == controller.OpDeclare && d.Host != victim:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare:
				attempts++
				switch {
				case err == nil:
					if declared.IsZero() {
						declared = time.Now()
					}
				case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || natslease.IsConflict(err):
					mismatches++
				default:
					other[err.Error()]++
				}
			case d.Op == controller.OpRefusedDue && d.Host == victim:
				other["refused-due: "+d.Reason]++
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing: the controller trusts every host's record

	mu.Lock()
	sims[victim].stop = true // power loss
	at := time.Now()
	mu.Unlock()
	puts := 0
	for range putters {
		go func() {
			for ctx.Err() == nil {
				if _, err := sims[attacker].st.KV.Put(ctx, vkey, []byte("garbage")); err == nil {
					mu.Lock()
					puts++
					mu.Unlock()
				}
				if flood > 0 {
					time.Sleep(flood)
				}
			}
		}()
	}
	const watchFor = 30 * time.Second
	for deadline := at.Add(watchFor); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		done := !declared.IsZero()
		cmu.Unlock()
		if done {
			break
		}
	}
	cancel()
	cmu.Lock()
	defer cmu.Unlock()
	mu.Lock()
	n := puts
	mu.Unlock()
	t.Logf("compute-1's puts into compute-3's key: %d; declaration attempts %d, revision mismatches %d, other %v; beacon loss windows %d", n, attempts, mismatches, other, lost)
	if declared.IsZero() {
		for k := range other {
			if strings.HasPrefix(k, "refused-due") {
				// The watch skipped and beacons went missing: the
				// documented flood (c) took over, not this race.
				t.Skipf("not declared: refused-due after watch skips and a beacon loss window (the documented flood, docs/security.md What is left): %s", k)
			}
		}
		t.Fatalf("the dead %s not declared within %s of its death (lease_ttl + grace 3.05 s at ×0.1), no watch skip said: each declaration's compare-and-set missed (%d of %d attempts: revision mismatch)",
			victim, watchFor, mismatches, attempts)
	}
	// Each miss costs DeclareRetry (5 s): measured 0–3 misses in a row at
	// 700–3000 puts/s (declared 3–18.5 s after the death) — a delay,
	// geometric in the miss rate, not a hold.
	t.Logf("%s declared %s after its death", victim, declared.Sub(at).Round(10*time.Millisecond))
}

// TestX70DeleteLoopOldReceiptOtherProcessNATS (reviewer X70, (c)): the
// X65 delete loop against a running controller — compute-1 deletes
// compute-3's lease key after each of compute-3's writes, so every record
// compute-3 writes is a create (prev_rev 0), each trusted (newer, of the
// same agent process: Tracker.Observe, recreated) — closed for a host
// WITHOUT receipts by the create chain (TestX65DeleteLoopKeepsDeadHostUndeclaredNATS).
// But compute-3, like any host whose agent was ever stopped in order (an
// upgrade, a reboot), has an old withdrawal receipt in its own stream,
// of an earlier agent process (incarnation 1; it now runs incarnation
// 2), naming a revision long before its current records. compute-3 dies.
// Before the declaration the leader reads its receipts (checkReceipt):
// the newest one is that old receipt, and Tracker.SealedBefore says, for
// a trusted create, "a receipt of another agent process than the
// record" → true (reviewer X69's reusedRev rule, meant for re-created
// buckets) — whatever its revision (1, below everything) — and the
// declaration waits on ErrReceiptAfterSeal at every tick, for good:
// compute-3 is dead and never writes again. compute-1 can stop its loop
// once compute-3 is dead; nothing ends the wait.
// Controls: no old receipt (X65's case) and no loop (the trusted record
// is an update: SealedBefore compares revisions) — both declared.
func TestX70DeleteLoopOldReceiptOtherProcessNATS(t *testing.T) {
	for _, c := range []struct {
		name               string
		loop, receipt, mut bool
	}{
		{"attack", true, true, false},
		{"control/no-loop", false, true, false},
		{"control/no-receipt", true, false, false},
		// The cause: with SealedBefore's other-process rule for a create
		// off (reusedRevMutation), the attack's compute-3 is declared.
		{"attack/reusedRevMutation", true, true, true},
		// The fix: the beacons' named writes of the record's process
		// above the receipt's revision (Tracker.SealedBefore); without
		// it, not declared.
		{"attack/procAfterMutation", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := true
			switch {
			case c.name == "attack/procAfterMutation":
				defer controller.SetProcAfterMutation(true)()
				want = false
			case c.mut:
				defer controller.SetReusedRevMutation(true)()
			}
			x70LoopOldReceipt(t, c.loop, c.receipt, want)
		})
	}
}

func x70LoopOldReceipt(t *testing.T, loop, oldReceipt, wantDeclared bool) {
	legacyCreates(t) // what the receipt rule judges: creates sealed for 0
	x65DeleteLoopStartNATS(t, loop, false, oldReceipt, wantDeclared)
}
