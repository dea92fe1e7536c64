package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = ".."

// firstScreen is how many lines of the README an operator sees before
// scrolling (a 50-line terminal, minus the prompt).
const firstScreen = 48

// TestREADMEFirstScreen: what hvguard is, what to install (deb and rpm of
// both daemons), where the runbooks and the status command are, and the
// two set-up commands, all within the first screen.
func TestREADMEFirstScreen(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	screen := strings.Join(lines[:min(firstScreen, len(lines))], "\n")
	for _, want := range []string{
		"OpenStack/libvirt", "hvguard-agent_<version>_amd64.deb", "hvguard-controller_<version>_amd64.deb", ".rpm",
		"hvguard-agent status", "runbooks", "(docs/monitoring.md)", "(docs/events.md)",
		"\nmake run    # ", "\nmake test   # ",
	} {
		if !strings.Contains(screen, want) {
			t.Errorf("README's first %d lines lack %q", firstScreen, want)
		}
	}
	runbooks := regexp.MustCompile(`\[[^]]+\]\((docs/[a-z-]+\.md)\)[^\n]*\n?[^\n]*runbooks`).FindStringSubmatch(screen)
	if runbooks == nil {
		t.Fatalf("README's first screen links no doc next to \"runbooks\"")
	}
	if _, err := os.Stat(filepath.Join(root, runbooks[1])); err != nil {
		t.Errorf("the runbooks link of README's first screen is dead: %v", err)
	}
}
