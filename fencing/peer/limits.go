package peer

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The endpoint's server limits (docs/security.md, "Peer endpoint"). A peer
// that cannot be reached counts for nothing, so a client that holds
// connections open must not be able to make the endpoint unreachable for
// the others: every phase of a connection is bounded in time, and one
// address can hold only a few connections.
const (
	// ReadHeaderTimeout bounds the request line and headers (a few hundred
	// bytes, sent in one write by a real peer).
	ReadHeaderTimeout = 2 * time.Second
	// ReadTimeout bounds the whole request, body included (at most
	// MaxBody): the asker gives up after its peer_timeout (3 s by
	// default), so a request still arriving after 5 s is of no use to
	// anyone; a client trickling its body is cut off then.
	ReadTimeout = 5 * time.Second
	// IdleTimeout closes a kept-alive connection that carries no new
	// request: askers re-ask every second within a round, so 30 s keeps
	// their connections across rounds, and an idle connection holds one of
	// its address's MaxConnsPerIP slots for at most this long.
	IdleTimeout = 30 * time.Second
	// MaxHeaderBytes: a request has three headers.
	MaxHeaderBytes = 8 << 10
	// MaxConnsPerIP is how many connections one address may hold at once:
	// an asker needs one per round in flight (re-asks every second, each
	// bounded by peer_timeout: ≤ 3 at once), 8 leaves room. Further
	// connections from that address are closed at once, so a client
	// opening many slow connections takes 8 slots, not the endpoint.
	MaxConnsPerIP = 8
	// MaxConns bounds all connections (file descriptors): far above the
	// questions one host receives in a fleet-wide outage (each host asks
	// threshold + peer_batch peers per round).
	MaxConns = 1024
)

// NewServer returns the http.Server of a peer endpoint serving h.
// relayBound is the longest a relay can take (the handler's NATS writes
// and reads); the write timeout covers reading the request plus that.
func NewServer(h http.Handler, relayBound time.Duration) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      ReadTimeout + relayBound + time.Second,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Endpoint returns what serves a peer endpoint on ln: ln wrapped with the
// connection limits (MaxConnsPerIP, MaxConns) and NewServer(h,
// relayBound); serve with srv.Serve(lim).
func Endpoint(ln net.Listener, h http.Handler, relayBound time.Duration) (lim *ConnLimiter, srv *http.Server) {
	return LimitConns(ln, MaxConnsPerIP, MaxConns), NewServer(h, relayBound)
}

// ConnLimiter is a net.Listener that holds at most perIP connections per
// remote address and total connections in all: a connection over either
// limit is closed as soon as it is accepted (the listener goes on
// accepting, so the others are not held up behind it).
type ConnLimiter struct {
	net.Listener
	perIP, total int
	mu           sync.Mutex
	open         int
	byIP         map[string]int
	// Refused counts the connections closed over a limit.
	Refused atomic.Uint64
}

// LimitConns wraps ln with the limits.
func LimitConns(ln net.Listener, perIP, total int) *ConnLimiter {
	return &ConnLimiter{Listener: ln, perIP: perIP, total: total, byIP: map[string]int{}}
}

// Accept returns the next connection within the limits.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		l.mu.Lock()
		if l.open >= l.total || l.byIP[ip] >= l.perIP {
			l.mu.Unlock()
			l.Refused.Add(1)
			c.Close()
			continue
		}
		l.open++
		l.byIP[ip]++
		l.mu.Unlock()
		return &limitedConn{Conn: c, l: l, ip: ip}, nil
	}
}

// Open is the number of connections held.
func (l *ConnLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

func (l *ConnLimiter) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

func remoteIP(c net.Conn) string {
	a := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}

type limitedConn struct {
	net.Conn
	l    *ConnLimiter
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}
