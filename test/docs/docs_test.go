// Package docs checks the documentation an operator reads first: the
// README's first screen and that the relative links of README.md and
// docs/*.md lead somewhere.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../.."

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

// TestRelativeLinksResolve: every relative link of README.md and docs/*.md
// names a file of the repository.
func TestRelativeLinksResolve(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
				t.Errorf("%s links %s: %v", strings.TrimPrefix(f, root+"/"), target, err)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d links checked: the pattern is broken", checked)
	}
}
