//go:build bench

package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/controller"
	"hvguard/controller/controllertest"
	"hvguard/controller/daemon"
	"hvguard/proto"
)

// controllerYAML is the configuration of a benchmark controller: every
// default (lock TTL 10 s, guard min(10, 20 %) within 1 m, drift 1 %) but
// the id, the cluster's URLs, an existing bucket and an endpoint on a
// free port.
func controllerYAML(id string, urls []string) string {
	return fmt.Sprintf(`id: %s
log: {level: info, format: json}
nats: {urls: [%s], ready_timeout: 30s, create_bucket: false}
metrics: {listen: "127.0.0.1:0"}
`, id, `"`+strings.Join(urls, `", "`)+`"`)
}

// startController starts the real hvguard-controller binary.
func startController(b *testing.B, id string, urls []string) *controllertest.Proc {
	b.Helper()
	return controllertest.StartProc(b, filepath.Join(binaries(b), "hvguard-controller"), nil, id, controllerYAML(id, urls))
}

// scrape returns the sum of the samples of metric (any labels) on the
// controller's /metrics.
func scrape(addr, metric string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, metric) || (len(l) > len(metric) && l[len(metric)] != ' ' && l[len(metric)] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	if !found {
		return 0, fmt.Errorf("%s not on /metrics", metric)
	}
	return sum, sc.Err()
}

// caughtUp waits until controller id's durable consumer exists and has
// less than one second of events (rate) pending or unacknowledged, and
// returns it.
func caughtUp(b *testing.B, js jetstream.JetStream, id string, rate int, deadline time.Time) jetstream.Consumer {
	b.Helper()
	var err error
	for ; time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var cons jetstream.Consumer
		var ci *jetstream.ConsumerInfo
		cons, err = js.Consumer(ctx, proto.StreamName, controller.DurableName(id))
		if err == nil {
			ci, err = cons.Info(ctx)
		}
		cancel()
		if err == nil && ci.NumPending+uint64(ci.NumAckPending) < uint64(max(rate, 1)) {
			return cons
		}
	}
	b.Fatalf("the consumer of controller %s did not catch up in time: %v", id, err)
	return nil
}

