// Package deps checks the module dependencies of what hvguard ships: no
// retired module is used, and (licenses_test.go) every module linked into
// a shipped binary has a license compatible with Apache-2.0 and is listed
// in docs/licenses.md.
package deps

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// retired modules must not be linked into anything (tests included): each
// with what replaces it.
var retired = map[string]string{
	"gopkg.in/yaml.v3": "go.yaml.in/yaml/v3 (gopkg.in/yaml.v3 is archived)",
}

// module is one module of `go list -deps`.
type module struct {
	Path, Version, Dir string
}

// listModules returns the modules providing the packages that the `go
// list` arguments args (flags, then packages) depend on, the main module
// excluded.
func listModules(t *testing.T, args ...string) []module {
	t.Helper()
	root := repoRoot(t)
	cmd := exec.Command("go", append([]string{"list", "-deps",
		"-f", `{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}`}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	var mods []module
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		mods = append(mods, module{Path: f[0], Version: f[1], Dir: f[2]})
	}
	if len(mods) == 0 {
		t.Fatal("go list found no dependency modules")
	}
	return mods
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestNoRetiredModules(t *testing.T) {
	for _, m := range listModules(t, "-test", "./...") {
		if repl, ok := retired[m.Path]; ok {
			t.Errorf("%s %s is retired: use %s", m.Path, m.Version, repl)
		}
	}
}
