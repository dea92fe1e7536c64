package schema_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"hvguard/controller"
	"hvguard/controller/recovery"
	"hvguard/fencing"
	"hvguard/proto"
	"hvguard/proto/schema"
)

// The published JSON Schemas (proto/schema/v1) against the Go encoders and
// decoders: every message the encoders write is schema-valid, and on
// messages in the writers' form (exact field names, no nulls, optional
// fields omitted when not set) the decoder accepts exactly the
// schema-valid ones — except for the cross-field rules a JSON Schema
// cannot express, which the decoder alone rejects (each schema's
// description lists them; crossField below).

func compile(t testing.TB) map[string]*jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for id, file := range schema.Files {
		b, err := schema.V1.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if err := c.AddResource(id, doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for id := range schema.Files {
		s, err := c.Compile(id)
		if err != nil {
			t.Fatalf("compile %s: %v", id, err)
		}
		out[strings.TrimPrefix(id, "urn:hvguard:schema:v1:")] = s
	}
	return out
}

func validate(s *jsonschema.Schema, b []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// The value lists hold no explicit zero ("", 0, []) of an optional field:
// writers omit those, the schema rejects them, and hvguard's decoder reads
// them as absent (docs/events.md, "Reading").

// kind is one message kind: its decoder, the valid messages the
// generator starts from, and per field the values a mutation may set
// (valid and invalid ones; writers' form: no null, no explicit zero of an
// optional field).
type kind struct {
	name   string
	decode func([]byte) error
	bases  []map[string]any
	values map[string][]any
	// crossField: decoder errors the schema cannot express.
	crossField *regexp.Regexp
}

const (
	uuidA = "d3fe1837-1656-48ea-8337-667709b89817"
	uuidB = "57a7da7d-2a0e-4df8-9f76-cc82fae3ff85"
	t0    = "2026-11-29T19:15:10.123456789Z"
)

var (
	maxU64   = json.Number("18446744073709551615")
	overU64  = json.Number("18446744073709551616")
	hosts    = []any{"node1", "Node-1.example.ORG", "a", strings.Repeat("a", 63) + ".b", "", "-node", "node-", "a..b", "a_b", "node 1", strings.Repeat("a", 64), strings.Repeat("a.", 126) + "aa", 5}
	uuids    = []any{uuidA, uuidB, strings.ToUpper(uuidA), "not-a-uuid", uuidA[:35], 7}
	times    = []any{t0, "2026-11-29T19:15:10Z", "1970-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2026-13-01T00:00:00Z", "yesterday", "", 1700000000}
	seqs     = []any{1, 2, 3, 5, 9, 10, 1000, maxU64, -1, 1.5, overU64, "5"}
	smallPos = []any{1, 2, 3, 4, 7, -2, "3", 2.5}
	texts    = []any{"x", "instance-0000002a", "running-at-window-end", "shutoff", "STOPPED", "DESTROYED", "ünïcödé", strings.Repeat("é", 70), 3, true}
)

func lifecycleKind() kind {
	dom := map[string]any{"schema": 1, "host": "node1.example.org", "incarnation": "00c0ffee00c0ffee", "seq": 7, "domain_uuid": uuidA,
		"domain_name": "instance-0000002a", "transition": "stopped", "reason": "off-at-window-end", "state": "shutoff",
		"libvirt_event": "STOPPED", "libvirt_detail": "DESTROYED", "occurred_at": t0, "observed_at": t0,
		"classification": "stopped-unexpectedly", "classification_reason": "no-operation"}
	reb := map[string]any{"schema": 1, "host": "node1", "seq": 8, "domain_uuid": uuidB, "transition": "rebooted", "reason": "reboot-event",
		"reboot_events": 3, "occurred_at": t0, "observed_at": t0}
	gap := map[string]any{"schema": 1, "host": "node1", "seq": 10, "transition": "gap", "reason": "outbox-full",
		"gap_first_seq": 4, "gap_last_seq": 9, "gap_count": 6, "occurred_at": t0, "observed_at": t0}
	inv := map[string]any{"schema": 1, "host": "node1", "seq": 12, "transition": "inventory", "reason": "start",
		"inventory_part": 1, "inventory_parts": 2, "occurred_at": t0, "observed_at": t0,
		"domains": []any{map[string]any{"uuid": uuidA, "name": "instance-0000002a", "state": "running"}, map[string]any{"uuid": uuidB, "state": "shutoff"}}}
	transitions := []any{"started", "stopped", "rebooted", "suspended", "resumed", "pmsuspended", "defined", "undefined", "gap", "inventory", "exploded", ""}
	return kind{name: "lifecycle", decode: func(b []byte) error { _, err := proto.DecodeLifecycle(b); return err },
		bases: []map[string]any{dom, reb, gap, inv},
		values: map[string][]any{
			"schema": {1, 2, 0, "1", 1.5}, "host": hosts, "seq": seqs, "transition": transitions,
			"incarnation": {"00c0ffee00c0ffee", "0123456789abcdef", "0000000000000000", "00C0FFEE00C0FFEE", "c0ffee", "", 12},
			"domain_uuid": uuids, "domain_name": texts, "reason": texts, "state": texts, "libvirt_event": texts, "libvirt_detail": texts,
			"occurred_at": times, "observed_at": times,
			"classification":        {"rebooted", "stopped-by-nova", "stopped-unexpectedly", "unknown", "bogus", 1},
			"classification_reason": {"no-operation", "nova-synced-stop", "x", strings.Repeat("a", 64), strings.Repeat("a", 65), "Bad Token", 2},
			"reboot_events":         {1, 2, 3, 17, maxU64, -1, overU64, "3"},
			"gap_first_seq":         seqs, "gap_last_seq": seqs, "gap_count": seqs,
			"inventory_part": smallPos, "inventory_parts": smallPos,
			"domains": {
				[]any{map[string]any{"uuid": uuidA, "state": "running"}},
				[]any{map[string]any{"uuid": uuidA, "name": "n", "state": "paused"}, map[string]any{"uuid": uuidB, "state": "shutoff"}},
				[]any{map[string]any{"uuid": "bad", "state": "running"}},
				[]any{map[string]any{"uuid": uuidA, "state": ""}},
				[]any{map[string]any{"uuid": uuidA}},
				[]any{map[string]any{"uuid": uuidA, "state": strings.Repeat("s", 65)}},
				"running", manyDomains(257),
			},
		},
		crossField: regexp.MustCompile(`^decode lifecycle event: (gap_last_seq: \d+ is (below gap_first_seq|not below the marker's seq)|gap_count: \d+ does not match|inventory_part: \d+, must be in 1\.\.inventory_parts|inventory_part: \d+ is above the message's seq)`),
	}
}

func manyDomains(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"uuid": fmt.Sprintf("00000000-0000-4000-8000-%012x", i), "state": "running"}
	}
	return out
}

