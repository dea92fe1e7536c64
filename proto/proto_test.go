package proto

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	t0 = time.Date(2026, 11, 29, 18, 0, 0, 123456789, time.UTC)
	t1 = t0.Add(15 * time.Second)
)

func validEvent() LifecycleEvent {
	return LifecycleEvent{
		Schema: SchemaVersion, Host: "cmp-01.az1.example.org", Seq: 42,
		DomainUUID: "0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f", DomainName: "instance-0000002a",
		Transition: TransitionStopped, Reason: "running-at-window-end", State: "shutoff",
		LibvirtEvent: "STOPPED", LibvirtDetail: "DESTROYED",
		OccurredAt: t0, ObservedAt: t1,
	}
}

// testInc is an incarnation as an agent's outbox draws it.
const testInc Incarnation = 0x9f3c2a1b4d5e6f70

// incarnatedEvent is validEvent from an agent with incarnations (issue 10).
func incarnatedEvent() LifecycleEvent {
	e := validEvent()
	e.Incarnation = testInc
	return e
}

func validGap() LifecycleEvent {
	return LifecycleEvent{
		Schema: SchemaVersion, Host: "cmp-01", Seq: 20, Transition: TransitionGap,
		Reason: "outbox-full", OccurredAt: t0, ObservedAt: t1,
		GapFirstSeq: 10, GapLastSeq: 19, GapCount: 10,
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(e *LifecycleEvent)
		gap     bool
		wantErr string // substring; "" = valid
	}{
		{"valid event", func(*LifecycleEvent) {}, false, ""},
		{"valid gap", func(*LifecycleEvent) {}, true, ""},
		{"schema missing", func(e *LifecycleEvent) { e.Schema = 0 }, false, "schema: missing"},
		{"schema 2", func(e *LifecycleEvent) { e.Schema = 2 }, false, "schema: unsupported version 2"},
		{"host empty", func(e *LifecycleEvent) { e.Host = "" }, false, "host: host name is empty"},
		{"host space", func(e *LifecycleEvent) { e.Host = "a b" }, false, `host: host name "a b" contains ' '`},
		{"host wildcard", func(e *LifecycleEvent) { e.Host = "*" }, false, "host:"},
		{"seq 0", func(e *LifecycleEvent) { e.Seq = 0 }, false, "seq: must be >= 1"},
		{"incarnation", func(e *LifecycleEvent) { e.Incarnation = testInc }, false, ""},
		{"incarnation on gap", func(e *LifecycleEvent) { e.Incarnation = testInc }, true, ""},
		{"transition unknown", func(e *LifecycleEvent) { e.Transition = "exploded" }, false, `transition: unknown value "exploded"`},
		{"transition empty", func(e *LifecycleEvent) { e.Transition = "" }, false, "transition: unknown value"},
		{"uuid empty", func(e *LifecycleEvent) { e.DomainUUID = "" }, false, `domain_uuid: invalid UUID ""`},
		{"uuid upper", func(e *LifecycleEvent) { e.DomainUUID = strings.ToUpper(e.DomainUUID) }, false, "domain_uuid: invalid UUID"},
		{"uuid no dashes", func(e *LifecycleEvent) { e.DomainUUID = "0b9f6a1e5d3c4c1e9a8e7f2b1c3d4e5f" }, false, "domain_uuid:"},
		{"uuid long value quoted short", func(e *LifecycleEvent) { e.DomainUUID = strings.Repeat("x", 1000) }, false, "(1000 bytes)"},
		{"occurred zero", func(e *LifecycleEvent) { e.OccurredAt = time.Time{} }, false, "occurred_at: missing"},
		{"observed zero", func(e *LifecycleEvent) { e.ObservedAt = time.Time{} }, false, "observed_at: missing"},
		{"observed 1900", func(e *LifecycleEvent) { e.ObservedAt = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC) }, false, "observed_at: 1900-01-01T00:00:00Z is outside"},
		{"bad utf8", func(e *LifecycleEvent) { e.Reason = "\xff" }, false, "reason: not valid UTF-8"},
		{"gap fields on event", func(e *LifecycleEvent) { e.GapCount = 1 }, false, "gap_first_seq/gap_last_seq/gap_count: set on a \"stopped\" event"},
		{"gap with uuid", func(e *LifecycleEvent) { e.DomainUUID = "0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f" }, true, "domain_uuid/domain_name: must be empty"},
		{"gap first 0", func(e *LifecycleEvent) { e.GapFirstSeq = 0 }, true, "gap_first_seq: must be >= 1"},
		{"gap last < first", func(e *LifecycleEvent) { e.GapLastSeq = 9 }, true, "gap_last_seq: 9 is below gap_first_seq 10"},
		{"gap last >= seq", func(e *LifecycleEvent) { e.GapLastSeq = 20; e.GapCount = 11 }, true, "gap_last_seq: 20 is not below the marker's seq 20"},
		{"gap count wrong", func(e *LifecycleEvent) { e.GapCount = 3 }, true, "gap_count: 3 does not match"},
		{"classified stop", func(e *LifecycleEvent) {
			e.Classification, e.ClassificationReason = ClassificationStoppedUnexpectedly, "nova-synced-stop"
		}, false, ""},
		{"classified reboot", func(e *LifecycleEvent) {
			e.Transition, e.Classification, e.ClassificationReason = TransitionRebooted, ClassificationRebooted, "operation-completed"
		}, false, ""},
		{"classification unknown value", func(e *LifecycleEvent) { e.Classification, e.ClassificationReason = "planned", "x" }, false, `classification: unknown value "planned"`},
		{"classification without reason", func(e *LifecycleEvent) { e.Classification = ClassificationUnknown }, false, `classification_reason: "": must be a token`},
		{"reason without classification", func(e *LifecycleEvent) { e.ClassificationReason = "nova-slow" }, false, `classification: unknown value ""`},
		{"reason too long", func(e *LifecycleEvent) {
			e.Classification, e.ClassificationReason = ClassificationUnknown, strings.Repeat("a", MaxClassificationReason+1)
		}, false, "classification_reason:"},
		{"reason max length", func(e *LifecycleEvent) {
			e.Classification, e.ClassificationReason = ClassificationUnknown, strings.Repeat("a", MaxClassificationReason)
		}, false, ""},
		{"reason charset", func(e *LifecycleEvent) { e.Classification, e.ClassificationReason = ClassificationUnknown, "Nova Slow" }, false, `classification_reason: "Nova Slow"`},
		{"rebooted classification on stop", func(e *LifecycleEvent) { e.Classification, e.ClassificationReason = ClassificationRebooted, "x" }, false, `classification: "rebooted" on a "stopped" event`},
		{"stop classification on reboot", func(e *LifecycleEvent) {
			e.Transition, e.Classification, e.ClassificationReason = TransitionRebooted, ClassificationUnknown, "nova-slow"
		}, false, `classification: "unknown" on a "rebooted" event`},
		{"classification on start", func(e *LifecycleEvent) {
			e.Transition, e.Classification, e.ClassificationReason = TransitionStarted, ClassificationUnknown, "nova-slow"
		}, false, `on a "started" event`},
		{"classification on gap", func(e *LifecycleEvent) { e.Classification, e.ClassificationReason = ClassificationUnknown, "nova-slow" }, true, `on a "gap" event`},
		{"reboot events on a reboot", func(e *LifecycleEvent) {
			e.Transition, e.Reason, e.RebootEvents = TransitionRebooted, "reboot-event", 2
		}, false, ""},
		{"reboot events on a stop", func(e *LifecycleEvent) { e.RebootEvents = 2 }, false, `reboot_events: 2 on a "stopped" event (only on "rebooted")`},
		{"reboot events on a gap", func(e *LifecycleEvent) { e.RebootEvents = 1 }, true, `reboot_events: 1 on a "gap" event`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := validEvent()
			if tt.gap {
				e = validGap()
			}
			tt.mod(&e)
			err := e.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func classifiedEvent() LifecycleEvent {
	e := validEvent()
	e.Classification, e.ClassificationReason = ClassificationStoppedByNova, "stop-requested"
	return e
}

func TestRoundTrip(t *testing.T) {
	for _, e := range []LifecycleEvent{validEvent(), validGap(), classifiedEvent(), incarnatedEvent(), rebootEvent()} {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeLifecycle(b)
		if err != nil {
			t.Fatalf("DecodeLifecycle(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, e)
		}
	}
}

func TestEncodeFieldNames(t *testing.T) {
	e := validEvent()
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":1,"host":"cmp-01.az1.example.org","seq":42,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","domain_name":"instance-0000002a","transition":"stopped","reason":"running-at-window-end","state":"shutoff","libvirt_event":"STOPPED","libvirt_detail":"DESTROYED","occurred_at":"2026-11-29T18:00:00.123456789Z","observed_at":"2026-11-29T18:00:15.123456789Z"}`
	if string(b) != want {
		t.Fatalf("Encode:\n got %s\nwant %s", b, want)
	}
	// Classified: the two optional fields, after the v1 fields a v1
	// reader knows.
	e = classifiedEvent()
	if b, err = e.Encode(); err != nil {
		t.Fatal(err)
	}
	want = strings.TrimSuffix(want, "}") + `,"classification":"stopped-by-nova","classification_reason":"stop-requested"}`
	if string(b) != want {
		t.Fatalf("Encode classified:\n got %s\nwant %s", b, want)
	}
	// With an incarnation: a JSON string next to host and seq.
	e = incarnatedEvent()
	if b, err = e.Encode(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"schema":1,"host":"cmp-01.az1.example.org","incarnation":"9f3c2a1b4d5e6f70","seq":42,`) {
		t.Fatalf("Encode with incarnation: %s", b)
	}
	// A coalesced reboot: the count after the v1 fields.
	e = rebootEvent()
	if b, err = e.Encode(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), `"transition":"rebooted","reason":"reboot-event","state":"running","libvirt_event":"REBOOT","occurred_at":"2026-11-29T18:00:00.123456789Z","observed_at":"2026-11-29T18:00:15.123456789Z","reboot_events":3}`) {
		t.Fatalf("Encode reboot: %s", b)
	}
	// Absent from an older agent's reboot: decodes as 0 (read it as 1).
	old := strings.Replace(string(b), `,"reboot_events":3`, "", 1)
	if got, err := DecodeLifecycle([]byte(old)); err != nil || got.RebootEvents != 0 {
		t.Fatalf("reboot without reboot_events: %+v, %v", got, err)
	}
}

