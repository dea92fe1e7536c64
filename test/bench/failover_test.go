//go:build bench

package bench

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/daemon"
)

// waitHealthyStandby waits until p reports itself a healthy standby (its
// watches synced: its tracker measures every host's silence from now on).
func waitHealthyStandby(b *testing.B, p *controllertest.Proc, within time.Duration) {
	b.Helper()
	var st daemon.Status
	var err error
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if st, err = p.Status(); err == nil && st.Role == "standby" && st.Health == "ok" {
			return
		}
	}
	b.Fatalf("%s not a healthy standby within %s: %+v %v", p.ID, within, st, err)
}

// seconds returns min, median and max of ds in seconds.
func seconds(ds []time.Duration) (lo, med, hi float64) {
	s := make([]float64, len(ds))
	for i, d := range ds {
		s[i] = d.Seconds()
	}
	slices.Sort(s)
	return s[0], median(s), s[len(s)-1]
}

// median returns the median of sorted s (the mean of the middle two for an
// even count).
func median(s []float64) float64 {
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// list formats ds in seconds, in run order.
func list(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%.3f", d.Seconds()))
	}
	return strings.Join(out, " ")
}

// BenchmarkLeaderFailover is issue 12's failover benchmark (run once:
// -benchtime 1x) with real hvguard-controller processes at the DEFAULT
// lock timing (TTL 10 s, renew 2.5 s, write timeout 2 s, act margin 2 s)
// on the 3-node cluster, HVG_FAILOVER_HOSTS (50) hosts renewing.
//
// kill -9, HVG_FAILOVER_RUNS (10) times: a host is made silent; 5 s
// before it is due (lease_ttl + grace after its last renewal) the leader
// is killed with SIGKILL, so the host becomes due while nobody leads. Measured from the kill: the
// standby's /status says leader (polled every 10 ms), and — the new
// leader acting — the host's expired record (signed by the new leader)
// arrives in its key. Then a replacement standby is started and its
// watches synced before the next host goes silent.
//
// Orderly stop, HVG_FAILOVER_RUNS times: SIGTERM of the leader (it
// resigns) → the standby's /status says leader; exit status 0.
//
// Baseline, same run: a lone controller's start → leading (the lock key
// absent: it waits TakeoverAfter(TTL) like a takeover), and the protocol's
// TakeoverAfter(TTL) and TakeoverAfter(act_margin).
func BenchmarkLeaderFailover(b *testing.B) {
	nHosts := envInt(b, "HVG_FAILOVER_HOSTS", 50)
	runs := envInt(b, "HVG_FAILOVER_RUNS", 10)
	cfg := daemon.DefaultConfig()
	grace, err := cfg.TrackerCore().Grace(benchHostRecord("x", 1))
	if err != nil {
		b.Fatal(err)
	}
	due := benchHostRecord("x", 1).Timing.LeaseTTL + grace
	const killLead = 5 * time.Second
	takeover := controller.TakeoverAfter(cfg.Leader.TTL.D(), cfg.Tracker.Drift)
	handover := controller.TakeoverAfter(cfg.Leader.ActMargin.D(), cfg.Tracker.Drift)

	for i := 0; i < b.N; i++ {
		cl := startCluster(b, 3)
		nc := cl.connect(b, cl.urls[0])
		js, _ := jetstream.New(nc)
		kv := provision(b, js)
		fl := startFleet(b, cl, nHosts, 2)
		fl.waitAllRenewed(b, 30*time.Second)

		n := 0
		next := func() *controllertest.Proc {
			n++
			return startController(b, fmt.Sprintf("ctl-%d", n), cl.urls)
		}
		start := time.Now()
		leader := next()
		controllertest.WaitRole(b, leader, "leader", 60*time.Second)
		cold := time.Since(start)
		b.Logf("lone controller leading %s after its start (TakeoverAfter(TTL) %s)", cold.Round(time.Millisecond), takeover)
		standby := next()
		waitHealthyStandby(b, standby, 60*time.Second)

		var killLeading, killDeclared, termLeading []time.Duration
		var details []string // per run; logged after the lists (go test keeps only the first 10 lines of a benchmark's log)
		for r := range runs {
			h := fl.hosts[r]
			decl := watchDeclared(b, kv, h.name)
			_, acked := h.silence()
			time.Sleep(time.Until(acked.Add(due - killLead)))
			select {
			case d := <-decl:
				b.Fatalf("run %d: %s declared before the kill: %s", r, h.name, d.rec.Reason)
			default:
			}
			killed := time.Now()
			_ = leader.Cmd.Process.Kill()
			d := controllertest.WaitRole(b, standby, "leader", 3*takeover)
			var dd declared
			select {
			case dd = <-decl:
			case <-time.After(3 * takeover):
				b.Fatalf("run %d: %s not declared within %s of the kill", r, h.name, 3*takeover)
			}
			if want := "declared by controller " + standby.ID + ","; !strings.Contains(dd.rec.Reason, want) {
				b.Fatalf("run %d: %s declared by someone else: %s", r, h.name, dd.rec.Reason)
			}
			<-leader.Exited
			killLeading = append(killLeading, d)
			killDeclared = append(killDeclared, dd.at.Sub(killed))
			details = append(details, fmt.Sprintf("kill -9 run %d: %s leading after %s, %s declared after %s (due %s after the kill)", r+1, standby.ID,
				d.Round(time.Millisecond), h.name, dd.at.Sub(killed).Round(time.Millisecond), acked.Add(due).Sub(killed).Round(time.Millisecond)))
			leader, standby = standby, next()
			waitHealthyStandby(b, standby, 60*time.Second)
		}
		for r := range runs {
			termed := time.Now()
			_ = leader.Cmd.Process.Signal(syscall.SIGTERM)
			d := controllertest.WaitRole(b, standby, "leader", 3*takeover)
			<-leader.Exited
			if code := leader.Cmd.ProcessState.ExitCode(); code != 0 {
				b.Fatalf("run %d: %s exited %d after SIGTERM", r, leader.ID, code)
			}
			termLeading = append(termLeading, d)
			details = append(details, fmt.Sprintf("SIGTERM run %d: %s leading after %s (%s after the signal)", r+1, standby.ID, d.Round(time.Millisecond), time.Since(termed).Round(time.Millisecond)))
			leader, standby = standby, next()
			waitHealthyStandby(b, standby, 60*time.Second)
		}

		b.Logf("kill -9 → leading, s: %s", list(killLeading))
		b.Logf("kill -9 → first declaration, s: %s", list(killDeclared))
		b.Logf("SIGTERM → leading, s: %s", list(termLeading))
		for _, d := range details {
			b.Log(d)
		}
		lo, med, hi := seconds(killLeading)
		b.ReportMetric(lo, "kill_leading_min_s")
		b.ReportMetric(med, "kill_leading_median_s")
		b.ReportMetric(hi, "kill_leading_max_s")
		lo, med, hi = seconds(killDeclared)
		b.ReportMetric(lo, "kill_declared_min_s")
		b.ReportMetric(med, "kill_declared_median_s")
		b.ReportMetric(hi, "kill_declared_max_s")
		lo, med, hi = seconds(termLeading)
		b.ReportMetric(lo, "term_leading_min_s")
		b.ReportMetric(med, "term_leading_median_s")
		b.ReportMetric(hi, "term_leading_max_s")
		b.ReportMetric(float64(runs), "runs")
		b.ReportMetric(cold.Seconds(), "base_cold_leading_s")
		b.ReportMetric(takeover.Seconds(), "base_takeover_after_ttl_s")
		b.ReportMetric(handover.Seconds(), "base_takeover_after_margin_s")
	}
}
