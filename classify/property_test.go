package classify

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var (
	genVM   = []VMState{VMActive, VMActive, VMActive, VMStopped, VMError, VMShelved, VMSuspended, VMPaused, VMBuilding, VMResized, "future"}
	genTask = []TaskState{TaskNone, TaskNone, TaskNone, TaskRebootStarted, TaskRebootStartedHard, TaskRebooting, TaskPoweringOff,
		TaskPoweringOn, TaskDeleting, TaskMigrating, TaskResizeMigrating, TaskShelving, TaskPausing, TaskUpdatingPassword, "future_task"}
	genPower = []PowerState{PowerRunning, PowerShutdown, PowerNoState, PowerCrashed}
)

// listing is one listing the classifier was given.
type listing struct {
	sentAt, at time.Duration
	views      map[string]Server
}

// TestPropertyBounds: for any Nova history (operations starting and ending,
// instances leaving the host, stop requests by users or by Nova itself),
// any Nova outage and latency, and any libvirt restarts:
//   - every stop is reported exactly once, no later than
//     3*QueryTimeout + MaxHold after the hand-over (never held forever);
//   - never stopped-unexpectedly while the Nova view it was based on shows
//     an operation that explains the stop (powering-off counts unless Nova
//     itself, or a request after the stop, is behind it);
//   - unknown iff no Nova view could be used: exactly the reasons
//     nova-unavailable, nova-slow and nova-lost-while-held give unknown,
//     and every other report (but a libvirt restart's) rests on a listing
//     requested after the stop began;
//   - with Nova always answering in time there is no unknown at all.
func TestPropertyBounds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := DefaultConfig()
		cfg.MaxHold = rapid.SampledFrom([]time.Duration{30 * sec, 2 * time.Minute, DefaultMaxHold}).Draw(rt, "maxhold")
		n := &novaModel{views: map[string][]timedView{}, actions: map[string][]Action{}}
		lat := rapid.SampledFrom([]time.Duration{20 * time.Millisecond, 300 * time.Millisecond, time.Second, 2900 * time.Millisecond, 4 * sec}).Draw(rt, "latency")
		n.latency = func(time.Duration) time.Duration { return lat }
		var outages [][2]time.Duration
		for i := range rapid.IntRange(0, 2).Draw(rt, "outages") {
			a := time.Duration(rapid.IntRange(0, 120).Draw(rt, fmt.Sprint("out-from-", i))) * sec
			outages = append(outages, [2]time.Duration{a, a + time.Duration(rapid.IntRange(1, 90).Draw(rt, fmt.Sprint("out-len-", i)))*sec})
		}
		n.down = func(t time.Duration) bool {
			for _, o := range outages {
				if t >= o[0] && t < o[1] {
					return true
				}
			}
			return false
		}
		stops := map[string]Stop{}
		var in []input
		for i := range rapid.IntRange(1, 8).Draw(rt, "stops") {
			u := fmt.Sprintf("vm-%d", i)
			began := time.Duration(rapid.IntRange(0, 60).Draw(rt, u+"-began")) * sec
			st := Stop{UUID: u, Detail: DetailDestroyed, Began: t0.Add(began)}
			stops[u] = st
			in = append(in, input{at: began + 15*sec, stop: &st})
			if rapid.IntRange(0, 3).Draw(rt, u+"-restarts") == 0 {
				in = append(in, input{at: began + 15*sec + time.Duration(rapid.IntRange(0, 400).Draw(rt, u+"-alive"))*sec/4, alive: u})
			}
			var h []timedView
			for j := range rapid.IntRange(1, 4).Draw(rt, u+"-views") {
				from := time.Duration(rapid.IntRange(-10, 200).Draw(rt, fmt.Sprint(u, "-from-", j))) * sec
				if j == 0 {
					from = -time.Hour
				}
				if rapid.IntRange(0, 9).Draw(rt, fmt.Sprint(u, "-present-", j)) == 0 {
					h = append(h, gone(from))
					continue
				}
				h = append(h, v(from, rapid.SampledFrom(genVM).Draw(rt, fmt.Sprint(u, "-vm-", j)),
					rapid.SampledFrom(genTask).Draw(rt, fmt.Sprint(u, "-task-", j)), rapid.SampledFrom(genPower).Draw(rt, fmt.Sprint(u, "-power-", j))))
			}
			// histories must be in time order for novaModel.view
			for a := 1; a < len(h); a++ {
				for b := a; b > 0 && h[b].from < h[b-1].from; b-- {
					h[b], h[b-1] = h[b-1], h[b]
				}
			}
			n.views[u] = h
			for j := range rapid.IntRange(0, 3).Draw(rt, u+"-actions") {
				n.actions[u] = append(n.actions[u], Action{
					Name:   rapid.SampledFrom([]string{ActionStop, ActionStop, "start", "reboot"}).Draw(rt, fmt.Sprint(u, "-act-", j)),
					UserID: rapid.SampledFrom([]string{"", "u1"}).Draw(rt, fmt.Sprint(u, "-user-", j)),
					Start:  t0.Add(time.Duration(rapid.IntRange(-20, 120).Draw(rt, fmt.Sprint(u, "-at-", j))) * sec),
				})
			}
		}
		s := newSim(rt, cfg, n, in)
		var listings []listing
		s.onListing = func(sentAt, at time.Duration, list []Server) {
			m := map[string]Server{}
			for _, x := range list {
				m[x.UUID] = x
			}
			listings = append(listings, listing{sentAt, at, m})
		}
		s.run(2 * time.Hour)
		bound := 3*cfg.QueryTimeout + cfg.MaxHold
		for u, st := range stops {
			r, ok := s.reports[u]
			if !ok {
				rt.Fatalf("%s never reported\n%s", u, strings.Join(s.log, "\n"))
			}
			if r.Held > bound {
				rt.Fatalf("%s reported %v after the hand-over, bound %v\n%s", u, r.Held, bound, strings.Join(s.log, "\n"))
			}
			noNova := r.Reason == ReasonNovaUnavailable || r.Reason == ReasonNovaSlow || r.Reason == ReasonNovaLost
			if noNova != (r.Classification == Unknown) {
				rt.Fatalf("%s: %s — unknown iff no Nova view", u, r)
			}
			at := s.reportAt[u]
			// the last listing delivered at or before the report that was
			// requested after the stop began
			var last *listing
			for i := range listings {
				l := &listings[i]
				if l.at <= at && l.sentAt >= st.Began.Sub(t0) {
					last = l
				}
			}
			if r.Classification != Unknown && r.Reason != ReasonStartedBeforeClassified && r.Reason != ReasonStartedDuringOperation && last == nil {
				rt.Fatalf("%s: %s without a listing requested after the stop began\n%s", u, r, strings.Join(s.log, "\n"))
			}
			if r.Classification == StoppedUnexpectedly {
				view, present := last.views[u]
				if !present {
					rt.Fatalf("%s: %s but the instance was not listed", u, r)
				}
				if view.TaskState.Explains() && !(view.TaskState == TaskPoweringOff && !userStopBefore(n.actions[u], st.Began, cfg.ClockSkew)) {
					rt.Fatalf("%s: %s while Nova showed %s\n%s", u, r, view.TaskState, strings.Join(s.log, "\n"))
				}
			}
			if len(outages) == 0 && lat < cfg.QueryTimeout && r.Classification == Unknown {
				rt.Fatalf("%s: %s although Nova always answered in time", u, r)
			}
		}
		if s.c.Pending() != 0 {
			rt.Fatalf("%d pending", s.c.Pending())
		}
	})
}

func userStopBefore(as []Action, began time.Time, skew time.Duration) bool {
	var newest *Action
	for i := range as {
		if as[i].Name == ActionStop && (newest == nil || as[i].Start.After(newest.Start)) {
			newest = &as[i]
		}
	}
	return newest != nil && newest.UserID != "" && !newest.Start.After(began.Add(skew))
}
