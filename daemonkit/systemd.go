package daemonkit

import (
	"log/slog"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier speaks systemd's sd_notify protocol. Outside systemd (no
// NOTIFY_SOCKET) every call is a no-op.
type Notifier struct {
	log      *slog.Logger
	mu       sync.Mutex
	status   string
	warned   bool
	Watchdog time.Duration // WatchdogSec from systemd, 0 when not enabled
}

// NewNotifier reads the watchdog setting systemd passed to this process.
func NewNotifier(log *slog.Logger) *Notifier {
	n := &Notifier{log: log}
	if d, err := daemon.SdWatchdogEnabled(false); err == nil {
		n.Watchdog = d
	}
	return n
}

func (n *Notifier) send(state string) {
	sent, err := daemon.SdNotify(false, state)
	if err != nil && !n.warned {
		// Not fatal: systemd may be restarting; say it once.
		n.warned = true
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
	_ = sent // false without NOTIFY_SOCKET: not running under systemd
}

// Ready tells systemd start-up is complete; status explains in what mode.
func (n *Notifier) Ready(status string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.status = status
	n.send(daemon.SdNotifyReady + "\nSTATUS=" + status)
}

// Status updates the one-line STATUS= shown by systemctl status, when it
// changed.
func (n *Notifier) Status(status string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if status == n.status {
		return
	}
	n.status = status
	n.send("STATUS=" + status)
}

// WatchdogPing sends WATCHDOG=1. Call it only from the loop whose progress
// it proves, never from a free-running ticker goroutine.
func (n *Notifier) WatchdogPing() {
	n.send(daemon.SdNotifyWatchdog)
}

// Stopping tells systemd a graceful stop has begun.
func (n *Notifier) Stopping() {
	n.send(daemon.SdNotifyStopping)
}

// WatchdogPeriod is how often the loop should ping: half of WatchdogSec, as
// sd_watchdog_enabled(3) recommends, and at most once a second.
func (n *Notifier) WatchdogPeriod() time.Duration {
	if n.Watchdog <= 0 {
		return time.Second
	}
	p := n.Watchdog / 2
	if p > time.Second {
		p = time.Second
	}
	return p
}
