// Package guest renders the libvirt domain XML of hvguard's tiny test guest:
// a QEMU/TCG machine booting Debian's cloud kernel directly with a
// busybox-static initramfs (both built by build.sh into out/).
//
// The guest's behaviour is chosen on the kernel command line (see ./init):
// ModeIdle, ModeRebootAfter, ModePoweroffAfter, ModePanicAfter. In every
// mode the ACPI power button powers the guest off, so virDomainShutdown works.
package guest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/template"
)

//go:embed domain.xml.tmpl
var domainTemplate string

var tmpl = template.Must(template.New("domain.xml").Parse(domainTemplate))

// Params are the fields of domain.xml.tmpl. Zero values get defaults from
// DomainXML (see there).
type Params struct {
	Name      string // libvirt domain name (required)
	UUID      string // optional; libvirt generates one when empty
	MemoryMiB int    // guest RAM; default 128 (64 MiB reset-loops)
	Kernel    string // path of the kernel; default OutDir()/vmlinuz
	Initrd    string // path of the initramfs; default OutDir()/initrd.cpio.gz
	Mode      string // hvg= mode, e.g. ModeIdle or ModeRebootAfter(5); default idle
	Cmdline   string // full kernel command line; default built from Mode
	OnCrash   string // <on_crash> action; default "destroy"
	SerialLog string // file receiving the serial console (required)
}

// Guest modes for Params.Mode (the hvg= kernel argument read by ./init).
const ModeIdle = "idle"

// ModeRebootAfter makes the guest reboot after n seconds (again after every
// boot: with on_reboot=restart it is a reboot loop).
func ModeRebootAfter(n int) string { return fmt.Sprintf("reboot-after=%d", n) }

// ModePoweroffAfter makes the guest power itself off after n seconds.
func ModePoweroffAfter(n int) string { return fmt.Sprintf("poweroff-after=%d", n) }

// ModePanicAfter makes the guest kernel panic after n seconds.
func ModePanicAfter(n int) string { return fmt.Sprintf("panic-after=%d", n) }

// OutDir is the directory build.sh writes the kernel and initramfs to:
// $HVG_GUEST_OUT if set, else test/guest/out next to this file's source
// (found through runtime.Caller, which -trimpath defeats: set the variable
// then).
func OutDir() string {
	if d := os.Getenv("HVG_GUEST_OUT"); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "test/guest/out"
	}
	return filepath.Join(filepath.Dir(file), "out")
}

// Built reports an error naming the missing file if build.sh has not
// produced the kernel and initramfs yet.
func Built() error {
	for _, f := range []string{"vmlinuz", "initrd.cpio.gz"} {
		p := filepath.Join(OutDir(), f)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("guest not built (run test/guest/build.sh): %w", err)
		}
	}
	return nil
}

// DomainXML renders domain.xml.tmpl with p, after filling defaults.
func DomainXML(p Params) (string, error) {
	if p.Name == "" {
		return "", errors.New("guest: Params.Name is required")
	}
	if p.SerialLog == "" {
		return "", errors.New("guest: Params.SerialLog is required")
	}
	if p.MemoryMiB == 0 {
		p.MemoryMiB = 128
	}
	if p.Kernel == "" {
		p.Kernel = filepath.Join(OutDir(), "vmlinuz")
	}
	if p.Initrd == "" {
		p.Initrd = filepath.Join(OutDir(), "initrd.cpio.gz")
	}
	if p.Mode == "" {
		p.Mode = ModeIdle
	}
	if p.Cmdline == "" {
		p.Cmdline = "console=ttyS0 panic=0 quiet hvg=" + p.Mode
	}
	if p.OnCrash == "" {
		p.OnCrash = "destroy"
	}
	for _, s := range []string{p.Name, p.UUID, p.Kernel, p.Initrd, p.Cmdline, p.OnCrash, p.SerialLog} {
		if strings.ContainsAny(s, "<>&'\"") {
			return "", fmt.Errorf("guest: value %q needs XML escaping, which the template does not do", s)
		}
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, p); err != nil {
		return "", fmt.Errorf("guest: render domain XML: %w", err)
	}
	return b.String(), nil
}
