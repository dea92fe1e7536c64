package instancerecovery

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// world is a fake environment for the pure core: a KV map with revisions,
// a Nova of server states, the actions performed, the event log (replayed
// into a new core at a controller restart, as the consumer does).
type world struct {
	t       testing.TB
	cfg     Config
	now     time.Time
	core    *Core
	leading bool
	kv      map[string]kvEntry
	rev     uint64
	nova    map[string]*Server
	novaErr bool
	log     []Event
	seqs    map[string]uint64
	acts    []performed
	reports []Report
	// answers: the last Nova answer the core was given, per uuid.
	answers map[string]Server
	// write faults: the next writes' results (consumed in order).
	writeFaults []fault
	actFault    error
	// crashAtAct: the controller dies right before performing the next
	// action (after its intent landed); needRestart tells the driver.
	crashAtAct, needRestart bool
	opsWhileNotLeading      int
}

type fault int

const (
	fLand        fault = iota
	fUnknownLand       // lands, but the answer is lost
	fUnknownLost       // does not land, no answer
	fConflict          // another writer bumped the revision first
)

type kvEntry struct {
	rec Record
	rev uint64
}

type performed struct {
	uuid, stop string
	action     Action
	at         time.Time
	class      string
	answer     Server
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newWorld(t testing.TB, cfg Config) *world {
	w := &world{t: t, cfg: cfg, now: t0, kv: map[string]kvEntry{}, nova: map[string]*Server{}, seqs: map[string]uint64{},
		answers: map[string]Server{}, leading: true}
	w.restart()
	return w
}

// restart replaces the core (a controller restart) and replays the log.
func (w *world) restart() {
	c, err := New(w.cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.core = c
	// The runner acts only once the consumer caught up with the stream
	// (the replay of what it retains): until then the core is told it
	// may not act.
	w.exec(c.Tick(w.now, false))
	for _, ev := range w.log {
		w.exec(c.Event(w.now, ev))
	}
	w.exec(c.Tick(w.now, w.leading))
}

func (w *world) server(uuid string, s Server) { s.Found = true; w.nova[uuid] = &s }

// event appends a domain event of host h to the log and feeds it.
func (w *world) event(uuid, transition, class, detail string) Event {
	w.seqs["node3"]++
	ev := Event{Host: "node3", Incarnation: 0xabc, Seq: w.seqs["node3"], UUID: uuid, Name: "inst-" + uuid, Transition: transition,
		Classification: class, Detail: detail, ObservedAt: w.now}
	if class != "" {
		ev.ClassificationReason = "test"
	}
	w.log = append(w.log, ev)
	w.exec(w.core.Event(w.now, ev))
	return ev
}

func (w *world) advance(d time.Duration) {
	end := w.now.Add(d)
	for {
		w.exec(w.core.Tick(w.now, w.leading))
		next := w.core.NextDeadline()
		if next.IsZero() || next.After(end) {
			break
		}
		if !next.After(w.now) {
			w.t.Fatalf("after Tick(%v) the next deadline %v is not in the future: the runner would spin", w.now, next)
		}
		w.now = next
	}
	w.now = end
	w.exec(w.core.Tick(w.now, w.leading))
}

func (w *world) setLeading(l bool) {
	w.leading = l
	w.exec(w.core.Tick(w.now, l))
}

func (w *world) exec(ops []Op) {
	for len(ops) > 0 {
		op := ops[0]
		ops = ops[1:]
		if op.Kind != OpReport && !w.leading {
			w.opsWhileNotLeading++
		}
		switch op.Kind {
		case OpReport:
			w.reports = append(w.reports, op.Report)
		case OpLoad:
			e, ok := w.kv[op.UUID]
			if ok {
				r := e.rec
				ops = append(ops, w.core.Loaded(w.now, op.UUID, &r, e.rev, WriteLanded)...)
			} else {
				ops = append(ops, w.core.Loaded(w.now, op.UUID, nil, 0, WriteLanded)...)
			}
		case OpQuery:
			if w.novaErr {
				ops = append(ops, w.core.NovaAnswer(w.now, op.UUID, Server{}, errors.New("nova down"))...)
				break
			}
			s := Server{}
			if p := w.nova[op.UUID]; p != nil {
				s = *p
			}
			w.answers[op.UUID] = s
			ops = append(ops, w.core.NovaAnswer(w.now, op.UUID, s, nil)...)
		case OpWrite:
			f := fLand
			if len(w.writeFaults) > 0 {
				f, w.writeFaults = w.writeFaults[0], w.writeFaults[1:]
			}
			if !w.leading {
				ops = append(ops, w.core.Written(w.now, op.UUID, 0, WriteNotActing)...)
				break
			}
			cur := w.kv[op.UUID]
			if cur.rev != op.Rev || f == fConflict {
				if f == fConflict { // another writer: same content, new revision
					w.rev++
					cur.rev = w.rev
					if cur.rec.UUID == "" {
						cur.rec = Record{Schema: RecordSchema, UUID: op.UUID}
					}
					w.kv[op.UUID] = cur
				}
				ops = append(ops, w.core.Written(w.now, op.UUID, 0, WriteConflict)...)
				break
			}
			if f == fUnknownLost {
				ops = append(ops, w.core.Written(w.now, op.UUID, 0, WriteUnknown)...)
				break
			}
			w.rev++
			w.kv[op.UUID] = kvEntry{rec: cloneRecord(op.Record), rev: w.rev}
			if f == fUnknownLand {
				ops = append(ops, w.core.Written(w.now, op.UUID, 0, WriteUnknown)...)
				break
			}
			ops = append(ops, w.core.Written(w.now, op.UUID, w.rev, WriteLanded)...)
		case OpAct:
			if w.crashAtAct {
				w.crashAtAct, w.needRestart, ops = false, true, nil
				continue
			}
			if !w.leading {
				ops = append(ops, w.core.Acted(w.now, op.UUID, nil, true, false)...)
				break
			}
			w.acts = append(w.acts, performed{uuid: op.UUID, stop: op.Stop.Key(), action: op.Action, at: w.now,
				class: op.Stop.Classification, answer: w.answers[op.UUID]})
			if w.actFault != nil {
				ops = append(ops, w.core.Acted(w.now, op.UUID, w.actFault, false, true)...)
				break
			}
			if s := w.nova[op.UUID]; s != nil && (op.Action == ActionStart || op.Action == ActionHardReboot) {
				s.VMState, s.TaskState, s.PowerState, s.Status = "active", "", PowerRunning, "ACTIVE"
			}
			ops = append(ops, w.core.Acted(w.now, op.UUID, nil, false, false)...)
		}
	}
}

// steps returns the report steps for uuid, "step/reason" each.
func (w *world) steps(uuid string) []string {
	var out []string
	for _, r := range w.reports {
		if r.UUID == uuid {
			out = append(out, fmt.Sprintf("%s/%s", r.Step, r.Reason))
		}
	}
	return out
}

func (w *world) last(uuid string) Report {
	for i := len(w.reports) - 1; i >= 0; i-- {
		if w.reports[i].UUID == uuid {
			return w.reports[i]
		}
	}
	return Report{}
}

// novaSyncs makes Nova's power sync mark a server stopped.
func (w *world) novaStopped(uuid string) {
	s := w.nova[uuid]
	s.VMState, s.TaskState, s.PowerState, s.Status = "stopped", "", 4, "SHUTOFF"
}
