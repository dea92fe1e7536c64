package controller_test

import (
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"fmt"
	"hvguard/controller/controllertest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"testing"
	"time"

	"hvguard/controller"
)

// TestX65DeleteLoopForcesCreatesKeepsDeadHostUndeclared ((c), a
// regression of 8ec2252, the tracker alone): compute-1 deletes
// compute-3's lease key after each of its writes (any agent may delete
// any key: relays). compute-3's agent meets the marker and re-creates its
// key (fencing/keydelete.go: Store.cas with rev 0, a create: prev_rev 0)
// every time, so every trusted record the controller holds of it is a
// create — which counted from nothing (coverNever, Tracker.coverStart).
// compute-3 then dies right after a create; compute-1's next delete
// lands as usual. The key is deleted (MayHideWrite): receipts matter, and
// no receipts stream covered the host — not even compute-3's own shipped
// stream created long before everything — so the declaration waited on
// ErrReceiptsUnsound for ever (docs/security.md "Key deleted": "the
// delete stops nothing" no longer held).
//
// Closed: a create newer than a trusted record of its host counts from
// what that record counted from (the host seals in identity order;
// hostState.bound, carried over the delete by recreated): the stream
// created an hour before covers. With createChainMutation it does not.
func TestX65DeleteLoopForcesCreatesKeepsDeadHostUndeclared(t *testing.T) {
	const host = "compute-3.example.org"
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("createChainMutation=%t", mut), func(t *testing.T) {
			if mut {
				defer controller.SetCreateChainMutation(true)()
			}
			tr, rec, t0, now := x64Tracked(t, host)
			rev := uint64(5)
			at := t0
			// Three cycles: compute-1's delete, compute-3's create —
			// every revision delivered (no skip at all).
			for i := range 3 {
				rev++
				at = at.Add(time.Second)
				tr.Stored(host, rev, at)
				tr.Observe(now, host, rev, nil) // compute-1's delete
				rev++
				at = at.Add(time.Second)
				rec.Seq, rec.PrevRev = uint64(2+i), 0
				tr.Stored(host, rev, at)
				tr.Observe(now, host, rev, &rec) // compute-3's create
			}
			// compute-3 dies; compute-1 deletes once more.
			rev++
			at = at.Add(time.Second)
			tr.Stored(host, rev, at)
			tr.Observe(now, host, rev, nil)
			if !tr.ReceiptsMatter(host) {
				t.Fatal("receipts do not matter over a delete marker")
			}
			// compute-3's own receipts stream, created an hour before
			// anything of it was seen (the shipped provisioning).
			created := t0.Add(-time.Hour)
			if got := tr.ReceiptsCover(host, created); mut && got {
				t.Fatal("createChainMutation: the stream covers a host whose trusted record is a create: the test no longer shows the hole")
			} else if mut {
				return
			}
			if !tr.ReceiptsCover(host, created) {
				t.Fatalf("compute-3's own receipts stream, created at %s (an hour before its first record seen), does not cover it: its trusted record is a create (coverNever), the declaration waits on ErrReceiptsUnsound until compute-3 writes again — it is dead: never declared; compute-1 made every record a create by deleting the key after each write", created.Format(time.RFC3339))
			}
		})
	}
}

// TestX65DeleteLoopKeepsDeadHostUndeclaredNATS ((c), end to end, the
// shipped permissions and provisioning — compute-3's own receipts stream,
// created before everything; no operator action, no watch cut): compute-1
// deletes compute-3's lease key after each of compute-3's writes, so
// compute-3 re-creates it every time (a create: prev_rev 0). compute-3
// dies (power loss: no withdrawal, no receipt); its key ends deleted
// (compute-1's delete after its last create). Wanted: declared (a delete
// stops nothing, docs/security.md "Key deleted"). loop=false (control):
// compute-1 deletes the key once, after the death — compute-3's last
// record is an update: declared. On 8ec2252 the loop kept it undeclared
// (ErrReceiptsUnsound at every tick); closed by the create chain
// (Tracker.coverStart), and with createChainMutation not declared.
func TestX65DeleteLoopKeepsDeadHostUndeclaredNATS(t *testing.T) {
	for _, c := range []struct{ loop, mut bool }{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("delete-loop=%t/createChainMutation=%t", c.loop, c.mut), func(t *testing.T) {
			legacyCreates(t) // the create chain matters for creates sealed for 0
			if c.mut {
				defer controller.SetCreateChainMutation(true)()
			}
			x65DeleteLoopStartNATS(t, c.loop, false, false, !c.mut)
		})
	}
}

