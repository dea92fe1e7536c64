package reconcile

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// genInput draws random, often hostile, Nova answers around a few local
// domains: host names that differ by case, statuses Nova has and has not,
// null destinations, 404s, task states, failures, clocks.
func genInput(t *rapid.T) Input {
	hostNames := []string{"node2", "node1", "NODE1", "node3", "", "node1.example.org"}
	statuses := []string{"done", "accepted", "pre-migrating", "completed", "failed", "error", "migrating", "DONE"}
	nUUID := rapid.IntRange(1, 6)
	in := Input{
		Now:                 t0.Add(time.Duration(rapid.IntRange(-3, 3).Draw(t, "nowOff")) * time.Minute),
		Hosts:               append([]string{"node1"}, rapid.SliceOfN(rapid.SampledFrom(hostNames[1:]), 0, 2).Draw(t, "hosts")...),
		EvacuationsComplete: chance(t, "complete", 0.85),
	}
	if chance(t, "nodes", 0.3) {
		in.Nodes = []string{"hv7"} // this machine's own host name (renamed)
	}
	if chance(t, "lastRun", 0.2) {
		in.LastRun = t0.Add(time.Duration(rapid.IntRange(-5, 5).Draw(t, "lastOff")) * time.Minute)
	}
	if chance(t, "noHost", 0.05) {
		in.Hosts = in.Hosts[1:]
	}
	if chance(t, "zeroNow", 0.05) {
		in.Now = time.Time{}
	}
	if chance(t, "fail", 0.15) {
		in.NovaFailure = rapid.SampledFrom([]Reason{ReasonNovaUnavailable, ReasonNovaRejected, ReasonMalformedData, ReasonPartialData, ReasonServerNotFound}).Draw(t, "failure")
	}
	nd := rapid.IntRange(0, 6).Draw(t, "ndomains")
	for i := 0; i < nd; i++ {
		d := Domain{
			UUID:   uuidN(i + 1),
			Nova:   rapid.SampledFrom([]NovaMark{NovaInstance, NovaInstance, NotNova, NovaUnknown}).Draw(t, "nova"),
			Active: rapid.Bool().Draw(t, "active"),
		}
		if chance(t, "marked", 0.2) {
			d.MarkedMigration = int64(rapid.IntRange(1, 8).Draw(t, "markedID"))
		}
		if chance(t, "dupDomain", 0.05) {
			d.UUID = uuidN(nUUID.Draw(t, "duuid"))
		}
		if chance(t, "upper", 0.05) {
			d.UUID = strings.ToUpper(d.UUID)
		}
		in.Domains = append(in.Domains, d)
	}
	nm := rapid.IntRange(0, 8).Draw(t, "nmigrations")
	for i := 0; i < nm; i++ {
		m := Migration{
			ID:            int64(i + 1),
			InstanceUUID:  uuidN(nUUID.Draw(t, "muuid")),
			SourceCompute: "node1",
			DestCompute:   rapid.SampledFrom(hostNames).Draw(t, "dst"),
			Status:        rapid.SampledFrom(statuses).Draw(t, "status"),
			Type:          "evacuation",
			CreatedAt:     t0.Add(time.Duration(rapid.IntRange(-120, 0).Draw(t, "created")) * time.Minute),
			SourceNode:    rapid.SampledFrom([]string{"hv1", "HV1", ""}).Draw(t, "srcNode"),
			DestNode:      rapid.SampledFrom([]string{"hv1", "hv2", "hv3", "", "hv1.example.org", "HV7"}).Draw(t, "dstNode"),
		}
		if chance(t, "oddMigration", 0.05) {
			m.SourceCompute = rapid.SampledFrom(hostNames).Draw(t, "src")
			m.ID = int64(rapid.IntRange(1, 10).Draw(t, "mid"))
			m.CreatedAt = m.CreatedAt.Add(time.Duration(rapid.IntRange(0, 15).Draw(t, "future")) * time.Minute)
			m.Type = rapid.SampledFrom([]string{"evacuation", "migration", "live-migration", "EVACUATION"}).Draw(t, "type")
			m.Status = rapid.SampledFrom([]string{m.Status, ""}).Draw(t, "oddStatus")
			if chance(t, "zeroCreated", 0.3) {
				m.CreatedAt = time.Time{}
			}
		}
		m.UUID = "m-" + uuidN(int(m.ID))
		in.Evacuations = append(in.Evacuations, m)
	}
	in.Servers = map[string]ServerLookup{}
	ns := rapid.IntRange(0, 6).Draw(t, "nservers")
	for i := 0; i < ns; i++ {
		s := ServerLookup{
			Found: chance(t, "found", 0.85),
			Host:  rapid.SampledFrom(hostNames).Draw(t, "shost"),
		}
		if chance(t, "task", 0.2) {
			s.TaskState = rapid.SampledFrom([]string{"migrating", "rebuilding", "resize_finish"}).Draw(t, "taskState")
		}
		in.Servers[uuidN(nUUID.Draw(t, "suuid"))] = s
	}
	for _, m := range in.Evacuations {
		if chance(t, "lookup", 0.7) {
			in.Servers[m.InstanceUUID] = ServerLookup{Found: true, Host: rapid.SampledFrom(hostNames).Draw(t, "lhost")}
		}
	}
	return in
}

