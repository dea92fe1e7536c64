package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"hvguard/agent"
	"hvguard/controller"
	"hvguard/controller/daemon"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/fencing/keyfile"
	"hvguard/proto"
)

// TestSignedLeasesCompromisedAgent (issue 11): two real agents and a real
// controller, signing required, on a nats-server with the shipped
// permissions, each with its own NKey. The attacker is compute-1: its NATS
// user, its host key, the peer secret. Against compute-2 it writes
// (allowed: agents write their peers' keys, for relays) an expired record
// signed by its own key and compute-2's own record turned expired:
// compute-2 never fences, is never declared, and its key holds its own
// signed active record again. Then compute-2 is cut off from NATS and its
// peer (it fences: a dead host as far as the controller can tell) while
// compute-1 writes into compute-2's key, every 300 ms, in turn: active
// records of compute-2 signed by compute-1's key, copies of compute-2's
// last genuine record, garbage, unsigned records and records signed by a
// key nobody knows (the last three the controller cannot tell from a live
// agent's renewals but by compute-2's beacons, which compute-1 cannot
// publish): the controller declares compute-2 anyway. No daemon hits a permission error.
func TestSignedLeasesCompromisedAgent(t *testing.T) {
	url := natspermtest.StartServer(t)
	const h1, h2 = permH1, permH2
	dir := t.TempDir()
	// Keys: hvguard-agent keygen on each host, hvguard-controller keygen.
	keyFile := map[string]string{}
	pub := map[string]string{}
	for _, n := range []string{h1, h2, "ctl-1"} {
		keyFile[n] = filepath.Join(dir, n+".seed")
		var err error
		if pub[n], err = keyfile.Generate(keyFile[n]); err != nil {
			t.Fatal(err)
		}
	}
	hostKeys := filepath.Join(dir, "host_keys")
	if err := os.WriteFile(hostKeys, []byte(fmt.Sprintf("%s %s\n%s %s\n", h1, pub[h1], h2, pub[h2])), 0o644); err != nil {
		t.Fatal(err)
	}
	var decMu sync.Mutex
	declared := map[string]time.Time{}
	invalid := map[string]int{}
	fl := startPermFleet(t, url, func(host string, a *agent.Config, c *daemon.Config) {
		if a != nil {
			a.Fence.Signing = agent.SigningConfig{Mode: "required", KeyFile: keyFile[host], ControllerKeys: []string{pub["ctl-1"]}, HostKeysFile: hostKeys}
		} else {
			c.Signing = daemon.SigningConfig{Mode: "required", KeyFile: keyFile["ctl-1"], HostKeysFile: hostKeys}
		}
	}, func(d controller.Decision, err error) {
		decMu.Lock()
		defer decMu.Unlock()
		switch {
		case d.Op == controller.OpDeclare && err == nil:
			declared[d.Host] = time.Now()
		case d.Op == controller.OpInvalid:
			invalid[d.Host]++
		}
	})

	// The attacker: compute-1's NATS user and host key.
	att := connectAs(t, url, "agent:"+h1)
	ajs, _ := jetstream.New(att.nc)
	actx, acancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer acancel()
	kv, err := ajs.KeyValue(actx, fencing.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	attKey, err := keyfile.Signer(keyFile[h1]) // compute-1's host key
	if err != nil {
		t.Fatal(err)
	}
	unknownSeed := filepath.Join(dir, "unknown.seed")
	if _, err := keyfile.Generate(unknownSeed); err != nil {
		t.Fatal(err)
	}
	unknownKey, err := keyfile.Signer(unknownSeed) // a key in no host_keys file
	if err != nil {
		t.Fatal(err)
	}
	read := func(host string) (fencing.LeaseRecord, uint64) {
		e, err := kv.Get(actx, mustToken(t, host))
		if err != nil {
			return fencing.LeaseRecord{}, 0
		}
		r, _ := fencing.DecodeRecord(e.Value())
		return r, e.Revision()
	}
	put := func(r fencing.LeaseRecord) {
		b, _ := r.Encode()
		if _, err := kv.Put(actx, mustToken(t, r.Host), b); err != nil {
			t.Fatalf("the attacker could not write %s's key: %v", r.Host, err)
		}
	}
	dump := fl.dump
	waitUntil := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		end := time.Now().Add(within)
		for !ok() {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %s\n%s", what, within, dump())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fencedOrDeclared := func() []string {
		var out []string
		for _, tr := range fl.transitions2() {
			if tr.To == fencing.StateFencing || tr.To == fencing.StateFenced || tr.To == fencing.StateAwaitingRelease {
				out = append(out, string(tr.Reason))
			}
		}
		return out
	}
	waitUntil("both leases renewed, signed by their hosts", 15*time.Second, func() bool {
		r1, _ := read(h1)
		r2, _ := read(h2)
		return r1.State == fencing.LeaseActive && r1.Signer == pub[h1] && r2.State == fencing.LeaseActive && r2.Signer == pub[h2]
	})
	waitUntil("guard published (signed)", 10*time.Second, func() bool {
		e, err := kv.Get(actx, fencing.GuardKey)
		if err != nil {
			return false
		}
		g, err := fencing.DecodeGuard(e.Value())
		return err == nil && g.Signer == pub["ctl-1"]
	})

	// 0. A lifecycle event of compute-2 forged by reflection (reviewer
	// X13; docs/security.md, "Signed events"): stored in a lease key,
	// direct-got with compute-2's lifecycle subject as the reply. The
	// controller refuses it; the agents' own signed events never were.
	if strings.Contains(fl.logsC.String(), "event refused") {
		t.Fatalf("the controller refused the agents' signed events\n%s", dump())
	}
	lsubj, _ := proto.LifecycleSubject(h2)
	if _, err := kv.Put(actx, "x13-reflect", []byte(`{"schema":1,"host":"`+h2+`","incarnation":"00000000000000ff","seq":1,"transition":"undefined","domain_uuid":"0f0f0f0f-1111-4222-8333-444444444444","occurred_at":"2026-12-01T00:00:00Z","observed_at":"2026-12-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if err := att.nc.PublishRequest("$JS.API.DIRECT.GET.KV_"+fencing.Bucket+".$KV."+fencing.Bucket+".x13-reflect", lsubj, nil); err != nil {
		t.Fatal(err)
	}
	// The direct get is denied to agents since reviewer X14 (docs/
	// security.md, "No direct gets"); the stream API's message get is
	// not, and its JSON answer lands on compute-2's subject too.
	if err := att.nc.PublishMsg(&nats.Msg{Subject: "$JS.API.STREAM.MSG.GET.KV_" + fencing.Bucket, Reply: lsubj,
		Data: []byte(`{"last_by_subj":"$KV.` + fencing.Bucket + `.x13-reflect"}`)}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the reflected lifecycle event refused", 10*time.Second, func() bool {
		return strings.Contains(fl.logsC.String(), "event refused") && strings.Contains(fl.logsC.String(), "reason=unsigned")
	})

	// 1. Forged declarations of the healthy compute-2.
	cur, rev := read(h2)
	exp := cur
	exp.State, exp.Epoch, exp.Reason = fencing.LeaseExpired, cur.Epoch+1, "forged by compute-1"
	put(attKey.Seal(exp, rev)) // signed by the attacker's own key
	time.Sleep(time.Second)
	put(exp)                    // compute-2's record and signature, turned expired
	time.Sleep(4 * time.Second) // > lease_ttl (3 s): a fence would have started; the declaration would come at ~6.5 s
	if f := fencedOrDeclared(); len(f) > 0 {
		t.Fatalf("compute-2 fenced after forged declarations: %v\n%s", f, dump())
	}
	decMu.Lock()
	_, wrong := declared[h2]
	decMu.Unlock()
	if wrong {
		t.Fatalf("compute-2 declared after forged declarations\n%s", dump())
	}
	if r, _ := read(h2); r.State != fencing.LeaseActive || r.Signer != pub[h2] {
		t.Fatalf("compute-2's key: %+v", r)
	}
	if !strings.Contains(fl.logs2.String(), "InvalidLeaseRecord") {
		t.Errorf("compute-2 did not say it ignored the forged records\n%s", fl.logs2.String())
	}

	// 2. compute-2 cut off (fences; the controller must declare it) while
	// the attacker keeps it "alive".
	fl.prxNATS2.Blackhole(true)
	fl.prxPeer1.Blackhole(true)
	cut := time.Now()
	last, _ := read(h2)
	stop := make(chan struct{})
	forgerDone := make(chan struct{})
	go func() {
		defer close(forgerDone)
		forged := last
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			forged.Seq = last.Seq + uint64(i) + 1
			switch i % 5 {
			case 0: // signed by the attacker's own key
				_, rev := read(h2)
				put(attKey.Seal(forged, rev))
			case 1: // a replay of compute-2's last genuine record
				put(last)
			case 2: // garbage
				if _, err := kv.Put(actx, mustToken(t, h2), []byte("not a record")); err != nil {
					t.Errorf("garbage: %v", err)
				}
			case 3: // unsigned (as an agent whose signing is off)
				u := forged
				u.Sig, u.Signer = "", ""
				put(u)
			case 4: // signed by a key nobody knows (as a rotated key)
				_, rev := read(h2)
				put(unknownKey.Seal(forged, rev))
			}
		}
	}()
	waitUntil("compute-2 declared despite the forged renewals", 25*time.Second, func() bool {
		decMu.Lock()
		defer decMu.Unlock()
		_, ok := declared[h2]
		return ok
	})
	close(stop)
	<-forgerDone
	decMu.Lock()
	t.Logf("compute-2 declared %.1f s after the cut; invalid values of its key said by the controller: %d", declared[h2].Sub(cut).Seconds(), invalid[h2])
	decMu.Unlock()
	if f := fencedOrDeclared(); !slices.Contains(f, string(fencing.ReasonIsolatedBecauseNoPeerAnswered)) && len(f) == 0 {
		t.Errorf("compute-2 did not fence when cut off: %v", f)
	}
	fl.noPermissionErrors(t)
}