func reconcileKind() kind {
	base := map[string]any{"schema": 1, "host": "node1", "domain_uuid": uuidA, "domain_name": "instance-d3fe", "outcome": "destroyed",
		"reason": "evacuated-elsewhere", "trigger": "rejoin", "migration_id": 1, "migration_uuid": "5f8c1a2e-0000-4000-8000-000000000001",
		"migration_status": "done", "source_compute": "node1", "dest_compute": "node2", "dest_host": "192.0.2.2", "server_host": "node2", "observed_at": t0}
	return kind{name: "reconcile", decode: func(b []byte) error { _, err := proto.DecodeReconcile(b); return err },
		bases: []map[string]any{base, {"schema": 1, "host": "node1", "domain_uuid": uuidB, "outcome": "destroy-failed", "reason": "evacuated-elsewhere",
			"trigger": "retry", "error": "virDomainDestroy: timed out", "observed_at": t0}},
		values: map[string][]any{
			"schema": {1, 2, 0, "1"}, "host": hosts, "domain_uuid": uuids, "domain_name": texts,
			"outcome": {"destroyed", "already-off", "would-destroy", "destroy-failed", "kept", "", 1},
			"reason":  texts, "trigger": texts, "migration_id": {1, 42, -3, json.Number("9223372036854775807"), json.Number("9223372036854775808"), 1.5, "1"},
			"migration_uuid": texts, "migration_status": texts, "source_compute": texts, "dest_compute": texts, "dest_host": texts,
			"server_host": texts, "error": texts, "observed_at": times,
		},
		crossField: regexp.MustCompile(`^$`),
	}
}

