package fencing

import (
	"testing"
	"time"
)

func TestRecordRoundTrip(t *testing.T) {
	r := LeaseRecord{Schema: 1, Host: "node1.example", BootID: "b", Epoch: 3, State: LeaseExpired, Seq: 9,
		FencingEnabled: true, Action: ActionPause, Backstop: BackstopWatchdog, Timing: DefaultTiming(), Reason: "x"}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(b)
	if err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{`{}`, `{"schema":2,"host":"h","state":"active"}`, `{"schema":1,"host":"h","state":"odd"}`, `nope`} {
		if _, err := DecodeRecord([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

func TestFenceEventRoundTrip(t *testing.T) {
	tr := Transition{From: StateAskingPeers, To: StateFencing, Reason: ReasonIsolatedBecauseTooFewPeersCantRenew, Epoch: 2, Detail: "2 running"}
	e := NewFenceEvent("node1", "b", tr, []string{"d1"}, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFenceEvent(b)
	if err != nil || got.Reason != tr.Reason || got.To != StateFencing || len(got.Paused) != 1 {
		t.Fatalf("%+v %v", got, err)
	}
}
