package reconcile

import (
	"fmt"
	"time"
)

// Decision is what the core decided for one local domain.
type Decision uint8

// Decisions. The zero value is DecisionSkip: a decision that was never
// filled in can never destroy anything.
const (
	// DecisionSkip: the data is ambiguous or incomplete; nothing is done to
	// the domain and it is not cleared either (a fenced domain stays fenced).
	DecisionSkip Decision = iota
	// DecisionKeep: Nova's data, complete and consistent, says this domain is
	// not a stale copy of an evacuated instance. Leave it alone.
	DecisionKeep
	// DecisionDestroy: both pieces of evidence hold; the domain is a stale
	// copy of an instance Nova evacuated elsewhere. Power it off (never
	// undefine, never touch disks) and mark it.
	DecisionDestroy
)

var decisionNames = [...]string{DecisionSkip: "skip", DecisionKeep: "keep", DecisionDestroy: "destroy"}

// String returns "skip", "keep" or "destroy".
func (d Decision) String() string {
	if int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return fmt.Sprintf("decision(%d)", uint8(d))
}

// MarshalText encodes the decision as its name.
func (d Decision) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText decodes a name written by MarshalText.
func (d *Decision) UnmarshalText(b []byte) error {
	for i, n := range decisionNames {
		if n == string(b) {
			*d = Decision(i)
			return nil
		}
	}
	return fmt.Errorf("reconcile: unknown decision %q", b)
}

// Reason says why a decision was taken. Reasons are typed so that logs,
// metrics, events and `hvguard status` say why, not only what.
type Reason uint8

// Reasons. ReasonNone (the zero value) is never attached to a domain
// decision; as a global reason it means "no global problem".
const (
	ReasonNone Reason = iota

	// Destroy.

	// ReasonEvacuatedElsewhere: Nova lists an evacuation of this instance
	// from this host in an evacuated status, and the server's current host
	// is that evacuation's destination (another host, another node).
	ReasonEvacuatedElsewhere

	// Keep.

	// ReasonNotANovaInstance: the domain has no Nova metadata.
	ReasonNotANovaInstance
	// ReasonNoEvacuation: Nova lists no evacuation of this instance from
	// this host.
	ReasonNoEvacuation
	// ReasonServerOnThisHost: the server's current host is this host (e.g.
	// evacuated and then migrated back: the old evacuation record stays).
	ReasonServerOnThisHost
	// ReasonAlreadyStopped: a stale copy that an earlier reconciliation
	// destroyed and marked (same migration), still off: not looked up
	// again, so periodic runs stay O(pages). Never resumable.
	ReasonAlreadyStopped

	// Skip, per domain.

	// ReasonMetadataUnreadable: the domain's Nova metadata could not be read
	// (libvirt error) or is not a Nova instance element.
	ReasonMetadataUnreadable
	// ReasonInvalidDomain: the domain's UUID is not a canonical UUID, or two
	// listed domains share it.
	ReasonInvalidDomain
	// ReasonMigrationStatusNotEvacuated: the newest evacuation of this
	// instance from this host is in a status Nova does not treat as
	// evacuated (failed, error, …) while the server is not on this host.
	ReasonMigrationStatusNotEvacuated
	// ReasonMigrationNoDestination: the newest evacuation has no destination
	// compute (not scheduled yet) although the server is on another host.
	ReasonMigrationNoDestination
	// ReasonMigrationDestIsThisHost: an evacuation record of this instance
	// names this host as its destination as well as its source, or its
	// destination node (dest_node) is a node Nova records as this host's
	// (the source_node of an evacuation from this host): this machine
	// under another host name.
	ReasonMigrationDestIsThisHost
	// ReasonServerNotFound: Nova answered 404 for the server.
	ReasonServerNotFound
	// ReasonServerHostUnknown: the server has no current host (null), e.g.
	// shelved-offloaded or failed scheduling.
	ReasonServerHostUnknown
	// ReasonServerInTransition: the server has a task state (migrating,
	// rebuilding, resize_finish, …): its host may be about to change.
	ReasonServerInTransition
	// ReasonServerNotOnDestination: the server is on another host than the
	// one its newest evacuation from this host sent it to. It may have
	// moved on, or that host may be this node under a Nova name missing
	// from Hosts (a renamed nova-compute): Nova's data does not prove the
	// domain here is not the live instance (issue 10).
	ReasonServerNotOnDestination
	// ReasonServerLookupMissing: the caller did not supply the server's
	// lookup result for a domain that needed one.
	ReasonServerLookupMissing

	// Global: no domain is destroyed in a reconciliation with one of these.

	// ReasonNovaUnavailable: Nova or keystone unreachable, timeout, 5xx,
	// authentication failure.
	ReasonNovaUnavailable
	// ReasonNovaRejected: Nova answered a 4xx other than a server 404 (bad
	// request, forbidden, microversion not supported).
	ReasonNovaRejected
	// ReasonMalformedData: a Nova answer did not have the expected shape.
	ReasonMalformedData
	// ReasonPartialData: the evacuation listing is not known to be complete
	// (paging error, caps exceeded).
	ReasonPartialData
	// ReasonUnexpectedMigration: Nova returned a migration that does not
	// match the filters asked for (another source host, another type, a
	// duplicate): the filters cannot be trusted.
	ReasonUnexpectedMigration
	// ReasonClockOddity: now is unset, earlier than the previous
	// reconciliation, or a Nova timestamp lies beyond MaxClockSkew in the
	// future.
	ReasonClockOddity
	// ReasonNoHostName: no usable host name for this node was configured.
	ReasonNoHostName
	// ReasonLibvirtUnavailable: the local domains could not be listed.
	ReasonLibvirtUnavailable
)