// chance returns true with probability about p. (rapid biases its draws
// toward small values; the multiplication spreads them.)
func chance(t *rapid.T, label string, p float64) bool {
	h := uint64(14695981039346656037)
	for i := 0; i < len(label); i++ {
		h = (h ^ uint64(label[i])) * 1099511628211
	}
	v := (rapid.Uint64().Draw(t, label) + h) * 0x9E3779B97F4A7C15 // spread rapid's small values over 64 bits
	return float64(v>>11)/float64(1<<53) < p
}

func ours(in Input, name string) bool {
	for _, h := range in.Hosts {
		if ValidHostName(h) && strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// TestPropertyNoDestroyWithoutBothEvidence: whatever Nova answers, a
// Destroy has (1) an evacuation of that instance from this host in an
// evacuated status, the newest of its evacuations, with a destination that
// is not this host, and no record naming this host as destination (nor a
// node Nova records as this host's source node); and (2) the server found
// on that destination with no task state; and no global ambiguity at all.
func TestPropertyNoDestroyWithoutBothEvidence(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t)
		r := Decide(in)
		if len(r.Decisions) != len(in.Domains) {
			t.Fatalf("%d decisions for %d domains", len(r.Decisions), len(in.Domains))
		}
		if !reflect.DeepEqual(r, Decide(in)) {
			t.Fatal("Decide is not deterministic")
		}
		uuidCount := map[string]int{}
		for _, d := range in.Domains {
			uuidCount[d.UUID]++
		}
		for _, d := range r.Decisions {
			if d.Reason == ReasonNone {
				t.Fatalf("decision without reason: %+v", d)
			}
			if d.Reason == ReasonAlreadyStopped {
				for _, x := range in.Domains {
					if x.UUID == d.UUID && (x.Active || x.MarkedMigration == 0 || d.Evidence == nil || x.MarkedMigration != d.Evidence.MigrationID) {
						t.Fatalf("already-stopped for %+v (evidence %+v)", x, d.Evidence)
					}
				}
			}
			if d.Decision != DecisionDestroy {
				continue
			}
			if d.Reason != ReasonEvacuatedElsewhere {
				t.Fatalf("destroy with reason %s", d.Reason)
			}
			// No global ambiguity.
			if r.Global != ReasonNone || in.NovaFailure != ReasonNone || !in.EvacuationsComplete || in.Now.IsZero() ||
				(!in.LastRun.IsZero() && in.Now.Before(in.LastRun)) {
				t.Fatalf("destroy despite global ambiguity: %+v", r)
			}
			// The domain is a Nova instance, unambiguous.
			var dom Domain
			for _, x := range in.Domains {
				if x.UUID == d.UUID {
					dom = x
				}
			}
			if dom.Nova != NovaInstance || !ValidUUID(dom.UUID) || uuidCount[dom.UUID] != 1 {
				t.Fatalf("destroy of a domain that is not one clear Nova instance: %+v", dom)
			}
			// Evidence 1: the newest evacuation of this instance.
			var newest *Migration
			for i := range in.Evacuations {
				m := &in.Evacuations[i]
				if !ours(in, m.SourceCompute) || m.Type != "evacuation" {
					t.Fatalf("destroy although a record does not match the filters: %+v", m)
				}
				if strings.ToLower(m.InstanceUUID) != d.UUID {
					continue
				}
				if ours(in, m.DestCompute) {
					t.Fatalf("destroy although a record names this host as destination: %+v", m)
				}
				// No name or short name of this machine: Hosts, Nodes, the
				// recorded source nodes (hv1 = hv1.example.org).
				self := slices.Concat(in.Hosts, in.Nodes)
				for _, o := range in.Evacuations {
					self = append(self, o.SourceNode)
				}
				short := func(n string) string { s, _, _ := strings.Cut(n, "."); return strings.ToLower(s) }
				for _, n := range self {
					for _, dst := range []string{m.DestNode, m.DestCompute} {
						if n != "" && dst != "" && short(n) == short(dst) {
							t.Fatalf("destroy although a record went to %q, which may be this machine (%q): %+v", dst, n, m)
						}
					}
				}
				if newest == nil || m.CreatedAt.After(newest.CreatedAt) || (m.CreatedAt.Equal(newest.CreatedAt) && m.ID > newest.ID) {
					newest = m
				}
			}
			if newest == nil || !evacuatedStatus(newest.Status) || newest.DestCompute == "" {
				t.Fatalf("destroy without an evacuated-status newest evacuation: %+v", newest)
			}
			if d.Evidence == nil || d.Evidence.MigrationID != newest.ID || d.Evidence.DestCompute != newest.DestCompute {
				t.Fatalf("evidence does not name the migration: %+v vs %+v", d.Evidence, newest)
			}
			// Evidence 2: the server is on another host, settled.
			s, ok := in.Servers[d.UUID]
			if !ok || !s.Found || s.Host == "" || ours(in, s.Host) || s.TaskState != "" {
				t.Fatalf("destroy without the server on another host: %+v", s)
			}
			if d.Evidence.ServerHost != s.Host {
				t.Fatalf("evidence server host %q, server %q", d.Evidence.ServerHost, s.Host)
			}
			// ... and that host is where the newest evacuation sent it (any
			// other host may be this node under another Nova name).
			if !strings.EqualFold(s.Host, newest.DestCompute) {
				t.Fatalf("destroy although the server is on %q, not on the newest evacuation's destination %q", s.Host, newest.DestCompute)
			}
		}
	})
}

