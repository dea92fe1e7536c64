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
	// its address's MaxConnsPerIP slots for at most this long — but never
	// a slot a new connection needs: with MaxConns held, the oldest
	// connection not serving a request (idle, or new with no request yet)
	// is closed to make room (ConnLimiter), so idle connections from many
	// addresses cannot lock the endpoint for this long.
	IdleTimeout = 30 * time.Second
	// MaxHeaderBytes: a request has three headers.
	MaxHeaderBytes = 8 << 10
	// MaxConnsPerIP is how many connections one address (an IPv6 /64:
	// IPv6PrefixBits) may hold at once:
	// an asker needs one per round in flight (re-asks every second, each
	// bounded by peer_timeout: ≤ 3 at once), 8 leaves room. Further
	// connections from that address are closed at once, so a client
	// opening many slow connections takes 8 slots, not the endpoint.
	MaxConnsPerIP = 8
	// MaxConns bounds all connections (file descriptors): far above the
	// questions one host receives in a fleet-wide outage (each host asks
	// threshold + peer_batch peers per round).
	MaxConns = 1024
	// IPv6PrefixBits: IPv6 sources count per /64 for MaxConnsPerIP — one
	// interface normally holds a whole /64, so one node could otherwise
	// take MaxConnsPerIP slots per address of it.
	IPv6PrefixBits = 64
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
	lim, srv = LimitConns(ln, MaxConnsPerIP, MaxConns), NewServer(h, relayBound)
	srv.ConnState = lim.ConnState
	return lim, srv
}

// ConnLimiter is a net.Listener that holds at most perIP connections per
// remote address (IPv6: per /64) and total connections in all. A
// connection over the per-address limit is closed as soon as it is
// accepted (the listener goes on accepting, so the others are not held up
// behind it). With total held, the oldest connection serving no request
// (idle between requests, or new with no request yet — as the server's
// ConnState reports them) is closed to make room; only when every
// connection is serving a request (each bounded by the server's
// timeouts) is the new one closed instead.
type ConnLimiter struct {
	net.Listener
	perIP, total int
	mu           sync.Mutex
	open         int
	byIP         map[string]int
	waiting      map[*limitedConn]uint64 // serving no request, since (waitSeq)
	waitSeq      uint64
	// Refused counts the connections closed over a limit.
	Refused atomic.Uint64
	// Evicted counts the waiting connections closed to make room.
	Evicted atomic.Uint64
}

// LimitConns wraps ln with the limits.
func LimitConns(ln net.Listener, perIP, total int) *ConnLimiter {
	return &ConnLimiter{Listener: ln, perIP: perIP, total: total, byIP: map[string]int{}, waiting: map[*limitedConn]uint64{}}
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
		var evict *limitedConn
		if l.open >= l.total && l.byIP[ip] < l.perIP {
			evict = l.oldestWaiting()
		}
		if evict == nil && (l.open >= l.total || l.byIP[ip] >= l.perIP) {
			l.mu.Unlock()
			l.Refused.Add(1)
			c.Close()
			continue
		}
		lc := &limitedConn{Conn: c, l: l, ip: ip}
		l.open++
		l.byIP[ip]++
		l.waitSeq++
		l.waiting[lc] = l.waitSeq // new: no request yet
		l.mu.Unlock()
		if evict != nil {
			l.Evicted.Add(1)
			evict.Close() // releases its slot (counted over the total meanwhile)
		}
		return lc, nil
	}
}

// oldestWaiting removes and returns the connection waiting longest (l.mu
// held), or nil.
func (l *ConnLimiter) oldestWaiting() *limitedConn {
	var old *limitedConn
	for c, seq := range l.waiting {
		if old == nil || seq < l.waiting[old] {
			old = c
		}
	}
	delete(l.waiting, old)
	return old
}

// ConnState is the server's http.Server.ConnState: it tracks which
// connections serve no request (new or idle), the ones Accept may close
// to make room.
func (l *ConnLimiter) ConnState(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateIdle:
		l.waitSeq++
		l.waiting[lc] = l.waitSeq
	case http.StateActive, http.StateHijacked, http.StateClosed:
		delete(l.waiting, lc)
	}
}

// Open is the number of connections held.
func (l *ConnLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

func (l *ConnLimiter) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.waiting, c)
	ip := c.ip
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// remoteIP returns what MaxConnsPerIP counts c under: its remote address,
// or for IPv6 its /64 (IPv6PrefixBits).
func remoteIP(c net.Conn) string {
	return addrKey(c.RemoteAddr().String())
}

func addrKey(a string) string {
	h, _, err := net.SplitHostPort(a)
	if err != nil {
		h = a
	}
	ip := net.ParseIP(h)
	if ip == nil || ip.To4() != nil {
		return h
	}
	n := net.IPNet{IP: ip.Mask(net.CIDRMask(IPv6PrefixBits, 128)), Mask: net.CIDRMask(IPv6PrefixBits, 128)}
	return n.String()
}

type limitedConn struct {
	net.Conn
	l    *ConnLimiter
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}
