package fencing

import "fmt"

// Written is what the stored message of a lease value says about how it
// was written (natslease.Store.WrittenOn reads it; the controller's
// tracker judges it with Fresh). JetStream stores the headers a publisher
// sent with its message, including the compare-and-set's
// Nats-Expected-Last-Subject-Sequence: the server accepted the message
// only because the key's last revision was that number at that moment.
type Written struct {
	// Known: the stored message was read (false: the read failed, or the
	// message is gone — superseded, the bucket keeps one per key).
	Known bool
	// HasExpected, Expected: the message's
	// Nats-Expected-Last-Subject-Sequence header and its value (a KV
	// update or create carries it; a plain put does not).
	HasExpected bool
	Expected    uint64
	// OtherSubject: the message carries
	// Nats-Expected-Last-Subject-Sequence-Subject (newer servers let a
	// publisher check another subject's sequence with it): its
	// Expected then says nothing about this key.
	OtherSubject bool
	// After: the revision of the key's previous message, when the watch
	// delivered it live and every message of the bucket since
	// (natslease.Update.After; 0: not known so). The value was then
	// written while the key ended at After: a record sealed for After
	// (prev_rev) landed where only a compare-and-set on it lands — the
	// header's proof, without the header. Used only when the stored
	// message is not Known: a delete loop supersedes it before the
	// controller reads it (reviewer X85's race).
	After uint64
}

// Headers of a stored message Written is read from (nats.go's
// jetstream.ExpectedLastSubjSeqHeader and ExpectedLastSubjSeqSubjHeader).
const (
	ExpectedLastSubjectSeqHeader     = "Nats-Expected-Last-Subject-Sequence"
	ExpectedLastSubjectSeqSubjHeader = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// Fresh reports whether r, a signed record whose stored message says w,
// was written fresh — by a compare-and-set on the very revision it was
// sealed for (r.PrevRev) — and if not, why (naming the header and
// prev_rev). A replay of an old genuine record sealed on revision p cannot
// be written by a compare-and-set on p again: the key's last revision
// moved past p when the record was first written, for good (stream
// sequences are never reused), so a replay is a plain put (no header) or
// a compare-and-set on a later revision (header ≠ p). A create (prev_rev
// 0) over a delete marker is written by nats.go on the marker's revision
// (header = the marker's revision ≠ 0): a genuine create and a replayed
// one look alike there, so it is not verified either (the host's next
// renewal, a compare-and-set on that revision, is).
func (w Written) Fresh(r LeaseRecord) (bool, string) {
	switch {
	case !w.Known && w.After != 0 && r.PrevRev == w.After:
		// Delivered directly after the revision it was sealed for: the
		// key ended there when it was written. A copy of it can land
		// there only in its stead (the original lands only there too).
		return true, ""
	case !w.Known:
		return false, fmt.Sprintf("its stored message could not be read (superseded, or the read failed): its %s header is unknown (prev_rev %d)", ExpectedLastSubjectSeqHeader, r.PrevRev)
	case w.OtherSubject:
		return false, fmt.Sprintf("its stored message carries %s: its %s is another subject's (prev_rev %d)", ExpectedLastSubjectSeqSubjHeader, ExpectedLastSubjectSeqHeader, r.PrevRev)
	case !w.HasExpected:
		return false, fmt.Sprintf("its stored message has no %s header: a plain put, not a compare-and-set on prev_rev %d", ExpectedLastSubjectSeqHeader, r.PrevRev)
	case w.Expected != r.PrevRev && r.PrevRev == 0:
		return false, fmt.Sprintf("a create (prev_rev 0) written on revision %d (%s): over a delete marker, genuine or replayed alike", w.Expected, ExpectedLastSubjectSeqHeader)
	case w.Expected != r.PrevRev:
		return false, fmt.Sprintf("written by a compare-and-set on revision %d (%s), not on its prev_rev %d", w.Expected, ExpectedLastSubjectSeqHeader, r.PrevRev)
	}
	return true, ""
}
