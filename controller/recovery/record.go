package recovery

import (
	"encoding/json"
	"fmt"
	"time"
)

// Bucket is the JetStream KV bucket of the recoveries' durable progress:
// one key per host (its host token), value a Record, written by CAS by
// the leader only.
const Bucket = "hvguard-host-recovery"

// RecordSchema is the version of Record.
const RecordSchema = 1

// Phase is where a host's recovery is.
type Phase string

// Phases, in order.
const (
	// PhaseNotified: notify mode; the decision was published, nothing
	// called. Final.
	PhaseNotified Phase = "notified"
	// PhaseForceDown: forcing the host's nova-compute service down (Nova
	// refuses to evacuate while the source looks up).
	PhaseForceDown Phase = "force-down"
	// PhaseList: listing the host's instances.
	PhaseList Phase = "list"
	// PhaseDetach: removing the dead host's attachments of the
	// volume-backed instances' non-multiattach volumes.
	PhaseDetach Phase = "detach"
	// PhaseEvacuate: evacuating, verifying, retrying (mode evacuate).
	PhaseEvacuate Phase = "evacuate"
	// PhaseMasakari: the COMPUTE_HOST notification and its outcome (mode
	// masakari).
	PhaseMasakari Phase = "masakari"
	// PhaseRecovered: every step done (Record.Unrecoverable lists what
	// could not be); the host stays forced down until it is back.
	PhaseRecovered Phase = "recovered"
	// PhaseStopped: the declaration went away (the lease came back,
	// withdrawn, deleted) or this controller does not accept the host
	// any more: no further destructive step.
	PhaseStopped Phase = "stopped"
	// PhaseReleasing: the host is back; clearing forced_down.
	PhaseReleasing Phase = "releasing"
	// PhaseDone: nothing more to do (forced_down cleared, never set, or
	// left to the operator). Final.
	PhaseDone Phase = "done"
)

// active reports whether a recovery in p counts toward MaxHosts.
func (p Phase) active() bool {
	switch p {
	case PhaseForceDown, PhaseList, PhaseDetach, PhaseEvacuate, PhaseMasakari:
		return true
	}
	return false
}

// Final reports whether nothing more happens in p.
func (p Phase) Final() bool { return p == PhaseNotified || p == PhaseDone }

// Progress is the state of one mutating call.
type Progress string

// Progress values.
const (
	// Pending: not started ("").
	Pending Progress = ""
	// Intent: recorded before the call; the call may or may not have
	// landed.
	Intent Progress = "intent"
	// Requested: the call was answered OK (an evacuation: its migration
	// is being followed; a notification: its outcome polled).
	Requested Progress = "requested"
	// Completed: done and verified.
	Completed Progress = "done"
	// Failed: the last attempt failed; retried after a backoff.
	Failed Progress = "failed"
	// Unrecoverable: given up (attempts exhausted, or the instance cannot
	// be evacuated): reported.
	Unrecoverable Progress = "unrecoverable"
	// Skipped: deliberately not done (Note says why).
	Skipped Progress = "skipped"
)

// Record is a host's recovery, durable in Bucket.
type Record struct {
	Schema int `json:"schema"`
	// Host is the lease host; NovaHost its name in Nova and Cinder.
	Host     string `json:"host"`
	NovaHost string `json:"nova_host"`
	Mode     Mode   `json:"mode"`
	// Epoch, LeaseRevision, DeclaredBy: the declaration this recovery is
	// for (the expired record's epoch and revision in the lease bucket).
	Epoch         uint64 `json:"epoch"`
	LeaseRevision uint64 `json:"lease_revision"`
	DeclaredBy    string `json:"declared_by"`
	// StartedBy names the controller (and term) that confirmed the
	// declaration and started the recovery; StartedAt is wall-clock.
	StartedBy string    `json:"started_by"`
	StartedAt time.Time `json:"started_at"`
	Phase     Phase     `json:"phase"`
	// Reason says why the recovery is where it is (the last decision).
	Reason string `json:"reason,omitempty"`
	// ForceDown is the force-down call's progress (Intent or Completed:
	// the service may be forced down and is released later).
	ForceDown Progress   `json:"force_down"`
	Instances []Instance `json:"instances,omitempty"`
	// Masakari is the COMPUTE_HOST notification (mode masakari).
	Masakari *Notification `json:"masakari,omitempty"`
	// ReleaseRefused is Nova's last refusal to clear forced_down.
	ReleaseRefused string `json:"release_refused,omitempty"`
	// UpdatedAt is stamped (wall clock) at every write; PhaseAt when each
	// phase was entered (wall clock: the time split of a recovery).
	UpdatedAt time.Time           `json:"updated_at"`
	PhaseAt   map[Phase]time.Time `json:"phase_at,omitempty"`
}

