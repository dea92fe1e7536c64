package peer

import (
	"sync"
	"time"
)

// DefaultReplayEntries bounds the replay cache. An entry lives until its
// request leaves the acceptance window (at most 2 × MaxSkew = 60 s after
// it arrived); 65 536 entries (~6 MB) hold more than a minute of
// questions even when hundreds of peers ask one host every second (a
// fleet-wide NATS outage). When it is full the oldest entry goes: only
// someone holding a peer secret can fill it, and such a sender can sign
// fresh requests anyway, so nothing is lost by evicting rather than
// refusing (refusing would make the peer unreachable).
const DefaultReplayEntries = 1 << 16

// ReplayCache remembers the digests of the requests accepted within the
// acceptance window, so the same request is answered once: a captured
// request replayed within MaxSkew is refused. Safe for concurrent use.
type ReplayCache struct {
	mu    sync.Mutex
	max   int
	seen  map[[32]byte]time.Time
	order [][32]byte // insertion order, for expiry and eviction
}

// NewReplayCache returns a cache of at most n entries.
func NewReplayCache(n int) *ReplayCache {
	return &ReplayCache{max: max(n, 1), seen: map[[32]byte]time.Time{}}
}

// First records key until expires and reports whether it was not seen
// before (true: answer the request; false: a replay). Entries whose
// expiry is not after now are forgotten: their requests are stale and
// refused by the timestamp check anyway.
func (c *ReplayCache) First(key [32]byte, expires, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.order) > 0 {
		k := c.order[0]
		if exp, ok := c.seen[k]; ok && exp.After(now) && len(c.order) < c.max {
			break
		}
		delete(c.seen, k)
		c.order = c.order[1:]
	}
	if exp, ok := c.seen[key]; ok && exp.After(now) {
		return false
	}
	c.seen[key] = expires
	c.order = append(c.order, key)
	return true
}

// Len is the number of remembered requests.
func (c *ReplayCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}
