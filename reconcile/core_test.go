package reconcile

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)

func uuidN(n int) string { return fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", n) }

func nova(n int) Domain {
	return Domain{UUID: uuidN(n), Name: fmt.Sprintf("instance-%08x", n), Nova: NovaInstance, Active: true, State: "running"}
}

func evac(id int, inst int, status, dest string) Migration {
	return Migration{
		ID: int64(id), UUID: fmt.Sprintf("aaaaaaaa-0000-4000-8000-%012d", id), InstanceUUID: uuidN(inst),
		SourceCompute: "node1", DestCompute: dest, DestHost: "192.168.0.1", Status: status, Type: "evacuation",
		SourceNode: "node1.example.org", DestNode: dest + ".example.org",
		CreatedAt: t0.Add(-time.Hour + time.Duration(id)*time.Second), UpdatedAt: t0.Add(-time.Minute),
	}
}

func on(host string) ServerLookup {
	return ServerLookup{Found: true, Host: host, Status: "ACTIVE", VMState: "active"}
}

func baseInput() Input {
	return Input{Now: t0, Hosts: []string{"node1"}, EvacuationsComplete: true}
}

func only(t *testing.T, r Result) DomainDecision {
	t.Helper()
	if len(r.Decisions) != 1 {
		t.Fatalf("want 1 decision, got %d: %+v", len(r.Decisions), r)
	}
	return r.Decisions[0]
}

func TestDecideTable(t *testing.T) {
	type tc struct {
		name    string
		mod     func(*Input)
		want    Decision
		reason  Reason
		global  Reason
		nocands bool
	}
	d1 := func(in *Input) { in.Domains = []Domain{nova(1)} }
	cases := []tc{
		{"evacuated elsewhere", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"each evacuated status destroys", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "pre-migrating", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"completed destroys", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "completed", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"server host differs from the destination only by case", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("NODE2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"server moved on (node3): not proven elsewhere", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node3")}
		}, DecisionSkip, ReasonServerNotOnDestination, ReasonNone, false},
		{"stale host name: server back here under its new name", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "completed", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node1-new")}
		}, DecisionSkip, ReasonServerNotOnDestination, ReasonNone, false},
		{"evacuated to this machine under its new host name (dest node = source node)", func(in *Input) {
			d1(in)
			m := evac(10, 1, "done", "node1-new")
			m.DestNode = "NODE1.example.org"
			in.Evacuations = []Migration{m}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node1-new")}
		}, DecisionSkip, ReasonMigrationDestIsThisHost, ReasonNone, false},
		{"older record went to this machine's node", func(in *Input) {
			d1(in)
			m := evac(10, 1, "completed", "node1-new")
			m.DestNode = "node1.example.org"
			in.Evacuations = []Migration{m, evac(11, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationDestIsThisHost, ReasonNone, false},
		{"another instance's record names this machine's node as source", func(in *Input) {
			d1(in)
			m := evac(10, 1, "done", "node2")
			m.DestNode = "hv-b"
			o := evac(11, 2, "done", "node3")
			o.SourceNode = "hv-b"
			in.Evacuations = []Migration{m, o}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationDestIsThisHost, ReasonNone, false},
		{"not a nova instance", func(in *Input) {
			in.Domains = []Domain{{UUID: uuidN(1), Nova: NotNova, Active: true}}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionKeep, ReasonNotANovaInstance, ReasonNone, true},
		{"metadata unreadable", func(in *Input) {
			in.Domains = []Domain{{UUID: uuidN(1), Nova: NovaUnknown, Active: true}}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMetadataUnreadable, ReasonNone, true},
		{"no evacuation", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 2, "done", "node2")}
		}, DecisionKeep, ReasonNoEvacuation, ReasonNone, true},
		{"migrated back: old evacuation, server here", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node1")}
		}, DecisionKeep, ReasonServerOnThisHost, ReasonNone, false},
		{"server host differs only by case", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("NODE1")}
		}, DecisionKeep, ReasonServerOnThisHost, ReasonNone, false},
		{"failed evacuation, server elsewhere", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "failed", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationStatusNotEvacuated, ReasonNone, false},
		{"newest evacuation failed, older done", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2"), evac(11, 1, "error", "")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationStatusNotEvacuated, ReasonNone, false},
		{"error evacuation, server here", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "error", "")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node1")}
		}, DecisionKeep, ReasonServerOnThisHost, ReasonNone, false},
		{"dest is this host", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node1")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationDestIsThisHost, ReasonNone, false},
		{"older record dest is this host", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "completed", "Node1"), evac(11, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationDestIsThisHost, ReasonNone, false},
		{"no destination yet", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "accepted", "")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonMigrationNoDestination, ReasonNone, false},
		{"server 404", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): {Found: false}}
		}, DecisionSkip, ReasonServerNotFound, ReasonNone, false},
		{"server host null", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): {Found: true, Host: "", Status: "SHELVED_OFFLOADED"}}
		}, DecisionSkip, ReasonServerHostUnknown, ReasonNone, false},
		{"server migrating", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "completed", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): {Found: true, Host: "node2", Status: "MIGRATING", TaskState: "migrating"}}
		}, DecisionSkip, ReasonServerInTransition, ReasonNone, false},
		{"already stopped and marked", func(in *Input) {
			d := nova(1)
			d.Active, d.MarkedMigration = false, 10
			in.Domains = []Domain{d}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
		}, DecisionKeep, ReasonAlreadyStopped, ReasonNone, true},
		{"marked for an older evacuation: looked up again", func(in *Input) {
			d := nova(1)
			d.Active, d.MarkedMigration = false, 9
			in.Domains = []Domain{d}
			in.Evacuations = []Migration{evac(9, 1, "completed", "node2"), evac(10, 1, "done", "node3")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node3")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"marked but running again", func(in *Input) {
			d := nova(1)
			d.MarkedMigration = 10
			in.Domains = []Domain{d}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
		{"lookup missing", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
		}, DecisionSkip, ReasonServerLookupMissing, ReasonNone, false},
		{"nova unavailable", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
			in.NovaFailure, in.NovaDetail = ReasonNovaUnavailable, "connection refused"
		}, DecisionSkip, ReasonNovaUnavailable, ReasonNovaUnavailable, true},
		{"incomplete listing", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
			in.EvacuationsComplete = false
		}, DecisionSkip, ReasonPartialData, ReasonPartialData, true},
		{"filter not applied (other source)", func(in *Input) {
			d1(in)
			m := evac(10, 1, "done", "node2")
			m2 := evac(11, 3, "done", "node1")
			m2.SourceCompute = "node3"
			in.Evacuations = []Migration{m, m2}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonUnexpectedMigration, ReasonUnexpectedMigration, true},
		{"filter not applied (type)", func(in *Input) {
			d1(in)
			m := evac(10, 1, "done", "node2")
			m.Type = "live-migration"
			in.Evacuations = []Migration{m}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonUnexpectedMigration, ReasonUnexpectedMigration, true},
		{"duplicate record", func(in *Input) {
			d1(in)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2"), evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonUnexpectedMigration, ReasonUnexpectedMigration, true},
		{"clock backwards", func(in *Input) {
			d1(in)
			in.LastRun = t0.Add(time.Second)
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonClockOddity, ReasonClockOddity, true},
		{"now unset", func(in *Input) {
			d1(in)
			in.Now = time.Time{}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonClockOddity, ReasonClockOddity, true},
		{"migration from the future", func(in *Input) {
			d1(in)
			m := evac(10, 1, "done", "node2")
			m.CreatedAt = t0.Add(MaxClockSkew + time.Second)
			in.Evacuations = []Migration{m}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonClockOddity, ReasonClockOddity, true},
		{"no host name", func(in *Input) {
			d1(in)
			in.Hosts = []string{"", " bad"}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonNoHostName, ReasonNoHostName, true},
		{"invalid domain uuid", func(in *Input) {
			d := nova(1)
			d.UUID = strings.ToUpper(d.UUID)
			in.Domains = []Domain{d}
			in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionSkip, ReasonInvalidDomain, ReasonNone, true},
		{"case-insensitive source and host names", func(in *Input) {
			d1(in)
			in.Hosts = []string{"Node1.example.org", "NODE1"}
			m := evac(10, 1, "DONE", "node2")
			m.SourceCompute = "node1"
			in.Evacuations = []Migration{m}
			in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
		}, DecisionDestroy, ReasonEvacuatedElsewhere, ReasonNone, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := baseInput()
			c.mod(&in)
			r := Decide(in)
			d := only(t, r)
			if d.Decision != c.want || d.Reason != c.reason || r.Global != c.global {
				t.Fatalf("got %s/%s global %s (%s), want %s/%s global %s", d.Decision, d.Reason, r.Global, r.GlobalDetail, c.want, c.reason, c.global)
			}
			if d.Decision == DecisionDestroy {
				if d.Evidence == nil || d.Evidence.MigrationID == 0 || d.Evidence.DestCompute == "" || d.Evidence.ServerHost == "" {
					t.Fatalf("destroy without evidence: %+v", d.Evidence)
				}
			}
			if got := len(Candidates(in)) == 0; got != c.nocands {
				t.Fatalf("Candidates empty = %v, want %v", got, c.nocands)
			}
		})
	}
}

func TestDecideDuplicateDomainUUID(t *testing.T) {
	in := baseInput()
	in.Domains = []Domain{nova(1), nova(1)}
	in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
	in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
	for _, d := range Decide(in).Decisions {
		if d.Decision != DecisionSkip || d.Reason != ReasonInvalidDomain {
			t.Fatalf("got %s/%s", d.Decision, d.Reason)
		}
	}
}

func TestDecideMixedAndSorted(t *testing.T) {
	in := baseInput()
	in.Domains = []Domain{nova(3), nova(1), nova(2), {UUID: uuidN(4), Nova: NotNova}}
	in.Evacuations = []Migration{evac(10, 1, "done", "node2"), evac(11, 2, "done", "node2"), evac(12, 9, "done", "node2")}
	if got := Candidates(in); strings.Join(got, ",") != uuidN(1)+","+uuidN(2) {
		t.Fatalf("candidates %v", got)
	}
	in.Servers = map[string]ServerLookup{uuidN(1): on("node2"), uuidN(2): on("node1")}
	r := Decide(in)
	want := []struct {
		d Decision
		r Reason
	}{{DecisionDestroy, ReasonEvacuatedElsewhere}, {DecisionKeep, ReasonServerOnThisHost}, {DecisionKeep, ReasonNoEvacuation}, {DecisionKeep, ReasonNotANovaInstance}}
	for i, w := range want {
		d := r.Decisions[i]
		if d.UUID != uuidN(i+1) || d.Decision != w.d || d.Reason != w.r {
			t.Fatalf("decision %d: %s %s/%s, want %s %s/%s", i, d.UUID, d.Decision, d.Reason, uuidN(i+1), w.d, w.r)
		}
	}
}

func TestReasonNamesRoundTrip(t *testing.T) {
	for r := ReasonNone; int(r) < len(reasonNames); r++ {
		if reasonNames[r] == "" {
			t.Fatalf("reason %d has no name", r)
		}
		b, _ := r.MarshalText()
		var back Reason
		if err := back.UnmarshalText(b); err != nil || back != r {
			t.Fatalf("round trip %s: %v %v", r, back, err)
		}
	}
	if !ReasonNovaUnavailable.Global() || ReasonServerNotFound.Global() || ReasonNone.Global() {
		t.Fatal("Global() wrong")
	}
}

func TestResultJSON(t *testing.T) {
	in := baseInput()
	in.Domains = []Domain{nova(1)}
	in.Evacuations = []Migration{evac(10, 1, "done", "node2")}
	in.Servers = map[string]ServerLookup{uuidN(1): on("node2")}
	b, err := json.Marshal(Decide(in))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"decision":"destroy"`, `"reason":"evacuated-elsewhere"`, `"migration_id":10`, `"dest_compute":"node2"`, `"server_host":"node2"`} {
		if !strings.Contains(s, want) {
			t.Fatalf("%s lacks %s", s, want)
		}
	}
}

func TestNextDelay(t *testing.T) {
	for _, c := range []struct {
		f    int
		want time.Duration
	}{{0, time.Minute}, {1, 2 * time.Second}, {2, 4 * time.Second}, {5, 32 * time.Second}, {6, time.Minute}, {60, time.Minute}} {
		if got := NextDelay(time.Minute, c.f); got != c.want {
			t.Errorf("NextDelay(1m, %d) = %v, want %v", c.f, got, c.want)
		}
	}
}

func TestNovaMetadataAndMark(t *testing.T) {
	// What libvirt returns for Nova's element: no prefix.
	meta := `<instance>
  <package version="26.2.2"/>
  <name>vm-1</name>
  <creationTime>2026-11-29 17:00:00</creationTime>
  <flavor name="m1.tiny"><memory>256</memory></flavor>
  <owner><user uuid="u">admin</user><project uuid="p">admin</project></owner>
</instance>`
	info, err := ParseNovaMetadata(meta)
	if err != nil || info.Name != "vm-1" {
		t.Fatalf("ParseNovaMetadata: %+v %v", info, err)
	}
	for _, bad := range []string{"", "<domain/>", "<instance>", "<instance/><instance/>", "text<instance/>", "<instance></other>"} {
		if _, err := ParseNovaMetadata(bad); err == nil {
			t.Errorf("ParseNovaMetadata(%q) accepted", bad)
		}
	}
	dd := DomainDecision{UUID: uuidN(1), Decision: DecisionDestroy, Reason: ReasonEvacuatedElsewhere,
		Evidence: &Evidence{MigrationID: 7, MigrationUUID: "m-7", MigrationStatus: "done", SourceCompute: "node1", DestCompute: "node2", DestHost: `a"<b`, ServerHost: "node2"}}
	x, err := MarkXML(markFrom(dd, OutcomeDestroyed, t0))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseMark(x)
	if err != nil || m.MigrationID != 7 || m.DestHost != `a"<b` || m.Action != OutcomeDestroyed || !m.At.Equal(t0) || m.Reason != ReasonEvacuatedElsewhere {
		t.Fatalf("mark round trip: %s -> %+v %v", x, m, err)
	}
}

// FuzzParseNovaMetadata: never panics; accepted metadata has the instance
// root element.
func FuzzParseNovaMetadata(f *testing.F) {
	f.Add(`<instance><name>vm</name></instance>`)
	f.Add(`<instance xmlns="http://openstack.org/xmlns/libvirt/nova/1.1"><package version="26"/></instance>`)
	f.Add(`<reconcile reason="evacuated-elsewhere" action="destroyed" at="2026-11-29T18:00:00Z" migration-id="1"/>`)
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := ParseNovaMetadata(s); err == nil && !strings.Contains(s, "instance") {
			t.Fatalf("accepted %q", s)
		}
		_, _ = ParseMark(s)
	})
}

func TestPlanLookups(t *testing.T) {
	in := baseInput()
	in.Hosts = []string{"node1", "node1.example"}
	for i := 1; i <= 9; i++ {
		in.Domains = append(in.Domains, nova(i))
	}
	in.Evacuations = []Migration{
		evac(1, 1, "done", "node2"), evac(2, 2, "done", "NODE2"), evac(3, 3, "accepted", "node2"), // three to node2 (case folded): listed
		evac(4, 4, "done", "node3"), evac(5, 5, "done", "node3"), // two to node3: below MinListingCandidates
		evac(6, 6, "done", ""),                                   // no destination
		evac(7, 7, "done", "node1.example"),                      // this host as destination
		evac(8, 8, "done", "node4"), evac(9, 8, "done", "node2"), // newest (id 9) went to node2
	}
	p := PlanLookups(in)
	if len(p.ByDest) != 1 || strings.Join(p.ByDest["node2"], ",") != strings.Join([]string{uuidN(1), uuidN(2), uuidN(3), uuidN(8)}, ",") {
		t.Fatalf("ByDest %v", p.ByDest)
	}
	if strings.Join(p.Single, ",") != strings.Join([]string{uuidN(4), uuidN(5), uuidN(6), uuidN(7)}, ",") {
		t.Fatalf("Single %v", p.Single)
	}
	// Domain 9 has no evacuation: not a candidate at all.
	in.EvacuationsComplete = false
	if p := PlanLookups(in); len(p.ByDest)+len(p.Single) != 0 {
		t.Fatalf("a global problem must plan nothing: %+v", p)
	}
}

// TestDecideStaleHostNameAfterRename (issue 10 item 9): this node was
// "node1" in Nova and is configured so (nova_hosts: [node1]); an instance
// was evacuated from node1 to node2 long ago (completed). Nova's service
// on this node was since renamed "node1-new" and the server came back
// here under that name: the domain here is the live instance. Nothing in
// Nova's data says node1-new is another node, so it must not be destroyed.
func TestDecideStaleHostNameAfterRename(t *testing.T) {
	in := baseInput()
	in.Domains = []Domain{nova(1)}
	in.Evacuations = []Migration{evac(10, 1, "completed", "node2")}
	in.Servers = map[string]ServerLookup{uuidN(1): on("node1-new")}
	if d := only(t, Decide(in)); d.Decision == DecisionDestroy {
		t.Fatalf("destroyed the running instance: %+v %+v", d, d.Evidence)
	}
}

// TestDecideEvacuatedToThisMachineUnderFQDN (attack on issue 10 item 9):
// this machine is "hv1" to hvguard (nova_hosts defaults to the agent's
// host) and was "hv1" to Nova (host and node). A rename campaign makes
// Nova's host and node the FQDN "hv1.example.org"; the old service "hv1"
// is down, and the operator evacuates its instances: the scheduler picks
// hv1.example.org, this very machine, which rebuilds the instance here.
// The record (source hv1/hv1, destination hv1.example.org/hv1.example.org)
// is listed, the server is on its destination, the destination is neither
// in Hosts nor a recorded source node: the live instance is destroyed.
func TestDecideEvacuatedToThisMachineUnderFQDN(t *testing.T) {
	in := baseInput()
	in.Hosts = []string{"hv1"}
	in.Domains = []Domain{nova(1)}
	m := evac(10, 1, "done", "hv1.example.org")
	m.SourceCompute, m.SourceNode, m.DestNode = "hv1", "hv1", "hv1.example.org"
	in.Evacuations = []Migration{m}
	in.Servers = map[string]ServerLookup{uuidN(1): on("HV1.example.org")}
	if d := only(t, Decide(in)); d.Decision == DecisionDestroy {
		t.Fatalf("destroyed the instance evacuated to this machine under its FQDN: %+v %+v", d, d.Evidence)
	}
}

// TestDecideEvacuatedToThisMachineRenamed: the machine was renamed
// completely (host name hv1 -> hv7; Nova host and node hv7); nova_hosts
// still says hv1, the old service hv1 is evacuated onto hv7, this machine.
// Only the machine's own host name (Nodes, os.Hostname) identifies it.
func TestDecideEvacuatedToThisMachineRenamed(t *testing.T) {
	in := baseInput()
	in.Hosts, in.Nodes = []string{"hv1"}, []string{"hv7"}
	in.Domains = []Domain{nova(1)}
	m := evac(10, 1, "done", "hv7")
	m.SourceCompute, m.SourceNode, m.DestNode = "hv1", "hv1", "hv7"
	in.Evacuations = []Migration{m}
	in.Servers = map[string]ServerLookup{uuidN(1): on("hv7")}
	if d := only(t, Decide(in)); d.Decision != DecisionSkip || d.Reason != ReasonMigrationDestIsThisHost {
		t.Fatalf("want skip %s, got %+v %+v", ReasonMigrationDestIsThisHost, d, d.Evidence)
	}
	// Another machine (hv2) is still a destroy.
	in.Evacuations[0].DestCompute, in.Evacuations[0].DestNode = "hv2", "hv2.example.org"
	in.Servers = map[string]ServerLookup{uuidN(1): on("hv2")}
	if d := only(t, Decide(in)); d.Decision != DecisionDestroy {
		t.Fatalf("want destroy, got %+v %+v", d, d.Evidence)
	}
}
