package controller

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"hvguard/fencing/natslease"
	"hvguard/proto"
)

// MemoryWritesPerTick bounds the memory writes one tick makes (the rest
// wait for the next ticks): a controller's first ticks have every
// beaconing host's memory to write, and the runner's loop must go on
// reading the watch.
// 256 writes take well under a tick on a local NATS.
const MemoryWritesPerTick = 256

// restoreMemory reads what an earlier controller remembered of every host
// the tracker knows and hands it over (Tracker.RestoreMemory); a memory it
// cannot read is logged and skipped (the host is then handled as without
// one: the lenient side).
func (r *Runner) restoreMemory(ctx context.Context, log *slog.Logger) {
	if r.Memory == nil {
		return
	}
	n := 0
	for _, host := range r.Tracker.Hosts() {
		tok, err := proto.HostToken(host)
		if err != nil {
			continue // not a host name: no memory was written for it
		}
		cctx, cancel := context.WithTimeout(ctx, natslease.ReadTimeout)
		e, err := r.Memory.Get(cctx, tok)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		var m Memory
		if err == nil {
			err = json.Unmarshal(e.Value(), &m)
		}
		if err != nil {
			log.Error("controller memory: a host's memory is unreadable; ignored", "host", host, "err", err)
			continue
		}
		for _, d := range r.Tracker.RestoreMemory(r.now(), host, m) {
			r.perform(ctx, log, d)
		}
		n++
	}
	log.Info("controller memory restored", "hosts", n)
}

// writeMemories writes the memories the tracker says changed (at most
// MemoryWritesPerTick a tick; a failed write is handed back and retried).
func (r *Runner) writeMemories(ctx context.Context, log *slog.Logger) {
	if r.Memory == nil {
		return
	}
	hosts, ms := r.Tracker.Memories()
	for i, host := range hosts {
		if i >= MemoryWritesPerTick {
			r.Tracker.MemoryFailed(host)
			continue
		}
		tok, err := proto.HostToken(host)
		if err != nil {
			continue // not a host name: nothing to remember it under
		}
		b, err := json.Marshal(ms[i])
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, natslease.ReadTimeout)
			_, err = r.Memory.Put(cctx, tok, b)
			cancel()
		}
		if err != nil {
			log.Warn("controller memory: write failed; retried", "host", host, "err", err)
			r.Tracker.MemoryFailed(host)
		}
	}
}
