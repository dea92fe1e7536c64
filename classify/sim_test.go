package classify

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)

// novaModel is a scripted Nova: what it answers about each instance at a
// given time, whether it answers at all, and how slowly.
type novaModel struct {
	// views[uuid] is the instance's history: the view in force from each
	// offset on (absent before the first entry, and where present=false).
	views   map[string][]timedView
	actions map[string][]Action
	// down reports whether a query sent at t fails; nil: never.
	down func(t time.Duration) bool
	// latency of an answer to a query sent at t; nil: 100 ms.
	latency func(t time.Duration) time.Duration
}

type timedView struct {
	from    time.Duration
	present bool
	s       Server
}

func (n *novaModel) view(uuid string, t time.Duration) (Server, bool) {
	var cur timedView
	for _, v := range n.views[uuid] {
		if v.from <= t {
			cur = v
		}
	}
	return cur.s, cur.present
}

func (n *novaModel) servers(t time.Duration) []Server {
	var out []Server
	keys := make([]string, 0, len(n.views))
	for k := range n.views {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, u := range keys {
		if s, ok := n.view(u, t); ok {
			s.UUID = u
			out = append(out, s)
		}
	}
	return out
}

// scripted input
type input struct {
	at    time.Duration
	stop  *Stop
	alive string
}

type answer struct {
	at      time.Duration
	sentAt  time.Duration
	servers bool
	token   uint64
	uuid    string
}

// tb is what the sim needs of *testing.T and *rapid.T.
type tb interface {
	Errorf(format string, args ...any)
	Fatal(args ...any)
}

type sim struct {
	t       tb
	c       *Classifier
	nova    *novaModel
	now     time.Duration
	inputs  []input
	answers []answer
	log     []string // every decision, "+12.5s report ..."
	reports map[string]Decision
	// reportAt: when each report was made
	reportAt map[string]time.Duration
	// onListing, if set, sees every successful listing handed over
	onListing func(sentAt, at time.Duration, list []Server)
	// views seen by the classifier: per uuid, the view the last answered
	// listing carried (for the property checks)
	queries int
}

func newSim(t tb, cfg Config, nova *novaModel, inputs []input) *sim {
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortStableFunc(inputs, func(a, b input) int { return int(a.at - b.at) })
	return &sim{t: t, c: c, nova: nova, inputs: inputs, reports: map[string]Decision{}, reportAt: map[string]time.Duration{}}
}

func (s *sim) at(d time.Duration) time.Time { return t0.Add(d) }

func (s *sim) handle(ds []Decision) {
	for _, d := range ds {
		s.log = append(s.log, fmt.Sprintf("+%v %s", s.now, d))
		switch d.Op {
		case OpReport:
			if _, dup := s.reports[d.UUID]; dup {
				s.t.Errorf("%s reported twice", d.UUID)
			}
			s.reports[d.UUID] = d
			s.reportAt[d.UUID] = s.now
		case OpQueryServers, OpQueryActions:
			s.queries++
			lat := 100 * time.Millisecond
			if s.nova.latency != nil {
				lat = s.nova.latency(s.now)
			}
			s.answers = append(s.answers, answer{at: s.now + lat, sentAt: s.now, servers: d.Op == OpQueryServers, token: d.Token, uuid: d.UUID})
		}
	}
}

var errDown = errors.New("connection refused")

// run drives the classifier until every input is consumed and nothing is
// pending, or until limit.
func (s *sim) run(limit time.Duration) {
	for s.now <= limit {
		next := limit + 1
		if len(s.inputs) > 0 {
			next = min(next, s.inputs[0].at)
		}
		for _, a := range s.answers {
			next = min(next, a.at)
		}
		if dl, ok := s.c.NextDeadline(); ok {
			next = min(next, max(dl.Sub(t0), s.now))
		}
		if next > limit {
			if s.c.Pending() > 0 {
				s.t.Errorf("still pending at the limit %v: %d", limit, s.c.Pending())
			}
			return
		}
		s.now = next
		progressed := false
		for len(s.inputs) > 0 && s.inputs[0].at <= s.now {
			in := s.inputs[0]
			s.inputs = s.inputs[1:]
			if in.stop != nil {
				s.handle(s.c.Add(*in.stop, s.at(s.now)))
			} else {
				s.handle(s.c.Alive(in.alive, s.at(s.now)))
			}
			progressed = true
		}
		for i := 0; i < len(s.answers); i++ {
			a := s.answers[i]
			if a.at > s.now {
				continue
			}
			s.answers = slices.Delete(s.answers, i, i+1)
			i--
			failed := s.nova.down != nil && s.nova.down(a.sentAt)
			if a.servers {
				var err error
				var list []Server
				if failed {
					err = errDown
				} else {
					list = s.nova.servers(a.sentAt + (a.at-a.sentAt)/2)
					if s.onListing != nil {
						s.onListing(a.sentAt, s.now, list)
					}
				}
				s.handle(s.c.ServersResult(a.token, list, err, s.at(s.now)))
			} else {
				var err error
				if failed {
					err = errDown
				}
				s.handle(s.c.ActionsResult(a.token, a.uuid, s.nova.actions[a.uuid], err, s.at(s.now)))
			}
			progressed = true
		}
		if dl, ok := s.c.NextDeadline(); ok && !dl.After(s.at(s.now)) || !progressed {
			s.handle(s.c.Tick(s.at(s.now)))
		}
		if len(s.inputs) == 0 && len(s.answers) == 0 && s.c.Pending() == 0 {
			return
		}
	}
}

func TestSimSmoke(t *testing.T) {
	n := &novaModel{views: map[string][]timedView{"a": {{0, true, Server{VMState: VMActive, PowerState: PowerRunning}}}}}
	s := newSim(t, Config{}, n, []input{{at: 15 * time.Second, stop: &Stop{UUID: "a", Detail: DetailDestroyed, Began: t0}}})
	s.run(time.Hour)
	if got := s.reports["a"]; got.Classification != StoppedUnexpectedly {
		t.Fatalf("%v", s.log)
	}
}
