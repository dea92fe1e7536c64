package reconcile

import (
	"fmt"
	"time"
)

// Mode says whether a reconciliation acts on its Destroy decisions.
type Mode uint8

// Modes (config `reconcile.action`).
const (
	// ModeDestroy powers off stale domains and marks them.
	ModeDestroy Mode = iota
	// ModeReport only reports what it would destroy.
	ModeReport
)

var modeNames = [...]string{ModeDestroy: "destroy", ModeReport: "report"}

// String returns "destroy" or "report".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// MarshalText encodes the mode as its name.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText decodes "destroy" or "report".
func (m *Mode) UnmarshalText(b []byte) error {
	for i, n := range modeNames {
		if n == string(b) {
			*m = Mode(i)
			return nil
		}
	}
	return fmt.Errorf("reconcile: unknown action %q (want destroy or report)", b)
}

// Trigger says why a reconciliation ran.
type Trigger string

// Triggers.
const (
	TriggerStart    Trigger = "start"    // agent start, before anything else
	TriggerRejoin   Trigger = "rejoin"   // the node rejoined; before any fenced domain is resumed
	TriggerPeriodic Trigger = "periodic" // the periodic timer
	TriggerRetry    Trigger = "retry"    // a retry after a failed reconciliation (backoff)
)

// Outcome is what the runner did about one domain.
type Outcome uint8

// Outcomes.
const (
	OutcomeNone          Outcome = iota // nothing to do (Keep/Skip)
	OutcomeDestroyed                    // powered off and marked
	OutcomeAlreadyOff                   // a stale copy already off: marked only
	OutcomeWouldDestroy                 // report mode: would have been destroyed
	OutcomeDestroyFailed                // the destroy (or the state check) failed; see Error
)

var outcomeNames = [...]string{
	OutcomeNone:          "none",
	OutcomeDestroyed:     "destroyed",
	OutcomeAlreadyOff:    "already-off",
	OutcomeWouldDestroy:  "would-destroy",
	OutcomeDestroyFailed: "destroy-failed",
}

