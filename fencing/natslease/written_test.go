package natslease_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery/deliverytest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
)

// TestWrittenOn (reviewers X6, X9): what Store.WrittenOn reads from the
// lease stream's stored messages on nats-server: a KV create carries
// Nats-Expected-Last-Subject-Sequence 0, an update (the agents' renewals,
// the controller's declarations) the revision it was a compare-and-set
// on, a create over a delete marker the marker's revision (nats.go
// retries on it), a plain put nothing; a header the server did not
// enforce (another case) is not taken, nor two of them, nor one naming
// another subject's sequence; a superseded message is gone.
func TestWrittenOn(t *testing.T) {
	nc, js, ctx := deliverytest.JetStream(t, deliverytest.StartJetStream(t, t.TempDir(), -1))
	kv, err := natslease.EnsureBucket(ctx, js, true)
	if err != nil {
		t.Fatal(err)
	}
	st := &natslease.Store{KV: kv, NC: nc}
	const host, k = "h0.example.org", "h0_example_org"
	subj := "$KV." + fencing.Bucket + "." + k
	written := func(rev uint64) fencing.Written {
		t.Helper()
		w, err := st.WrittenOn(ctx, host, rev, time.Second)
		if err != nil {
			t.Fatalf("revision %d: %v", rev, err)
		}
		return w
	}
	check := func(what string, rev uint64, want fencing.Written, prevRev uint64, fresh bool) {
		t.Helper()
		w := written(rev)
		if w != want {
			t.Errorf("%s (revision %d): %+v, want %+v", what, rev, w, want)
		}
		ok, why := w.Fresh(fencing.LeaseRecord{PrevRev: prevRev})
		if ok != fresh {
			t.Errorf("%s (revision %d) with prev_rev %d: fresh %t (%s), want %t", what, rev, prevRev, ok, why, fresh)
		}
		t.Logf("%s: %+v, prev_rev %d: fresh %t %s", what, w, prevRev, ok, why)
	}
	hdr := func(n uint64) fencing.Written {
		return fencing.Written{Known: true, HasExpected: true, Expected: n}
	}

	created, err := kv.Create(ctx, k, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	check("create", created, hdr(0), 0, true)
	updated, err := kv.Update(ctx, k, []byte("b"), created)
	if err != nil {
		t.Fatal(err)
	}
	check("update", updated, hdr(created), created, true)
	check("update, a record sealed on another revision", updated, hdr(created), updated, false)
	if _, err := st.WrittenOn(ctx, host, created, time.Second); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("superseded revision %d: %v, want jetstream.ErrMsgNotFound", created, err)
	}
	if err := kv.Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	marker := updated + 1 // the delete marker's revision
	recreated, err := kv.Create(ctx, k, []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	check("create over a delete marker", recreated, hdr(marker), 0, false)
	check("create over a delete marker, a record sealed on the marker", recreated, hdr(marker), marker, true)
	put, err := kv.Put(ctx, k, []byte("d"))
	if err != nil {
		t.Fatal(err)
	}
	check("put", put, fencing.Written{Known: true}, put-1, false)

	// Headers the server does not enforce as written, or ambiguous.
	raw := func(what string, h nats.Header) uint64 {
		t.Helper()
		m := nats.NewMsg(subj)
		m.Data, m.Header = []byte("e"), h
		a, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return a.Sequence
	}
	lower := raw("lower-case header", nats.Header{"nats-expected-last-subject-sequence": {"1"}})
	if w, err := st.WrittenOn(ctx, host, lower, time.Second); err == nil {
		t.Errorf("lower-case header (not enforced by the server): %+v, want an error", w)
	}
	twice := raw("header twice", nats.Header{fencing.ExpectedLastSubjectSeqHeader: {strconv.FormatUint(lower, 10), "1"}})
	if w, err := st.WrittenOn(ctx, host, twice, time.Second); err == nil {
		t.Errorf("header twice (the server checks the first): %+v, want an error", w)
	}
	other := raw("other subject", nats.Header{fencing.ExpectedLastSubjectSeqHeader: {strconv.FormatUint(twice, 10)},
		fencing.ExpectedLastSubjectSeqSubjHeader: {subj}})
	check("other-subject header", other, fencing.Written{Known: true, HasExpected: true, Expected: twice, OtherSubject: true}, twice, false)

	// The controller's declaration (Store.Write: a compare-and-set).
	declared, err := st.Write(ctx, host, other, fencing.LeaseRecord{Schema: fencing.RecordSchema, Host: host, State: fencing.LeaseExpired}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("declaration (Store.Write)", declared, hdr(other), other, true)
	if _, err := st.WrittenOn(ctx, "h1.example.org", declared, time.Second); err == nil {
		t.Error("the message of another host's key was taken")
	}
	if _, err := (&natslease.Store{KV: kv}).WrittenOn(ctx, host, declared, time.Second); err == nil {
		t.Error("a Store without JS read a stored message")
	}
}

// TestStrictHeaders: header blocks a lenient reader and the server read
// differently are refused (reviewer X11: a bare LF and a second block
// after an empty line hid the header the server enforced).
func TestStrictHeaders(t *testing.T) {
	const h = "Nats-Expected-Last-Subject-Sequence"
	for _, c := range []struct {
		raw  string
		ok   bool
		want string
	}{
		{"", true, ""},
		{"NATS/1.0\r\n\r\n", true, ""},
		{"NATS/1.0\r\n" + h + ": 7\r\n\r\n", true, "7"},
		{"NATS/1.0\r\nX-A: a\r\n" + h + ":  7 \r\n\r\n", true, "7"},
		{"NATS/1.0\r\nX-A: a\n" + h + ": 5\r\n\r\n" + h + ": 7\r\n\r\n", false, ""}, // X11's smuggled block
		{"NATS/1.0\r\n" + h + ": 5\r\n\r\n" + h + ": 7\r\n\r\n", false, ""},         // a second block
		{"NATS/1.0\r\nX-A: a\r" + h + ": 5\r\n\r\n", false, ""},                     // a bare CR
		{"NATS/1.0\r\n" + h + ": 5\r\n", false, ""},                                 // no empty line
		{"NATS/1.0\r\nnats-expected-last-subject-sequence: 5\r\n\r\n", false, ""},   // another case
		{"NATS/1.0 503\r\n\r\n", false, ""},
		{"NATS/1.0\r\nno colon\r\n\r\n", false, ""},
	} {
		got, err := natslease.StrictHeaders([]byte(c.raw))
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok %t", c.raw, err, c.ok)
			continue
		}
		if c.ok && c.want != "" && (len(got[h]) != 1 || got[h][0] != c.want) {
			t.Errorf("%q: %s = %q, want %q", c.raw, h, got[h], c.want)
		}
	}
}

// FuzzStrictHeaders: a header block strictHeaders accepts is read the
// same by nats.go's decoder (the lenient reader X11 fooled) for the
// headers the first-value check reads, and never holds a bare CR or LF
// or a second block. go test -run '^$' -fuzz FuzzStrictHeaders ./fencing/natslease/
func FuzzStrictHeaders(f *testing.F) {
	const h = "Nats-Expected-Last-Subject-Sequence"
	for _, s := range []string{"", "NATS/1.0\r\n\r\n", "NATS/1.0\r\n" + h + ": 7\r\n\r\n",
		"NATS/1.0\r\nX-A: a\n" + h + ": 5\r\n\r\n" + h + ": 7\r\n\r\n", "NATS/1.0\r\n" + h + ":7\r\nX: y\r\n\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := natslease.StrictHeaders(raw)
		if err != nil || len(raw) == 0 {
			return
		}
		body := strings.TrimSuffix(strings.TrimPrefix(string(raw), "NATS/1.0\r\n"), "\r\n\r\n")
		if strings.Contains(strings.ReplaceAll(body, "\r\n", ""), "\n") || strings.Contains(strings.ReplaceAll(body, "\r\n", ""), "\r") {
			t.Fatalf("accepted a bare CR or LF: %q", raw)
		}
		lenient, err := nats.DecodeHeadersMsg(raw)
		if err != nil {
			return // nats.go refuses what we accept: no disagreement to exploit
		}
		for _, k := range []string{h, h + "-Subject"} {
			if a, b := got[k], lenient.Values(k); len(a) != len(b) || len(a) > 0 && a[0] != b[0] {
				t.Fatalf("%q: %s strict %q, nats.go %q", raw, k, a, b)
			}
		}
	})
}
