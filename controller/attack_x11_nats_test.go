package controller_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"hvguard/controller"
	"hvguard/controller/natsperm/natspermtest"
	"hvguard/fencing"
	"hvguard/proto"
)

// rawPublish publishes data with the raw header block hdr to subj as the
// agent user host (its NKey, shipped permissions) over a bare NATS
// protocol connection — a compromised node is not bound to nats.go,
// which sanitises CR and LF in header values — and returns the
// JetStream publish acknowledgement (its stream sequence) or the error
// the server answered.
func rawPublish(t *testing.T, natsURL, host, subj string, hdr, data []byte) (uint64, error) {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("raw connection: %q %v", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "INFO ")), &info); err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed([]byte(natspermtest.Seeds(t)["agent:"+host]))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		t.Fatal(err)
	}
	connect, _ := json.Marshal(map[string]any{"verbose": false, "pedantic": false, "headers": true, "protocol": 1,
		"nkey": pub, "sig": base64.RawURLEncoding.EncodeToString(sig), "lang": "raw", "version": "0"})
	inbox := proto.AgentInboxPrefix(host) + ".raw"
	msg := fmt.Sprintf("CONNECT %s\r\nSUB %s 1\r\nHPUB %s %s %d %d\r\n", connect, inbox, subj, inbox, len(hdr), len(hdr)+len(data))
	if _, err := c.Write(append(append(append([]byte(msg), hdr...), data...), "\r\nPING\r\n"...)); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("raw connection: %v", err)
		}
		switch {
		case strings.HasPrefix(line, "-ERR"):
			return 0, fmt.Errorf("server: %s", strings.TrimSpace(line))
		case strings.HasPrefix(line, "PING"):
			_, _ = c.Write([]byte("PONG\r\n"))
		case strings.HasPrefix(line, "MSG "), strings.HasPrefix(line, "HMSG "):
			f := strings.Fields(line)
			n, _ := strconv.Atoi(f[len(f)-1])
			body := make([]byte, n+2)
			if _, err := io.ReadFull(r, body); err != nil {
				t.Fatal(err)
			}
			b := string(body[:n])
			if i := strings.Index(b, "\r\n\r\n"); strings.HasPrefix(line, "HMSG ") && i >= 0 {
				b = b[i+4:]
			}
			var ack struct {
				Seq   uint64 `json:"seq"`
				Error *struct {
					Description string `json:"description"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(b), &ack); err != nil {
				return 0, fmt.Errorf("ack %q: %v", b, err)
			}
			if ack.Error != nil {
				return 0, fmt.Errorf("jetstream: %s", ack.Error.Description)
			}
			return ack.Seq, nil
		}
	}
}

// smuggledHeader is a header block that nats-server and nats.go read
// differently: the server enforces the FIRST
// Nats-Expected-Last-Subject-Sequence that follows a CRLF (enforced),
// found after the blank line that ends the block for nats.go's
// DecodeHeadersMsg; nats.go splits lines on a bare LF too and reads only
// up to that blank line, so the one line it sees (shown, after a bare LF
// the server does not take for a line start) is what
// Store.WrittenOn reports.
func smuggledHeader(shown, enforced uint64) []byte {
	return []byte(fmt.Sprintf("NATS/1.0\r\nX-A: a\nNats-Expected-Last-Subject-Sequence: %d\r\n\r\nNats-Expected-Last-Subject-Sequence: %d\r\n\r\n", shown, enforced))
}

// TestX11SmuggledHeaderReplayAcrossRestartNATS (reviewer X11; S):
// TestX6ReplayedWithdrawalAcrossRestartNATS's attack, the replayed
// withdrawal written with a header block that nats-server and nats.go
// read differently (smuggledHeader). compute-1..3, signing required,
// shipped permissions, real agents and runners, threshold 1.
// compute-2 and compute-3 are cut off (Held, guests running); C1 holds
// and stops. While no controller runs, compute-1's NATS user writes
// compute-2's old genuine withdrawal (sealed on revision P, long gone)
// into compute-2's key with one raw publish: the server enforces
// "Nats-Expected-Last-Subject-Sequence: <the key's current revision>"
// (the first CRLF-anchored one, after the blank line) and accepts it;
// Store.WrittenOn (nats.go's DecodeHeadersMsg) reads only the line before
// the blank line, "Nats-Expected-Last-Subject-Sequence: P" (after a bare
// LF, which the server does not take for a line start) — P is the
// record's prev_rev, so fencing.Written.Fresh says "written fresh". C2
// takes the replay as compute-2's first record (withdrawn, not counted
// silent): silent 1 = threshold 1, the hold ends and the Held compute-3
// is declared ~3 s after C2's start. Control "put": the same replay by a
// plain put is refused as before (C2 holds, declares nobody for 7 s).
func TestX11SmuggledHeaderReplayAcrossRestartNATS(t *testing.T) {
	t.Parallel()
	const (
		replayed = "compute-2.example.org"
		held     = "compute-3.example.org"
		key2     = "compute-2_example_org"
	)
	for _, attack := range []string{"put", "smuggled"} {
		t.Run(attack, func(t *testing.T) {
			natsURL := natspermtest.StartServer(t)
			hosts := []string{"compute-1.example.org", replayed, held}
			f := newFleetOf(t, hosts)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			cut, _ := startPermAgents(ctx, t, natsURL, f, hosts)
			cfg := controller.DefaultConfig()
			cfg.GuardCount, cfg.GuardShare = 1, 0.5 // 3 hosts: threshold 1
			startCtl := func() (*controllerRun, context.CancelFunc) {
				st, nc := permStore(t, natsURL, "controller:ctl-1", f, "ctl")
				cctx, stop := context.WithCancel(ctx)
				return startControllerCfg(cctx, t, st, nc, cfg, nil), stop
			}
			attacker, _ := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			c1, stopC1 := startCtl()
			time.Sleep(time.Second) // everybody renewing, the guard published

			// compute-2's withdrawal from an earlier orderly stop, sealed
			// by its key on a revision long gone.
			last, rev, err := attacker.Read(ctx, replayed)
			if err != nil {
				t.Fatal(err)
			}
			old := *last
			old.State, old.Reason = fencing.LeaseWithdrawn, "orderly-stop"
			prev := rev - 1
			saved, err := f.signers[replayed].Seal(old, prev).Encode()
			if err != nil {
				t.Fatal(err)
			}

			cut[replayed]()
			cut[held]() // the rack is cut off: Held, guests running
			deadline := time.Now().Add(5 * time.Second)
			for !c1.holding() && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if !c1.holding() {
				t.Fatal("C1 not holding over the cut-off rack: the test shows nothing")
			}
			stopC1()
			time.Sleep(100 * time.Millisecond)
			switch attack { // no controller runs
			case "put":
				if _, err := attacker.KV.Put(ctx, key2, saved); err != nil {
					t.Fatalf("compute-1's put refused: %v", err)
				}
			case "smuggled":
				e, err := attacker.KV.Get(ctx, key2)
				if err != nil {
					t.Fatal(err)
				}
				seq, err := rawPublish(t, natsURL, hosts[0], "$KV."+fencing.Bucket+"."+key2, smuggledHeader(prev, e.Revision()), saved)
				if err != nil {
					t.Fatalf("compute-1's raw publish refused: %v", err)
				}
				w, err := attacker.WrittenOn(ctx, replayed, seq, time.Second)
				t.Logf("replay at revision %d (prev_rev %d, the key's revision before %d): WrittenOn %+v %v", seq, prev, e.Revision(), w, err)
			}
			c2, _ := startCtl()
			started := time.Now()
			for time.Since(started) < 7*time.Second {
				for _, h := range hosts[1:] {
					if at, ok := c2.declaredAt(h); ok {
						c2.mu.Lock()
						defer c2.mu.Unlock()
						t.Fatalf("C2 declared %s %s after its start while compute-2 and compute-3 were cut off (Held, guests running); decisions: %v",
							h, at.Sub(started).Round(100*time.Millisecond), c2.decisions)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !c2.holding() {
				c2.mu.Lock()
				defer c2.mu.Unlock()
				t.Fatalf("C2 not holding: the test shows nothing; decisions: %v", c2.decisions)
			}
			if c2.invalidCount(replayed) == 0 {
				t.Errorf("the replay in %s's key was not reported invalid", replayed)
			}
		})
	}
}

// TestX11UnobservedWithdrawalNATS (S): TestX11UnobservedWithdrawalDeclaredFromMemory
// against nats-server with the shipped permissions, real agents and
// runners, the controllers' memory bucket. C1 runs and remembers
// compute-3 active; C1 stops (no controller runs). compute-3's agent
// stops in order: its withdrawal, a compare-and-set on its key's revision
// signed by its key, written on its own NATS user (what fencing.Agent.Stop
// sends); its guests keep running. compute-1's NATS user then writes
// garbage over it. C2 starts with the memory: compute-3's key holds only
// an untrusted value, C2 restores its remembered active record and
// declares it by CAS over the garbage ~3 s (lease_ttl + grace at ×0.1)
// after its start. Control "no-memory": C2 without the bucket never
// declares it (as before the memory).
func TestX11UnobservedWithdrawalNATS(t *testing.T) {
	t.Parallel()
	const withdrawn = "compute-3.example.org"
	for _, memory := range []bool{true, false} {
		t.Run(map[bool]string{true: "memory", false: "control-no-memory"}[memory], func(t *testing.T) {
			r := memoryRig(t, withdrawn, memory)
			natsURL, hosts, f, ctx, open := r.url, r.hosts, r.f, r.ctx, r.open
			stopAgent, wst := r.cut[withdrawn], r.stores[withdrawn]
			_, stopC1 := open()
			attacker, _ := permStore(t, natsURL, "agent:"+hosts[0], f, hosts[0])
			time.Sleep(1500 * time.Millisecond) // renewing, beaconing, the guard published, remembered
			stopC1()
			time.Sleep(200 * time.Millisecond)
			// compute-3's orderly stop while no controller runs.
			stopAgent()
			time.Sleep(100 * time.Millisecond)
			cur, rev, err := wst.Read(ctx, withdrawn)
			if err != nil {
				t.Fatal(err)
			}
			w := *cur
			w.State, w.Reason = fencing.LeaseWithdrawn, "orderly-stop"
			if res := wst.Renew(ctx, fencing.RenewRequest{Seq: w.Seq + 1, Revision: rev, Record: w}, time.Second); res.Outcome != fencing.RenewAcked {
				t.Fatalf("compute-3's withdrawal not acked: %+v", res)
			}
			if _, err := attacker.KV.Put(ctx, "compute-3_example_org", []byte("garbage")); err != nil {
				t.Fatal(err)
			}
			c2, _ := open()
			started := time.Now()
			for time.Since(started) < 8*time.Second {
				if at, ok := c2.declaredAt(withdrawn); ok {
					t.Fatalf("C2 declared %s %s after its start: its agent withdrew (stopped in order, guests running) while no controller ran; memory %t",
						withdrawn, at.Sub(started).Round(100*time.Millisecond), memory)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
