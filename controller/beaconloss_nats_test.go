package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/agent/delivery/deliverytest"
)

// TestBeaconLossesNATS: the runner's loss check (beaconLosses) on a real
// nats-server names every way a beacon can be lost before the tracker
// sees it — and nothing when none was: the subscription dropping
// messages (slow consumer: its pending limit reached), the full beacon
// queue, the connection down (the server stopped), and the reconnect
// after it. Each window starts at the previous check.
func TestBeaconLossesNATS(t *testing.T) {
	// Not parallel: it restarts nats-server on the same port, which a
	// parallel test's socket may take meanwhile (seen under load).
	dir, port := t.TempDir(), deliverytest.FreePort(t)
	srv := deliverytest.StartJetStream(t, dir, port)
	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	box := newBeaconBox()
	block := make(chan struct{})
	sub, err := nc.Subscribe("hvguard.v1.*.beacon", func(*nats.Msg) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(4, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has the interest before pub publishes
		t.Fatal(err)
	}
	at := time.Unix(1000, 0)
	l := beaconLosses{nc: nc, sub: sub, box: box, last: at}
	tick := func() (time.Time, string) { at = at.Add(time.Second); return l.check(at) }
	expect := func(what, want string) {
		t.Helper()
		from, why := tick()
		switch {
		case want == "" && why != "":
			t.Fatalf("%s: a loss said (%s), none happened", what, why)
		case want != "" && !strings.Contains(why, want):
			t.Fatalf("%s: said %q, want it to name %q", what, why, want)
		case want != "" && !from.Equal(at.Add(-time.Second)):
			t.Fatalf("%s: window from %v, want the previous check %v", what, from, at.Add(-time.Second))
		}
		t.Logf("%s: %q", what, why)
	}
	expect("nothing lost", "")

	// Slow consumer: the handler blocks, 50 beacons for a pending limit of 4.
	for range 50 {
		if err := pub.Publish("hvguard.v1.h1.beacon", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// All 50 arrived: 1 in the blocked handler, 4 pending, the rest
		// dropped (checked before they all had, the next check saw more).
		if d, _ := sub.Dropped(); d >= 50-1-4 {
			break
		}
		if time.Now().After(deadline) {
			d, _ := sub.Dropped()
			t.Fatalf("the subscription dropped %d of 50 (pending limit 4)", d)
		}
	}
	expect("slow consumer", "dropped by the subscription")
	close(block)
	expect("after the drops", "")

	// The beacon queue full.
	box.mu.Lock()
	box.lost++
	box.mu.Unlock()
	expect("full queue", "full beacon queue")

	// The server stopped, then back: down, then reconnected.
	srv.Shutdown()
	srv.WaitForShutdown()
	for deadline := time.Now().Add(5 * time.Second); nc.IsConnected(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still connected 5 s after the server stopped")
		}
	}
	expect("server down", "connection is down")
	deliverytest.StartJetStream(t, dir, port)
	for deadline := time.Now().Add(10 * time.Second); !nc.IsConnected(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not reconnected 10 s after the server restarted")
		}
	}
	expect("reconnected", "reconnected")
	expect("after the reconnect", "")
}
