package lifecycle

import (
	"strings"
	"testing"
)

// TestRenamedOffDomainIsNoStop (attack): virsh domrename (libvirt renames
// inactive domains only) sends UNDEFINED/RENAMED then DEFINED/RENAMED with
// the same UUID. The undefine forgets the domain, and the DEFINED/RENAMED
// left it unplaced (phase unknown): the next listing, which shows it off,
// began a stop and the check reported "stopped" for a domain that never
// ran.
func TestRenamedOffDomainIsNoStop(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	for _, line := range []string{
		"resync a=shutoff",
		"expect a report defined resync state=shutoff",
		"observe UNDEFINED/RENAMED",
		"expect a report undefined event state=gone",
		"observe DEFINED/RENAMED",
		"expect a report defined event",
		"resync a=shutoff",
		"advance 15s",
	} {
		h.step(line)
	}
	if len(h.out) > 0 && strings.Contains(h.out[0], " check ") {
		h.step("resolve shutoff")
	}
	if len(h.out) > 0 {
		t.Fatalf("a renamed domain that never ran: %q", h.out)
	}
	h.step("observe STARTED/BOOTED")
	h.step("expect a report started")
}