func fenceKind() kind {
	base := map[string]any{"schema": 1, "host": "node1", "boot_id": "0e3b8f4a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "epoch": 3, "from": "asking-peers",
		"to": "fencing", "reason": "NoPeerConfirmed", "detail": "0 of 4 peers answered", "paused": []any{uuidA}, "at": t0}
	states := []any{"healthy", "fenced", "awaiting-release", "some-future-state", "", 4}
	return kind{name: "fence", decode: func(b []byte) error { _, err := fencing.DecodeFenceEvent(b); return err },
		bases: []map[string]any{base, {"schema": 1, "host": "node1", "boot_id": "b", "epoch": 0, "from": "starting", "to": "healthy", "reason": "Renewed", "at": t0}},
		values: map[string][]any{
			"schema": {1, 2, 0, "1"}, "host": {"node1", "any host text", "", 3}, "boot_id": {"b", "", 2}, "epoch": {0, 1, maxU64, -1, overU64, "1"},
			"from": states, "to": states, "reason": {"Renewed", "", 9}, "detail": texts,
			"paused": {[]any{uuidA}, []any{uuidA, uuidB}, []any{1}, "x"}, "would_fence": {[]any{uuidB}, []any{2}},
			"at": {t0, "0001-01-01T00:00:00Z", "yesterday", 5},
		},
		crossField: regexp.MustCompile(`^$`),
	}
}

func beaconKind() kind {
	base := map[string]any{"schema": 1, "host": "node1", "boot_id": "0e3b8f4a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "incarnation": 7, "revision": 42, "at": t0}
	return kind{name: "beacon", decode: func(b []byte) error { _, err := fencing.DecodeBeacon(b); return err },
		bases: []map[string]any{base, {"schema": 1, "host": "node1", "revision": 1}},
		values: map[string][]any{
			"schema": {1, 2, 0, "1"}, "host": {"node1", "any host text", "", 3}, "boot_id": {"b", "", 2},
			"incarnation": {0, 1, maxU64, -1, overU64, "1"}, "revision": {1, 9, maxU64, 0, -1, overU64, 1.5, "1"},
			"at": {t0, "0001-01-01T00:00:00Z", "yesterday", 5},
		},
		crossField: regexp.MustCompile(`^$`),
	}
}

func decisionKind() kind {
	base := map[string]any{"schema": 1, "controller": "ctl-a", "term": 4, "op": "declare", "host": "node1", "epoch": 3,
		"reason": "lease expired", "at": t0}
	return kind{name: "controller-decision", decode: func(b []byte) error { _, err := controller.DecodeDecisionEvent(b); return err },
		bases: []map[string]any{base, {"schema": 1, "controller": "ctl-b", "term": 5, "op": "hold-started", "silent": 5, "threshold": 3, "at": t0}},
		values: map[string][]any{
			"schema": {1, 2, 0, "1"}, "controller": {"ctl-a", "", 1}, "term": {0, 1, maxU64, -1, overU64}, "op": {"declare", "release", "future-op", "", 2},
			"host": {"node1", 3}, "epoch": {1, 9, maxU64, -1, overU64}, "reason": texts, "silent": {1, 40, -1, 1.5}, "threshold": {2, 7, "3"},
			"error": texts, "at": {t0, "0001-01-01T00:00:00Z", "yesterday", 5},
		},
		crossField: regexp.MustCompile(`^$`),
	}
}

func recoveryKind() kind {
	base := map[string]any{"schema": 1, "controller": "ctl-a", "term": 4, "host": "node1", "op": "evacuated", "phase": "evacuate",
		"instance": uuidA, "reason": "instance ACTIVE on node2", "at": t0}
	return kind{name: "controller-recovery", decode: func(b []byte) error { _, err := controller.DecodeRecoveryEvent(b); return err },
		bases: []map[string]any{base, {"schema": 1, "controller": "ctl-b", "host": "node2", "op": "refused", "why": "guard-holding", "at": t0}},
		values: map[string][]any{
			"schema": {1, 2, 0, "1"}, "controller": {"ctl-a", "", 1}, "term": {0, 1, maxU64, -1, overU64}, "host": {"node1", "", 3},
			"op": {"started", "future-op", "", 2}, "phase": {"evacuate", "future-phase", 4}, "instance": {uuidA, 5}, "why": texts,
			"reason": texts, "error": texts, "at": {t0, "0001-01-01T00:00:00Z", "yesterday", 5},
		},
		crossField: regexp.MustCompile(`^$`),
	}
}

func kinds() []kind {
	return []kind{lifecycleKind(), reconcileKind(), fenceKind(), beaconKind(), decisionKind(), recoveryKind()}
}

// mutate applies n random changes to a copy of m: set a known field to one
// of its values, delete a field, or add an unknown one.
func (k kind) mutate(m map[string]any, n int, r *rand.Rand) map[string]any {
	out := map[string]any{}
	for f, v := range m {
		out[f] = v
	}
	fields := make([]string, 0, len(k.values))
	for f := range k.values {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	for range n {
		switch x := r.IntN(10); {
		case x == 0:
			out[fmt.Sprintf("future_field_%d", r.IntN(3))] = map[string]any{"nested": []any{1, "two"}}
		case x == 1:
			delete(out, fields[r.IntN(len(fields))])
		default:
			f := fields[r.IntN(len(fields))]
			vs := k.values[f]
			out[f] = vs[r.IntN(len(vs))]
		}
	}
	return out
}

// check compares the decoder and the schema on one message.
func (k kind) check(t testing.TB, s *jsonschema.Schema, msg map[string]any) (accepted bool) {
	t.Helper()
	b, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	derr := k.decode(b)
	serr := validate(s, b)
	switch {
	case derr == nil && serr != nil:
		t.Errorf("%s: the decoder accepts what the schema rejects:\n%s\nschema: %v", k.name, b, serr)
	case derr != nil && serr == nil && !k.crossField.MatchString(derr.Error()):
		t.Errorf("%s: the schema accepts what the decoder rejects (not a cross-field rule):\n%s\ndecoder: %v", k.name, b, derr)
	}
	return derr == nil
}

// TestSchemaAgreesWithDecoder: random mutations of valid messages, the
// decoder's verdict against the schema's (both directions).
func TestSchemaAgreesWithDecoder(t *testing.T) {
	schemas := compile(t)
	r := rand.New(rand.NewPCG(15, 2026))
	for _, k := range kinds() {
		s := schemas[k.name]
		accepted, rejected := 0, 0
		for i := range 3000 {
			base := k.bases[i%len(k.bases)]
			if k.check(t, s, k.mutate(base, r.IntN(4), r)) {
				accepted++
			} else {
				rejected++
			}
			if t.Failed() {
				return
			}
		}
		// The generator must exercise both verdicts, or it proves nothing.
		if accepted < 300 || rejected < 300 {
			t.Errorf("%s: %d accepted, %d rejected: the generator is lopsided", k.name, accepted, rejected)
		}
	}
}

// FuzzSchemaAgreesWithDecoder: the same property, the fuzzer choosing the
// mutations (its input is the random source).
func FuzzSchemaAgreesWithDecoder(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte("inventory gap reboot"))
	schemas := compile(f)
	ks := kinds()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 8 {
			return
		}
		var seed [32]byte
		copy(seed[:], data)
		r := rand.New(rand.NewChaCha8(seed))
		k := ks[int(data[0])%len(ks)]
		k.check(t, schemas[k.name], k.mutate(k.bases[int(data[1])%len(k.bases)], 1+int(data[2])%5, r))
	})
}

