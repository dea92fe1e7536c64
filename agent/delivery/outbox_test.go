package delivery

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"hvguard/proto"
)

const testHost = "cmp-01.example"

var testTime = time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)

// tb is what the test helpers need of testing.TB and *rapid.T.
type tb interface {
	Helper()
	Log(args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func testLogger(t tb) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t tb }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

func testEvent(i int) *proto.LifecycleEvent {
	return &proto.LifecycleEvent{
		DomainUUID: fmt.Sprintf("00000000-0000-4000-8000-%012x", i),
		DomainName: fmt.Sprintf("instance-%08x", i),
		Transition: proto.TransitionStopped, Reason: "running-at-window-end", State: "shutoff",
		LibvirtEvent: "STOPPED", LibvirtDetail: "DESTROYED",
		OccurredAt: testTime.Add(time.Duration(i) * time.Millisecond), ObservedAt: testTime.Add(time.Second),
	}
}

func openTest(t tb, dir string, cfg OutboxConfig) *Outbox {
	t.Helper()
	cfg.Host = testHost
	o, err := OpenOutbox(filepath.Join(dir, "outbox"), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("OpenOutbox: %v", err)
	}
	return o
}

// crash simulates the agent being killed: no final sync, state write or
// cleanup (written data stays, as it would in the page cache).
func (o *Outbox) crash() {
	close(o.stop)
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closeFiles()
	o.closed = true
}

func appendN(t testing.TB, o *Outbox, from, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := from; i < from+n; i++ {
		ev := testEvent(i)
		if err := o.Append(ev); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
		seqs = append(seqs, ev.Seq)
	}
	return seqs
}

// readAll syncs and returns every unacked record, decoded.
func readAll(t tb, o *Outbox) []proto.LifecycleEvent {
	t.Helper()
	if err := o.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	recs, err := o.read(0, 1<<30)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var out []proto.LifecycleEvent
	for _, r := range recs {
		ev, err := proto.DecodeLifecycle(r.Data)
		if err != nil {
			t.Fatalf("record seq %d: %v", r.Seq, err)
		}
		if ev.Seq != r.Seq {
			t.Fatalf("record seq %d holds event seq %d", r.Seq, ev.Seq)
		}
		out = append(out, ev)
	}
	return out
}

func seqsOf(evs []proto.LifecycleEvent) []uint64 {
	var s []uint64
	for _, e := range evs {
		s = append(s, e.Seq)
	}
	return s
}

func seqRange(first, last uint64) []uint64 {
	var s []uint64
	for i := first; i <= last; i++ {
		s = append(s, i)
	}
	return s
}

func segFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "outbox", "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOutboxAppendReplayAck(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	if got := appendN(t, o, 0, 10); !slices.Equal(got, seqRange(1, 10)) {
		t.Fatalf("seqs = %v", got)
	}
	evs := readAll(t, o)
	if !slices.Equal(seqsOf(evs), seqRange(1, 10)) {
		t.Fatalf("read seqs = %v", seqsOf(evs))
	}
	if evs[3].Host != testHost || evs[3].Schema != proto.SchemaVersion || evs[3].DomainName != "instance-00000003" {
		t.Fatalf("event 4 = %+v", evs[3])
	}
	o.ack(5)
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, seqRange(6, 10)) {
		t.Fatalf("after ack(5): %v", got)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, seqRange(6, 10)) {
		t.Fatalf("after reopen: %v", got)
	}
	if got := appendN(t, o, 10, 1); got[0] != 11 {
		t.Fatalf("seq after reopen = %d, want 11", got[0])
	}
	if st := o.Stats(); st.Depth != 6 || st.NextSeq != 12 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestOutboxRejectsInvalidWithoutConsumingSeq(t *testing.T) {
	o := openTest(t, t.TempDir(), OutboxConfig{})
	defer o.Close()
	bad := testEvent(1)
	bad.DomainUUID = "nope"
	if err := o.Append(bad); err == nil {
		t.Fatal("Append accepted an invalid UUID")
	}
	other := testEvent(2)
	other.Host = "other-host"
	if err := o.Append(other); err == nil {
		t.Fatal("Append accepted another host's event")
	}
	if got := appendN(t, o, 3, 1); got[0] != 1 {
		t.Fatalf("seq = %d, want 1", got[0])
	}
}

