package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"hvguard/agent"
	"hvguard/agent/delivery/deliverytest"
	"hvguard/libvirtx"
	"hvguard/lifecycle"
	"hvguard/openstack"
	"hvguard/openstack/openstacktest"
	"hvguard/proto"
)

// Nova-aware stop classification through the whole agent (agent.Run):
// libvirt's test driver, the embedded JetStream, and a Nova whose
// servers/detail and os-instance-actions answers are Nova 26.2.2's recorded
// bodies (openstack/testdata/e2e-lv-*) with the state each test sets.

// fakeNova serves this host's servers listing with test-controlled states.
type fakeNova struct {
	*openstacktest.Server
	t        *testing.T
	host     string
	template map[string]json.RawMessage // one recorded server
	header   map[string][]string

	mu      sync.Mutex
	servers map[string]novaState
}

type novaState struct {
	status, vm, task string
	power            int
}

var (
	novaActive     = novaState{"ACTIVE", "active", "", 1}
	novaHardReboot = novaState{"HARD_REBOOT", "active", "reboot_started_hard", 4}
	novaStopped    = novaState{"SHUTOFF", "stopped", "", 4}
	// novaRebootFailed: Nova's reboot raised (manager.py reboot_instance
	// sets vm_state error), the domain left off.
	novaRebootFailed = novaState{"ERROR", "error", "", 4}
)

func newFakeNova(t *testing.T, host string) *fakeNova {
	rec := openstacktest.MustLoad(t, "e2e-lv-servers-node3-active.mv2.59")
	var body struct {
		Servers []map[string]json.RawMessage `json:"servers"`
	}
	if err := json.Unmarshal(rec.Body, &body); err != nil || len(body.Servers) == 0 {
		t.Fatalf("recorded listing: %v", err)
	}
	n := &fakeNova{Server: openstacktest.New(t), t: t, host: host, template: body.Servers[0], header: rec.Header, servers: map[string]novaState{}}
	n.route()
	return n
}

// set puts uuid on this host in state st (and re-renders the listing).
func (n *fakeNova) set(uuid string, st novaState) {
	n.mu.Lock()
	n.servers[uuid] = st
	n.mu.Unlock()
	n.route()
}

func (n *fakeNova) route() {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	var list []map[string]json.RawMessage
	for uuid, st := range n.servers {
		s := map[string]json.RawMessage{}
		for k, v := range n.template {
			s[k] = v
		}
		var task any
		if st.task != "" {
			task = st.task
		}
		s["id"], s["status"] = q(uuid), q(st.status)
		s["OS-EXT-SRV-ATTR:host"] = q(n.host)
		s["OS-EXT-STS:task_state"], s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:power_state"] = q(task), q(st.vm), q(st.power)
		list = append(list, s)
		// GET /servers/{id} (the controller's instance recovery), and its
		// actions (os-start, reboot) accepted.
		one, _ := json.Marshal(map[string]any{"server": s})
		n.Route("/v2.1/servers/"+uuid, openstacktest.Recorded{Status: 200, Header: n.header, Body: one})
		n.RouteMethod("POST", "/v2.1/servers/"+uuid+"/action", openstacktest.Recorded{Status: 202, Header: n.header})
	}
	body, _ := json.Marshal(map[string]any{"servers": list})
	n.Route(fmt.Sprintf("/v2.1/servers/detail?all_tenants=1&host=%s&limit=%d", n.host, openstack.PageSize),
		openstacktest.Recorded{Status: 200, Header: n.header, Body: body})
}

// userStop records a stop API request by a user at start (the recorded
// os-instance-actions body, Nova's own format).
func (n *fakeNova) userStop(uuid string, start time.Time) {
	rec := openstacktest.MustLoad(n.t, "e2e-lv-actions-user-stop.mv2.59")
	var body struct {
		Actions []map[string]json.RawMessage `json:"instanceActions"`
	}
	if err := json.Unmarshal(rec.Body, &body); err != nil {
		n.t.Fatal(err)
	}
	a := body.Actions[0] // "stop" by a user
	a["instance_uuid"], _ = json.Marshal(uuid)
	a["start_time"], _ = json.Marshal(start.UTC().Format("2006-01-02T15:04:05.000000"))
	b, _ := json.Marshal(map[string]any{"instanceActions": []any{a}})
	n.Route(fmt.Sprintf("/v2.1/servers/%s/os-instance-actions?limit=%d", uuid, openstack.MaxActions),
		openstacktest.Recorded{Status: 200, Header: rec.Header, Body: b})
}

