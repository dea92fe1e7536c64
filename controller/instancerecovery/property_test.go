package instancerecovery

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var propActs int

// TestPropertyRecovery: random histories of 3 instances — crashes of
// every classification, Nova reboots that look like stops, Nova's power
// sync, users' stop API, starts, controller restarts (the stream
// replayed), lost leadership, write answers lost or conflicting, Nova
// unavailable, a crash between the intent and the action. Invariants:
//
//   - an action only for stopped-unexpectedly or unknown; for unknown only
//     when the Nova answer before it showed SHUTOFF with no task;
//   - never an action for a stop that was really a Nova reboot or stop;
//   - at most one action per stop event, across restarts;
//   - no load, query, write or action while not leading;
//   - at most Budget actions per instance within BudgetWindow, the k-th
//     at least Backoff·2^(k-2) after the previous one.
func TestPropertyRecovery(t *testing.T) {
	propActs = 0
	defer func() { t.Logf("%d actions over all histories", propActs) }()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := testConfig()
		cfg.Details = []string{DetailCrashed, DetailFailed, DetailDestroyed, DetailShutdown}
		cfg.Budget = rapid.IntRange(1, 3).Draw(rt, "budget")
		cfg.Mode = rapid.SampledFrom([]Mode{ModeRestart, ModeRestart, ModeMasakari}).Draw(rt, "mode")
		w := newWorld(t, cfg)
		uuids := []string{"u1", "u2", "u3"}
		type truth struct {
			running bool
			reboot  bool   // a Nova reboot in progress (the domain is off)
			cause   string // why it is off: crash, reboot, user
			stop    string // key of the last stop reported
		}
		tr := map[string]*truth{}
		cause := map[string]string{} // stop key → what really happened
		for _, u := range uuids {
			w.server(u, haServer())
			tr[u] = &truth{running: true}
		}
		steps := rapid.IntRange(10, 80).Draw(rt, "steps")
		for i := range steps {
			u := rapid.SampledFrom(uuids).Draw(rt, "uuid")
			s, x := w.nova[u], tr[u]
			switch k := rapid.IntRange(0, 11).Draw(rt, fmt.Sprintf("op%d", i)); k {
			case 0, 1: // a crash (or guest poweroff, destroy), classified
				if !x.running {
					break
				}
				x.running, x.cause = false, "crash"
				// Nova's power_state lags: it still says running until
				// its own sync (case 5)
				class := rapid.SampledFrom([]string{"stopped-unexpectedly", "stopped-unexpectedly", "unknown", ""}).Draw(rt, "class")
				detail := rapid.SampledFrom(RecoverableDetails).Draw(rt, "detail")
				ev := w.event(u, "stopped", class, detail)
				cause[ev.Key()] = "crash"
			case 2: // a Nova reboot, seen as a stop (rebooted or unknown)
				if !x.running {
					break
				}
				x.running, x.reboot, x.cause = false, true, "reboot"
				s.PowerState, s.TaskState = 4, "reboot_started_hard"
				if rapid.Bool().Draw(rt, "unknown") {
					ev := w.event(u, "stopped", "unknown", DetailDestroyed)
					cause[ev.Key()] = "reboot"
				}
			case 3: // the reboot completes
				if !x.reboot {
					break
				}
				x.reboot, x.running = false, true
				s.PowerState, s.TaskState, s.VMState = PowerRunning, "", "active"
				w.event(u, "rebooted", "rebooted", "")
			case 4: // the stop API
				if !x.running {
					break
				}
				x.running, x.cause = false, "user"
				s.PowerState, s.VMState, s.TaskState, s.StopByUser = 4, "stopped", "", true
				ev := w.event(u, "stopped", rapid.SampledFrom([]string{"stopped-by-nova", "unknown"}).Draw(rt, "userclass"), DetailShutdown)
				cause[ev.Key()] = "user"
			case 5: // Nova's power sync of a crash
				if !x.running && x.cause == "crash" && s.VMState == "active" {
					s.VMState, s.PowerState, s.StopByUser = "stopped", 4, false
				}
			case 6: // the domain runs again after a start (ours or a user's)
				if !x.running && !x.reboot && s.VMState == "active" && s.PowerState == PowerRunning {
					x.running = true
					w.event(u, "started", "", "")
				} else if !x.running && x.cause == "user" && rapid.Bool().Draw(rt, "userstart") {
					x.running = true
					s.PowerState, s.VMState = PowerRunning, "active"
					w.event(u, "started", "", "")
				}
			case 7:
				w.advance(time.Duration(rapid.IntRange(1, 240).Draw(rt, "secs")) * time.Second)
			case 8:
				w.restart()
			case 9:
				w.setLeading(!w.leading)
			case 10:
				w.writeFaults = append(w.writeFaults, fault(rapid.IntRange(1, 3).Draw(rt, "fault")))
				w.crashAtAct = rapid.Bool().Draw(rt, "crashAtAct")
			case 11:
				w.novaErr = !w.novaErr
			}
			if w.needRestart {
				w.needRestart = false
				w.restart()
			}
		}
		w.novaErr = false
		w.setLeading(true)
		w.advance(time.Hour)

		propActs += len(w.acts)
		if w.opsWhileNotLeading != 0 {
			rt.Fatalf("%d ops while not leading", w.opsWhileNotLeading)
		}
		per := map[string]int{}
		last := map[string][]time.Time{}
		for _, a := range w.acts {
			per[a.stop]++
			if per[a.stop] > 1 {
				rt.Fatalf("two actions for stop %s: %+v", a.stop, w.acts)
			}
			switch a.class {
			case "stopped-unexpectedly":
			case "unknown":
				if a.answer.VMState != "stopped" || a.answer.TaskState != "" {
					rt.Fatalf("unknown stop %s acted on with Nova %+v", a.stop, a.answer)
				}
			default:
				rt.Fatalf("action for a %q stop %s", a.class, a.stop)
			}
			if c := cause[a.stop]; c == "reboot" || c == "user" {
				rt.Fatalf("action for stop %s that was a %s (%s)", a.stop, c, a.class)
			}
			if a.action == ActionNotify {
				continue
			}
			ts := append(last[a.uuid], a.at)
			last[a.uuid] = ts
			n := 0
			for _, x := range ts {
				if a.at.Sub(x) < cfg.BudgetWindow {
					n++
				}
			}
			if n > cfg.Budget {
				rt.Fatalf("%d actions for %s within %v", n, a.uuid, cfg.BudgetWindow)
			}
			if len(ts) >= 2 && n >= 2 {
				prev := ts[len(ts)-2]
				min := cfg.Backoff << (n - 2)
				if a.at.Sub(prev) < min {
					rt.Fatalf("action %d of %s %v after the previous (backoff %v)", n, a.uuid, a.at.Sub(prev), min)
				}
			}
		}
	})
}
