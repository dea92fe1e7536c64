package watchdog

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFedWhileAllowedThenFires(t *testing.T) {
	f := &Fake{Now: t0}
	w := New(f)
	if err := w.Arm(t0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	now := t0
	for range 100 { // 50 s of healthy loop iterations every 500 ms
		now = now.Add(500 * time.Millisecond)
		f.Now = now
		if st := w.Feed(now, true); st != Armed {
			t.Fatalf("state %s", st)
		}
	}
	if f.Fired(now) {
		t.Fatal("fired while fed")
	}
	// Feeding no longer allowed (fence incomplete, lease lapsed).
	for range 21 {
		now = now.Add(500 * time.Millisecond)
		f.Now = now
		if st := w.Feed(now, false); st != Triggered {
			t.Fatalf("state %s", st)
		}
	}
	if !f.Fired(now) {
		t.Fatal("did not fire 10.5 s after feeding stopped")
	}
	if err := w.Disarm(); err == nil || f.Armed == false {
		t.Fatal("a triggered watchdog must not be disarmed")
	}
}

func TestWedgedLoopFires(t *testing.T) {
	f := &Fake{Now: t0}
	w := New(f)
	if err := w.Arm(t0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The loop stops calling Feed at all: nothing else feeds.
	if !f.Fired(t0.Add(10*time.Second + time.Millisecond)) {
		t.Fatal("a wedged loop must let the watchdog fire")
	}
}

func TestOrderlyShutdownMagicClose(t *testing.T) {
	f := &Fake{Now: t0}
	w := New(f)
	if err := w.Arm(t0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.Disarm(); err != nil || f.Armed || !f.Closed || w.State() != Disarmed {
		t.Fatalf("disarm: %v armed=%v closed=%v state=%s", err, f.Armed, f.Closed, w.State())
	}
}

func TestMalfunction(t *testing.T) {
	f := &Fake{Now: t0}
	w := New(f)
	if err := w.Arm(t0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f.FailFeeds = true
	f.Now = t0.Add(5 * time.Second)
	if st := w.Feed(f.Now, true); st != Malfunction || w.Err() == nil {
		t.Fatalf("state %s err %v", st, w.Err())
	}
}

// TestLeaveKeepsCounting: a process leaving with its fence incomplete
// closes the device without the magic close: it still fires.
func TestLeaveKeepsCounting(t *testing.T) {
	f := &Fake{Now: t0}
	w := New(f)
	if err := w.Arm(t0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.Leave(); err != nil || !f.Armed || !f.Closed || !f.Fired(t0.Add(11*time.Second)) {
		t.Fatalf("leave: %v armed=%v closed=%v", err, f.Armed, f.Closed)
	}
}
