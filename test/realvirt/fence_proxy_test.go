//go:build realvirt

package realvirt

// Copied from fencing/natslease/proxy_test.go (test files cannot be shared
// across packages).

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy that can blackhole traffic like a cut link: while
// blackholed, bytes are held (not lost: TCP retransmits them after the
// heal, which is how the measured 16 s late write happened) and delivered
// when the link is healed.
type fenceProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	cut    bool
	conns  []net.Conn
}

func newFenceProxy(t *testing.T, target string) *fenceProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fenceProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *fenceProxy) addr() string { return p.ln.Addr().String() }

func (p *fenceProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
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

func (p *fenceProxy) pipe(dst, src net.Conn) {
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

// blackhole cuts (true) or heals (false) every connection, present and
// future.
func (p *fenceProxy) blackhole(on bool) {
	p.mu.Lock()
	p.cut = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *fenceProxy) close() {
	p.blackhole(false)
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
