package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"hvguard/daemonkit/atomicfile"
	"hvguard/lifecycle"
	"hvguard/proto"
)

// KnownSaveInterval bounds how often the known-state file is rewritten while
// reports flow. The file records the outbox seq of the last report it
// includes; after a crash the agent folds the reports the outbox still
// holds after that seq into it (foldReported), so a transition reported
// during the last interval is not reported again. Only when the outbox no
// longer holds them (recreated, or the segment sealed and deleted) may it
// re-report, with reason resync: at-least-once, never lost.
const KnownSaveInterval = time.Second

// knownFile is the on-disk form of lifecycle.Debouncer.Known.
type knownFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	// OutboxIncarnation and OutboxSeq: the last report appended to the
	// outbox before the save (absent in files of older agents).
	OutboxIncarnation proto.Incarnation `json:"outbox_incarnation,omitempty"`
	OutboxSeq         *uint64           `json:"outbox_seq,omitempty"`
	Domains           []knownEntry      `json:"domains"`
}

// knownMark is the outbox position a known-state file was saved at.
type knownMark struct {
	inc proto.Incarnation
	seq uint64
}

type knownEntry struct {
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	State string `json:"state"`
}

var stateByName = func() map[string]lifecycle.State {
	m := map[string]lifecycle.State{}
	for s := lifecycle.StateUnknown; s <= lifecycle.StateGone; s++ {
		m[s.String()] = s
	}
	return m
}()

// loadKnown reads the known-state file. A missing file is not an error (first
// start); a corrupt one is set aside and reported, and the agent starts
// without beliefs (every domain is then announced as defined by the resync).
func loadKnown(path string) ([]lifecycle.DomainSnapshot, *knownMark, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var f knownFile
	if err := json.Unmarshal(data, &f); err != nil || f.Version != 1 {
		_ = os.Rename(path, path+".corrupt")
		if err == nil {
			err = fmt.Errorf("version %d", f.Version)
		}
		return nil, nil, fmt.Errorf("%s is unreadable (kept as %s.corrupt): %w", path, filepath.Base(path), err)
	}
	var mark *knownMark
	if f.OutboxSeq != nil {
		mark = &knownMark{inc: f.OutboxIncarnation, seq: *f.OutboxSeq}
	}
	out := make([]lifecycle.DomainSnapshot, 0, len(f.Domains))
	for _, e := range f.Domains {
		st, ok := stateByName[e.State]
		if !ok {
			continue
		}
		out = append(out, lifecycle.DomainSnapshot{UUID: e.UUID, Name: e.Name, State: st})
	}
	return out, mark, nil
}

// reportedSince is what an outbox offers to follow a mark (delivery.Outbox).
type reportedSince interface {
	Since(inc proto.Incarnation, after uint64) ([]proto.LifecycleEvent, bool, error)
}

// foldSince folds into known the reports the sink still holds after the
// file's mark, and returns the mark the folded states stand at: nil when
// it cannot be known (no mark in the file, or the reports after it are no
// longer all held): the agent then re-reports what changed, at least once.
func foldSince(known []lifecycle.DomainSnapshot, mark *knownMark, sink Sink, log *slog.Logger) ([]lifecycle.DomainSnapshot, *knownMark) {
	rs, ok := sink.(reportedSince)
	if mark == nil || !ok {
		return known, nil
	}
	evs, ok, err := rs.Since(mark.inc, mark.seq)
	if err != nil || !ok {
		log.Warn("known domain states: the reports after their save are no longer in the outbox; what changed since may be reported again",
			"outbox_seq", mark.seq, "err", err)
		return known, nil
	}
	if len(evs) > 0 {
		log.Info("known domain states: folded in the reports appended after their last save", "reports", len(evs),
			"from_seq", evs[0].Seq, "to_seq", evs[len(evs)-1].Seq)
		mark = &knownMark{inc: mark.inc, seq: evs[len(evs)-1].Seq}
	}
	return foldReported(known, evs), mark
}

// foldReported applies to known the transitions of evs (reports appended
// after known was saved, in seq order): what consumers were told last.
func foldReported(known []lifecycle.DomainSnapshot, evs []proto.LifecycleEvent) []lifecycle.DomainSnapshot {
	idx := make(map[string]int, len(known))
	for i, k := range known {
		idx[k.UUID] = i
	}
	gone := map[string]bool{}
	set := func(uuid, name string, st lifecycle.State) {
		delete(gone, uuid)
		if i, ok := idx[uuid]; ok {
			known[i].State = st
			if name != "" {
				known[i].Name = name
			}
			return
		}
		idx[uuid] = len(known)
		known = append(known, lifecycle.DomainSnapshot{UUID: uuid, Name: name, State: st})
	}
	for _, ev := range evs {
		st, ok := stateByName[ev.State]
		ok = ok && st != lifecycle.StateUnknown
		switch ev.Transition {
		case proto.TransitionUndefined:
			gone[ev.DomainUUID] = true
		case proto.TransitionStopped:
			set(ev.DomainUUID, ev.DomainName, lifecycle.StateShutoff)
		case proto.TransitionStarted, proto.TransitionRebooted, proto.TransitionResumed,
			proto.TransitionSuspended, proto.TransitionPMSuspended, proto.TransitionDefined:
			if ok {
				set(ev.DomainUUID, ev.DomainName, st)
			}
		}
	}
	out := known[:0]
	for _, k := range known {
		if !gone[k.UUID] {
			out = append(out, k)
		}
	}
	return out
}

// saveKnown writes the file with atomicfile.Write.
func saveKnown(path string, known []lifecycle.DomainSnapshot, mark *knownMark, now time.Time) error {
	f := knownFile{Version: 1, SavedAt: now.UTC(), Domains: make([]knownEntry, len(known))}
	if mark != nil {
		f.OutboxIncarnation, f.OutboxSeq = mark.inc, &mark.seq
	}
	for i, k := range known {
		f.Domains[i] = knownEntry{UUID: k.UUID, Name: k.Name, State: k.State.String()}
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}