// rebootEvent is a coalesced burst of REBOOT events (issue 15).
func rebootEvent() LifecycleEvent {
	e := validEvent()
	e.Transition, e.Reason, e.State, e.LibvirtEvent, e.LibvirtDetail, e.RebootEvents = TransitionRebooted, "reboot-event", "running", "REBOOT", "", 3
	return e
}

// TestIncarnationCompatible: the incarnation is a compatible schema 1
// addition. An event without it (an older agent) decodes with the empty
// incarnation; an event with it decodes in a reader that does not know the
// field (an older consumer, simulated by the schema-1 fields it knew)
// with every field it knows unchanged.
func TestIncarnationCompatible(t *testing.T) {
	old := validEvent()
	b, err := old.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeLifecycle(b); err != nil || got.Incarnation != 0 || !reflect.DeepEqual(got, old) {
		t.Fatalf("event without incarnation: %+v, %v", got, err)
	}
	e := incarnatedEvent()
	if b, err = e.Encode(); err != nil {
		t.Fatal(err)
	}
	type oldReader struct {
		Schema     int        `json:"schema"`
		Host       string     `json:"host"`
		Seq        uint64     `json:"seq"`
		DomainUUID string     `json:"domain_uuid"`
		Transition Transition `json:"transition"`
	}
	var r oldReader
	if err := json.Unmarshal(b, &r); err != nil || r.Seq != e.Seq || r.Host != e.Host || r.DomainUUID != e.DomainUUID || r.Transition != e.Transition {
		t.Fatalf("an older reader: %+v, %v", r, err)
	}
	// Not a number: 64-bit values do not survive JSON readers using doubles.
	if _, err := DecodeLifecycle([]byte(strings.Replace(string(b), `"9f3c2a1b4d5e6f70"`, `11474839023424458608`, 1))); err == nil {
		t.Fatal("a numeric incarnation was accepted")
	}
}

