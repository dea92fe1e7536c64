package instancerecovery

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// RecordSchema is the version of Record.
const RecordSchema = 1

// Bucket is the JetStream KV bucket of the instance records (one key per
// instance UUID), written only by the leader, by compare-and-set.
const Bucket = "hvguard-instance-recovery"

// Record is an instance's durable recovery history: the stops decided and
// the actions taken (the budget), oldest first.
type Record struct {
	Schema int     `json:"schema"`
	UUID   string  `json:"uuid"`
	Stops  []Entry `json:"stops,omitempty"`
}

// Entry is one stop of the instance and what was done about it.
type Entry struct {
	// Stop identifies the stop event: host/incarnation/seq (StopKey).
	Stop string `json:"stop"`
	// Action taken (none: decided without acting). An entry with an action
	// and no outcome is an intent: the action may or may not have been
	// performed, and is never performed again.
	Action  Action    `json:"action,omitempty"`
	ActedAt time.Time `json:"acted_at,omitzero"`
	// By: the controller that recorded the intent, and a nonce unique to
	// that intent (so the writer recognises its own intent after a write
	// whose outcome was unknown).
	By string `json:"by,omitempty"`
	// Outcome and Reason: how it ended ("" while in progress).
	Outcome   Step      `json:"outcome,omitempty"`
	Reason    Reason    `json:"reason,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// open reports whether e is an intent without an outcome.
func (e Entry) open() bool { return e.Action != "" && e.Outcome == "" }

// Encode returns the JSON encoding of r.
func (r Record) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode instance record: %w", err)
	}
	return b, nil
}

// DecodeRecord decodes a record, rejecting other schemas and a UUID other
// than uuid.
func DecodeRecord(b []byte, uuid string) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode instance record %s: %w", uuid, err)
	}
	if r.Schema != RecordSchema || r.UUID != uuid {
		return r, fmt.Errorf("decode instance record %s: schema %d uuid %q", uuid, r.Schema, r.UUID)
	}
	return r, nil
}

// entry returns the entry of stop (nil if none).
func (r *Record) entry(stop string) *Entry {
	for i := range r.Stops {
		if r.Stops[i].Stop == stop {
			return &r.Stops[i]
		}
	}
	return nil
}

// actions returns the actions taken at or after since, and the last one's
// time.
func (r *Record) actions(since time.Time) (n int, last time.Time) {
	for _, e := range r.Stops {
		if e.Action != "" && e.Action != ActionNotify && !e.ActedAt.Before(since) {
			n++
			if e.ActedAt.After(last) {
				last = e.ActedAt
			}
		}
	}
	return n, last
}

// prune drops entries decided before keepFrom (never an open intent) and
// the oldest beyond MaxRecordEntries.
func (r *Record) prune(keepFrom time.Time) {
	out := r.Stops[:0]
	for _, e := range r.Stops {
		at := e.DecidedAt
		if e.ActedAt.After(at) {
			at = e.ActedAt
		}
		if e.open() || !at.Before(keepFrom) {
			out = append(out, e)
		}
	}
	if len(out) > MaxRecordEntries {
		out = out[len(out)-MaxRecordEntries:]
	}
	r.Stops = out
}

// StopKey identifies a stop event: host/incarnation(hex)/seq.
func StopKey(host string, incarnation, seq uint64) string {
	return host + "/" + strconv.FormatUint(incarnation, 16) + "/" + strconv.FormatUint(seq, 10)
}
