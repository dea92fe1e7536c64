package reconcile

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"hvguard/proto"
)

// MaxClockSkew is how far in the future (relative to Input.Now) a Nova
// timestamp may lie before the core distrusts the clocks. Nova writes
// created_at/updated_at with the controller's clock; NTP keeps hosts within
// well under a second, so five minutes only catches real clock faults.
const MaxClockSkew = 5 * time.Minute

// EvacuatedStatuses are the migration statuses Nova itself treats as "this
// instance was evacuated from the source host": accepted, pre-migrating and
// done are what nova-compute's _destroy_evacuated_instances looks for at
// start; completed is what it turns them into once it has destroyed the
// local copy (a copy that exists again, or was never destroyed, is stale
// all the same).
var EvacuatedStatuses = []string{"accepted", "pre-migrating", "done", "completed"}

// MigrationTypeEvacuation is Nova's migration_type of an evacuation.
const MigrationTypeEvacuation = "evacuation"

func evacuatedStatus(s string) bool {
	for _, e := range EvacuatedStatuses {
		if strings.EqualFold(s, e) {
			return true
		}
	}
	return false
}

// hostSet holds this node's Nova host names. Comparisons are
// case-insensitive (strings.EqualFold): see doc.go for why this can only
// make a destroy less likely.
type hostSet []string

func newHostSet(names []string) hostSet {
	var hs hostSet
	for _, n := range names {
		if ValidHostName(n) && !hs.has(n) {
			hs = append(hs, n)
		}
	}
	return hs
}