// startClassifying runs an agent with classification on against nova.
func startClassifying(t *testing.T, nova *fakeNova, url, host string, tune func(*agent.Config)) func() error {
	return startAgent(t, classifyingConfig(t, nova, url, host, tune), agent.Options{})
}

// classifyingConfig is the configuration of an agent classifying with nova.
func classifyingConfig(t *testing.T, nova *fakeNova, url, host string, tune func(*agent.Config)) agent.Config {
	cfg := agentConfig(t, host, url, stateDir(t))
	cfg.Classification.Enabled = true
	cfg.OpenStack.Cloud = "test"
	cfg.OpenStack.CloudsFile = nova.CloudsYAML(t)
	cfg.OpenStack.RequestTimeout = agent.Duration(2 * time.Second)
	cfg.Classification.QueryTimeout = agent.Duration(agent.MinQueryTimeout)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(&cfg) // test-only bounds below the validated ones
	}
	return cfg
}

// classified renders a domain's events as transition(reason)[classification/reason].
func classified(evs []proto.LifecycleEvent, uuid string) []string {
	var out []string
	for _, e := range evs {
		if e.DomainUUID != uuid {
			continue
		}
		s := string(e.Transition) + "(" + e.Reason + ")"
		if e.Classification != "" {
			s += "[" + string(e.Classification) + "/" + e.ClassificationReason + "]"
		}
		out = append(out, s)
	}
	return out
}

// stopsAndReboots keeps what a recovery controller judges.
func stopsAndReboots(evs []string) []string {
	return slices.DeleteFunc(slices.Clone(evs), func(s string) bool {
		return !(len(s) > 7 && (s[:7] == "stopped" || s[:8] == "rebooted"))
	})
}

// expectOne checks that each domain had exactly the one stop or reboot
// report given.
func expectOne(t *testing.T, evs []proto.LifecycleEvent, want map[string]string) {
	t.Helper()
	for uuid, w := range want {
		if got := stopsAndReboots(classified(evs, uuid)); !slices.Equal(got, []string{w}) {
			t.Errorf("domain %s: got %v, want [%s]", uuid, got, w)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestClassifyAgainstNova: a Nova hard reboot that keeps the domain off past
// the window (destroy, undefine, define, start, as the libvirt driver does
// it) is held and reported once as rebooted, its undefine/define and start
// folded in; a virsh destroy Nova knows nothing of is stopped-unexpectedly
// with the libvirt detail; a stop API request is stopped-by-nova.
func TestClassifyAgainstNova(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-cls1.example.org"
	reboot, rebootName := newDomain(t, wl, "cls-reboot")
	crash, _ := newDomain(t, wl, "cls-destroy")
	stopped, _ := newDomain(t, wl, "cls-stopapi")
	nova := newFakeNova(t, host)
	for _, u := range []string{reboot, crash, stopped} {
		nova.set(u, novaActive)
	}
	startClassifying(t, nova, ns.ClientURL(), host, nil)
	nc := natsConn(t, ns.ClientURL())
	ctx := context.Background()

	// Nova's hard reboot: task set before the domain goes down.
	nova.set(reboot, novaHardReboot)
	must(t, wl.Destroy(ctx, reboot))
	must(t, wl.Destroy(ctx, crash))
	nova.set(stopped, novaState{"ACTIVE", "active", "powering-off", 1})
	nova.userStop(stopped, time.Now().Add(-time.Second))
	must(t, wl.Shutdown(ctx, stopped))
	nova.set(stopped, novaStopped)

	// Past the window (+ Nova's answer): the destroy and the stop API are
	// reported, the reboot is held.
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(stopsAndReboots(classified(evs, crash))) == 1 && len(stopsAndReboots(classified(evs, stopped))) == 1
	})
	time.Sleep(2 * testWindow)
	evs = deliverytest.Collect(t, nc, host, len(evs), 5*time.Second).Events
	if got := stopsAndReboots(classified(evs, reboot)); len(got) != 0 {
		t.Fatalf("held reboot reported early: %v", got)
	}
	// The libvirt driver's hard reboot goes on: undefine, define, start;
	// Nova ends the task.
	must(t, wl.Undefine(ctx, reboot))
	_, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(rebootName, reboot))
	must(t, err)
	must(t, wl.Start(ctx, reboot))
	nova.set(reboot, novaActive)

	evs = waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(stopsAndReboots(classified(evs, reboot))) == 1
	})
	time.Sleep(2 * testWindow) // any wrong later report arrives
	evs = deliverytest.Collect(t, nc, host, len(evs), 5*time.Second).Events
	checkContiguous(t, evs)

	expectOne(t, evs, map[string]string{
		reboot:  "rebooted(off-at-window-end)[rebooted/started-during-operation]",
		crash:   "stopped(off-at-window-end)[stopped-unexpectedly/no-operation]",
		stopped: "stopped(off-at-window-end)[stopped-by-nova/stop-requested]",
	})
	// The hard reboot's undefine, define and start are part of the reboot.
	for _, e := range classified(evs, reboot) {
		if e != "rebooted(off-at-window-end)[rebooted/started-during-operation]" && !slices.Contains([]string{"defined(resync)", "started(resync)"}, e) {
			t.Errorf("reboot domain: unexpected event %s in %v", e, classified(evs, reboot))
		}
	}
	for _, e := range evs {
		if e.DomainUUID == crash && e.Transition == proto.TransitionStopped && e.LibvirtDetail != "DESTROYED" {
			t.Errorf("destroyed domain: libvirt detail %q", e.LibvirtDetail)
		}
	}
}

