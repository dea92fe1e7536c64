package fencing

import (
	"bytes"
	"errors"
	"testing"
)

const (
	h0Lifecycle = "hvguard.v1.h0.lifecycle"
	h1Lifecycle = "hvguard.v1.h1.lifecycle"
	h0Reconcile = "hvguard.v1.h0.reconcile"
)

var stopData = []byte(`{"schema":1,"host":"h0","seq":7,"domain_uuid":"8d3b8b7e-0c59-4f1e-9d5b-2f3c1f0a9e11","transition":"stopped"}`)

// TestVerifyEvent: only h0's key over exactly h0's subject and payload
// verifies under required; every other combination is refused with its
// reason.
func TestVerifyEvent(t *testing.T) {
	k, s := testKeyring(SigningRequired)
	id, sig := s["h0"].SignEvent(h0Lifecycle, stopData)
	if id != s["h0"].ID || sig == "" {
		t.Fatalf("SignEvent: %q %q", id, sig)
	}
	if id2, sig2 := s["h0"].SignEvent(h0Lifecycle, stopData); id2 != id || sig2 != sig {
		t.Fatal("a re-sent event must carry the same signature (ed25519 is deterministic)")
	}
	tampered := bytes.Replace(stopData, []byte(`"seq":7`), []byte(`"seq":8`), 1)
	h1id, h1sig := s["h1"].SignEvent(h0Lifecycle, stopData)
	cid, csig := s["ctl"].SignEvent(h0Lifecycle, stopData)
	cases := []struct {
		name, host, subject string
		data                []byte
		signer, sig         string
		reason              string // "" = accepted
	}{
		{"genuine", "h0", h0Lifecycle, stopData, id, sig, ""},
		{"missing headers", "h0", h0Lifecycle, stopData, "", "", EventUnsigned},
		{"signer without sig", "h0", h0Lifecycle, stopData, id, "", EventBadSignature},
		{"sig without signer", "h0", h0Lifecycle, stopData, "", sig, EventUnknownSigner},
		{"tampered payload", "h0", h0Lifecycle, tampered, id, sig, EventBadSignature},
		{"moved to another host's subject", "h1", h1Lifecycle, stopData, id, sig, EventForeignKey},
		{"moved to another kind", "h0", h0Reconcile, stopData, id, sig, EventBadSignature},
		{"another host's key", "h0", h0Lifecycle, stopData, h1id, h1sig, EventForeignKey},
		{"another host's key naming h0's", "h0", h0Lifecycle, stopData, id, h1sig, EventBadSignature},
		{"controller key", "h0", h0Lifecycle, stopData, cid, csig, EventUnknownSigner},
		{"unknown host", "h9", "hvguard.v1.h9.lifecycle", stopData, id, sig, EventForeignKey},
		{"garbage sig", "h0", h0Lifecycle, stopData, id, "!!!", EventBadSignature},
		{"truncated sig", "h0", h0Lifecycle, stopData, id, sig[:40], EventBadSignature},
	}
	for _, c := range cases {
		err := k.VerifyEvent(c.host, c.subject, c.data, c.signer, c.sig)
		var ee *EventError
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.reason != "" && !errors.As(err, &ee):
			t.Errorf("%s: want refused (%s), got %v", c.name, c.reason, err)
		case c.reason != "" && (ee.Reason != c.reason || !errors.Is(err, ErrInvalidEvent)):
			t.Errorf("%s: reason %q (%v), want %q", c.name, ee.Reason, err, c.reason)
		}
	}
}

// TestVerifyEventModes: optional accepts an unsigned event but not a bad
// signature; off (and a nil Keyring) check nothing; the zero Signer signs
// nothing.
func TestVerifyEventModes(t *testing.T) {
	opt, s := testKeyring(SigningOptional)
	if err := opt.VerifyEvent("h0", h0Lifecycle, stopData, "", ""); err != nil {
		t.Errorf("optional refused an unsigned event: %v", err)
	}
	id, sig := s["h1"].SignEvent(h0Lifecycle, stopData)
	if err := opt.VerifyEvent("h0", h0Lifecycle, stopData, id, sig); err == nil {
		t.Error("optional accepted h0's event signed by h1")
	}
	off, _ := testKeyring(SigningOff)
	var none *Keyring
	for _, k := range []*Keyring{off, none} {
		if err := k.VerifyEvent("h0", h0Lifecycle, stopData, id, "garbage"); err != nil {
			t.Errorf("mode off refused: %v", err)
		}
	}
	if id, sig := (Signer{}).SignEvent(h0Lifecycle, stopData); id != "" || sig != "" {
		t.Errorf("the zero Signer signed: %q %q", id, sig)
	}
}

// FuzzVerifyEvent: VerifyEvent never panics, and whatever it accepts under
// required is exactly the subject and payload h0 signed (nothing else
// verifies with h0's key).
func FuzzVerifyEvent(f *testing.F) {
	k, s := testKeyring(SigningRequired)
	id, sig := s["h0"].SignEvent(h0Lifecycle, stopData)
	f.Add("h0", h0Lifecycle, stopData, id, sig)
	f.Add("h0", h0Lifecycle, stopData, id, sig+"A")
	f.Add("h0", h0Reconcile, stopData, id, sig)
	f.Add("h1", h1Lifecycle, stopData, id, sig)
	f.Add("h0", h0Lifecycle, []byte{}, "", "")
	f.Fuzz(func(t *testing.T, host, subject string, data []byte, signer, sg string) {
		err := k.VerifyEvent(host, subject, data, signer, sg)
		if err == nil && (host != "h0" || subject != h0Lifecycle || !bytes.Equal(data, stopData)) {
			t.Fatalf("accepted host %q subject %q data %q signer %q sig %q", host, subject, data, signer, sg)
		}
		var ee *EventError
		if err != nil && (!errors.As(err, &ee) || ee.Error() == "") {
			t.Fatalf("error %v is not an EventError", err)
		}
	})
}
