package delivery

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestOutboxProperties runs random sequences of appends, acks, syncs,
// crashes and clean reopens (small segments, so compaction runs often) and
// checks after each step the outbox invariants:
//   - every appended, unacked record is still there, in order;
//   - after a crash at most records acked but not yet persisted come back,
//     and always as a contiguous suffix of what was appended;
//   - seqs strictly increase across reopens; with a bound, every seq is
//     either a record or covered by a gap marker.
func TestOutboxProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir := t.TempDir()
		maxEvents := rapid.SampledFrom([]int{5, 20, 1000}).Draw(rt, "maxEvents")
		cfg := OutboxConfig{SegmentBytes: int64(rapid.IntRange(400, 4000).Draw(rt, "segBytes")), MaxEvents: maxEvents}
		o := openTest(rt, dir, cfg)
		defer func() { o.Close() }()

		var (
			records   []uint64 // seqs of every record written (events and gap markers), in order
			accounted = map[uint64]bool{}
			acked     uint64
			lastSeq   uint64
		)
		check := func(afterCrash bool) {
			evs := readAll(rt, o)
			got := seqsOf(evs)
			for _, ev := range evs {
				if ev.GapCount > 0 {
					for s := ev.GapFirstSeq; s <= ev.GapLastSeq; s++ {
						accounted[s] = true
					}
				}
			}
			var want []uint64
			for _, s := range records {
				if s > acked {
					want = append(want, s)
				}
			}
			if !afterCrash {
				if !slices.Equal(got, want) {
					rt.Fatalf("unacked records = %v, want %v", got, want)
				}
				return
			}
			// A suffix of records that contains every unacked one.
			if len(got) < len(want) || !slices.Equal(got[len(got)-len(want):], want) {
				rt.Fatalf("after crash records = %v, want a suffix of %v containing %v", got, records, want)
			}
			if i := slices.Index(records, firstOr(got)); len(got) > 0 && (i < 0 || !slices.Equal(records[i:], got)) {
				rt.Fatalf("after crash records = %v, not a contiguous suffix of %v", got, records)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"append": func(rt *rapid.T) {
				ev := testEvent(int(lastSeq))
				err := o.Append(ev)
				if ev.Seq <= lastSeq {
					rt.Fatalf("seq %d not above previous %d", ev.Seq, lastSeq)
				}
				// Records the outbox wrote meanwhile (a gap marker) and this one.
				for _, s := range recordSeqsAbove(rt, o, lastSeq) {
					if !slices.Contains(records, s) {
						records = append(records, s)
					}
				}
				switch {
				case err == nil:
					accounted[ev.Seq] = true
				case errors.Is(err, ErrFull):
				default:
					rt.Fatalf("Append: %v", err)
				}
				lastSeq = ev.Seq
			},
			"ack": func(rt *rapid.T) {
				var unacked []uint64
				for _, s := range records {
					if s > acked {
						unacked = append(unacked, s)
					}
				}
				if len(unacked) == 0 {
					rt.Skip("nothing to ack")
				}
				acked = unacked[rapid.IntRange(0, len(unacked)-1).Draw(rt, "ackIdx")]
				o.ack(acked)
				for _, s := range recordSeqsAbove(rt, o, lastSeq) { // gap marker
					records = append(records, s)
					lastSeq = s
				}
				check(false)
			},
			"sync": func(rt *rapid.T) {
				if err := o.Sync(); err != nil {
					rt.Fatal(err)
				}
			},
			"reopen": func(rt *rapid.T) {
				if err := o.Close(); err != nil {
					rt.Fatal(err)
				}
				o = openTest(rt, dir, cfg)
				check(false)
			},
			"crash": func(rt *rapid.T) {
				o.crash()
				o = openTest(rt, dir, cfg)
				check(true)
				// Records that came back are unacked again.
				if evs := readAll(rt, o); len(evs) > 0 && evs[0].Seq-1 < acked {
					acked = evs[0].Seq - 1
				}
			},
			"": func(rt *rapid.T) {
				check(false)
			},
		})
		// Drain: every seq ever assigned is a record or inside a gap marker.
		o.ack(lastSeq)
		acked = lastSeq
		for _, s := range recordSeqsAbove(rt, o, lastSeq) {
			records = append(records, s)
			lastSeq = s
		}
		check(false) // notes the ranges of gap markers
		for _, s := range records {
			accounted[s] = true
		}
		for s := uint64(1); s <= lastSeq; s++ {
			if !accounted[s] && !o.Stats().PendingGap {
				rt.Fatalf("seq %d neither a record nor covered by a gap marker (records %v)", s, records)
			}
		}
	})
}

func firstOr(s []uint64) uint64 {
	if len(s) == 0 {
		return 0
	}
	return s[0]
}

// recordSeqsAbove returns the seqs of unacked records above seq.
func recordSeqsAbove(rt *rapid.T, o *Outbox, seq uint64) []uint64 {
	if err := o.Sync(); err != nil {
		rt.Fatal(err)
	}
	recs, err := o.read(seq, 1<<30)
	if err != nil {
		rt.Fatal(err)
	}
	var out []uint64
	for _, r := range recs {
		out = append(out, r.Seq)
	}
	return out
}
