package daemonkit

import (
	"time"

	"golang.org/x/sys/unix"
)

// BootNow is the clock of every lease hvguard measures (the agents'
// fencing, the controllers' leader lock and lease tracker): CLOCK_BOOTTIME
// as a time.Time (nanoseconds since boot, from the Unix epoch). Why this
// clock:
//   - it is monotonic: NTP steps and operator `date` changes do not move
//     it, so a lease can neither be stretched nor cut by a wall-clock jump;
//   - unlike CLOCK_MONOTONIC it keeps counting while the host is suspended
//     (ACPI S3, a paused VM) and while the process is stopped (SIGSTOP): a
//     process resumed after 30 s sees its lease 30 s older, exactly as its
//     peers do, and a frozen controller does not act on a lapsed lock;
//   - it is shared by every process of one boot, so a lease age kept in a
//     durable state file survives an agent restart; the boot id tells
//     boots apart.
//
// The values are compared only with each other (Sub), never with wall time.
func BootNow() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; this cannot happen
		// on a supported kernel. MONOTONIC is the nearest safe clock.
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	}
	return time.Unix(ts.Sec, ts.Nsec).UTC()
}
