package controller

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

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
// one: the lenient side). It lists the bucket with one watch (readMemories):
// a get per host took ~20 s for 10 000 hosts on the decision loop, and a
// host due meanwhile was declared that much later (docs/BENCHMARKS.md,
// issue 12's rerun of 2026-12-02).
func (r *Runner) restoreMemory(ctx context.Context, log *slog.Logger) {
	if r.Memory == nil {
		return
	}
	listed, err := r.readMemories(ctx)
	if err != nil {
		log.Warn("controller memory: listing failed; reading host by host", "err", err)
	}
	n := 0
	for _, host := range r.Tracker.Hosts() {
		tok, err := proto.HostToken(host)
		if err != nil {
			continue // not a host name: no memory was written for it
		}
		var b []byte
		if listed != nil {
			if b = listed[tok]; b == nil {
				continue
			}
		} else {
			cctx, cancel := context.WithTimeout(ctx, natslease.ReadTimeout)
			e, gerr := r.Memory.Get(cctx, tok)
			cancel()
			if errors.Is(gerr, jetstream.ErrKeyNotFound) {
				continue
			}
			if err = gerr; err == nil {
				b = e.Value()
			}
		}
		var m Memory
		if err == nil {
			err = json.Unmarshal(b, &m)
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

// memoryListTimeout bounds the listing of the memory bucket (one watch's
// first batch; 10 000 memories take well under a second on a local NATS).
const memoryListTimeout = 30 * time.Second

// readMemories returns every memory in the bucket by key, read with one
// watch (its first batch: each key's latest value; deleted keys left out).
func (r *Runner) readMemories(ctx context.Context) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, memoryListTimeout)
	defer cancel()
	w, err := r.Memory.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string][]byte{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, errors.New("memory watch ended")
			case e == nil:
				return out, nil // the first batch is complete
			}
			out[e.Key()] = e.Value()
		}
	}
}

// writeMemories writes the memories the tracker says changed, at most
// max (0: all — before the runner stops on a rolled-back stream, the
// pins dropped must reach the bucket), oldest due first; a failed write is
// handed back and retried.
func (r *Runner) writeMemories(ctx context.Context, log *slog.Logger, max int) {
	if r.Memory == nil {
		return
	}
	hosts, ms := r.Tracker.Memories(max) // oldest due first; the rest stay due
	for i, host := range hosts {
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