func TestOutboxCompactionAndSeqAfterFullAck(t *testing.T) {
	dir := t.TempDir()
	cfg := OutboxConfig{SegmentBytes: 2048} // ~5 records per segment
	o := openTest(t, dir, cfg)
	appendN(t, o, 0, 50)
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := len(segFiles(t, dir)); n < 5 {
		t.Fatalf("%d segments, want several", n)
	}
	o.ack(50)
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := len(segFiles(t, dir)); n != 1 {
		t.Fatalf("%d segments after full ack, want only the active one", n)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(segFiles(t, dir)); n != 0 {
		t.Fatalf("%d segments after Close with everything acked, want 0", n)
	}

	o = openTest(t, dir, cfg)
	if got := appendN(t, o, 50, 1); got[0] != 51 {
		t.Fatalf("seq after full ack + compaction + reopen = %d, want 51", got[0])
	}
	// And again after a crash right after compaction.
	o.ack(51)
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	o.crash()
	o = openTest(t, dir, cfg)
	defer o.Close()
	if got := appendN(t, o, 51, 1); got[0] != 52 {
		t.Fatalf("seq after crash = %d, want 52", got[0])
	}
}

func TestOutboxTornTailTruncated(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	appendN(t, o, 0, 5)
	o.crash()
	segs := segFiles(t, dir)
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	// Cut the last record in half, as a crash mid-write would.
	if err := os.Truncate(segs[0], fi.Size()-40); err != nil {
		t.Fatal(err)
	}

	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, seqRange(1, 4)) {
		t.Fatalf("after torn tail: %v", got)
	}
	if st := o.Stats(); st.Corrupt != 0 {
		t.Fatalf("torn tail counted as corruption: %+v", st)
	}
	// Appending continues after the truncation point and replays cleanly.
	seq := appendN(t, o, 5, 1)[0]
	if seq != 5 {
		t.Fatalf("seq after torn tail = %d, want 5 (the torn record was never published)", seq)
	}
	o.crash()
	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, seqRange(1, 5)) {
		t.Fatalf("after append past torn tail + reopen: %v", got)
	}
}

func TestOutboxCorruptMiddleSkipped(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{})
	appendN(t, o, 0, 5)
	o.crash()
	seg := segFiles(t, dir)[0]
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	recLen := len(b) / 5                    // all records have the same length here
	b[2*recLen+recordHeaderSize+10] ^= 0xff // a payload byte of seq 3
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}

	o = openTest(t, dir, OutboxConfig{})
	defer o.Close()
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, []uint64{1, 2, 4, 5}) {
		t.Fatalf("after corrupt middle: %v", got)
	}
	if st := o.Stats(); st.Corrupt != 1 {
		t.Fatalf("Corrupt = %d, want 1", st.Corrupt)
	}
	if got := appendN(t, o, 5, 1)[0]; got != 6 {
		t.Fatalf("seq = %d, want 6", got)
	}
}

func TestOutboxFullDropsThenGapMarker(t *testing.T) {
	dir := t.TempDir()
	o := openTest(t, dir, OutboxConfig{MaxEvents: 10})
	defer o.Close()
	appendN(t, o, 0, 10)
	for i := 10; i < 15; i++ {
		ev := testEvent(i)
		err := o.Append(ev)
		if !errors.Is(err, ErrFull) {
			t.Fatalf("Append into full outbox = %v, want ErrFull", err)
		}
		if ev.Seq != uint64(i+1) {
			t.Fatalf("dropped event seq = %d, want %d (drops consume seqs)", ev.Seq, i+1)
		}
	}
	st := o.Stats()
	if st.Dropped != 5 || !st.PendingGap || st.Depth != 10 || st.GapMarkers != 0 {
		t.Fatalf("stats when full = %+v", st)
	}
	// Nothing appended before the bound is lost.
	if got := seqsOf(readAll(t, o)); !slices.Equal(got, seqRange(1, 10)) {
		t.Fatalf("records when full: %v", got)
	}
	o.ack(1) // depth 9: not below the resume mark (0.9*10 with room for 2)
	if o.Stats().GapMarkers != 0 {
		t.Fatal("gap marker appended before the outbox drained below ResumeFraction")
	}
	o.ack(5) // depth 5: the marker goes in at once, without a new Append
	st = o.Stats()
	if st.GapMarkers != 1 || st.PendingGap || st.Depth != 6 {
		t.Fatalf("stats after space freed = %+v", st)
	}
	if got := appendN(t, o, 20, 1)[0]; got != 17 {
		t.Fatalf("seq after gap marker = %d, want 17", got)
	}
	evs := readAll(t, o)
	if got := seqsOf(evs); !slices.Equal(got, []uint64{6, 7, 8, 9, 10, 16, 17}) {
		t.Fatalf("records after gap: %v", got)
	}
	gap := evs[5]
	want := proto.LifecycleEvent{
		Schema: 1, Host: testHost, Incarnation: o.Stats().Incarnation, Seq: 16, Transition: proto.TransitionGap, Reason: GapReason,
		OccurredAt: testEvent(10).OccurredAt, ObservedAt: gap.ObservedAt,
		GapFirstSeq: 11, GapLastSeq: 15, GapCount: 5,
	}
	if !reflect.DeepEqual(gap, want) {
		t.Fatalf("gap marker:\n got %+v\nwant %+v", gap, want)
	}
}

