package natslease

// StrictHeaders exports strictHeaders to the external tests.
var StrictHeaders = strictHeaders

// Adjacency exports Watch's adjacency memory (Update.After).
type Adjacency = adjacency

// See exports adjacency.see.
func (a *adjacency) See(host string, rev uint64, skipped, live bool) uint64 {
	return a.see(host, rev, skipped, live)
}

// MaxWatchAfter exports maxWatchAfter.
const MaxWatchAfter = maxWatchAfter
