package controller

import (
	"fmt"
	"testing"
	"time"

	"hvguard/fencing"
)

// Fence-time model of the hypervisor: a pause (virDomainSuspend: one QMP
// "stop") takes benchPauseLatency and the shell runs benchPauseConcurrency
// of them at once. These are assumptions, not measurements: the real
// libvirtd/QEMU figure is for the next round (test/realvirt).
const (
	benchPauseLatency     = 20 * time.Millisecond
	benchPauseConcurrency = 8
)

// partitionFence runs one host with n running domains cut off from NATS
// and from every peer at t0 (its last acknowledged renewal was sent at t0),
// with the agent's clock slow and the controller's fast by the drift bound
// (the worst case for the margin), and returns, in real time after t0,
// when the last domain was paused, when the controller declared the host,
// and the core's Ready count.
func partitionFence(n int, backstop fencing.Backstop) (fenced, declared time.Duration, readies int) {
	const drift = fencing.MaxClockDrift
	cfg := fencing.DefaultConfig("h0", "b")
	cfg.Enabled, cfg.HardwareWatchdog = true, true
	if backstop == fencing.BackstopReset {
		cfg.AllowReset = true
	}
	d := &fencing.Durable{Host: "h0", BootID: "b", HaveLease: true, LastAck: t0, Incarnation: 1, Revision: 1}
	a, _, err := fencing.NewAgent(cfg, d, nil, 0, t0)
	if err != nil {
		panic(err)
	}
	members := []string{"h0"}
	for i := 1; i < 50; i++ {
		members = append(members, fmt.Sprintf("h%d", i))
	}
	a.SetMembers(members, fencing.DefaultGuard(50))
	doms := make([]fencing.Domain, n)
	for i := range doms {
		doms[i] = fencing.Domain{UUID: fmt.Sprintf("d%d", i), Running: true}
	}
	a.Domains(t0, doms)
	tr, _ := NewTracker(DefaultConfig())
	rec := fencing.LeaseRecord{Schema: 1, Host: "h0", State: fencing.LeaseActive, FencingEnabled: true,
		Action: fencing.ActionPause, Backstop: cfg.Backstop(), Timing: cfg.Timing}
	tr.Observe(t0, "h0", 1, &rec)
	for i := 1; i < 50; i++ { // the rest of the cloud stays healthy
		r := rec
		r.Host = members[i]
		tr.Observe(t0, members[i], uint64(i+1), &r)
	}
	tr.GuardPublished(tr.Guard(), nil)

	agentAt := func(real time.Duration) time.Time { return t0.Add(time.Duration(float64(real) * (1 - drift))) }
	ctrlAt := func(real time.Duration) time.Time { return t0.Add(time.Duration(float64(real) * (1 + drift))) }
	var queue []string // pauses asked for, not started
	type op struct {
		uuid string
		done time.Duration
	}
	var running []op
	paused := 0
	const step = 10 * time.Millisecond
	rev := uint64(100)
	for real := time.Duration(0); real < 2*time.Minute && declared == 0; real += step {
		now := agentAt(real)
		var rs []fencing.Ready
		rs = append(rs, a.Tick(now))
		// Finish pauses due by now, start queued ones.
		keep := running[:0]
		for _, o := range running {
			if o.done <= real {
				paused++
				rs = append(rs, a.FenceDone(now, o.uuid, nil))
			} else {
				keep = append(keep, o)
			}
		}
		running = keep
		for _, r := range rs {
			readies++
			queue = append(queue, r.Pause...)
		}
		for len(running) < benchPauseConcurrency && len(queue) > 0 {
			running = append(running, op{uuid: queue[0], done: real + benchPauseLatency})
			queue = queue[1:]
		}
		if paused == n && fenced == 0 {
			fenced = real
		}
		// The healthy hosts keep renewing; h0 is silent.
		rev++
		for i := 1; i < 50; i++ {
			r := rec
			r.Host = members[i]
			tr.Observe(ctrlAt(real), members[i], rev*100+uint64(i), &r)
		}
		for _, dd := range tr.Tick(ctrlAt(real)) {
			if dd.Op == OpDeclare && dd.Host == "h0" {
				declared = real
			}
		}
	}
	return fenced, declared, readies
}

// BenchmarkPartitionFence: a host cut off alone with N running domains;
// reports (in simulated real time after the last acknowledged renewal was
// sent) when all N domains are paused, when the controller declares the
// host, and the margin between the two, at the defaults, for the worst
// clock drift, with the hypervisor model above. ns/op is the CPU cost of
// driving the pure cores through the whole episode.
func BenchmarkPartitionFence(b *testing.B) {
	for _, bs := range []fencing.Backstop{fencing.BackstopReset, fencing.BackstopWatchdog} {
		for _, n := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("%s/N=%d", bs, n), func(b *testing.B) {
				var fenced, declared time.Duration
				for b.Loop() {
					fenced, declared, _ = partitionFence(n, bs)
				}
				if fenced == 0 || declared == 0 {
					b.Fatalf("fenced %s declared %s", fenced, declared)
				}
				b.ReportMetric(fenced.Seconds(), "fenced_s")
				b.ReportMetric(declared.Seconds(), "declared_s")
				b.ReportMetric((declared - fenced).Seconds(), "margin_s")
			})
		}
	}
}

// TestPartitionFenceMargin: at the defaults, 1000 domains are fenced at
// least 2 s before the controller may declare the host (the issue's
// target), for both backstops.
func TestPartitionFenceMargin(t *testing.T) {
	for _, bs := range []fencing.Backstop{fencing.BackstopReset, fencing.BackstopWatchdog} {
		fenced, declared, _ := partitionFence(1000, bs)
		if fenced == 0 || declared-fenced < 2*time.Second {
			t.Errorf("%s: fenced at %s, declared at %s: margin %s < 2 s", bs, fenced, declared, declared-fenced)
		}
		t.Logf("%s: 1000 domains fenced at %s, declared at %s, margin %s", bs, fenced, declared, declared-fenced)
	}
}
