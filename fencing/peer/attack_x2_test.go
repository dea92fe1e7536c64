package peer

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"hvguard/fencing"
)

// TestManyAddressesKeepPeerReachable: the per-address limit counts exact
// source addresses, so one compromised node with many addresses (an IPv6
// /64 is one interface's normal allotment; IPv4 aliases on its segment)
// takes every one of the endpoint's MaxConns slots: from 129 addresses
// (127.0.1.1 … here), 8 connections each, it sends one cheap request per
// connection (a GET, refused at once) and then keeps the connection idle —
// IdleTimeout (30 s) keeps each slot for it. A real question from
// 127.0.0.2 with the agent's peer_timeout is then refused at accept:
// "a slow-loris client does not make peers unreachable" (issue 11) does
// not hold for one node with many addresses.
func TestManyAddressesKeepPeerReachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef-fleet")
	view := fencing.PeerView{Lease: true, LastAck: time.Now(), Timing: fencing.DefaultTiming()}
	h := &Handler{Host: "h1", Secret: secret,
		View: func() (fencing.PeerView, time.Time) { return view, view.LastAck.Add(6 * time.Second) }}
	l, srv := Endpoint(ln, h, 8*time.Second)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	addrs := MaxConns/MaxConnsPerIP + 1
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < addrs; i++ {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, byte(1+i/250), byte(1+i%250))}
		for j := 0; j < MaxConnsPerIP; j++ {
			c, err := (&net.Dialer{LocalAddr: src, Timeout: time.Second}).Dial("tcp", addr)
			if err != nil {
				t.Fatalf("attacker's connection from %s: %v", src, err)
			}
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: h1\r\n\r\n", Path)
			conns = append(conns, c)
		}
	}
	// Read each answer (405): the connection is now idle, kept alive.
	buf := make([]byte, 512)
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		c.Read(buf)
	}
	t.Logf("attacker holds %d connections from %d addresses; endpoint open: %d", len(conns), addrs, l.Open())

	cl := &Client{Host: "h2", Secret: secret, URL: func(string) string { return "http://" + addr + Path },
		HTTP: &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}}
	ctx, cancel := context.WithTimeout(context.Background(), fencing.DefaultTiming().PeerTimeout)
	defer cancel()
	ans, err := cl.Ask(ctx, "h1", fencing.PeerRound{ID: 1, Peers: []string{"h1"},
		Renewal: fencing.RenewRequest{Seq: 1, Record: fencing.LeaseRecord{Schema: 1, Host: "h2", State: fencing.LeaseActive}}})
	if err != nil || ans.Kind == fencing.PeerUnreachable {
		t.Errorf("a real peer's question went unanswered while one attacker held the endpoint's connections from %d addresses: %v", addrs, err)
	}
}

// TestIPv6CountsPerPrefix: MaxConnsPerIP counts an IPv6 source per /64
// (one interface's allotment), an IPv4 source per address.
func TestIPv6CountsPerPrefix(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"[2001:db8:1:2::1]:9476", "[2001:db8:1:2:ffff:ffff:ffff:fffe]:1"},
		{"10.0.0.1:9476", "10.0.0.1:1"},
	} {
		if ka, kb := addrKey(tc.a), addrKey(tc.b); ka != kb {
			t.Errorf("%s and %s count apart (%s, %s)", tc.a, tc.b, ka, kb)
		}
	}
	if addrKey("[2001:db8:1:2::1]:1") == addrKey("[2001:db8:1:3::1]:1") || addrKey("10.0.0.1:1") == addrKey("10.0.0.2:1") {
		t.Error("different /64s (or IPv4 addresses) count together")
	}
}