// TestClassifyNovaUnavailable: Nova not answering (hung, then within the
// backoff) → the stops are reported unknown right after the window, nothing
// lost; a reboot Nova never finishes is not held forever (max_hold).
func TestClassifyNovaUnavailable(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-cls2.example.org"
	a, _ := newDomain(t, wl, "cls-hang")
	b, _ := newDomain(t, wl, "cls-down")
	stuck, _ := newDomain(t, wl, "cls-stuck")
	nova := newFakeNova(t, host)
	nova.set(a, novaActive)
	nova.set(b, novaActive)
	nova.set(stuck, novaHardReboot)
	const maxHold = 3 * time.Second
	startClassifying(t, nova, ns.ClientURL(), host, func(c *agent.Config) { c.Classification.MaxHold = agent.Duration(maxHold) })
	nc := natsConn(t, ns.ClientURL())
	ctx := context.Background()

	// A reboot that never ends: held, then held-too-long.
	t0 := time.Now()
	must(t, wl.Destroy(ctx, stuck))
	time.Sleep(testWindow + time.Second) // held by now (Nova answered)

	nova.FailAll(openstacktest.FaultHang)
	must(t, wl.Destroy(ctx, a))
	time.Sleep(testWindow + agent.MinQueryTimeout + 300*time.Millisecond)
	nova.FailAll(openstacktest.FaultDrop)
	must(t, wl.Destroy(ctx, b)) // within the backoff after a's timeout

	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(stopsAndReboots(classified(evs, a))) == 1 && len(stopsAndReboots(classified(evs, b))) == 1 &&
			len(stopsAndReboots(classified(evs, stuck))) == 1
	})
	checkContiguous(t, evs)
	expectOne(t, evs, map[string]string{
		a: "stopped(off-at-window-end)[unknown/nova-slow]",
		b: "stopped(off-at-window-end)[unknown/nova-unavailable]",
		// Held, then Nova gone: the hold ends at max_hold or when no Nova
		// view came for nova_lost_after, whichever first (max_hold here).
		stuck: "stopped(off-at-window-end)[stopped-by-nova/held-too-long]",
	})
	for _, e := range evs {
		if e.DomainUUID == a && e.Transition == proto.TransitionStopped {
			// Unknown after the window plus at most the query timeout.
			if d := e.ObservedAt.Sub(e.OccurredAt); d > testWindow+agent.MinQueryTimeout+time.Second {
				t.Errorf("nova-slow stop reported %v after it happened", d)
			}
		}
		if e.DomainUUID == stuck && e.Transition == proto.TransitionStopped {
			if d := e.ObservedAt.Sub(t0); d < maxHold || d > testWindow+maxHold+3*time.Second {
				t.Errorf("held-too-long after %v, want ~window + %v", d, maxHold)
			}
		}
	}
}

// TestClassifyShutdownMidHold: SIGTERM while a stop is held for a Nova
// operation publishes it (unknown, agent-stopping) before the outbox
// flush: never lost.
func TestClassifyShutdownMidHold(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-cls3.example.org"
	a, _ := newDomain(t, wl, "cls-term")
	nova := newFakeNova(t, host)
	nova.set(a, novaHardReboot)
	stop := startClassifying(t, nova, ns.ClientURL(), host, nil)
	nc := natsConn(t, ns.ClientURL())
	must(t, wl.Destroy(context.Background(), a))
	time.Sleep(testWindow + time.Second) // held
	before := deliverytest.Collect(t, nc, host, 0, time.Second).Events
	if got := stopsAndReboots(classified(before, a)); len(got) != 0 {
		t.Fatalf("held stop reported before shutdown: %v", got)
	}
	must(t, stop())
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool {
		return len(stopsAndReboots(classified(evs, a))) == 1
	})
	checkContiguous(t, evs)
	expectOne(t, evs, map[string]string{a: "stopped(off-at-window-end)[unknown/agent-stopping]"})
}

