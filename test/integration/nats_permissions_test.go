package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent/delivery"
	"hvguard/controller"
	"hvguard/controller/natsperm"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// logBuffer is a slog handler's target that tests can search.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// deniedConn connects as user with the connection options the daemons use
// and collects the asynchronous permission errors.
type deniedConn struct {
	nc   *nats.Conn
	mu   sync.Mutex
	errs []error
}

func connectAs(t *testing.T, url, user string) *deniedConn {
	t.Helper()
	d := &deniedConn{}
	d.nc = natspermtest.Connect(t, url, user, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		d.mu.Lock()
		d.errs = append(d.errs, err)
		d.mu.Unlock()
	}))
	return d
}

// denied waits for the server's refusal of perm ("publish \"subject\"" or
// "subscription \"subject\"") and returns its message.
func (d *deniedConn) denied(t *testing.T, perm string) string {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		d.mu.Lock()
		for _, e := range d.errs {
			if delivery.PermissionOf(e) == perm {
				d.mu.Unlock()
				return e.Error()
			}
		}
		d.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t.Fatalf("no permission violation for %s; got %v", perm, d.errs)
	return ""
}

// TestNATSPermissions runs two real agents (fencing on, pausing nothing)
// and a real controller on a nats-server configured with the shipped
// accounts file, each authenticated with its own NKey: everything works
// under the least-privilege permissions — events are stored, leases
// renewed, the guard published, a cut-off agent's renewals relayed by its
// peer (a write of another host's key), and an isolated agent declared by
// the controller — and no daemon logs a permission error. Then, as an
// agent, the operations the permissions exist to refuse are refused, each
// with an error naming the permission, and a reader reads but cannot
// write.
func TestNATSPermissions(t *testing.T) {
	url := natspermtest.StartServer(t)
	const h1, h2 = permH1, permH2
	var decMu sync.Mutex
	var declared []string
	fl := startPermFleet(t, url, nil, func(d controller.Decision, err error) {
		if d.Op == controller.OpDeclare && err == nil {
			decMu.Lock()
			declared = append(declared, d.Host)
			decMu.Unlock()
		}
	})
	prxNATS2, prxPeer1 := fl.prxNATS2, fl.prxPeer1

	// A reader watches what happens (its permissions are tested too).
	reader := connectAs(t, url, "reader:dashboard")
	rjs, _ := jetstream.New(reader.nc)
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	kv, err := rjs.KeyValue(rctx, fencing.Bucket)
	if err != nil {
		t.Fatalf("reader: lease bucket: %v", err)
	}
	record := func(host string) (fencing.LeaseRecord, uint64) {
		e, err := kv.Get(rctx, mustToken(t, host))
		if err != nil {
			return fencing.LeaseRecord{}, 0
		}
		r, _ := fencing.DecodeRecord(e.Value())
		return r, e.Revision()
	}
	waitUntil := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		end := time.Now().Add(within)
		for !ok() {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %s\n%s", what, within, fl.dump())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Both agents renew, the controller publishes the guard, events are
	// stored (the reader counts h1's lifecycle events in the stream).
	waitUntil("both leases renewed", 10*time.Second, func() bool {
		r1, _ := record(h1)
		r2, _ := record(h2)
		return r1.State == fencing.LeaseActive && r2.State == fencing.LeaseActive
	})
	waitUntil("guard published", 10*time.Second, func() bool { _, err := kv.Get(rctx, fencing.GuardKey); return err == nil })
	// The controller's own state is in the controllers' account
	// (nats.control): the reader's user there sees the leader lock held
	// by ctl-1 and the guard's authoritative copy; the agents' account has
	// no such bucket (docs/security.md, "The controllers' account").
	creader := connectAs(t, url, "reader:dashboard:control")
	crjs, _ := jetstream.New(creader.nc)
	ckv, err := crjs.KeyValue(rctx, controller.ControlBucket)
	if err != nil {
		t.Fatalf("reader (controllers' account): control bucket: %v", err)
	}
	waitUntil("lock held by ctl-1 and the guard kept in the controllers' account", 10*time.Second, func() bool {
		l, err := ckv.Get(rctx, controller.LeaderKey)
		if err != nil {
			return false
		}
		var lock controller.LockRecord
		_, gerr := ckv.Get(rctx, fencing.GuardKey)
		return json.Unmarshal(l.Value(), &lock) == nil && lock.Holder == "ctl-1" && gerr == nil
	})
	nctx, ncancel := context.WithTimeout(context.Background(), time.Second)
	if _, err := rjs.KeyValue(nctx, controller.ControlBucket); err == nil {
		t.Error("the reader's user in the agents' account opened the control bucket")
	}
	ncancel()
	subj, _ := proto.LifecycleSubject(h1)
	waitUntil("h1's events stored", 10*time.Second, func() bool {
		s, err := rjs.Stream(rctx, proto.StreamName)
		if err != nil {
			return false
		}
		info, err := s.Info(rctx, jetstream.WithSubjectFilter(subj))
		return err == nil && info.State.Subjects[subj] > 0
	})

	// Each agent's beacon names the revision of a renewal it wrote (the
	// reader sees them: hvguard.v1.*.beacon; the controller subscribes
	// to them under its permissions — no permission error below).
	var bmu sync.Mutex
	beacons := map[string]map[uint64]bool{}
	bsub, err := reader.nc.Subscribe(proto.BeaconWildcard, func(m *nats.Msg) {
		b, err := fencing.DecodeBeacon(m.Data)
		if want, _ := proto.BeaconSubject(b.Host); err != nil || m.Subject != want {
			t.Errorf("beacon %q on %s: %v", m.Data, m.Subject, err)
			return
		}
		bmu.Lock()
		defer bmu.Unlock()
		if beacons[b.Host] == nil {
			beacons[b.Host] = map[uint64]bool{}
		}
		beacons[b.Host][b.Revision] = true
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{h1, h2} {
		waitUntil(h+"'s beacon names its key's revision", 10*time.Second, func() bool {
			_, rev := record(h)
			bmu.Lock()
			defer bmu.Unlock()
			return beacons[h][rev]
		})
	}
	bsub.Unsubscribe()

	// h2 loses NATS: h1 relays its renewals (a put on h2's key).
	_, revBefore := record(h2)
	prxNATS2.Blackhole(true)
	waitUntil("h2 relayed by h1", 15*time.Second, func() bool {
		return slices.ContainsFunc(fl.transitions2(), func(tr fencing.Transition) bool { return tr.Reason == fencing.ReasonRelayedByPeer })
	})
	if _, rev := record(h2); rev <= revBefore {
		t.Fatalf("h2's key not written since the cut (revision %d, before %d)", rev, revBefore)
	}
	// h2 loses its peer too: it fences (nothing to pause) and the
	// controller declares it.
	prxPeer1.Blackhole(true)
	waitUntil("h2 declared", 20*time.Second, func() bool {
		decMu.Lock()
		defer decMu.Unlock()
		return slices.Contains(declared, h2)
	})
	waitUntil("h2's record expired", 5*time.Second, func() bool { r, _ := record(h2); return r.State == fencing.LeaseExpired })

	fl.noPermissionErrors(t)

	// As agent h1 (its credentials, its inbox prefix): what it must not do.
	a := connectAs(t, url, "agent:"+h1)
	ajs, _ := jetstream.New(a.nc)
	akv, err := ajs.KeyValue(rctx, fencing.Bucket)
	if err != nil {
		t.Fatalf("agent: lease bucket: %v", err)
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 500*time.Millisecond)
	}
	// The membership an agent reads (natslease.Subjects: stream info, no
	// consumer) under its permissions.
	if m, _, err := (&natslease.Store{KV: akv, NC: a.nc}).Members(rctx); err != nil || !slices.Contains(m, h1) || !slices.Contains(m, h2) {
		t.Fatalf("agent's membership: %v (%v), want %s and %s", m, err, h1, h2)
	}
	for _, key := range natsperm.ControllerKeys {
		c, cc := short()
		if _, err := akv.Put(c, key, []byte("{}")); err == nil {
			t.Errorf("agent wrote %s", key)
		}
		cc()
		msg := a.denied(t, fmt.Sprintf("publish %q", "$KV."+fencing.Bucket+"."+key))
		t.Logf("agent writing %s: %s", key, msg)
	}
	other, _ := proto.LifecycleSubject(h2)
	if err := a.nc.Publish(other, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent publishing another host's events: %s", a.denied(t, fmt.Sprintf("publish %q", other)))
	c, cc := short()
	if err := ajs.DeleteStream(c, proto.StreamName); err == nil {
		t.Error("agent deleted the event stream")
	}
	cc()
	a.denied(t, fmt.Sprintf("publish %q", "$JS.API.STREAM.DELETE."+proto.StreamName))
	c, cc = short()
	if s, err := ajs.Stream(c, "KV_"+fencing.Bucket); err == nil {
		if err := s.Purge(c); err == nil {
			t.Error("agent purged the lease bucket")
		}
	}
	cc()
	a.denied(t, fmt.Sprintf("publish %q", "$JS.API.STREAM.PURGE.KV_"+fencing.Bucket))
	// No consumer on the lease stream: a push consumer delivers stored
	// values to any subject with a literal subscription, the server's
	// consumer resets among them (reviewer X15). The agent's membership
	// (listed above, natslease.Subjects) needs none.
	create := "$JS.API.CONSUMER.CREATE.KV_" + fencing.Bucket + ".x15"
	if err := a.nc.PublishRequest(create, proto.AgentInboxPrefix(h1)+".x15", []byte(`{"stream_name":"KV_`+fencing.Bucket+`","config":{"name":"x15","deliver_subject":"x"}}`)); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent creating a consumer on the lease stream: %s", a.denied(t, fmt.Sprintf("publish %q", create)))
	if _, err := a.nc.SubscribeSync("_INBOX.>"); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent subscribing to every inbox: %s", a.denied(t, `subscription "_INBOX.>"`))
	// What it may do besides its own key: relay a peer's record, store
	// its reconcile events (the rejoin reconciliation's, not run above),
	// publish its fence events.
	c, cc = short()
	if _, err := akv.Put(c, mustToken(t, "compute-9.example.org"), []byte("{}")); err != nil {
		t.Errorf("agent could not write another host's key (relays): %v", err)
	}
	cc()
	rsubj, _ := proto.ReconcileSubject(h1)
	c, cc = context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := ajs.Publish(c, rsubj, []byte("{}"), jetstream.WithExpectStream(proto.StreamName)); err != nil {
		t.Errorf("agent could not store its reconcile event: %v", err)
	}
	cc()
	fsubj, _ := proto.FenceSubject(h1)
	if err := a.nc.Publish(fsubj, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// Another host's beacon: refused (a beacon is evidence only its host
	// can make: fencing.Beacon).
	obeacon, _ := proto.BeaconSubject(h2)
	if err := a.nc.Publish(obeacon, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent publishing another host's beacon: %s", a.denied(t, fmt.Sprintf("publish %q", obeacon)))
	// Its own withdrawal receipt is stored (a publish ack on its own
	// inbox), and the reader reads it back; another host's: refused (a
	// receipt stops that host's declaration: docs/security.md,
	// "Withdrawal receipts").
	wsubj, _ := proto.WithdrawnSubject(h1)
	c, cc = context.WithTimeout(context.Background(), 5*time.Second)
	own, _ := proto.WithdrawalStreamOf(h1)
	if ack, err := ajs.Publish(c, wsubj, []byte(`{"receipt":"h1"}`)); err != nil || ack.Stream != own {
		t.Errorf("agent could not store its withdrawal receipt in its own stream %s: %v, %v", own, ack, err)
	}
	if rs, err := natslease.OpenReceipts(c, rjs, h1); err != nil || rs == nil {
		t.Errorf("reader: receipts stream: %v", err)
	} else if m, err := rs.GetLastMsgForSubject(c, wsubj); err != nil || string(m.Data) != `{"receipt":"h1"}` {
		t.Errorf("reader: h1's receipt: %v", err)
	}
	cc()
	owsubj, _ := proto.WithdrawnSubject(h2)
	if err := a.nc.Publish(owsubj, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent publishing another host's withdrawal receipt: %s", a.denied(t, fmt.Sprintf("publish %q", owsubj)))
	// A marker: a refused publish after them. Refusals are reported in
	// order, so once the marker's is in, theirs would be too.
	marker, _ := proto.FenceSubject("compute-3.example.org")
	if err := a.nc.Publish(marker, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	a.denied(t, fmt.Sprintf("publish %q", marker))
	a.mu.Lock()
	for _, e := range a.errs {
		if p := delivery.PermissionOf(e); strings.Contains(p, rsubj) || strings.Contains(p, fsubj) || strings.Contains(p, "compute-9") {
			t.Errorf("agent refused its own subject: %v", e)
		}
	}
	a.mu.Unlock()

	// The reader writes nothing.
	c, cc = short()
	if _, err := kv.Put(c, mustToken(t, h1), []byte("{}")); err == nil {
		t.Error("reader wrote a lease")
	}
	cc()
	reader.denied(t, fmt.Sprintf("publish %q", "$KV."+fencing.Bucket+"."+mustToken(t, h1)))
	c, cc = short()
	_, err = rjs.CreateOrUpdateConsumer(c, proto.StreamName, jetstream.ConsumerConfig{Durable: controller.DurableName("ctl-1")})
	cc()
	if err == nil {
		t.Error("reader changed the controller's durable consumer")
	}
	reader.denied(t, fmt.Sprintf("publish %q", "$JS.API.CONSUMER.CREATE."+proto.StreamName+"."+controller.DurableName("ctl-1")))
	if errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func mustToken(t *testing.T, host string) string {
	t.Helper()
	tok, err := proto.HostToken(host)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
