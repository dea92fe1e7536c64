//go:build linux

package watchdog

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// Linux watchdog ioctls (linux/watchdog.h).
const (
	wdiocKeepalive  = 0x80045705 // _IOR('W', 5, int)
	wdiocSetTimeout = 0xc0045706 // _IOWR('W', 6, int)
)

// LinuxDevice is /dev/watchdog (or /dev/watchdogN). Opening it arms it.
type LinuxDevice struct {
	f *os.File
}

// OpenLinux opens the watchdog device at path (arming it).
func OpenLinux(path string) (*LinuxDevice, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("watchdog: open %s: %w", path, err)
	}
	return &LinuxDevice{f: f}, nil
}

func (d *LinuxDevice) ioctl(req uintptr, arg *int32) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, d.f.Fd(), req, uintptr(unsafe.Pointer(arg))); e != 0 {
		return e
	}
	return nil
}

// SetTimeout implements Device (whole seconds, rounded up).
func (d *LinuxDevice) SetTimeout(t time.Duration) (time.Duration, error) {
	s := int32((t + time.Second - 1) / time.Second)
	if err := d.ioctl(wdiocSetTimeout, &s); err != nil {
		return 0, fmt.Errorf("watchdog: WDIOC_SETTIMEOUT %ds: %w", s, err)
	}
	return time.Duration(s) * time.Second, nil
}

// Keepalive implements Device.
func (d *LinuxDevice) Keepalive() error {
	var dummy int32
	if err := d.ioctl(wdiocKeepalive, &dummy); err != nil {
		return fmt.Errorf("watchdog: WDIOC_KEEPALIVE: %w", err)
	}
	return nil
}

// MagicClose implements Device: 'V' then close disarms (unless the driver
// was loaded with nowayout).
func (d *LinuxDevice) MagicClose() error {
	if _, err := d.f.Write([]byte("V")); err != nil {
		d.f.Close()
		return fmt.Errorf("watchdog: magic close write: %w", err)
	}
	return d.Close()
}

// Close implements Device: the device stays armed.
func (d *LinuxDevice) Close() error {
	if err := d.f.Close(); err != nil {
		return fmt.Errorf("watchdog: close: %w", err)
	}
	return nil
}