// TestNewIncarnation: valid, and not the same twice.
func TestNewIncarnation(t *testing.T) {
	seen := map[Incarnation]bool{}
	for range 100 {
		i, err := NewIncarnation()
		if err != nil || i == 0 || len(i.String()) != IncarnationLen || seen[i] {
			t.Fatalf("NewIncarnation = %q, %v (seen before: %v)", i, err, seen[i])
		}
		seen[i] = true
	}
}

func TestEncodeRejectsInvalid(t *testing.T) {
	e := validEvent()
	e.Seq = 0
	if _, err := e.Encode(); err == nil || !strings.Contains(err.Error(), "seq") {
		t.Fatalf("Encode(seq 0) = %v, want seq error", err)
	}
}

func TestDecode(t *testing.T) {
	good := `{"schema":1,"host":"h1","seq":1,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","occurred_at":"2026-01-01T00:00:00+01:00","observed_at":"2026-01-01T00:00:01Z"`
	tests := []struct {
		name, in, wantErr string
	}{
		{"valid", good + `}`, ""},
		{"unknown field tolerated", good + `,"nova_task":"planned"}`, ""},
		{"classified", strings.Replace(good, `"started"`, `"stopped"`, 1) + `,"classification":"unknown","classification_reason":"agent-stopping"}`, ""},
		{"classification unknown value", strings.Replace(good, `"started"`, `"stopped"`, 1) + `,"classification":"planned","classification_reason":"x"}`, `classification: unknown value "planned"`},
		{"classification not a string", good + `,"classification":{"x":1}}`, "classification"},
		{"classification reason empty", strings.Replace(good, `"started"`, `"stopped"`, 1) + `,"classification":"unknown","classification_reason":""}`, "classification_reason"},
		{"incarnation", strings.Replace(good, `"seq":1`, `"incarnation":"9f3c2a1b4d5e6f70","seq":1`, 1) + `}`, ""},
		{"incarnation null", strings.Replace(good, `"seq":1`, `"incarnation":null,"seq":1`, 1) + `}`, ""},
		{"incarnation short", strings.Replace(good, `"seq":1`, `"incarnation":"9f3c","seq":1`, 1) + `}`, `incarnation: "9f3c" is not 16 lower-case hex digits`},
		{"incarnation upper case", strings.Replace(good, `"seq":1`, `"incarnation":"9F3C2A1B4D5E6F70","seq":1`, 1) + `}`, "incarnation: "},
		{"incarnation long", strings.Replace(good, `"seq":1`, `"incarnation":"09f3c2a1b4d5e6f70","seq":1`, 1) + `}`, "incarnation: "},
		{"incarnation signed", strings.Replace(good, `"seq":1`, `"incarnation":"+f3c2a1b4d5e6f70","seq":1`, 1) + `}`, "incarnation: "},
		{"incarnation zero", strings.Replace(good, `"seq":1`, `"incarnation":"0000000000000000","seq":1`, 1) + `}`, `incarnation: "0000000000000000" is zero`},
		{"incarnation number", strings.Replace(good, `"seq":1`, `"incarnation":11474839023424458608,"seq":1`, 1) + `}`, "incarnation"},
		{"trailing whitespace", good + "}\n", ""},
		{"trailing data", good + `}{}`, "trailing data"},
		{"trailing garbage", good + `}x`, "trailing data"},
		{"not json", `hello`, "decode lifecycle event: invalid character"},
		{"null", `null`, "schema: missing"},
		{"empty", ``, "EOF"},
		{"schema string", `{"schema":"1"}`, "schema"},
		{"seq negative", `{"schema":1,"seq":-1}`, "seq"},
		{"wrong schema", strings.Replace(good, `"schema":1`, `"schema":7`, 1) + `}`, "schema: unsupported version 7"},
		{"bad host", strings.Replace(good, `"h1"`, `"h>1"`, 1) + `}`, "host:"},
		{"bad time", strings.Replace(good, `2026-01-01T00:00:01Z`, `yesterday`, 1) + `}`, "observed_at"},
		{"oversize", `{"schema":1,"reason":"` + strings.Repeat("a", MaxMessageSize) + `"}`, "exceeds 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := DecodeLifecycle([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("DecodeLifecycle = %v", err)
				}
				if e.OccurredAt.Location() != time.UTC {
					t.Fatalf("occurred_at not normalised to UTC: %v", e.OccurredAt)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("DecodeLifecycle = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestHostToken(t *testing.T) {
	tests := []struct {
		host, token, wantErr string
	}{
		{"cmp-01", "cmp-01", ""},
		{"cmp-01.az1.example.org", "cmp-01_az1_example_org", ""},
		{"Node7.Example", "Node7_Example", ""},
		{"1.2.3.4", "1_2_3_4", ""},
		{"", "", "empty"},
		{"a b", "", "contains ' '"},
		{"a*", "", "contains '*'"},
		{"a.>", "", "contains '>'"},
		{"a_b", "", "contains '_'"},
		{"-a", "", "starting or ending with '-'"},
		{"a-", "", "starting or ending with '-'"},
		{"a..b", "", "empty label"},
		{"a.", "", "empty label"},
		{".a", "", "empty label"},
		{strings.Repeat("a", 64), "", "label longer than 63"},
		{strings.Repeat("a.", 127) + "a", "", "longer than 253"},
		{"héllo", "", "contains"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			tok, err := HostToken(tt.host)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("HostToken(%q) = %q, %v; want error containing %q", tt.host, tok, err, tt.wantErr)
				}
				return
			}
			if err != nil || tok != tt.token {
				t.Fatalf("HostToken(%q) = %q, %v; want %q", tt.host, tok, err, tt.token)
			}
			back, err := TokenToHost(tok)
			if err != nil || back != tt.host {
				t.Fatalf("TokenToHost(%q) = %q, %v; want %q", tok, back, err, tt.host)
			}
		})
	}
}