func TestOutboxFullByBytes(t *testing.T) {
	o := openTest(t, t.TempDir(), OutboxConfig{MaxBytes: 4096})
	defer o.Close()
	n := 0
	for ; ; n++ {
		if err := o.Append(testEvent(n)); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			break
		}
	}
	if st := o.Stats(); st.Bytes > 4096 || st.Depth != n || st.Dropped != 1 {
		t.Fatalf("stats = %+v (appended %d)", st, n)
	}
}

func TestOutboxGapSurvivesCrash(t *testing.T) {
	dir := t.TempDir()
	cfg := OutboxConfig{MaxEvents: 3}
	o := openTest(t, dir, cfg)
	appendN(t, o, 0, 3)
	if err := o.Append(testEvent(3)); !errors.Is(err, ErrFull) {
		t.Fatalf("Append = %v, want ErrFull", err)
	}
	o.crash() // before any gap marker could be appended

	o = openTest(t, dir, cfg)
	defer o.Close()
	// The drop burst may have gone on after the last persist: the gap
	// covers every seq reserved for drops, so no seq is ever reused.
	const last = 4 + dropSeqReserve
	if st := o.Stats(); !st.PendingGap || st.NextSeq != last+1 {
		t.Fatalf("after crash: %+v, want pending gap and next seq %d", st, last+1)
	}
	o.ack(3)
	evs := readAll(t, o)
	if len(evs) != 1 || evs[0].Seq != last+1 || evs[0].Transition != proto.TransitionGap ||
		evs[0].GapFirstSeq != 4 || evs[0].GapLastSeq != last || evs[0].GapCount != last-3 {
		t.Fatalf("after crash and ack: %+v", evs)
	}
}

func TestOutboxGapExactAfterCleanClose(t *testing.T) {
	dir := t.TempDir()
	cfg := OutboxConfig{MaxEvents: 3}
	o := openTest(t, dir, cfg)
	appendN(t, o, 0, 3)
	for i := 3; i < 6; i++ {
		if err := o.Append(testEvent(i)); !errors.Is(err, ErrFull) {
			t.Fatalf("Append = %v, want ErrFull", err)
		}
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, dir, cfg)
	defer o.Close()
	o.ack(3)
	evs := readAll(t, o)
	if len(evs) != 1 || evs[0].Seq != 7 || evs[0].GapFirstSeq != 4 || evs[0].GapLastSeq != 6 || evs[0].GapCount != 3 {
		t.Fatalf("after clean close and ack: %+v", evs)
	}
}

func TestOutboxSyncDelay(t *testing.T) {
	o := openTest(t, t.TempDir(), OutboxConfig{})
	defer o.Close()
	appendN(t, o, 0, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs, err := o.read(0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 {
			return // fsynced by the background syncer, without Sync()
		}
		if time.Now().After(deadline) {
			t.Fatal("record not fsynced by the background syncer")
		}
		time.Sleep(SyncDelay)
	}
}

func BenchmarkOutboxAppend(b *testing.B) {
	o := openTest(b, b.TempDir(), OutboxConfig{})
	defer o.Close()
	ev := testEvent(1)
	data, _ := (&proto.LifecycleEvent{Schema: 1, Host: testHost, Seq: 1 << 20, DomainUUID: ev.DomainUUID,
		DomainName: ev.DomainName, Transition: ev.Transition, Reason: ev.Reason, State: ev.State,
		LibvirtEvent: ev.LibvirtEvent, LibvirtDetail: ev.LibvirtDetail,
		OccurredAt: ev.OccurredAt, ObservedAt: ev.ObservedAt}).Encode()
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		e := *ev
		if err := o.Append(&e); err != nil {
			b.Fatal(err)
		}
		if i%10000 == 9999 { // keep the outbox below its bound
			o.ack(e.Seq)
		}
	}
	if err := o.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric(float64(len(data)+recordHeaderSize), "bytes/event")
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