// TestEncodersWriteSchemaValid: what the Go encoders write, for each kind
// of message, is valid against its schema.
func TestEncodersWriteSchemaValid(t *testing.T) {
	schemas := compile(t)
	at := time.Date(2026, 11, 29, 19, 15, 10, 123456789, time.UTC)
	inc, err := proto.NewIncarnation()
	if err != nil {
		t.Fatal(err)
	}
	var lc []proto.LifecycleEvent
	for i, tr := range []proto.Transition{proto.TransitionStarted, proto.TransitionStopped, proto.TransitionSuspended, proto.TransitionResumed,
		proto.TransitionPMSuspended, proto.TransitionDefined, proto.TransitionUndefined} {
		lc = append(lc, proto.LifecycleEvent{Schema: 1, Host: "node1.example.org", Incarnation: inc, Seq: uint64(i + 1), DomainUUID: uuidA,
			DomainName: "instance-0000002a", Transition: tr, Reason: "r", State: "running", LibvirtEvent: "E", LibvirtDetail: "D", OccurredAt: at, ObservedAt: at})
	}
	lc = append(lc,
		proto.LifecycleEvent{Schema: 1, Host: "node1", Seq: 20, DomainUUID: uuidA, Transition: proto.TransitionStopped, OccurredAt: at, ObservedAt: at,
			Classification: proto.ClassificationStoppedByNova, ClassificationReason: "nova-synced-stop"},
		proto.LifecycleEvent{Schema: 1, Host: "node1", Seq: 21, DomainUUID: uuidA, Transition: proto.TransitionRebooted, Reason: "reboot-event",
			RebootEvents: 3, OccurredAt: at, ObservedAt: at, Classification: proto.ClassificationRebooted, ClassificationReason: "nova-operation"},
		proto.LifecycleEvent{Schema: 1, Host: "node1", Seq: 30, Transition: proto.TransitionGap, Reason: "outbox-full",
			GapFirstSeq: 22, GapLastSeq: 29, GapCount: 8, OccurredAt: at, ObservedAt: at})
	var doms []proto.InventoryDomain
	for i := range 300 {
		doms = append(doms, proto.InventoryDomain{UUID: fmt.Sprintf("00000000-0000-4000-8000-%012x", i), Name: fmt.Sprint("instance-", i), State: "running"})
	}
	for _, part := range [][]proto.InventoryDomain{nil, doms} {
		for i, m := range proto.InventoryMessages("node1", "start", part) {
			m.Seq, m.OccurredAt, m.ObservedAt = uint64(40+i), at, at
			lc = append(lc, m)
		}
	}
	for _, e := range lc {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(schemas["lifecycle"], b); err != nil {
			t.Errorf("encoded %s is not schema-valid: %v\n%s", e.Transition, err, b)
		}
	}
	rc := proto.ReconcileEvent{Schema: 1, Host: "node1", DomainUUID: uuidA, DomainName: "instance-d3fe", Outcome: proto.ReconcileDestroyed,
		Reason: "evacuated-elsewhere", Trigger: "rejoin", MigrationID: 1, MigrationUUID: "m", MigrationStatus: "done", SourceCompute: "node1",
		DestCompute: "node2", ServerHost: "node2", ObservedAt: at}
	fe := fencing.NewFenceEvent("node1", "boot", fencing.Transition{Epoch: 2, From: fencing.StateAskingPeers, To: fencing.StateFencing,
		Reason: "NoPeerConfirmed", Detail: "d"}, []string{uuidA}, nil, at)
	de := controller.NewDecisionEvent("ctl-a", 4, controller.Decision{Op: controller.OpDeclare, Host: "node1", Reason: "lease expired",
		Record: fencing.LeaseRecord{Epoch: 3}}, errors.New("cas conflict"), at)
	re := controller.NewRecoveryEvent("ctl-a", 4, recovery.Event{Host: "node1", Op: "evacuation-failed", Phase: recovery.PhaseEvacuate,
		Instance: uuidA, Reason: "migration 12 error (no destination: NoValidHost, the server stays on node1)"}, at)
	be := fencing.Beacon{Schema: fencing.BeaconSchema, Host: "node1", BootID: "boot", Incarnation: 3, Revision: 42, At: at}
	for name, enc := range map[string]func() ([]byte, error){"reconcile": rc.Encode, "fence": fe.Encode, "beacon": be.Encode, "controller-decision": de.Encode,
		"controller-recovery": re.Encode} {
		b, err := enc()
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(schemas[name], b); err != nil {
			t.Errorf("encoded %s is not schema-valid: %v\n%s", name, err, b)
		}
	}
}