// TestClassifyShutdownPublishesQueuedStop (issue 10 item 10): a stop held
// for a Nova hard reboot; the domain's start event is lost (libvirt's
// hand-off overflowed), so its next reports — suspended, then a second stop
// after its window — are not a start that ends the hold: they queue behind
// the held stop. SIGTERM then publishes the held stop (unknown,
// agent-stopping), the queued suspended and the queued stop, in order
// (unknown, agent-stopping too). Before the fix the queued stop was handed
// to the classifier again after the drain and never published.
func TestClassifyShutdownPublishesQueuedStop(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-cls6.example.org"
	a, _ := newDomain(t, wl, "cls-queued")
	nova := newFakeNova(t, host)
	nova.set(a, novaHardReboot) // held for as long as the test runs (max_hold 5 min)
	cfg := classifyingConfig(t, nova, ns.ClientURL(), host, nil)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", deliverytest.FreePort(t))
	cfg.Metrics.Listen = strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics")
	var lose atomic.Bool
	stop := startAgent(t, cfg, agent.Options{WrapHypervisor: func(hv agent.Hypervisor) agent.Hypervisor {
		return newGatedHV(hv, a, nil, func(ev lifecycle.Event) bool {
			return lose.Load() && ev.UUID == a && (ev.Kind == lifecycle.KindStarted || ev.Kind == lifecycle.KindResumed)
		}, nil)
	}})
	nc := natsConn(t, ns.ClientURL())
	ctx := context.Background()
	waitMetric := func(series string, want float64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for metric(scrape(t, url), series) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s never reached %v", series, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	must(t, wl.Destroy(ctx, a))
	waitMetric("hvguard_stops_classifying", 1) // held: Nova shows the hard reboot
	lose.Store(true)
	must(t, wl.Start(ctx, a))   // STARTED lost
	must(t, wl.Suspend(ctx, a)) // suspended: queued behind the held stop
	must(t, wl.Destroy(ctx, a)) // a second stop: queued after its window
	waitMetric("hvguard_reports_queued", 2)
	before := deliverytest.Collect(t, nc, host, 0, time.Second).Events
	if got := classified(before, a); !slices.Equal(got, []string{"defined(resync)"}) {
		t.Fatalf("before the shutdown: %v, want only defined(resync)", got)
	}

	must(t, stop())
	evs := deliverytest.Collect(t, nc, host, 3, 5*time.Second).Events
	checkContiguous(t, evs)
	want := []string{
		"defined(resync)",
		"stopped(off-at-window-end)[unknown/agent-stopping]",
		"suspended(event)",
		"stopped(off-at-window-end)[unknown/agent-stopping]",
	}
	if got := classified(evs, a); !slices.Equal(got, want) {
		t.Errorf("after the shutdown: %v, want %v", got, want)
	}
}

// TestClassifySIGKILLMidHold: the agent (a child process) is killed with
// SIGKILL while a stop is held for a Nova hard reboot in flight, and
// started again on the same state directory. domains.json kept the held
// domain running, so the restart's resync finds it off and the stop goes
// through classification again (held while Nova still shows the reboot),
// then is reported once with its classification; the stop reported before
// the kill is not reported again; seqs are contiguous across the restart.
func TestClassifySIGKILLMidHold(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	state := stateDir(t)
	host := childClsHost
	const (
		held  = "5e1d7c3a-0000-4000-8000-0000000000c1"
		crash = "5e1d7c3a-0000-4000-8000-0000000000c2"
	)
	domains := func(st string) string {
		return childDomainsEnv + "=" + held + ",cls-held," + st + " " + crash + ",cls-crash," + st
	}
	nova := newFakeNova(t, host)
	nova.set(held, novaHardReboot) // the held domain's destroy is Nova's hard reboot
	nova.set(crash, novaActive)
	clouds := childCloudsEnv + "=" + nova.CloudsYAML(t)
	nc := natsConn(t, ns.ClientURL())
	stops := func(evs []proto.LifecycleEvent, uuid string) int { return len(stopsAndReboots(classified(evs, uuid))) }

	first := startChild(t, childClassify, ns.ClientURL(), state, clouds, domains("running"))
	waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return len(evs) >= 2 }) // defined(resync) of both
	first.destroy(t, held)
	first.destroy(t, crash)
	// Both windows end together: one listing answers both, the crash is
	// reported, the reboot held.
	waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return stops(evs, crash) == 1 })
	time.Sleep(2*agent.KnownSaveInterval + 500*time.Millisecond) // domains.json written since the hold
	evs := deliverytest.Collect(t, nc, host, 0, time.Second).Events
	if got := stopsAndReboots(classified(evs, held)); len(got) != 0 {
		t.Fatalf("held stop reported before the kill: %v", got)
	}
	first.kill(t)
	queried := nova.NovaRequests()

	// The restarted agent's host: both domains off (the reboot has not
	// brought the domain back), Nova still in the reboot.
	second := startChild(t, childClassify, ns.ClientURL(), state, clouds, domains("shutoff"))
	time.Sleep(testWindow + 2*time.Second)
	evs = deliverytest.Collect(t, nc, host, 0, time.Second).Events
	if got := stopsAndReboots(classified(evs, held)); len(got) != 0 {
		t.Fatalf("stop reported after the restart while Nova still reboots: %v", got)
	}
	if nova.NovaRequests() == queried {
		t.Fatal("the restarted agent did not ask Nova about the stop")
	}
	nova.set(held, novaRebootFailed)
	evs = waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return stops(evs, held) == 1 })
	time.Sleep(2 * testWindow) // any wrong later report arrives
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("graceful stop of the second agent: %v", err)
	}
	evs = deliverytest.Collect(t, nc, host, len(evs), 5*time.Second).Events
	checkContiguous(t, evs)
	expectOne(t, evs, map[string]string{
		crash: "stopped(off-at-window-end)[stopped-unexpectedly/no-operation]",
		held:  "stopped(off-at-window-end)[stopped-unexpectedly/nova-error]",
	})
	t.Logf("stream: %v", summarize(evs))
}

