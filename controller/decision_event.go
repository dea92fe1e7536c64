package controller

import (
	"encoding/json"
	"fmt"
	"time"
)

// DecisionEventSchema is the version of DecisionEvent.
const DecisionEventSchema = 1

// DecisionEvent is the published form of a Decision the leading controller
// made (proto.ControllerDecisionSubject). Decoders tolerate unknown fields.
type DecisionEvent struct {
	Schema     int    `json:"schema"`
	Controller string `json:"controller"`
	Term       uint64 `json:"term"`
	Op         string `json:"op"`
	Host       string `json:"host,omitempty"`
	Epoch      uint64 `json:"epoch,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Silent     int    `json:"silent,omitempty"`
	Threshold  int    `json:"threshold,omitempty"`
	// Error is set when the decision was not carried out (a declaration
	// whose CAS failed: the host renewed).
	Error string    `json:"error,omitempty"`
	At    time.Time `json:"at"`
}

// NewDecisionEvent builds the event of d (err: its outcome) made by
// controller id in term at wall-clock time at.
func NewDecisionEvent(id string, term uint64, d Decision, err error, at time.Time) DecisionEvent {
	e := DecisionEvent{Schema: DecisionEventSchema, Controller: id, Term: term, Op: d.Op.String(), Host: d.Host,
		Reason: d.Reason, Silent: d.Silent, Threshold: d.Threshold, At: at.UTC()}
	if d.Op == OpDeclare || d.Op == OpRelease {
		e.Epoch = d.Record.Epoch
	}
	if err != nil {
		e.Error = err.Error()
	}
	return e
}

// Encode returns the JSON encoding of e.
func (e DecisionEvent) Encode() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode decision event: %w", err)
	}
	return b, nil
}

// DecodeDecisionEvent decodes a DecisionEvent, rejecting other schemas.
func DecodeDecisionEvent(b []byte) (DecisionEvent, error) {
	var e DecisionEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("decode decision event: %w", err)
	}
	if e.Schema != DecisionEventSchema || e.Controller == "" || e.Op == "" {
		return e, fmt.Errorf("decode decision event: schema %d controller %q op %q", e.Schema, e.Controller, e.Op)
	}
	return e, nil
}