// String returns the outcome's name.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// MarshalText encodes the outcome as its name.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText decodes a name written by MarshalText.
func (o *Outcome) UnmarshalText(b []byte) error {
	for i, n := range outcomeNames {
		if n == string(b) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("reconcile: unknown outcome %q", b)
}

// DomainReport is one domain's line in a Report.
type DomainReport struct {
	DomainDecision
	Outcome Outcome `json:"outcome"`
	Marked  bool    `json:"marked,omitempty"` // the hvguard mark was written (or was already there)
	Error   string  `json:"error,omitempty"`  // destroy or mark error
}

// Report is the serialisable summary of one reconciliation: what was
// checked, found, destroyed, and why not. `hvguard status` shows the last
// one.
type Report struct {
	Hosts      []string  `json:"hosts"`
	Mode       Mode      `json:"mode"`
	Trigger    Trigger   `json:"trigger"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// Global is ReasonNone or why nothing was destroyed at all.
	Global       Reason `json:"global"`
	GlobalDetail string `json:"global_detail,omitempty"`

	Domains       int `json:"domains"`        // local domains listed
	NovaInstances int `json:"nova_instances"` // of which carry Nova metadata
	Evacuations   int `json:"evacuations"`    // evacuation records from this host (all pages)
	Candidates    int `json:"candidates"`     // servers whose host was asked (evacuated from here, not already stopped)
	Listings      int `json:"listings"`       // destination hosts listed (servers/detail?host=)
	Lookups       int `json:"lookups"`        // servers looked up one by one (GET /servers/{id})
	Destroyed     int `json:"destroyed"`      // powered off (OutcomeDestroyed)
	AlreadyOff    int `json:"already_off"`    // stale but already off
	WouldDestroy  int `json:"would_destroy"`  // report mode
	Kept          int `json:"kept"`
	Skipped       int `json:"skipped"`
	Failed        int `json:"failed"` // destroys that failed
	APICalls      int `json:"api_calls"`

	// ConsecutiveFailures counts reconciliations in a row (this one
	// included) that were not OK; RetryIn is when the runner suggests the
	// next attempt (backoff on failure, the period on success).
	ConsecutiveFailures int           `json:"consecutive_failures"`
	RetryIn             time.Duration `json:"retry_in_ns"`

	Results []DomainReport `json:"results"`
}

// OK reports whether the reconciliation saw complete, consistent data and
// carried out every destroy it decided. A fenced host must stay fenced
// until a reconciliation is OK.
func (r *Report) OK() bool { return r.Global == ReasonNone && r.Failed == 0 }

// MayResume reports whether the fenced domain uuid may be resumed after
// this reconciliation: the reconciliation is OK and the domain was decided
// Keep (other than ReasonAlreadyStopped). Domains that were skipped (ambiguous) or destroyed, or not listed,
// may not.
func (r *Report) MayResume(uuid string) bool {
	if !r.OK() {
		return false
	}
	for i := range r.Results {
		if r.Results[i].UUID == uuid {
			return r.Results[i].Decision == DecisionKeep && r.Results[i].Reason != ReasonAlreadyStopped
		}
	}
	return false
}

// Event is the record published for each domain the reconciliation
// destroyed, found already off, or (report mode) would destroy.
type Event struct {
	Host       string    `json:"host"`
	DomainUUID string    `json:"domain_uuid"`
	DomainName string    `json:"domain_name,omitempty"`
	Outcome    Outcome   `json:"outcome"`
	Reason     Reason    `json:"reason"`
	Evidence   Evidence  `json:"evidence"`
	Error      string    `json:"error,omitempty"`
	Trigger    Trigger   `json:"trigger"`
	ObservedAt time.Time `json:"observed_at"`
}

// Events returns one Event per domain with an outcome other than
// OutcomeNone, in UUID order.
func (r *Report) Events() []Event {
	var out []Event
	host := ""
	if len(r.Hosts) > 0 {
		host = r.Hosts[0]
	}
	for _, d := range r.Results {
		if d.Outcome == OutcomeNone {
			continue
		}
		e := Event{Host: host, DomainUUID: d.UUID, DomainName: d.Name, Outcome: d.Outcome, Reason: d.Reason,
			Error: d.Error, Trigger: r.Trigger, ObservedAt: r.FinishedAt}
		if d.Evidence != nil {
			e.Evidence = *d.Evidence
		}
		out = append(out, e)
	}
	return out
}

// Summary is a one-line human summary of the report.
func (r *Report) Summary() string {
	s := fmt.Sprintf("reconcile %s (%s): %d domains, %d nova instances, %d evacuations, %d candidates (%d destinations listed, %d looked up); destroyed %d, already off %d, would destroy %d, kept %d, skipped %d, failed %d; %d API calls in %s",
		r.Trigger, r.Mode, r.Domains, r.NovaInstances, r.Evacuations, r.Candidates, r.Listings, r.Lookups, r.Destroyed, r.AlreadyOff, r.WouldDestroy,
		r.Kept, r.Skipped, r.Failed, r.APICalls, r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond))
	if r.Global != ReasonNone {
		s += fmt.Sprintf("; NOTHING DESTROYED: %s: %s", r.Global, r.GlobalDetail)
	}
	return s
}

// Backoff timing. After a failed reconciliation the runner suggests a retry
// after RetryMin, doubling per consecutive failure up to the period: soon
// enough that a rejoining host is unfenced within seconds of Nova coming
// back, slow enough not to hammer a struggling Nova.
const (
	DefaultInterval = 60 * time.Second // periodic reconciliation (the default)
	RetryMin        = 2 * time.Second
)

// NextDelay returns the delay before the next reconciliation after
// failures consecutive failed ones (0 = the last one was OK).
func NextDelay(interval time.Duration, failures int) time.Duration {
	if failures <= 0 {
		return interval
	}
	d := RetryMin
	for i := 1; i < failures && d < interval; i++ {
		d *= 2
	}
	return min(d, interval)
}
