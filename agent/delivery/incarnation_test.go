package delivery

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/proto"
)

// TestOutboxIncarnation: a new outbox draws an incarnation, keeps it across
// reopens and stamps it on every record (gap markers included: see
// TestOutboxFullDropsThenGapMarker); a new outbox in a wiped directory
// starts again at seq 1 under another one.
func TestOutboxIncarnation(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	inc := o.Stats().Incarnation
	if inc == 0 {
		t.Fatalf("new outbox incarnation %q", inc)
	}
	appendN(t, o, 0, 3)
	if evs := readAll(t, o); evs[2].Incarnation != inc || evs[2].Seq != 3 {
		t.Fatalf("record %+v", evs[2])
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, dir, OutboxConfig{})
	if got := o.Stats().Incarnation; got != inc {
		t.Fatalf("reopened: incarnation %q, want %q", got, inc)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	// The state directory is lost.
	if err := os.RemoveAll(filepath.Join(dir, "outbox")); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := o.Stats().Incarnation; got == inc || got == 0 {
		t.Fatalf("recreated outbox: incarnation %q (old %q)", got, inc)
	}
	if seqs := appendN(t, o, 0, 1); seqs[0] != 1 {
		t.Fatalf("recreated outbox: first seq %d", seqs[0])
	}
}

// TestOutboxIncarnationWithoutState: state.json lost while unacked records
// remain: the incarnation is the records' (their seqs continue).
func TestOutboxIncarnationWithoutState(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	inc := o.Stats().Incarnation
	appendN(t, o, 0, 3)
	o.crash()
	if err := os.Remove(filepath.Join(dir, "outbox", stateFileName)); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := o.Stats().Incarnation; got != inc {
		t.Fatalf("incarnation %q, want the records' %q", got, inc)
	}
	if seqs := appendN(t, o, 3, 1); seqs[0] != 4 {
		t.Fatalf("next seq %d, want 4", seqs[0])
	}
}

// TestOutboxCreatedBeforeIncarnations: an outbox whose state.json has no
// incarnation (written by an agent from before them) keeps none while it
// holds unacked events (they were encoded without one): its seqs
// continue, its events carry none and keep their Msg-Ids <host>:<seq>.
// Once a start finds nothing unacked it draws one (seqs continue): those
// Msg-Ids were predictable, and JetStream deduplicates them stream-wide
// (reviewer X17: another host pre-empted this host's next event).
func TestOutboxCreatedBeforeIncarnations(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	appendN(t, o, 0, 2)
	legacyState(t, dir, o)
	o = openTest(t, dir, OutboxConfig{})
	if got := o.Stats().Incarnation; got != 0 {
		t.Fatalf("legacy outbox incarnation %q", got)
	}
	ev := testEvent(9)
	if err := o.Append(ev); err != nil || ev.Incarnation != 0 || ev.Seq != 3 {
		t.Fatalf("legacy append: %+v, %v", ev, err)
	}
	if id := proto.MsgID(testHost, o.inc, 3); id != testHost+":3" {
		t.Fatalf("legacy Msg-Id %q", id)
	}
	o.ack(3) // everything sent
	legacyState(t, dir, o)
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if o.inc == 0 {
		t.Fatal("a legacy outbox with nothing unacked kept the empty incarnation (predictable Msg-Ids)")
	}
	ev = testEvent(10)
	if err := o.Append(ev); err != nil || ev.Incarnation != o.inc || ev.Seq != 4 {
		t.Fatalf("append after the new incarnation: %+v, %v (incarnation %s)", ev, err, o.inc)
	}
}

// legacyState closes o and removes the incarnation from its state file,
// as an agent from before incarnations wrote it.
func legacyState(t *testing.T, dir string, o *Outbox) {
	t.Helper()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "outbox", stateFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	delete(st, "incarnation")
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPublishAfterOutboxLost (issue 10 item 7): the outbox is lost and a new
// one publishes to the same stream within its duplicate window. Its seqs
// restart at 1; every event must be stored, none acked as a duplicate.
func TestPublishAfterOutboxLost(t *testing.T) {
	nc, _, _ := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	ensureStream(t, nc)
	for life := 1; life <= 2; life++ {
		o := openTest(t, t.TempDir(), OutboxConfig{}) // a new state directory each life
		p := runPublisher(t, nc, o, PublisherConfig{})
		appendN(t, o, 0, 10)
		flush(t, p)
		if st := p.Stats(); st.DupAcks != 0 || st.Acked != 10 {
			t.Fatalf("life %d: %d of 10 events acked as duplicates (stats %+v)", life, st.DupAcks, st)
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
	c := deliverytest.Collect(t, nc, testHost, 20, testTimeout)
	if len(c.Events) != 20 || c.StreamMsgs != 20 {
		t.Fatalf("stream holds %d events (%d messages), want 20", len(c.Events), c.StreamMsgs)
	}
	if a, b := c.Events[0].Incarnation, c.Events[10].Incarnation; a == b || c.Events[10].Seq != 1 {
		t.Fatalf("lives: incarnations %q and %q, second life starts at seq %d", a, b, c.Events[10].Seq)
	}
}

// TestSegmentsLostAfterCrash (attack on issue 10 item 7): the agent is
// killed; its outbox's segment files are lost but state.json stays (an
// operator clearing a big backlog with rm outbox/*.seg, a partial restore).
// state.json's last_seq lags what was published (it is persisted at most
// every StatePersistInterval, here never: the clock stands still), so the
// reopened outbox assigns seqs already published under the same
// incarnation: JetStream acks them as duplicates (Msg-Id host:inc:seq) and
// a consumer drops them (seq <= last). Every event of the second life
// must be stored and be new to a consumer (a new incarnation, or seqs
// above the first life's).
func TestSegmentsLostAfterCrash(t *testing.T) {
	nc, _, _ := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	ensureStream(t, nc)
	dir := t.TempDir()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cfg := OutboxConfig{Now: func() time.Time { return at }}

	o := openTest(t, dir, cfg)
	p, err := NewPublisher(nc, o, PublisherConfig{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	appendN(t, o, 0, 5)
	flush(t, p)
	cancel()
	<-done
	o.crash() // SIGKILL
	segs, _ := filepath.Glob(filepath.Join(dir, "outbox", "*"+segSuffix))
	for _, s := range segs {
		if err := os.Remove(s); err != nil {
			t.Fatal(err)
		}
	}

	o = openTest(t, dir, cfg)
	defer o.Close()
	p2 := runPublisher(t, nc, o, PublisherConfig{})
	appendN(t, o, 5, 5)
	flush(t, p2)
	if st := p2.Stats(); st.DupAcks != 0 {
		t.Fatalf("second life: %d of 5 new events acked as duplicates, never stored (stats %+v)", st.DupAcks, st)
	}
	c := deliverytest.Collect(t, nc, testHost, 10, testTimeout)
	if len(c.Events) != 10 {
		t.Fatalf("stream holds %d events, want 10", len(c.Events))
	}
	if first, second := c.Events[4], c.Events[5]; first.Incarnation == second.Incarnation && second.Seq <= first.Seq {
		t.Fatalf("second life's first event %+v reuses the first life's incarnation and seqs (last %+v): a consumer drops it", second, first)
	}
}

// TestSegmentsKeptAfterCrashNoHole: the guard of TestSegmentsLostAfterCrash
// costs nothing in the common cases: after a crash with the segments
// intact, and after a clean stop whose segments were deleted (all acked),
// seqs continue without a hole.
func TestSegmentsKeptAfterCrashNoHole(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	appendN(t, o, 0, 3)
	o.crash()
	o = openTest(t, dir, OutboxConfig{})
	if seqs := appendN(t, o, 3, 1); seqs[0] != 4 {
		t.Fatalf("after a crash with the segments intact: next seq %d, want 4", seqs[0])
	}
	o.ack(4)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "outbox", "*"+segSuffix)); len(segs) != 0 {
		t.Fatalf("acked segments kept after Close: %q", segs)
	}
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if seqs := appendN(t, o, 4, 1); seqs[0] != 5 {
		t.Fatalf("after a clean stop: next seq %d, want 5", seqs[0])
	}
}

// TestOutboxSecondOpenRefused (attack): a second agent on the same
// state_dir (started by hand while the service runs, or a container and
// the package both) opens the same outbox: both assign the same seqs to
// different events under the same incarnation, JetStream keeps whichever
// Msg-Id arrives first and acks the other as a duplicate: events lost
// with no trace. The second open must be refused while the first lives.
func TestOutboxSecondOpenRefused(t *testing.T) {
	dir := t.TempDir()
	o1 := openTest(t, dir, OutboxConfig{})
	o2, err := OpenOutbox(filepath.Join(dir, "outbox"), OutboxConfig{Host: testHost}, testLogger(t))
	if err == nil {
		a, b := testEvent(1), testEvent(2)
		_ = o1.Append(a)
		_ = o2.Append(b)
		o2.Close()
		o1.Close()
		t.Fatalf("a second outbox opened on the same directory: it assigned seq %d/%s to another event than the first's seq %d/%s: JetStream keeps one of them",
			b.Seq, b.Incarnation, a.Seq, a.Incarnation)
	}
	t.Logf("second open: %v", err)
	// A crashed (SIGKILLed) owner does not keep the directory locked.
	o1.crash()
	o3 := openTest(t, dir, OutboxConfig{})
	if err := o3.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestIncarnationKeptWhenKilledBeforeFirstAppend (attack held): the agent
// is killed after the outbox drew its incarnation and before any append;
// the next start keeps it (state.json is written when the outbox opens).
func TestIncarnationKeptWhenKilledBeforeFirstAppend(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	inc := o.Stats().Incarnation
	o.crash()
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := o.Stats().Incarnation; got != inc {
		t.Fatalf("incarnation %s after a kill before the first append, want %s", got, inc)
	}
}

// TestOutboxSince: the records after a seq, acked ones included, while the
// outbox still holds all of them; not ok for another incarnation or once
// the records after the seq are gone (a clean Close deletes acked
// segments).
func TestOutboxSince(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	inc := o.Stats().Incarnation
	appendN(t, o, 0, 5)
	o.ack(5)
	evs, ok, err := o.Since(inc, 2)
	if err != nil || !ok || len(evs) != 3 || evs[0].Seq != 3 || evs[2].Seq != 5 {
		t.Fatalf("Since(2) = %d events, %v, %v", len(evs), ok, err)
	}
	if evs, ok, _ := o.Since(inc, 5); !ok || len(evs) != 0 {
		t.Fatalf("Since(last) = %d events, %v", len(evs), ok)
	}
	if _, ok, _ := o.Since(inc+1, 2); ok {
		t.Fatal("Since of another incarnation is ok")
	}
	o.crash()
	o = openTest(t, dir, OutboxConfig{})
	if evs, ok, _ := o.Since(inc, 2); !ok || len(evs) != 3 {
		t.Fatalf("after a crash: Since(2) = %d events, %v", len(evs), ok)
	}
	o.ack(5) // the re-sends after the crash are acked again
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if _, ok, _ := o.Since(inc, 2); ok {
		t.Fatal("after a clean Close (acked segments deleted): Since(2) is ok")
	}
}