var reasonNames = [...]string{
	ReasonNone:                        "none",
	ReasonEvacuatedElsewhere:          "evacuated-elsewhere",
	ReasonNotANovaInstance:            "not-a-nova-instance",
	ReasonNoEvacuation:                "no-evacuation",
	ReasonServerOnThisHost:            "server-on-this-host",
	ReasonAlreadyStopped:              "already-stopped",
	ReasonMetadataUnreadable:          "metadata-unreadable",
	ReasonInvalidDomain:               "invalid-domain",
	ReasonMigrationStatusNotEvacuated: "migration-status-not-evacuated",
	ReasonMigrationNoDestination:      "migration-no-destination",
	ReasonMigrationDestIsThisHost:     "migration-dest-is-this-host",
	ReasonServerNotFound:              "server-not-found",
	ReasonServerHostUnknown:           "server-host-unknown",
	ReasonServerInTransition:          "server-in-transition",
	ReasonServerNotOnDestination:      "server-not-on-destination",
	ReasonServerLookupMissing:         "server-lookup-missing",
	ReasonNovaUnavailable:             "nova-unavailable",
	ReasonNovaRejected:                "nova-rejected",
	ReasonMalformedData:               "malformed-data",
	ReasonPartialData:                 "partial-data",
	ReasonUnexpectedMigration:         "unexpected-migration",
	ReasonClockOddity:                 "clock-oddity",
	ReasonNoHostName:                  "no-host-name",
	ReasonLibvirtUnavailable:          "libvirt-unavailable",
}

// String returns the reason's kebab-case name.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// MarshalText encodes the reason as its name.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText decodes a name written by MarshalText.
func (r *Reason) UnmarshalText(b []byte) error {
	for i, n := range reasonNames {
		if n == string(b) {
			*r = Reason(i)
			return nil
		}
	}
	return fmt.Errorf("reconcile: unknown reason %q", b)
}

// Global reports whether r is a reason that stops a whole reconciliation.
func (r Reason) Global() bool { return r >= ReasonNovaUnavailable && int(r) < len(reasonNames) }

// NovaMark says whether a domain's metadata shows it is a Nova instance.
type NovaMark uint8

// Nova marks. The zero value is NovaUnknown (metadata not read or
// unreadable), which never leads to a destroy.
const (
	NovaUnknown  NovaMark = iota // metadata could not be read: Skip
	NovaInstance                 // a <instance> element in Nova's namespace
	NotNova                      // no metadata in Nova's namespace
)

// Domain is one local libvirt domain as the core sees it.
type Domain struct {
	UUID   string   // canonical lower-case UUID (= Nova instance UUID)
	Name   string   // libvirt name, e.g. instance-0000002a (report only)
	Nova   NovaMark // from the domain's metadata in NovaNamespace
	Active bool     // has a live QEMU process (running, paused, …): a destroy powers it off
	State  string   // libvirt state name, report only
	// MarkedMigration is the migration id in the domain's hvguard mark
	// (MarkNamespace), 0 if it has none.
	MarkedMigration int64
}

