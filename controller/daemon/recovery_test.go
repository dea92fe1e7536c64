package daemon_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/daemon"
	"hvguard/controller/recovery"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// silentHost starts a JetStream whose lease bucket has h0 silent (declared
// once past grace) and h1-h3 renewing.
func silentHost(t *testing.T) (string, context.Context) {
	t.Helper()
	url, kv := controllertest.Bucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	st := &natslease.Store{KV: kv}
	if _, err := st.Write(ctx, "h0", 0, controllertest.HostRecord("h0"), time.Second); err != nil {
		t.Fatal(err)
	}
	go controllertest.Renew(ctx, st, "h1", "h2", "h3")
	return url, ctx
}

// TestDaemonHostRecovery: the daemon in mode evacuate (the cloud replaced
// by the in-memory one) recovers a host it declared: the progress events
// on hvguard.v1._controller.recovery, `status --json` and the printed
// status show the recovery and why, the metrics count it.
func TestDaemonHostRecovery(t *testing.T) {
	url, ctx := silentHost(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var ops []string
	sub, err := nc.Subscribe(proto.ControllerRecoverySubject, func(m *nats.Msg) {
		e, err := controller.DecodeRecoveryEvent(m.Data)
		if err != nil {
			t.Errorf("undecodable recovery event: %v", err)
			return
		}
		mu.Lock()
		ops = append(ops, e.Op)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	cloud := controllertest.NewRecoveryCloud()
	c := startCtlWith(t, url, "ctl-a", func(c *daemon.Config) { c.Recovery.Mode = "evacuate" },
		func(o *daemon.Options) { o.RecoveryCloud = cloud.As("ctl-a") })
	var s daemon.Status
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		s, err = daemon.FetchStatus(ctx, c.addr, "")
		if err == nil && s.Recovery != nil && len(s.Recovery.Hosts) == 1 && s.Recovery.Hosts[0].Record != nil &&
			s.Recovery.Hosts[0].Record.Phase == recovery.PhaseRecovered {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.Recovery == nil || len(s.Recovery.Hosts) != 1 || s.Recovery.Hosts[0].Record == nil || s.Recovery.Hosts[0].Record.Phase != recovery.PhaseRecovered {
		t.Fatalf("status: %+v; calls %v", s.Recovery, cloud.Calls())
	}
	if s.Recovery.Mode != "evacuate" || len(s.Recovery.Hosts[0].Record.Instances) != 3 {
		t.Fatalf("recovery status %+v", s.Recovery)
	}
	var out bytes.Buffer
	daemon.PrintStatus(&out, s)
	for _, want := range []string{"recovery:   mode evacuate", "h0", "recovered", "3/0/0/0/3", "stays forced down", "TIMES", "force-down +0s", "recovered +"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed status lacks %q:\n%s", want, out.String())
		}
	}
	resp, err := http.Get("http://" + c.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`hvguard_controller_recovery_events_total{op="evacuated"} 3`, `hvguard_controller_recoveries{phase="recovered"} 1`,
		"hvguard_controller_evacuations_in_flight 0"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	time.Sleep(200 * time.Millisecond) // the last events' publish
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"started", "forced-down", "listed", "attachment-removed", "detached", "evacuate-requested", "evacuated", "recovered"} {
		found := false
		for _, o := range ops {
			found = found || o == want
		}
		if !found {
			t.Errorf("no %s event published: %v", want, ops)
		}
	}
}

// The default mode (notify) calls nothing and says what it would do.
func TestDaemonHostRecoveryNotifyByDefault(t *testing.T) {
	url, ctx := silentHost(t)
	cloud := controllertest.NewRecoveryCloud()
	c := startCtlWith(t, url, "ctl-a", nil, func(o *daemon.Options) { o.RecoveryCloud = cloud.As("ctl-a") })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		s, err := daemon.FetchStatus(ctx, c.addr, "")
		if err == nil && s.Recovery != nil && len(s.Recovery.Hosts) == 1 && s.Recovery.Hosts[0].Record != nil {
			r := s.Recovery.Hosts[0].Record
			if r.Phase != recovery.PhaseNotified || !strings.Contains(r.Reason, "would force down") {
				t.Fatalf("%+v", r)
			}
			time.Sleep(time.Second)
			if calls := cloud.Calls(); len(calls) != 0 {
				t.Fatalf("notify mode called %v", calls)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no notified record")
}