// x65DeleteLoopStartNATS: startLate, the controller starts (a restart, a
// new leader's first listing) while compute-1's loop already runs.
// wantDeclared: the dead compute-3 is declared within 30 s.
// oldReceipt (reviewer X70): compute-3's agent, incarnation 1, stopped in
// order once (an upgrade) before everything: its withdrawal's receipt
// (revision 1) is in its own stream, and its records are of incarnation 2.
func x65DeleteLoopStartNATS(t *testing.T, loop, startLate, oldReceipt, wantDeclared bool) {
	const attacker, companion, victim = loopAttacker, loopCompanion, loopVictim
	ctx, srvURL, hosts, f, sims, vkey := newLoopRig(t)
	var mu sync.Mutex
	inc := uint64(0)
	if oldReceipt {
		// Stored with a publish ack, as the agent does.
		rec := controllertest.HostRecord(victim)
		rec.State, rec.Incarnation, rec.Seq = fencing.LeaseWithdrawn, 1, 7
		m, err := natslease.ReceiptMsg(f.signers[victim], rec, 1, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(sims[victim].nc)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		inc = 2 // the agent started again since
	}
	creates := 0
	looping := false // under mu
	renew := func(h string) {
		s := sims[h]
		s.seq++
		rec := controllertest.HostRecord(h)
		rec.Incarnation, rec.Seq = inc, s.seq
		res, created, _ := loopRenew(ctx, s, f, rec)
		if res.Outcome != fencing.RenewAcked {
			t.Logf("%s: renewal: %+v", h, res)
			return
		}
		if created && h == victim {
			creates++
		}
		if h == victim && looping {
			// compute-1, watching the bucket, deletes compute-3's key
			// right after each of its writes.
			if err := sims[attacker].st.KV.Delete(ctx, vkey); err != nil {
				t.Errorf("compute-1's delete: %v", err)
			}
			s.rev = 0 // compute-3's next write meets the marker: a create
		}
	}
	renewEvery(ctx, &mu, hosts, sims, renew)
	if startLate {
		mu.Lock()
		looping = loop
		mu.Unlock()
		time.Sleep(time.Second)
	}

	cst, bnc, cjs, tr := vouchingController(ctx, t, srvURL, f, victim)
	var cmu sync.Mutex
	var declared time.Time
	var waits []error
	lost := "" // a refused-due of the victim for lost beacons (beaconloss.go)
	r := &controller.Runner{Store: cst, Tracker: tr, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Beacons: bnc, Receipts: cjs,
		OnDecision: func(d controller.Decision, err error) {
			cmu.Lock()
			defer cmu.Unlock()
			if x65Debug && d.Host == victim && d.Op != controller.OpLeaseDeleted {
				t.Logf("decision %v rev %d err %v: %s", d.Op, d.Revision, err, d.Reason)
			}
			if d.Host == victim && d.Op == controller.OpRefusedDue && strings.Contains(d.Reason, "beacons were lost") {
				lost = d.Reason
			}
			switch {
			case d.Op == controller.OpDeclare && d.Host != victim:
				t.Errorf("declared the live %s", d.Host)
			case d.Op == controller.OpDeclare && err != nil:
				if len(waits) < 3 {
					waits = append(waits, err)
				}
			case d.Op == controller.OpDeclare && declared.IsZero():
				declared = time.Now()
			}
		}}
	go r.Run(ctx)
	time.Sleep(2 * time.Second) // renewing: the controller trusts every host's record
	mu.Lock()
	looping = loop
	mu.Unlock()
	time.Sleep(2 * time.Second) // loop: compute-3's key deleted and re-created ~10 times

	mu.Lock()
	sims[victim].stop = true // power loss
	at := time.Now()
	if !loop {
		if err := sims[attacker].st.KV.Delete(ctx, vkey); err != nil {
			t.Fatal(err)
		}
	}
	nCreates := creates
	mu.Unlock()
	t.Logf("compute-3 created its key %d times (loop %t) and died", nCreates, loop)
	// Declared 3 s after the death when it is (lease_ttl + grace 3.05 s
	// at the rig's timings); a hole shown in 12 s keeps make test short.
	watch := 30 * time.Second
	if !wantDeclared {
		watch = 12 * time.Second
	}
	for deadline := time.Now().Add(watch); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cmu.Lock()
		done := !declared.IsZero()
		cmu.Unlock()
		if done {
			break
		}
	}
	cmu.Lock()
	defer cmu.Unlock()
	if !wantDeclared {
		if !declared.IsZero() {
			t.Fatalf("%s declared %s after its death: the test no longer shows the hole", victim, declared.Sub(at).Round(10*time.Millisecond))
		}
		t.Logf("%s not declared within %s of its death (the declaration waits: %v)", victim, watch, waits)
		return
	}
	if declared.IsZero() && lost != "" && len(waits) == 0 {
		// Another mechanism, documented and fail-safe: beacons lost on a
		// loaded machine (seen in about 1 run of 10 with 4 copies of this
		// test at once, before and after reviewer X73's change) open a
		// loss window, and a host whose write the watch may have hidden
		// meanwhile is refused-due, not declared (docs/security.md).
		t.Skipf("not declared: refused-due for lost beacons (beaconloss.go), not this test's mechanism: %s", lost)
	}
	if declared.IsZero() {
		t.Fatalf("the dead %s not declared within 30 s of its death (compute-1's delete loop %t: every trusted record a create, covered by no receipts stream); the declaration waits: %v", victim, loop, waits)
	}
	t.Logf("%s declared %s after its death", victim, declared.Sub(at).Round(10*time.Millisecond))
}

