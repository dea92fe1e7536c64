// Package netcut is a TCP proxy for tests that can cut a link the way a
// failed switch port does: while cut, bytes are held, not lost — TCP
// retransmits them after the heal, which is how the late write measured in
// shared/reference/nats-partitions.md (applied 16 s after the cut) happens —
// and delivered when the link is healed. Loopback only.
package netcut

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards connections from Addr to Target.
type Proxy struct {
	// Target is the address connections are forwarded to.
	Target string
	ln     net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	cut    bool
	conns  []net.Conn
}

// New starts a proxy on a random loopback port in front of target; it is
// closed when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, Target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the address clients dial instead of Target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.Target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.cut {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

// Blackhole cuts (true) or heals (false) every connection, present and
// future.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.cut = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Reset closes every connection open now, as a peer's reset does; new
// ones are accepted (clients reconnect through the proxy).
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Close heals, stops accepting and closes every connection. Idempotent.
func (p *Proxy) Close() {
	p.Blackhole(false)
	p.ln.Close()
	p.Reset()
}