func (hs hostSet) has(name string) bool {
	for _, h := range hs {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// ValidHostName reports whether name can be a Nova host name for this
// node: non-empty, at most 255 bytes, printable ASCII without spaces.
func ValidHostName(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// ValidUUID reports whether s is a UUID in canonical lower-case 8-4-4-4-12
// form, the form libvirtx and Nova use. It is proto's check (one definition
// for the whole project; proto is standard library only, like this core).
func ValidUUID(s string) bool { return proto.ValidUUID(s) }

// globalCheck returns the reason (and detail) why nothing at all may be
// destroyed, or ReasonNone. The order is the order of the checks'
// severity: configuration, clock, Nova, then the shape of Nova's data.
func globalCheck(in Input, hosts hostSet) (Reason, string) {
	if len(hosts) == 0 {
		return ReasonNoHostName, fmt.Sprintf("no valid host name in %q", in.Hosts)
	}
	if in.Now.IsZero() {
		return ReasonClockOddity, "now is not set"
	}
	if !in.LastRun.IsZero() && in.Now.Before(in.LastRun) {
		return ReasonClockOddity, fmt.Sprintf("clock went backwards: now %s is before the previous reconciliation at %s",
			in.Now.UTC().Format(time.RFC3339Nano), in.LastRun.UTC().Format(time.RFC3339Nano))
	}
	if in.NovaFailure != ReasonNone {
		r := in.NovaFailure
		if !r.Global() {
			r = ReasonNovaUnavailable
		}
		return r, in.NovaDetail
	}
	if !in.EvacuationsComplete {
		return ReasonPartialData, "the evacuation listing is not complete"
	}
	seenID := make(map[int64]bool, len(in.Evacuations))
	seenUUID := make(map[string]bool, len(in.Evacuations))
	horizon := in.Now.Add(MaxClockSkew)
	for _, m := range in.Evacuations {
		switch {
		case !hosts.has(m.SourceCompute):
			return ReasonUnexpectedMigration, fmt.Sprintf("migration %d has source_compute %q, not this host: the source filter was not applied", m.ID, m.SourceCompute)
		case !strings.EqualFold(m.Type, MigrationTypeEvacuation):
			return ReasonUnexpectedMigration, fmt.Sprintf("migration %d has type %q, not %s: the type filter was not applied", m.ID, m.Type, MigrationTypeEvacuation)
		case !ValidUUID(strings.ToLower(m.InstanceUUID)):
			return ReasonMalformedData, fmt.Sprintf("migration %d has instance_uuid %q", m.ID, m.InstanceUUID)
		case m.Status == "":
			return ReasonMalformedData, fmt.Sprintf("migration %d has no status", m.ID)
		case m.CreatedAt.IsZero():
			return ReasonMalformedData, fmt.Sprintf("migration %d has no created_at", m.ID)
		case seenID[m.ID] || (m.UUID != "" && seenUUID[strings.ToLower(m.UUID)]):
			return ReasonUnexpectedMigration, fmt.Sprintf("migration %d (%s) listed twice: paging is inconsistent", m.ID, m.UUID)
		case m.CreatedAt.After(horizon) || m.UpdatedAt.After(horizon):
			return ReasonClockOddity, fmt.Sprintf("migration %d was created/updated at %s/%s, more than %s after now (%s)",
				m.ID, m.CreatedAt.UTC().Format(time.RFC3339), m.UpdatedAt.UTC().Format(time.RFC3339), MaxClockSkew, in.Now.UTC().Format(time.RFC3339))
		}
		seenID[m.ID] = true
		if m.UUID != "" {
			seenUUID[strings.ToLower(m.UUID)] = true
		}
	}
	return ReasonNone, ""
}

// byInstance groups the evacuations by lower-case instance UUID, newest
// first (created_at, then id).
func byInstance(ms []Migration) map[string][]Migration {
	out := make(map[string][]Migration)
	for _, m := range ms {
		k := strings.ToLower(m.InstanceUUID)
		out[k] = append(out[k], m)
	}
	for _, l := range out {
		slices.SortFunc(l, func(a, b Migration) int {
			if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
	}
	return out
}

// Candidates returns the UUIDs (sorted) of the servers whose current host
// the caller must look up before calling Decide: the local Nova instances
// that have at least one evacuation record from this host. It returns nil
// when a global problem already forbids any destroy (Decide will say why),
// so a failing Nova is not asked more questions.
func Candidates(in Input) []string {
	hosts := newHostSet(in.Hosts)
	if r, _ := globalCheck(in, hosts); r != ReasonNone {
		return nil
	}
	evac := byInstance(in.Evacuations)
	var out []string
	for _, d := range in.Domains {
		if d.Nova != NovaInstance || !ValidUUID(d.UUID) {
			continue
		}
		if ms := evac[d.UUID]; len(ms) > 0 && !alreadyStopped(d, ms[0]) {
			out = append(out, d.UUID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MinListingCandidates is how many candidates must share a destination
// before the runner lists that destination's servers (one paged
// servers/detail?host=<dest>) instead of looking each candidate up (one
// GET /servers/{id} each). Measured on the real Nova (docs/reconcile.md):
// a lookup costs ~25 ms on a single-worker nova-api, a listing page of
// 200 servers ~0.3 s; below three candidates the lookups are cheaper than
// listing a destination that may hold many other servers.
const MinListingCandidates = 3

// LookupPlan says how the caller looks up the candidates' current hosts.
type LookupPlan struct {
	// ByDest maps a destination host (as Nova wrote it in the newest
	// evacuation record, lower case) to the candidates evacuated there, for
	// destinations with at least MinListingCandidates of them. A candidate
	// listed on its destination with that host is as good as a lookup
	// (the same OS-EXT-SRV-ATTR:host and task_state fields of the same
	// instance record); one missing from the listing is not evidence of
	// anything and must be looked up singly.
	ByDest map[string][]string
	// Single are the candidates to look up one by one (sorted).
	Single []string
}

// PlanLookups groups Candidates(in) by the destination of their newest
// evacuation from this host. It is pure and returns an empty plan when
// Candidates does.
func PlanLookups(in Input) LookupPlan {
	cands := Candidates(in)
	if len(cands) == 0 {
		return LookupPlan{}
	}
	hosts := newHostSet(in.Hosts)
	evac := byInstance(in.Evacuations)
	byDest := map[string][]string{}
	for _, u := range cands {
		dest := strings.ToLower(evac[u][0].DestCompute)
		// No destination, or this host as destination: Decide skips these
		// whatever the lookup says; keep them on the single path so the
		// plan never lists this host's own servers.
		if dest == "" || hosts.has(dest) || !ValidHostName(dest) {
			dest = ""
		}
		byDest[dest] = append(byDest[dest], u)
	}
	plan := LookupPlan{ByDest: map[string][]string{}}
	for dest, us := range byDest {
		if dest != "" && len(us) >= MinListingCandidates {
			plan.ByDest[dest] = us
		} else {
			plan.Single = append(plan.Single, us...)
		}
	}
	slices.Sort(plan.Single)
	return plan
}

// Decide returns one decision per domain. It is pure: the same Input gives
// the same Result. See doc.go for the rules and invariants.
func Decide(in Input) Result {
	hosts := newHostSet(in.Hosts)
	global, detail := globalCheck(in, hosts)
	res := Result{Global: global, GlobalDetail: detail, Decisions: make([]DomainDecision, 0, len(in.Domains))}

	count := make(map[string]int, len(in.Domains))
	for _, d := range in.Domains {
		count[d.UUID]++
	}
	var evac map[string][]Migration
	var self hostSet
	if global == ReasonNone {
		evac = byInstance(in.Evacuations)
		self = machineNames(in)
	}
	for _, d := range in.Domains {
		dd := DomainDecision{UUID: d.UUID, Name: d.Name, Active: d.Active}
		switch {
		case !ValidUUID(d.UUID):
			dd.Decision, dd.Reason, dd.Detail = DecisionSkip, ReasonInvalidDomain, fmt.Sprintf("domain UUID %q is not a canonical lower-case UUID", d.UUID)
		case count[d.UUID] > 1:
			dd.Decision, dd.Reason, dd.Detail = DecisionSkip, ReasonInvalidDomain, "two listed domains have this UUID"
		case d.Nova == NotNova:
			dd.Decision, dd.Reason = DecisionKeep, ReasonNotANovaInstance
		case d.Nova != NovaInstance:
			dd.Decision, dd.Reason = DecisionSkip, ReasonMetadataUnreadable
		case global != ReasonNone:
			dd.Decision, dd.Reason, dd.Detail = DecisionSkip, global, detail
		default:
			decideInstance(&dd, d, evac[d.UUID], in.Servers, hosts, self)
		}
		res.Decisions = append(res.Decisions, dd)
	}
	slices.SortStableFunc(res.Decisions, func(a, b DomainDecision) int { return strings.Compare(a.UUID, b.UUID) })
	return res
}

// machineNames returns every name known to be this machine's: its Nova
// host names (Hosts), the compute node names Nova recorded as the source
// of the evacuations from them (for libvirt the machine's host name), and
// the machine's own host names (Nodes).
func machineNames(in Input) hostSet {
	names := slices.Concat(in.Hosts, in.Nodes)
	for _, m := range in.Evacuations {
		names = append(names, m.SourceNode)
	}
	return newHostSet(names)
}

// mayBe reports whether a host or node name may name this machine: it is
// one of names, or has the same first DNS label as one of them ("hv1" and
// "hv1.example.org": a rename to the FQDN, or Nova's host and node
// differing by the domain part). Conservative by design: a destination
// that merely shares a short name with this machine is not evidence that
// the instance is elsewhere.
func (hs hostSet) mayBe(name string) bool {
	short := func(n string) string { s, _, _ := strings.Cut(n, "."); return s }
	return slices.ContainsFunc(hs, func(h string) bool { return strings.EqualFold(short(h), short(name)) })
}

// alreadyStopped: an earlier reconciliation destroyed (or found off) and
// marked this domain for the same newest evacuation, and it is still off.
func alreadyStopped(d Domain, newest Migration) bool {
	return !d.Active && d.MarkedMigration != 0 && d.MarkedMigration == newest.ID
}

// decideInstance decides for a Nova instance with no global problem; ms
// are its evacuations from this host, newest first; self are this
// machine's names (machineNames).
func decideInstance(dd *DomainDecision, d Domain, ms []Migration, servers map[string]ServerLookup, hosts, self hostSet) {
	if len(ms) == 0 {
		dd.Decision, dd.Reason = DecisionKeep, ReasonNoEvacuation
		return
	}
	newest := ms[0]
	ev := &Evidence{
		MigrationID:     newest.ID,
		MigrationUUID:   newest.UUID,
		MigrationStatus: newest.Status,
		SourceCompute:   newest.SourceCompute,
		DestCompute:     newest.DestCompute,
		DestHost:        newest.DestHost,
		DestNode:        newest.DestNode,
		MigratedAt:      newest.CreatedAt,
		Evacuations:     len(ms),
	}
	dd.Evidence = ev
	if alreadyStopped(d, newest) {
		dd.Decision, dd.Reason = DecisionKeep, ReasonAlreadyStopped
		return
	}

	s, ok := servers[dd.UUID]
	if !ok {
		dd.Decision, dd.Reason = DecisionSkip, ReasonServerLookupMissing
		return
	}
	ev.ServerFound, ev.ServerHost, ev.ServerStatus, ev.ServerTaskState = s.Found, s.Host, s.Status, s.TaskState
	switch {
	case !s.Found:
		dd.Decision, dd.Reason = DecisionSkip, ReasonServerNotFound
		return
	case s.Host == "":
		dd.Decision, dd.Reason = DecisionSkip, ReasonServerHostUnknown
		return
	case hosts.has(s.Host):
		// Evacuated and migrated back (the old record stays), or an
		// evacuation that failed before the server left.
		dd.Decision, dd.Reason = DecisionKeep, ReasonServerOnThisHost
		return
	case s.TaskState != "":
		dd.Decision, dd.Reason = DecisionSkip, ReasonServerInTransition
		dd.Detail = "task state " + s.TaskState
		return
	}
	// The server is on another host.
	for _, m := range ms {
		if m.DestCompute != "" && hosts.has(m.DestCompute) {
			dd.Decision, dd.Reason = DecisionSkip, ReasonMigrationDestIsThisHost
			dd.Detail = fmt.Sprintf("migration %d names this host as destination", m.ID)
			return
		}
		if (m.DestNode != "" && self.mayBe(m.DestNode)) || (m.DestCompute != "" && self.mayBe(m.DestCompute)) {
			dd.Decision, dd.Reason = DecisionSkip, ReasonMigrationDestIsThisHost
			dd.Detail = fmt.Sprintf("migration %d went to host %q, node %q, which may be this machine (its names: %s; same name or same short name)", m.ID, m.DestCompute, m.DestNode, strings.Join(self, ", "))
			return
		}
	}
	if !evacuatedStatus(newest.Status) {
		dd.Decision, dd.Reason = DecisionSkip, ReasonMigrationStatusNotEvacuated
		dd.Detail = fmt.Sprintf("newest evacuation %d is %q", newest.ID, newest.Status)
		return
	}
	if newest.DestCompute == "" {
		dd.Decision, dd.Reason = DecisionSkip, ReasonMigrationNoDestination
		return
	}
	if !strings.EqualFold(s.Host, newest.DestCompute) {
		// Only the destination is known not to be this host: any other
		// host may be this node under a name missing from Hosts.
		dd.Decision, dd.Reason = DecisionSkip, ReasonServerNotOnDestination
		dd.Detail = fmt.Sprintf("the server is on %q, its newest evacuation %d sent it to %q: it moved on, or %q is this node under a Nova name missing from nova_hosts",
			s.Host, newest.ID, newest.DestCompute, s.Host)
		return
	}
	dd.Decision, dd.Reason = DecisionDestroy, ReasonEvacuatedElsewhere
}