// TestPropertyAmbiguityNeverDestroys: making the data worse (a failure, an
// incomplete listing, a server lookup missing or 404) never adds a Destroy.
func TestPropertyAmbiguityNeverDestroys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t)
		base := destroys(Decide(in))
		worse := in
		switch rapid.IntRange(0, 3).Draw(t, "worsen") {
		case 0:
			worse.NovaFailure = ReasonNovaUnavailable
		case 1:
			worse.EvacuationsComplete = false
		case 2:
			worse.Servers = map[string]ServerLookup{}
			for k, v := range in.Servers {
				if rapid.Bool().Draw(t, "drop") {
					continue
				}
				worse.Servers[k] = v
			}
		case 3:
			worse.Servers = map[string]ServerLookup{}
			for k, v := range in.Servers {
				if rapid.Bool().Draw(t, "404") {
					v = ServerLookup{}
				}
				worse.Servers[k] = v
			}
		}
		for u := range destroys(Decide(worse)) {
			if !base[u] {
				t.Fatalf("worse data destroyed %s", u)
			}
		}
		if worse.NovaFailure != ReasonNone || !worse.EvacuationsComplete {
			if n := len(destroys(Decide(worse))); n != 0 {
				t.Fatalf("%d destroys despite a global problem", n)
			}
		}
	})
}

func destroys(r Result) map[string]bool {
	out := map[string]bool{}
	for _, d := range r.Decisions {
		if d.Decision == DecisionDestroy {
			out[d.UUID] = true
		}
	}
	return out
}

// TestPropertyPlanPartitionsCandidates: the lookup plan asks about exactly
// the candidates, each once, lists only destinations that are not this
// host and have at least MinListingCandidates candidates, each of which
// went there in its newest evacuation.
func TestPropertyPlanPartitionsCandidates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInput(t)
		want := Candidates(in)
		p := PlanLookups(in)
		evac := byInstance(in.Evacuations)
		var got []string
		got = append(got, p.Single...)
		for dest, us := range p.ByDest {
			if ours(in, dest) || len(us) < MinListingCandidates || dest != strings.ToLower(dest) {
				t.Fatalf("listing %q for %d candidates", dest, len(us))
			}
			for _, u := range us {
				if !strings.EqualFold(evac[u][0].DestCompute, dest) {
					t.Fatalf("%s listed on %s but its newest evacuation went to %s", u, dest, evac[u][0].DestCompute)
				}
			}
			got = append(got, us...)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("plan covers %v, candidates %v", got, want)
		}
	})
}