// Migration is one record of Nova's /os-migrations, as far as the core
// needs it. Times are UTC; UpdatedAt is zero when Nova says null.
type Migration struct {
	ID            int64  `json:"id"`
	UUID          string `json:"uuid"`
	InstanceUUID  string `json:"instance_uuid"`
	SourceCompute string `json:"source_compute"`
	DestCompute   string `json:"dest_compute,omitempty"` // "" when null (not yet scheduled, or failed scheduling)
	DestHost      string `json:"dest_host,omitempty"`
	// SourceNode and DestNode are the hypervisor (compute node) names,
	// "" when null; for libvirt the machine's host name, which does not
	// change when nova-compute's host name (CONF.host) does.
	SourceNode string    `json:"source_node,omitempty"`
	DestNode   string    `json:"dest_node,omitempty"`
	Status     string    `json:"status"`
	Type       string    `json:"migration_type"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
}

// ServerLookup is Nova's answer about one server.
type ServerLookup struct {
	Found     bool   `json:"found"`                // false: Nova answered 404
	Host      string `json:"host,omitempty"`       // OS-EXT-SRV-ATTR:host; "" when null
	Status    string `json:"status,omitempty"`     // API status (ACTIVE, ERROR, …)
	VMState   string `json:"vm_state,omitempty"`   // OS-EXT-STS:vm_state
	TaskState string `json:"task_state,omitempty"` // OS-EXT-STS:task_state; "" when null
}

// Input is everything one reconciliation decides from. The core never
// reads the clock: Now (and LastRun) are passed in.
type Input struct {
	// Now is the time of this reconciliation (the caller's clock).
	Now time.Time
	// LastRun is Now of the previous reconciliation (zero if none).
	LastRun time.Time
	// Hosts are this node's Nova host names (CONF.host of its
	// nova-compute); compared case-insensitively (see doc.go).
	Hosts []string
	// Nodes are this machine's own host names besides Hosts (the agent
	// passes os.Hostname()): an evacuation whose destination host or node
	// is one of them (or shares its first DNS label with one of them, or
	// with Hosts or a recorded source node) went to this machine under
	// another Nova name, whatever nova_hosts says (issue 10 item 9).
	Nodes []string
	// Domains are all local domains.
	Domains []Domain
	// Evacuations are Nova's evacuation migrations whose source_compute is
	// one of Hosts, all pages of all of them.
	Evacuations []Migration
	// EvacuationsComplete is true only when every page of every host's
	// listing was read successfully.
	EvacuationsComplete bool
	// Servers holds the lookup of each server Candidates named, by UUID.
	Servers map[string]ServerLookup
	// NovaFailure is set when a Nova call failed (listing or lookup):
	// ReasonNovaUnavailable, ReasonNovaRejected, ReasonMalformedData or
	// ReasonPartialData; NovaDetail says what happened.
	NovaFailure Reason
	NovaDetail  string
}

// Evidence is what Nova said about one domain's instance.
type Evidence struct {
	MigrationID     int64     `json:"migration_id,omitempty"`
	MigrationUUID   string    `json:"migration_uuid,omitempty"`
	MigrationStatus string    `json:"migration_status,omitempty"`
	SourceCompute   string    `json:"source_compute,omitempty"`
	DestCompute     string    `json:"dest_compute,omitempty"`
	DestHost        string    `json:"dest_host,omitempty"`
	DestNode        string    `json:"dest_node,omitempty"`
	MigratedAt      time.Time `json:"migrated_at,omitzero"`  // the migration's created_at
	Evacuations     int       `json:"evacuations,omitempty"` // evacuation records of this instance from this host
	ServerFound     bool      `json:"server_found,omitempty"`
	ServerHost      string    `json:"server_host,omitempty"`
	ServerStatus    string    `json:"server_status,omitempty"`
	ServerTaskState string    `json:"server_task_state,omitempty"`
}

// DomainDecision is the decision for one domain with its reason and the
// evidence it rests on.
type DomainDecision struct {
	UUID     string    `json:"uuid"`
	Name     string    `json:"name,omitempty"`
	Decision Decision  `json:"decision"`
	Reason   Reason    `json:"reason"`
	Active   bool      `json:"active"`
	Evidence *Evidence `json:"evidence,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// Result is the outcome of Decide.
type Result struct {
	// Global is ReasonNone, or the reason no domain may be destroyed in this
	// reconciliation.
	Global       Reason `json:"global"`
	GlobalDetail string `json:"global_detail,omitempty"`
	// Decisions has one entry per input domain, sorted by UUID.
	Decisions []DomainDecision `json:"decisions"`
}
