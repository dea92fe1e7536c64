package agent

import "hvguard/daemonkit"

// Notifier speaks systemd's sd_notify protocol (shared with the controller).
type Notifier = daemonkit.Notifier

// NewNotifier reads the watchdog setting systemd passed to this process.
var NewNotifier = daemonkit.NewNotifier