// BenchmarkFleetScale is issue 12's fleet-scale benchmark (run once:
// -benchtime 1x). A 3-node nats-server cluster on this machine (R3 lease
// bucket, R3 event stream), HVG_FLEET_HOSTS (10 000) simulated agents
// renewing their lease records every 2 s by CAS over HVG_FLEET_CONNS (16)
// pooled connections, HVG_FLEET_EVENTS (1 000) lifecycle events/s on the
// stream. Two phases of HVG_FLEET_SECONDS (150) each, same load:
//
//  1. baseline: no controller — the NATS processes' CPU and RSS, renewal
//     latency and failures;
//  2. the real hvguard-controller binary (default configuration) leading,
//     its consumer caught up: the same figures, plus the controller's CPU
//     and RSS, its consumer's lag sampled every second (NumPending +
//     NumAckPending of hvguard-controller-<id>), and HVG_FLEET_SILENT (5)
//     hosts made silent one after another (under the guard's threshold
//     min(10, 20 % of hosts)): the delay from each one's last landed
//     renewal to its expired record in its key, against lease_ttl + grace
//     + 1 s. The phase lasts at least until the last silent host is due.
//
// Targets missed are reported (metrics, MISSED in the log and in
// bench.sh's summary), not failed: a failed benchmark prints no figures.
// Only a harness failure (a cluster, a controller or a consumer that does
// not come up) fails it.
//
// Smoke: HVG_FLEET_HOSTS=500 HVG_FLEET_SECONDS=30 (about 2 minutes).
func BenchmarkFleetScale(b *testing.B) {
	nHosts := envInt(b, "HVG_FLEET_HOSTS", 10000)
	conns := envInt(b, "HVG_FLEET_CONNS", 16)
	rate := envInt(b, "HVG_FLEET_EVENTS", 1000)
	phase := time.Duration(envInt(b, "HVG_FLEET_SECONDS", 150)) * time.Second
	nSilent := envInt(b, "HVG_FLEET_SILENT", 5)
	cfg := daemon.DefaultConfig()
	if limit := min(cfg.Guard.Count, int(cfg.Guard.Share*float64(nHosts))); nSilent < 1 || nSilent > limit {
		b.Fatalf("HVG_FLEET_SILENT=%d: want 1..%d (the guard holds above min(%d, %g × %d hosts))", nSilent, limit, cfg.Guard.Count, cfg.Guard.Share, nHosts)
	}
	grace, err := cfg.TrackerCore().Grace(benchHostRecord("x", 1))
	if err != nil {
		b.Fatal(err)
	}
	ttl := benchHostRecord("x", 1).Timing.LeaseTTL
	bound := ttl + grace + time.Second

	for i := 0; i < b.N; i++ {
		cl := startCluster(b, 3)
		nc := cl.connect(b, cl.urls[0])
		js, _ := jetstream.New(nc)
		kv := provision(b, js)

		fl := startFleet(b, cl, nHosts, conns)
		ev := startEvents(b, cl, fl.hosts, rate)
		fl.waitAllRenewed(b, 60*time.Second)
		time.Sleep(5 * time.Second) // the first renewals (creates) out of the way
		fl.phase()
		b.Logf("%d hosts renewing, %d events/s; baseline phase %s", nHosts, rate, phase)

		// ---- 1. baseline: NATS alone ----
		natsCPU := newCPUMeter(b, cl.pids()...)
		harness := newCPUMeter(b, syscall.Getpid())
		pub0, fail0 := ev.published.Load(), ev.failed.Load()
		t0 := time.Now()
		time.Sleep(phase)
		base := fl.phase()
		b.ReportMetric(natsCPU.cores(b), "base_nats_cpu_cores")
		b.ReportMetric(harness.cores(b), "base_harness_cpu_cores")
		memSum(b, cl.pids()...).report(b, "base_nats_", 1)
		b.ReportMetric(float64(ev.published.Load()-pub0)/time.Since(t0).Seconds(), "base_events/s")
		b.ReportMetric(float64(ev.failed.Load()-fail0), "base_event_failures")
		base.report(b, "base_")

		// ---- 2. the controller ----
		started := time.Now()
		ctl := startController(b, "bench-ctl", cl.urls)
		for deadline := started.Add(120 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if v, err := scrape(ctl.Addr, "hvguard_controller_leader"); err == nil && v == 1 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the controller did not lead within 120 s")
			}
		}
		leading := time.Since(started)
		cons := caughtUp(b, js, "bench-ctl", rate, started.Add(300*time.Second))
		synced := time.Since(started)
		b.ReportMetric(leading.Seconds(), "ctl_leading_after_s")
		b.ReportMetric(synced.Seconds(), "ctl_caught_up_after_s")
		b.Logf("controller leading after %s, consumer caught up after %s (backlog of the baseline phase)", leading.Round(time.Millisecond), synced.Round(time.Millisecond))

		pid := ctl.Cmd.Process.Pid
		ctlCPU := newCPUMeter(b, pid)
		natsCPU = newCPUMeter(b, cl.pids()...)
		harness = newCPUMeter(b, syscall.Getpid())
		pub0, fail0 = ev.published.Load(), ev.failed.Load()
		applied0, _ := scrape(ctl.Addr, "hvguard_controller_lifecycle_messages_total")
		fl.phase()
		t0 = time.Now()
		// Silent hosts, spread so that the last is due before the phase ends.
		due := ttl + grace
		span := max(0, phase-due-3*time.Second)
		gap := time.Duration(0)
		if nSilent > 1 {
			gap = span / time.Duration(nSilent-1)
		}
		type silent struct {
			host        string
			sent, acked time.Time
			decl        <-chan declared
		}
		var silents []silent
		var lags, pend []float64
		lagMetric := 0.0 // the controller's own lag gauge (read by it every 5 s)
		end := t0.Add(max(phase, time.Duration(nSilent-1)*gap+due+3*time.Second))
		nextSilent := t0.Add(2 * time.Second)
		for now := time.Now(); now.Before(end); now = time.Now() {
			if len(silents) < nSilent && !now.Before(nextSilent) {
				h := fl.hosts[(len(silents)*7919+13)%nHosts]
				d := watchDeclared(b, kv, h.name)
				sent, acked := h.silence()
				silents = append(silents, silent{h.name, sent, acked, d})
				nextSilent = nextSilent.Add(gap)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
			if ci, err := cons.Info(ctx); err == nil {
				lags = append(lags, float64(ci.NumPending+uint64(ci.NumAckPending)))
				pend = append(pend, float64(ci.NumPending))
			}
			cancel()
			if v, err := scrape(ctl.Addr, "hvguard_controller_stream_lag_messages"); err == nil {
				lagMetric = max(lagMetric, v)
			}
			time.Sleep(time.Until(now.Add(time.Second)))
		}
		el := time.Since(t0)
		b.ReportMetric(ctlCPU.cores(b), "ctl_cpu_cores")
		b.ReportMetric(natsCPU.cores(b), "ctl_nats_cpu_cores")
		b.ReportMetric(harness.cores(b), "ctl_harness_cpu_cores")
		m, err := procMem(pid)
		if err != nil {
			b.Fatal(err)
		}
		m.report(b, "ctl_", 1)
		memSum(b, cl.pids()...).report(b, "ctl_nats_", 1)
		b.ReportMetric(float64(ev.published.Load()-pub0)/el.Seconds(), "ctl_events/s")
		b.ReportMetric(float64(ev.failed.Load()-fail0), "ctl_event_failures")
		if applied, err := scrape(ctl.Addr, "hvguard_controller_lifecycle_messages_total"); err == nil {
			b.ReportMetric((applied-applied0)/el.Seconds(), "ctl_consumed_events/s")
		}
		ctlStats := fl.phase()
		ctlStats.report(b, "ctl_")
		if n := ctlStats.declaredWhileRenewing; n > 0 {
			b.Logf("FALSE DECLARATIONS: %d renewals of hosts that never stopped renewing met an expired record", n)
		}
		slices.Sort(lags)
		slices.Sort(pend)
		if len(lags) > 0 {
			b.ReportMetric(lags[len(lags)-1], "lag_max_msgs")
			b.ReportMetric(lags[int(0.99*float64(len(lags)-1))], "lag_p99_msgs")
			b.ReportMetric(median(lags), "lag_p50_msgs")
			b.ReportMetric(pend[len(pend)-1], "lag_pending_max_msgs")
			if rate > 0 {
				b.ReportMetric(lags[len(lags)-1]/float64(rate), "lag_max_s")
			}
			b.ReportMetric(float64(len(lags)), "lag_samples")
		}
		b.ReportMetric(lagMetric, "lag_metric_max_msgs")
		for _, m := range []struct{ metric, name string }{
			{`hvguard_controller_declarations_total{result="written"}`, "ctl_declarations_written"},
			{`hvguard_controller_declarations_total{result="failed"}`, "ctl_declarations_failed"},
			{"hvguard_controller_guard_holds_total", "ctl_guard_holds"},
			{"hvguard_controller_host_refusals_total", "ctl_refusals"},
			{"hvguard_controller_hosts_stale", "ctl_hosts_stale"},
		} {
			if v, err := scrape(ctl.Addr, m.metric); err == nil {
				b.ReportMetric(v, m.name)
			}
		}

		// Declarations.
		var delays []float64
		for _, s := range silents {
			var timeout <-chan time.Time // nil: no timeout while a declaration is already there
			if len(s.decl) == 0 {
				timeout = time.After(time.Until(s.acked.Add(bound + 5*time.Second)))
			}
			select {
			case d := <-s.decl:
				delays = append(delays, d.at.Sub(s.acked).Seconds())
				b.Logf("%s silent: last renewal sent %s, acked %s; expired record seen %.3f s after the ack (%.3f s after the send; bound %.3f s): %s",
					s.host, s.sent.Format("15:04:05.000"), s.acked.Format("15:04:05.000"), d.at.Sub(s.acked).Seconds(), d.at.Sub(s.sent).Seconds(), bound.Seconds(), d.rec.Reason)
			case <-timeout:
				b.Logf("MISSED: %s not declared within %s of its last renewal", s.host, bound+5*time.Second)
			}
		}
		slices.Sort(delays)
		b.ReportMetric(float64(len(delays)), "declared_hosts")
		b.ReportMetric(bound.Seconds(), "declare_bound_s")
		if len(delays) > 0 {
			b.ReportMetric(delays[0], "declare_min_s")
			b.ReportMetric(median(delays), "declare_median_s")
			b.ReportMetric(delays[len(delays)-1], "declare_max_s")
		}
		b.ReportMetric(float64(nHosts), "hosts")
		_ = ctl.Cmd.Process.Signal(syscall.SIGTERM)
		<-ctl.Exited
	}
}
