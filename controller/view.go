package controller

import (
	"time"

	"hvguard/fencing"
)

// LeaseView is what the lease tracker knows of one host, for status and
// metrics.
type LeaseView struct {
	Host     string             `json:"host"`
	State    fencing.LeaseState `json:"state"`
	Epoch    uint64             `json:"epoch"`
	Revision uint64             `json:"revision"`
	Backstop fencing.Backstop   `json:"backstop"`
	// GraceSeconds is the grace granted beyond the host's lease TTL
	// (0 for a refused host).
	GraceSeconds float64 `json:"grace_seconds"`
	// LastRenewalSeconds is how long ago (on this controller's clock) the
	// host's record last changed while watched (renewal, release, watch
	// start).
	LastRenewalSeconds float64 `json:"last_renewal_age_seconds"`
	// Silent: counted silent by the mass-failure guard now.
	Silent bool `json:"silent"`
	// Refused says why the host will never be declared ("" if not).
	Refused string `json:"refused,omitempty"`
	// Reason is the record's reason (set by whoever declared, released or
	// withdrew it).
	Reason string `json:"reason,omitempty"`
	// KeyDeleted: the host's key was deleted or purged (never declared;
	// still counted by the guard until the key is back).
	KeyDeleted bool `json:"key_deleted,omitempty"`
	// BootID is the boot id the host's record carries (its kernel's).
	BootID string `json:"boot_id,omitempty"`
	// Guard is the guard version and threshold the host's agent names.
	Guard *fencing.GuardVersion `json:"guard,omitempty"`
	// FenceState is the agent's fencing state when it wrote the record
	// (healthy, fencing, fenced, held, …); AgentVersion its version.
	FenceState   fencing.State `json:"fence_state,omitempty"`
	AgentVersion string        `json:"agent_version,omitempty"`
	// SilentFor is how long no renewal was observed (watching), Due the
	// lease_ttl + grace this controller grants the host (host recovery
	// confirms a declaration with them: controller/recovery).
	SilentFor time.Duration `json:"-"`
	Due       time.Duration `json:"-"`
	// InvalidRecord says why the last untrusted value of the host's key
	// was ignored, InvalidAgeSeconds how long ago it was seen (signed
	// records: docs/security.md).
	InvalidRecord     string  `json:"invalid_record,omitempty"`
	InvalidAgeSeconds float64 `json:"invalid_record_age_seconds,omitempty"`
	// Signer: the key that signed the host's current record ("": unsigned).
	Signer string `json:"signer,omitempty"`
	// TrustedRevision is the revision of the record shown (the last
	// trusted one); Revision may be later (an untrusted value, a delete).
	// DeclarationStands: the record shown is a declaration that still
	// stands although untrusted values or a delete followed it
	// (Tracker.declarationStands; signatures required only).
	TrustedRevision   uint64 `json:"trusted_revision,omitempty"`
	DeclarationStands bool   `json:"declaration_stands,omitempty"`
	// GuardHolds: more hosts are silent now than the lowest threshold of
	// the guards this host's agent may act on (Tracker.hostThreshold): the
	// controller would not declare it now, and host recovery waits
	// (recovery.WhyGuardHolding). Per host: another member's guard
	// cannot pause this host's recovery.
	GuardHolds bool `json:"guard_holds,omitempty"`
	// RollbackGated: the host fell due after the lease stream rolled back
	// and is not declared until its beacon names its record or an
	// operator confirms it (rollbackgate.go, hvguard-controller
	// confirm-rollback).
	RollbackGated bool `json:"rollback_gated,omitempty"`
}

// TrackerView is the tracker's state at one instant.
type TrackerView struct {
	Hosts     []LeaseView `json:"hosts"`
	Holding   bool        `json:"holding"`
	Silent    int         `json:"silent"`
	Threshold int         `json:"threshold"`
	// GuardVersions are the guard versions kept in force (guard.go).
	GuardVersions []fencing.GuardVersion `json:"guard_versions,omitempty"`
}

// View returns the tracker's state at now (hosts sorted by name).
func (t *Tracker) View(now time.Time) TrackerView {
	v := TrackerView{Holding: t.holding, Silent: t.Silent(now), Threshold: t.Threshold(), GuardVersions: t.GuardVersions()}
	base := t.membershipThreshold()
	for _, name := range t.Hosts() {
		h := t.hosts[name]
		lv := LeaseView{
			Host: name, State: h.rec.State, Epoch: h.rec.Epoch, Revision: h.rev, Backstop: h.rec.Backstop,
			GraceSeconds: h.grace.Seconds(), LastRenewalSeconds: now.Sub(h.lastSeen).Seconds(),
			Silent: t.counted(h, now), Refused: h.refused, Reason: h.rec.Reason,
			KeyDeleted: h.deleted, BootID: h.rec.BootID, Guard: h.rec.Guard, FenceState: h.rec.AgentState, AgentVersion: h.rec.AgentVersion,
			Signer: h.rec.Signer, TrustedRevision: h.trustedRev, DeclarationStands: t.declarationStands(h, now),
			SilentFor: t.silentFor(h, now), Due: h.rec.Timing.LeaseTTL + h.grace, GuardHolds: v.Silent > t.hostThreshold(base, h),
		}
		lv.RollbackGated = h.saidGate
		if !h.untrusted.IsZero() {
			lv.InvalidRecord, lv.InvalidAgeSeconds = h.untrustedWhy, now.Sub(h.untrusted).Seconds()
		}
		v.Hosts = append(v.Hosts, lv)
	}
	return v
}

// NotPerformed tells the tracker a declaration it decided was not written
// (this controller may not act now): it is decided again at the next Tick
// instead of after DeclareRetry, so a standby that becomes the leader
// declares a due host at once.
func (t *Tracker) NotPerformed(d Decision) {
	if h := t.hosts[d.Host]; h != nil && d.Op == OpDeclare {
		h.declaring = time.Time{}
	}
}
