package peer

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hvguard/fencing"
)

const (
	slowLorisChildEnv = "HVGUARD_PEER_SLOWLORIS_CHILD"
	// slowLorisFDs is the child's file descriptor limit: a real agent has
	// far more, and an attacker correspondingly more connections; the
	// limit only makes exhaustion reachable with a few dozen of them.
	slowLorisFDs = 48
	// slowLorisConns is how many slow connections the attacker opens:
	// more than the child has descriptors.
	slowLorisConns = 80
)

// TestSlowLorisChild is the endpoint under attack: started by
// TestSlowLorisKeepsPeerReachable in its own process, with a low file
// descriptor limit, serving Endpoint on 127.0.0.1 until stdin closes.
func TestSlowLorisChild(t *testing.T) {
	if os.Getenv(slowLorisChildEnv) != "1" {
		t.Skip("run by TestSlowLorisKeepsPeerReachable")
	}
	lim := syscall.Rlimit{Cur: slowLorisFDs, Max: slowLorisFDs}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	view := fencing.PeerView{Lease: true, LastAck: time.Now(), Timing: fencing.DefaultTiming()}
	h := &Handler{Host: "h1", Secret: []byte("0123456789abcdef-fleet"),
		View: func() (fencing.PeerView, time.Time) { return view, view.LastAck.Add(6 * time.Second) }}
	l, srv := Endpoint(ln, h, 8*time.Second)
	go srv.Serve(l)
	fmt.Println(ln.Addr().String())
	io.Copy(io.Discard, os.Stdin)
}

// A client that opens many slow connections (headers complete, then the
// body one byte every 500 ms, forever) must not make the peer endpoint
// unreachable for a legitimate peer asking from another address. The
// endpoint runs in a child process whose descriptor limit is lower than
// the attacker's connection count: without limits its descriptors run out
// and the legitimate question is never accepted.
func TestSlowLorisKeepsPeerReachable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSlowLorisChild$", "-test.v")
	cmd.Env = append(os.Environ(), slowLorisChildEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	var addr string
	for sc.Scan() {
		if _, _, err := net.SplitHostPort(sc.Text()); err == nil && strings.HasPrefix(sc.Text(), "127.") {
			addr = sc.Text()
			break
		}
	}
	if addr == "" {
		t.Fatal("child did not print its address")
	}
	go io.Copy(io.Discard, stdout)

	// The attacker, from 127.0.0.3.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	closedEarly := 0
	attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}}
	for range slowLorisConns {
		c, err := attacker.Dial("tcp", addr)
		if err != nil {
			continue // the backlog is full: nothing more to hold
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: h1\r\nContent-Length: 100000\r\n\r\n", Path)
			start := time.Now()
			for ctx.Err() == nil {
				if _, err := c.Write([]byte("x")); err != nil {
					if time.Since(start) < time.Second {
						mu.Lock()
						closedEarly++
						mu.Unlock()
					}
					return
				}
				c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if _, err := c.Read(make([]byte, 1)); err != nil && !os.IsTimeout(err) {
					if time.Since(start) < time.Second {
						mu.Lock()
						closedEarly++
						mu.Unlock()
					}
					return
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	time.Sleep(500 * time.Millisecond)

	// The legitimate peer, from 127.0.0.2, with the agent's peer timeout.
	tm := fencing.DefaultTiming()
	legit := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c := &Client{Host: "h0", Secret: []byte("0123456789abcdef-fleet"),
		HTTP: &http.Client{Timeout: tm.PeerTimeout, Transport: &http.Transport{DialContext: legit.DialContext}},
		URL:  func(string) string { return "http://" + addr + Path }}
	rd := fencing.PeerRound{ID: 1, Renewal: fencing.RenewRequest{Record: fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive}}}
	ans, err := c.Ask(context.Background(), "h1", rd)
	if err != nil || ans.Kind != fencing.PeerCannotRenew {
		t.Fatalf("legitimate peer under a slow-loris attack: %+v %v", ans, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if closedEarly < slowLorisConns-MaxConnsPerIP-1 {
		t.Errorf("only %d of %d slow connections were refused at once (limit %d per address)", closedEarly, slowLorisConns, MaxConnsPerIP)
	}
	t.Logf("%d of %d slow connections from one address refused at once; the legitimate peer was answered", closedEarly, slowLorisConns)
}
