package controller

import (
	"encoding/json"
	"fmt"
	"time"

	"hvguard/controller/recovery"
)

// RecoveryEventSchema is the version of RecoveryEvent.
const RecoveryEventSchema = 1

// RecoveryEvent is the published form of a host recovery event
// (proto.ControllerRecoverySubject): the leading controller's progress and
// refusals, each with why. Decoders tolerate unknown fields.
type RecoveryEvent struct {
	Schema     int    `json:"schema"`
	Controller string `json:"controller"`
	Term       uint64 `json:"term"`
	recovery.Event
	At time.Time `json:"at"`
}

// NewRecoveryEvent builds the event of e published by controller id in
// term at wall-clock time at.
func NewRecoveryEvent(id string, term uint64, e recovery.Event, at time.Time) RecoveryEvent {
	return RecoveryEvent{Schema: RecoveryEventSchema, Controller: id, Term: term, Event: e, At: at.UTC()}
}

// Encode returns the JSON encoding of e.
func (e RecoveryEvent) Encode() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode recovery event: %w", err)
	}
	return b, nil
}

// DecodeRecoveryEvent decodes a RecoveryEvent, rejecting other schemas.
func DecodeRecoveryEvent(b []byte) (RecoveryEvent, error) {
	var e RecoveryEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("decode recovery event: %w", err)
	}
	if e.Schema != RecoveryEventSchema || e.Controller == "" || e.Op == "" || e.Host == "" {
		return e, fmt.Errorf("decode recovery event: schema %d controller %q op %q host %q", e.Schema, e.Controller, e.Op, e.Host)
	}
	return e, nil
}
