package libvirtx

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"libvirt.org/go/libvirt"
)

// eventLoopHeartbeat is the period of the timeout handle that stamps the
// loop heartbeat and wakes the loop.
const eventLoopHeartbeat = time.Second

var (
	loopOnce sync.Once
	loopErr  error
	loopTick atomic.Int64 // UnixNano of the last heartbeat on the loop goroutine
	loopRuns atomic.Uint64
)

// startEventLoop registers libvirt's default event loop implementation
// (exactly once per process, before the first connection) and starts the
// single goroutine that runs it for the life of the process. log is the
// logger of the first Dial; it is kept by the loop goroutine.
func startEventLoop(log *slog.Logger) error {
	loopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			loopErr = fmt.Errorf("libvirtx: register default event loop: %w", err)
			return
		}
		// The timeout handle runs on the loop goroutine itself: a fresh tick
		// proves the loop is iterating, and it makes virEventRunDefaultImpl
		// return at least once a second.
		if _, err := libvirt.EventAddTimeout(int(eventLoopHeartbeat/time.Millisecond), func(int) {
			loopTick.Store(time.Now().UnixNano())
		}); err != nil {
			loopErr = fmt.Errorf("libvirtx: add event loop heartbeat timeout: %w", err)
			return
		}
		loopTick.Store(time.Now().UnixNano())
		go runEventLoop(log)
	})
	return loopErr
}

func runEventLoop(log *slog.Logger) {
	for {
		loopRuns.Add(1)
		if err := libvirt.EventRunDefaultImpl(); err != nil {
			// Not expected; do not spin.
			log.Error("libvirt event loop iteration failed", "reason", err.Error())
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// eventLoopTick returns the time of the last event loop heartbeat.
func eventLoopTick() time.Time {
	n := loopTick.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