func TestTokenToHostRejects(t *testing.T) {
	for _, tok := range []string{"", "a.b", "a__b", "_a", "a*", ">", "a b"} {
		if h, err := TokenToHost(tok); err == nil {
			t.Errorf("TokenToHost(%q) = %q, want error", tok, h)
		}
	}
}

func TestSubjects(t *testing.T) {
	s, err := LifecycleSubject("cmp-01.example")
	if err != nil || s != "hvguard.v1.cmp-01_example.lifecycle" {
		t.Fatalf("LifecycleSubject = %q, %v", s, err)
	}
	if s, err := FenceSubject("h"); err != nil || s != "hvguard.v1.h.fence" {
		t.Fatalf("FenceSubject = %q, %v", s, err)
	}
	if s, err := ReconcileSubject("h"); err != nil || s != "hvguard.v1.h.reconcile" {
		t.Fatalf("ReconcileSubject = %q, %v", s, err)
	}
	if _, err := LifecycleSubject("a.*"); err == nil {
		t.Fatal("LifecycleSubject accepted a wildcard host")
	}
	if got := MsgID("cmp-01.example", 0, 17); got != "cmp-01.example:17" {
		t.Fatalf("MsgID (no incarnation) = %q", got)
	}
	if got := MsgID("cmp-01.example", testInc, 17); got != "cmp-01.example:9f3c2a1b4d5e6f70:17" {
		t.Fatalf("MsgID = %q", got)
	}
	if MsgID("h", testInc, 1) == MsgID("h", 0xa1, 1) {
		t.Fatal("two incarnations share a Msg-Id")
	}
}

