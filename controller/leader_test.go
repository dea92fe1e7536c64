package controller

import (
	"strings"
	"testing"
	"time"
)

func mustLeader(t *testing.T, id string) *Leader {
	t.Helper()
	l, err := NewLeader(DefaultLeaderConfig(id))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// elected returns a Leader that took an absent lock at lsT0 + w (w =
// TakeoverAfter), its write landing at once at revision 1.
func elected(t *testing.T, id string) (l *Leader, take LeaderOp, t0 time.Time, w time.Duration) {
	t.Helper()
	l = mustLeader(t, id)
	t0 = lsT0
	l.WatchStarted(t0)
	l.Observe(t0, 0, nil)
	w = TakeoverAfter(DefaultLeaderTTL, DefaultDrift)
	take = l.Tick(t0.Add(w))[0]
	l.WriteResult(t0.Add(w), take.Record, WriteLanded, 1, nil)
	return l, take, t0, w
}

func opKinds(ops []LeaderOp) string {
	var s []string
	for _, o := range ops {
		s = append(s, o.Kind.String())
	}
	return strings.Join(s, ",")
}

// A standby takes an absent lock only after watching it stand still for
// TakeoverAfter(TTL); it may act once its write landed, until TTL −
// ActMargin after that write was SENT.
func TestLeaderElectionTiming(t *testing.T) {
	l := mustLeader(t, "a")
	t0 := lsT0
	l.WatchStarted(t0)
	l.Observe(t0, 0, nil)
	wait := TakeoverAfter(DefaultLeaderTTL, DefaultDrift)
	if ops := l.Tick(t0.Add(wait - time.Millisecond)); len(ops) != 0 {
		t.Fatalf("took the lock before %s: %v", wait, ops)
	}
	ops := l.Tick(t0.Add(wait))
	if len(ops) != 1 || ops[0].Kind != LeaderWrite || ops[0].Revision != 0 || ops[0].Record.Term != 1 {
		t.Fatalf("takeover ops %+v", ops)
	}
	sent := t0.Add(wait)
	if l.MayAct(sent) {
		t.Fatal("may act before the write landed")
	}
	// The answer comes 1.5 s later: validity counts from the send time.
	ans := sent.Add(1500 * time.Millisecond)
	if got := opKinds(l.WriteResult(ans, ops[0].Record, WriteLanded, 7, nil)); got != "elected" {
		t.Fatalf("after landing: %s", got)
	}
	end := sent.Add(DefaultLeaderTTL - DefaultActMargin)
	if !l.MayAct(end.Add(-time.Millisecond)) || l.MayAct(end) {
		t.Fatalf("MayAct window must end at send + TTL − ActMargin = %s", end.Sub(t0))
	}
	// It renews every RenewInterval by CAS on its own revision.
	if ops := l.Tick(sent.Add(DefaultLeaderRenew)); len(ops) != 1 || ops[0].Revision != 7 || ops[0].Record.Seq != 2 {
		t.Fatalf("renewal ops %+v", ops)
	}
}

// A renewal with no answer does not extend the lease; the next one is
// sent on the same expected revision; if the first is then seen landed
// (watch), it counts from its own send time.
func TestLeaderUnknownRenewal(t *testing.T) {
	l, _, t0, w := elected(t, "a")
	r1 := l.Tick(t0.Add(w + DefaultLeaderRenew))[0]
	s1 := t0.Add(w + DefaultLeaderRenew)
	// No answer: after the write timeout the core retries, faster, on rev 1.
	later := s1.Add(WriteTimeout + DefaultLeaderRenew/2)
	r2 := l.Tick(later)
	if len(r2) != 1 || r2[0].Revision != 1 || r2[0].Record.Seq != r1.Record.Seq+1 {
		t.Fatalf("retry %+v", r2)
	}
	if l.ValidUntil() != t0.Add(w+DefaultLeaderTTL-DefaultActMargin) {
		t.Fatalf("an unanswered renewal extended the lease to %s", l.ValidUntil().Sub(t0))
	}
	// The watch shows r1 landed (rev 2): validity from s1.
	l.Observe(later, 2, &r1.Record)
	if got := l.ValidUntil(); !got.Equal(s1.Add(DefaultLeaderTTL - DefaultActMargin)) {
		t.Fatalf("late landing counted from %s, want its send time", got.Sub(t0))
	}
	// r2 (on rev 1) then conflicts with our own r1: adopted, not deposed.
	if got := opKinds(l.WriteResult(later.Add(time.Second), r2[0].Record, WriteConflict, 2, &r1.Record)); got != "" || !l.Leading() {
		t.Fatalf("conflict with own record: %q leading=%v", got, l.Leading())
	}
}

// Another holder in the watch, or a conflict with one, deposes at once.
func TestLeaderDeposed(t *testing.T) {
	for _, how := range []string{"watch", "conflict", "deleted"} {
		t.Run(how, func(t *testing.T) {
			l, _, t0, w := elected(t, "a")
			now := t0.Add(w + time.Second)
			other := LockRecord{Schema: LockSchema, Holder: "b", Term: 2, Seq: 1, TTLMillis: 10000, Drift: 0.01}
			var ops []LeaderOp
			switch how {
			case "watch":
				ops = l.Observe(now, 5, &other)
			case "deleted":
				ops = l.Observe(now, 5, nil)
			case "conflict":
				r := l.Tick(t0.Add(w + DefaultLeaderRenew))[0]
				ops = l.WriteResult(now, r.Record, WriteConflict, 5, &other)
			}
			if opKinds(ops) != "deposed" || l.Leading() || l.MayAct(now) {
				t.Fatalf("ops %v leading %v", ops, l.Leading())
			}
			// Its next claim uses a higher term than any seen.
			l.Observe(now, 6, &other)
			next := l.Tick(now.Add(w))
			if how != "deleted" && (len(next) != 1 || next[0].Record.Term <= other.Term) {
				t.Fatalf("next claim %+v", next)
			}
		})
	}
}

// Resigning: the holder stops acting at once and writes a released
// record; a standby that sees it takes over after TakeoverAfter(ActMargin),
// not a whole TTL.
func TestLeaderResignHandover(t *testing.T) {
	a, take, t0, w := elected(t, "a")
	b := mustLeader(t, "b")
	b.WatchStarted(t0.Add(w))
	b.Observe(t0.Add(w), 1, &take.Record)
	now := t0.Add(w + time.Second)
	ops := a.Resign()
	if opKinds(ops) != "deposed,lock-write" || !ops[1].Record.Released || a.MayAct(now) {
		t.Fatalf("resign ops %+v", ops)
	}
	b.Observe(now, 2, &ops[1].Record)
	fast := TakeoverAfter(DefaultActMargin, DefaultDrift)
	if got := b.Tick(now.Add(fast - time.Millisecond)); len(got) != 0 {
		t.Fatalf("took over before %s: %v", fast, got)
	}
	if got := b.Tick(now.Add(fast)); len(got) != 1 || got[0].Revision != 2 || got[0].Record.Term != 2 {
		t.Fatalf("takeover after resign %+v", got)
	}
}

func TestLockRecordDecode(t *testing.T) {
	good := LockRecord{Schema: LockSchema, Holder: "a", Term: 1, Seq: 1, TTLMillis: 10000, Drift: 0.01}
	b, err := good.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeLockRecord(b); err != nil || got != good {
		t.Fatalf("round trip %+v %v", got, err)
	}
	for name, bad := range map[string]string{
		"schema": `{"schema":2,"holder":"a","term":1,"ttl_ms":1000}`,
		"holder": `{"schema":1,"term":1,"ttl_ms":1000}`,
		"term":   `{"schema":1,"holder":"a","ttl_ms":1000}`,
		"ttl":    `{"schema":1,"holder":"a","term":1}`,
		"drift":  `{"schema":1,"holder":"a","term":1,"ttl_ms":1000,"drift":0.7}`,
		"json":   `{`,
	} {
		if _, err := DecodeLockRecord([]byte(bad)); err == nil {
			t.Errorf("%s: accepted %s", name, bad)
		}
	}
}

func TestLeaderConfigValidate(t *testing.T) {
	c := DefaultLeaderConfig("a")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.RenewInterval = 7 * time.Second // 7 + 2 + 2 ≥ 10
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "must be < ttl") {
		t.Fatalf("renew too long accepted: %v", err)
	}
	c = DefaultLeaderConfig("")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "id is empty") {
		t.Fatalf("empty id: %v", err)
	}
}

// A watch that started before an operator deleted the key may deliver its
// "absent" snapshot after the delete marker: the takeover must still be a
// CAS on the marker's revision (found by the simulation: a CAS on 0
// conflicted forever and no controller ever led).
func TestLeaderStaleAbsentSnapshotAfterDelete(t *testing.T) {
	l := mustLeader(t, "a")
	t0 := lsT0
	l.WatchStarted(t0)
	l.Observe(t0, 1, nil) // the delete marker
	l.Observe(t0, 0, nil) // the snapshot, late
	ops := l.Tick(t0.Add(TakeoverAfter(DefaultLeaderTTL, DefaultDrift)))
	if len(ops) != 1 || ops[0].Revision != 1 {
		t.Fatalf("takeover %+v, want a CAS on revision 1", ops)
	}
	// And a conflict that reveals a newer revision is taken as observed.
	l.WriteResult(t0.Add(time.Minute), ops[0].Record, WriteConflict, 5, nil)
	if next := l.Tick(t0.Add(time.Minute + TakeoverAfter(DefaultLeaderTTL, DefaultDrift))); len(next) != 1 || next[0].Revision != 5 {
		t.Fatalf("after a conflict at revision 5: %+v", next)
	}
}