var x65Debug = false

// TestX65DeleteLoopAcrossStartNATS ((c), closed): compute-1's delete loop
// (above) already runs when the controller starts (a restart, an upgrade,
// a new leader that lists the bucket). Every value of compute-3 it sees
// is a create over a delete marker — never "written fresh"
// (fencing.Written.Fresh: a genuine create and a replayed one look alike
// there) — so the controller never held a trusted record of compute-3,
// and a host without one is never declared: compute-3 died, undeclared
// while the loop ran. Closed: compute-3's own beacon, naming the
// revision and identity of a create, vouches for it (vouch.go), and the
// vouched create counts receipts coverage from the marker before it
// (Tracker.coverStart). Mutations: vouch (never trusted) and cover (a
// vouched create covered by no receipts stream: the declaration waits on
// ErrReceiptsUnsound): not declared.
func TestX65DeleteLoopAcrossStartNATS(t *testing.T) {
	for _, c := range []struct {
		name       string
		mut, cover bool
		anchored   bool
	}{{"vouched", false, false, false}, {"vouchMutation", true, false, false}, {"vouchCoverMutation", true, true, false},
		// Anchored creates (the agents' default): verified fresh when the
		// controller reads the stored message before the loop's next
		// delete, or — the loop's delete superseded it first (reviewer
		// X85's race: this case with vouchMutation once failed under CI
		// load) — when the watch delivered it directly after the marker
		// it was sealed for (natslease.Update.After): no vouching needed.
		{"anchored", false, false, true}, {"anchored/vouchMutation", true, false, true}} {
		t.Run(c.name, func(t *testing.T) {
			if !c.anchored {
				legacyCreates(t)
			}
			if c.mut {
				defer controller.SetVouchMutation(c.cover)()
			}
			x65DeleteLoopStartNATS(t, true, true, false, !c.mut || c.anchored)
		})
	}
}

// legacyCreates: the simulated agents seal a create over a delete marker
// for revision 0, as agents before anchored creates did (and as a relay's
// create still is): the creates the vouching (vouch.go) is for.
func legacyCreates(t *testing.T) {
	natslease.AnchorMutation = true
	t.Cleanup(func() { natslease.AnchorMutation = false })
}

// TestX65GarbageAfterHiddenWithdrawalThenPutBack (held; the tracker
// alone): trusted record at rev 5 (t0); compute-3's renewal P at 6 and
// its withdrawal at 7 hidden (a skip); compute-1's garbage at 8 (t0+10 s,
// delivered); the withheld relay sealed for P put back at 9 (t0+11 s).
// storedBefore(9) would be the garbage's time, after the withdrawal — but
// the put-back names prev_rev 6 < 8: a replay, refused (never trusted),
// and the host is judged by rev 5: a stream created at t0+5 s must not
// cover it.
func TestX65GarbageAfterHiddenWithdrawalThenPutBack(t *testing.T) {
	const host = "compute-3.example.org"
	for _, prev := range []uint64{5, 6} {
		t.Run(fmt.Sprintf("prev_rev=%d", prev), func(t *testing.T) {
			tr, rec, t0, now := x64Tracked(t, host)
			tr.Skipped(8)
			tr.Stored(host, 8, t0.Add(10*time.Second))
			tr.ObserveInvalid(now, host, 8, "garbage", false)
			rec.Seq, rec.PrevRev = 2, prev
			tr.Stored(host, 9, t0.Add(11*time.Second))
			tr.Observe(now, host, 9, &rec)
			x64WantCover(t, tr, host, t0.Add(5*time.Second), false)
		})
	}
}

// TestX65StaleRedeliveryThenPutBack (held; the tracker alone): a
// re-watch's listing re-delivers the key's last value (same revision,
// Stored called again: the stamp's prev is dropped) before the put-back
// arrives; coverage still counts from that value (rev 5, t0).
func TestX65StaleRedeliveryThenPutBack(t *testing.T) {
	const host = "compute-3.example.org"
	tr, rec, t0, now := x64Tracked(t, host)
	tr.Skipped(5)
	tr.Stored(host, 5, t0)
	tr.Observe(now, host, 5, &rec) // stale delivery
	rec.Seq, rec.PrevRev = 2, 6
	tr.Skipped(8)
	tr.Stored(host, 8, t0.Add(10*time.Second))
	tr.Observe(now, host, 8, &rec)
	x64WantCover(t, tr, host, t0.Add(5*time.Second), false)
}