func FuzzDecodeLifecycle(f *testing.F) {
	for _, e := range []LifecycleEvent{validEvent(), validGap(), classifiedEvent(), incarnatedEvent(), rebootEvent()} {
		b, err := e.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"schema":1,"host":"h","seq":1,"transition":"gap","occurred_at":"2026-01-01T00:00:00-01:00","observed_at":"9999-12-31T23:59:59+01:00","gap_first_seq":1,"gap_last_seq":0}`))
	f.Add([]byte(`{}`))
	for _, seed := range []string{
		// Unknown field, offsets, escapes, case-insensitive and duplicate keys.
		`{"schema":1,"host":"h-1.x","seq":18446744073709551615,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"rebooted","occurred_at":"1970-01-01T00:00:00+00:00","observed_at":"2026-01-01T00:00:00.999999999-12:00","classification":{"x":[1,2]}}`,
		`{"schema":1,"host":"h","seq":5,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"rebooted","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z","classification":"rebooted","classification_reason":"started-during-operation","Classification_Reason":"x"}`,
		`{"SCHEMA":1,"Host":"h","seq":2,"seq":3,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","reason":"\u00e9\ud83d\ude00","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z"}`,
		`{"schema":1,"host":"h","seq":9,"transition":"gap","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z","gap_first_seq":1,"gap_last_seq":8,"gap_count":8}`,
		// Incarnations: valid on a gap, upper case, a number, null, zero,
		// duplicate keys differing by case.
		`{"schema":1,"host":"h","incarnation":"0123456789abcdef","seq":9,"transition":"gap","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z","gap_first_seq":1,"gap_last_seq":8,"gap_count":8}`,
		`{"schema":1,"host":"h","incarnation":"0123456789ABCDEF","seq":1,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z"}`,
		`{"schema":1,"host":"h","incarnation":81985529216486895,"seq":1,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z"}`,
		`{"schema":1,"host":"h","incarnation":null,"seq":1,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z"}`,
		`{"schema":1,"host":"h","incarnation":"0000000000000000","Incarnation":"0000000000000001","seq":1,"domain_uuid":"0b9f6a1e-5d3c-4c1e-9a8e-7f2b1c3d4e5f","transition":"started","occurred_at":"2026-01-01T00:00:00Z","observed_at":"2026-01-01T00:00:00Z"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeLifecycle(data)
		if err != nil {
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted event fails Validate: %v", err)
		}
		b, err := e.Encode()
		if err != nil {
			t.Fatalf("accepted event does not re-encode: %v", err)
		}
		e2, err := DecodeLifecycle(b)
		if err != nil {
			t.Fatalf("re-encoded event %s does not decode: %v", b, err)
		}
		if !reflect.DeepEqual(e2, e) {
			t.Fatalf("round trip changed the value:\n got %+v\nwant %+v", e2, e)
		}
	})
}

func FuzzHostToken(f *testing.F) {
	for _, s := range []string{"cmp-01", "a.b.c", "", "a_b", "-", "a..b", "*", ">"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		tok, err := HostToken(host)
		if err != nil {
			return
		}
		if strings.ContainsAny(tok, ". *>\t\r\n") || tok == "" {
			t.Fatalf("HostToken(%q) = %q: not a single safe subject token", host, tok)
		}
		back, err := TokenToHost(tok)
		if err != nil || back != host {
			t.Fatalf("TokenToHost(HostToken(%q)) = %q, %v", host, back, err)
		}
		if _, err := TokenToHost(host); err == nil && strings.Contains(host, ".") {
			t.Fatalf("TokenToHost accepted a token with a dot: %q", host)
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	e := validEvent()
	for b.Loop() {
		if _, err := e.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeLifecycle(b *testing.B) {
	e := validEvent()
	data, err := e.Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := DecodeLifecycle(data); err != nil {
			b.Fatal(err)
		}
	}
}
