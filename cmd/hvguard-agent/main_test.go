package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEveryFlag(t *testing.T) {
	code, _, errOut := runCLI("--help")
	if code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, f := range []string{"--config", "--check-config", "--print-defaults", "--log-level", "--log-format", "--version", "READY=1", "WATCHDOG=1", "/metrics"} {
		if !strings.Contains(errOut, f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("host: node1\nstate_dir: /var/lib/hvguard\n"), 0o600)
	os.WriteFile(bad, []byte("host: node1\nlifecycle:\n  window: -3s\n"), 0o600)

	if code, out, errOut := runCLI("--config", good, "--check-config"); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("valid config: exit %d, out %q, err %q", code, out, errOut)
	}
	if code, out, _ := runCLI("--check-config", good); code != 0 || !strings.Contains(out, "valid") {
		t.Errorf("--check-config PATH: exit %d, out %q", code, out)
	}
	if code, _, _ := runCLI("--config", good, "--check-config", bad); code != 2 {
		t.Errorf("--config X --check-config Y: exit %d, want 2 (ambiguous)", code)
	}
	code, _, errOut := runCLI("--config", bad, "--check-config")
	if code != ExitConfig || !strings.Contains(errOut, "lifecycle.window") || !strings.Contains(errOut, "-3s") {
		t.Errorf("invalid config: exit %d, err %q; want exit 78 naming lifecycle.window and -3s", code, errOut)
	}
	if code, _, errOut := runCLI("--config", filepath.Join(dir, "missing.yaml"), "--check-config"); code != ExitConfig || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("missing config: exit %d, err %q", code, errOut)
	}
	if code, _, _ := runCLI("stray"); code != 2 {
		t.Errorf("stray argument: exit %d, want 2", code)
	}
}

// The printed defaults are themselves a valid configuration.
func TestPrintDefaultsRoundTrips(t *testing.T) {
	code, out, _ := runCLI("--print-defaults")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	p := filepath.Join(t.TempDir(), "defaults.yaml")
	os.WriteFile(p, []byte(out), 0o600)
	if code, _, errOut := runCLI("--config", p, "--check-config"); code != 0 {
		t.Fatalf("printed defaults do not validate: %s\n%s", errOut, out)
	}
}
