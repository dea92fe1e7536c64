//go:build bench

// Command benchagent is a bench-only program for measuring the agent's
// resident memory under an event burst. libvirt's test driver lives inside
// the process that opens it, so the workload that makes events must run in
// the agent's process: benchagent runs the workload (1000 test-driver
// domains, then suspend/resume bursts) and, with -agent, the real agent
// (agent.Run, production defaults, publishing to the NATS server given by
// -nats, which runs in another process). Run without -agent it is the
// baseline: the same binary and workload without the agent, so that
// RSS(with agent) − RSS(without) is what the agent adds.
//
// Protocol with the harness (test/bench BenchmarkAgentRSS): benchagent
// prints "IDLE <reports>" once the domains exist (and, with -agent, the
// agent has reported all of them), waits for a line on stdin, runs the
// burst, prints "BURST <reports>", waits for a line on stdin and exits.
// The harness reads /proc/<pid>/status at both points.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"hvguard/agent"
	"hvguard/libvirtx"
	"hvguard/proto"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchagent:", err)
		os.Exit(1)
	}
}

func run() error {
	withAgent := flag.Bool("agent", false, "run the agent in this process")
	natsURL := flag.String("nats", "", "NATS URL for the agent")
	stateDir := flag.String("state", "", "agent state directory")
	host := flag.String("host", "bench-rss", "agent host name")
	domains := flag.Int("domains", 1000, "test-driver domains")
	rounds := flag.Int("rounds", 20, "burst rounds: each suspends or resumes every domain")
	workers := flag.Int("workers", 4, "workload goroutines")
	flag.Parse()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	wl, err := libvirtx.Dial(ctx, libvirtx.DefaultConfig("test:///default"), quiet)
	if err != nil {
		return fmt.Errorf("workload libvirt: %w", err)
	}
	defer wl.Close()
	go func() {
		for range wl.Events() {
		}
	}()
	uuids := make([]string, *domains)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("c0ffee00-0000-4000-8000-%012d", i)
		if _, err := wl.DefineXML(ctx, libvirtx.TestDomainXML(fmt.Sprintf("instance-%08x", i), uuids[i])); err != nil {
			return fmt.Errorf("define: %w", err)
		}
		if err := wl.Start(ctx, uuids[i]); err != nil {
			return fmt.Errorf("start: %w", err)
		}
	}

	var reports atomic.Int64
	agentDone := make(chan error, 1)
	if *withAgent {
		cfg := agent.DefaultConfig()
		cfg.Host = *host
		cfg.StateDir = *stateDir
		cfg.Libvirt.URI = "test:///default"
		cfg.NATS.URLs = []string{*natsURL}
		cfg.Metrics.Listen = "127.0.0.1:0"
		if err := cfg.Validate(); err != nil {
			return err
		}
		// Production log format and level, written nowhere: the harness
		// measures memory, not the terminal.
		log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
		ready := make(chan struct{})
		go func() {
			agentDone <- agent.Run(ctx, cfg, log, agent.Options{
				Ready:    ready,
				OnReport: func(proto.LifecycleEvent) { reports.Add(1) },
			})
		}()
		select {
		case <-ready:
		case err := <-agentDone:
			return fmt.Errorf("agent exited before ready: %w", err)
		}
		if !waitCount(&reports, int64(*domains), 10*time.Second) {
			return fmt.Errorf("agent reported %d of %d domains", reports.Load(), *domains)
		}
	} else {
		agentDone <- nil
	}
	time.Sleep(time.Second)
	in := bufio.NewScanner(os.Stdin)
	fmt.Printf("IDLE %d\n", reports.Load())
	if !in.Scan() {
		return errors.New("harness went away")
	}

	var wg sync.WaitGroup
	per := (len(uuids) + *workers - 1) / *workers
	for w := 0; w < *workers; w++ {
		mine := uuids[min(w*per, len(uuids)):min((w+1)*per, len(uuids))]
		wg.Go(func() {
			for r := 0; r < *rounds; r++ {
				op := wl.Suspend
				if r%2 == 1 {
					op = wl.Resume
				}
				for _, u := range mine {
					_ = op(ctx, u)
				}
			}
		})
	}
	wg.Wait()
	if *withAgent {
		waitCount(&reports, int64(*domains)*int64(*rounds+1), 10*time.Second)
	}
	fmt.Printf("BURST %d\n", reports.Load())
	if !in.Scan() {
		return errors.New("harness went away")
	}
	cancel()
	return <-agentDone
}

// waitCount waits until n reaches want (true) or stops moving for idle.
func waitCount(n *atomic.Int64, want int64, idle time.Duration) bool {
	last, at := n.Load(), time.Now()
	for n.Load() < want {
		if v := n.Load(); v != last {
			last, at = v, time.Now()
		} else if time.Since(at) > idle {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