// Instance is one server of the host and its recovery.
type Instance struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Status is the API status when listed (ACTIVE, SHUTOFF, ERROR, ...):
	// the state the server must be back in.
	Status       string   `json:"status"`
	TaskState    string   `json:"task_state,omitempty"`
	VolumeBacked bool     `json:"volume_backed,omitempty"`
	Volumes      []Volume `json:"volumes,omitempty"`
	// Evac is the evacuation's progress; Attempts counts evacuate calls;
	// IntentAt (wall clock) is the last intent; Migration the id of the
	// migration followed; After: only migrations with a larger id count
	// (an earlier attempt's failed one does not).
	Evac      Progress  `json:"evac"`
	Attempts  int       `json:"attempts,omitempty"`
	IntentAt  time.Time `json:"intent_at,omitzero"`
	Migration int64     `json:"migration,omitempty"`
	After     int64     `json:"after,omitempty"`
	Dest      string    `json:"dest,omitempty"`
	// Note says why the instance is skipped, failed or unrecoverable.
	Note string `json:"note,omitempty"`
}

// Volume is one volume attached to an instance.
type Volume struct {
	ID string `json:"id"`
	// Checked: read from Cinder (Multiattach and Attachments are known).
	Checked     bool         `json:"checked,omitempty"`
	Multiattach bool         `json:"multiattach,omitempty"`
	Attachments []Attachment `json:"attachments,omitempty"`
	Note        string       `json:"note,omitempty"`
}

// Attachment is one of the dead host's attachments to remove.
type Attachment struct {
	ID       string   `json:"id"`
	Server   string   `json:"server,omitempty"`
	Host     string   `json:"host"`
	Progress Progress `json:"progress"`
	Attempts int      `json:"attempts,omitempty"`
	Note     string   `json:"note,omitempty"`
}

// Notification is the Masakari COMPUTE_HOST notification.
type Notification struct {
	Progress Progress `json:"progress"`
	ID       string   `json:"id,omitempty"`
	Status   string   `json:"status,omitempty"`
	Attempts int      `json:"attempts,omitempty"`
}

// Encode returns r's JSON.
func (r Record) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode recovery record: %w", err)
	}
	return b, nil
}

// DecodeRecord decodes a Record, rejecting other schemas.
func DecodeRecord(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode recovery record: %w", err)
	}
	if r.Schema != RecordSchema || r.Host == "" || r.Phase == "" {
		return r, fmt.Errorf("decode recovery record: schema %d host %q phase %q", r.Schema, r.Host, r.Phase)
	}
	return r, nil
}

// clone returns a deep copy of r (the core never changes a record it
// handed out).
func (r *Record) clone() *Record {
	c := *r
	c.Instances = make([]Instance, len(r.Instances))
	for i, in := range r.Instances {
		in.Volumes = append([]Volume(nil), in.Volumes...)
		for j := range in.Volumes {
			in.Volumes[j].Attachments = append([]Attachment(nil), in.Volumes[j].Attachments...)
		}
		c.Instances[i] = in
	}
	if r.Masakari != nil {
		m := *r.Masakari
		c.Masakari = &m
	}
	if r.PhaseAt != nil {
		c.PhaseAt = make(map[Phase]time.Time, len(r.PhaseAt))
		for k, v := range r.PhaseAt {
			c.PhaseAt[k] = v
		}
	}
	return &c
}

// Unrecoverable lists the instances given up, with why.
func (r *Record) Unrecoverable() []string {
	var out []string
	for _, in := range r.Instances {
		if in.Evac == Unrecoverable {
			out = append(out, in.ID+": "+in.Note)
		}
	}
	return out
}