// TestClassifyAndReconcileShareOneClient: with reconciliation and
// classification both on, the start reconciliation and a stop's
// classification ask Nova through the agent's one OpenStack client: one
// keystone token between them.
func TestClassifyAndReconcileShareOneClient(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	wl := workloadConn(t)
	host := "it-cls4.example.org"
	a, _ := newDomain(t, wl, "cls-shared")
	nova := newFakeNova(t, host)
	nova.set(a, novaActive)
	nova.Route(fmt.Sprintf("/v2.1/os-migrations?source_compute=%s&migration_type=evacuation&limit=%d", host, openstack.PageSize),
		openstacktest.Recorded{Status: 200, Header: openstacktest.NovaHeader(), Body: openstacktest.MigrationsPage(nil, false, nova.URL, openstack.PageSize)})
	var cfg agent.Config
	startClassifying(t, nova, ns.ClientURL(), host, func(c *agent.Config) {
		c.Reconcile.Enabled = true
		c.Reconcile.Action = agent.ReconcileActionReport
		cfg = *c
	})
	if st, err := agent.ReadReconcileStatus(cfg.StateDir); err != nil || !st.Report.OK() {
		t.Fatalf("start reconciliation: %v %s", err, st.Report.Summary())
	}
	nc := natsConn(t, ns.ClientURL())
	must(t, wl.Destroy(context.Background(), a))
	evs := waitFor(t, nc, host, func(evs []proto.LifecycleEvent) bool { return len(stopsAndReboots(classified(evs, a))) == 1 })
	expectOne(t, evs, map[string]string{a: "stopped(off-at-window-end)[stopped-unexpectedly/no-operation]"})
	if n := nova.Tokens(); n != 1 {
		t.Errorf("%d keystone tokens for reconcile and classification, want 1 (one shared client); Nova requests: %v", n, nova.Requests())
	}
}

// TestClassifyLogsInAtStart: with classification on (and reconcile off),
// the agent gets its keystone token at start, before any stop needs Nova,
// so the first classification query waits for Nova only.
func TestClassifyLogsInAtStart(t *testing.T) {
	ns := deliverytest.StartJetStream(t, t.TempDir(), -1)
	host := "it-cls5.example.org"
	nova := newFakeNova(t, host)
	startClassifying(t, nova, ns.ClientURL(), host, nil)
	deadline := time.Now().Add(10 * time.Second)
	for nova.Tokens() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no keystone token 10 s after the agent started; requests: %v", nova.Requests())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := nova.NovaRequests(); n != 0 {
		t.Fatalf("%d Nova requests without any stop", n)
	}
}
