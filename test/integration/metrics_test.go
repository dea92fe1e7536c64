package integration

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
)

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// grepLines returns the lines of body that contain s.
func grepLines(body, s string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metric returns the value of one series; -1 when it is absent.
func metric(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// /metrics reports what the agent did: events in, reports by transition,
// suppressed stops by reason, connection state; /healthz answers.
func TestMetricsEndpoint(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	uuid, _ := newDomain(t, wl, "metrics")
	cfg := agentConfig(t, "it-metrics", ns.ClientURL(), t.TempDir())
	addr := fmt.Sprintf("127.0.0.1:%d", deliverytest.FreePort(t))
	cfg.Metrics.Listen = addr
	startAgent(t, cfg, agent.Options{})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		_ = wl.Suspend(ctx, uuid)
		_ = wl.Resume(ctx, uuid)
	}
	_ = wl.Destroy(ctx, uuid)
	_ = wl.Start(ctx, uuid) // a hard reboot: one suppressed stop

	url := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for {
		body = scrape(t, url+"/metrics")
		if metric(body, `hvguard_lifecycle_stops_suppressed_total{reason="started-within-window"}`) >= 1 ||
			time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for series, min := range map[string]float64{
		`hvguard_lifecycle_reports_total{transition="suspended"}`:                  5,
		`hvguard_lifecycle_reports_total{transition="resumed"}`:                    5,
		`hvguard_lifecycle_reports_total{transition="rebooted"}`:                   1,
		`hvguard_lifecycle_stops_suppressed_total{reason="started-within-window"}`: 1,
		`hvguard_libvirt_events_total`:                                             12,
		`hvguard_libvirt_connected`:                                                1,
		`hvguard_nats_connected`:                                                   1,
		`hvguard_domains_tracked`:                                                  1,
	} {
		if v := metric(body, series); v < min {
			t.Errorf("%s = %v, want ≥ %v", series, v, min)
		}
	}
	// The agent created the stream: nothing differs from the recommendation.
	for _, series := range []string{`hvguard_stream_settings_differing{risky="true"}`, `hvguard_stream_settings_differing{risky="false"}`} {
		if v := metric(body, series); v != 0 {
			t.Errorf("%s = %v, want 0", series, v)
		}
	}
	if v := metric(body, `hvguard_lifecycle_reports_total{transition="stopped"}`); v != 0 {
		t.Errorf("a hard reboot counted as %v stops", v)
	}
	// Prometheus naming (issue 15): a build_info, points in time as Unix
	// timestamps (an age would be a few seconds, not ~now), the outbox's
	// bounds next to its depth.
	if !regexp.MustCompile(`(?m)^hvguard_build_info\{commit="[^"]+",daemon="agent",goversion="go[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("no hvguard_build_info{daemon=\"agent\",...} 1 in:\n%s", grepLines(body, "build_info"))
	}
	if v := metric(body, "hvguard_libvirt_event_loop_last_tick_timestamp_seconds"); math.Abs(v-float64(time.Now().Unix())) > 60 {
		t.Errorf("hvguard_libvirt_event_loop_last_tick_timestamp_seconds = %v, want a Unix time near %d", v, time.Now().Unix())
	}
	if v := metric(body, "hvguard_outbox_max_events"); v != float64(cfg.Outbox.MaxEvents) {
		t.Errorf("hvguard_outbox_max_events = %v, want %d", v, cfg.Outbox.MaxEvents)
	}
	if h := scrape(t, url+"/healthz"); len(h) < 3 || h[:2] != "ok" {
		t.Errorf("/healthz = %q", h)
	}
}