// TestEventsDocExamples: every JSON example in docs/events.md names its
// schema ("<!-- schema: NAME valid|invalid|cross-field -->" before the
// block) and is valid (and accepted by the decoder), invalid (and
// rejected), or schema-valid but rejected by a cross-field rule, as it
// says.
func TestEventsDocExamples(t *testing.T) {
	schemas := compile(t)
	doc, err := os.ReadFile("../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	ex := regexp.MustCompile("(?s)<!-- schema: ([a-z-]+) (valid|invalid|cross-field) -->\\s*```json\\n(.*?)```")
	byName := map[string]kind{}
	for _, k := range kinds() {
		byName[k.name] = k
	}
	blocks := strings.Count(string(doc), "```json")
	found := ex.FindAllStringSubmatch(string(doc), -1)
	if len(found) < 8 || len(found) != blocks {
		t.Fatalf("%d of %d JSON examples in docs/events.md name their schema", len(found), blocks)
	}
	for _, m := range found {
		name, want, body := m[1], m[2], []byte(m[3])
		s := schemas[name]
		if s == nil {
			t.Fatalf("docs/events.md: unknown schema %q", name)
		}
		serr, derr := validate(s, body), byName[name].decode(body)
		ok := (want == "valid") == (serr == nil) && (want == "valid") == (derr == nil)
		if want == "cross-field" {
			ok = serr == nil && derr != nil && byName[name].crossField.MatchString(derr.Error())
		}
		if !ok {
			t.Errorf("docs/events.md example (%s, %s): schema %v, decoder %v\n%s", name, want, serr, derr, body)
		}
	}
}
