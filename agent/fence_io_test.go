package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"hvguard/fencing"
)

// TestFenceStateRuntimeCopy: both copies are written together; a
// state_dir copy that is missing or corrupt is replaced by the runtime
// copy of this boot; a runtime copy of another state_dir or boot is not
// used.
func TestFenceStateRuntimeCopy(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stateDir, runDir := t.TempDir(), t.TempDir()
	p := fenceStateFiles{stateDir: stateDir, statePath: filepath.Join(stateDir, fenceStateFile), runtimePath: filepath.Join(runDir, fenceStateFile)}
	d := &fencing.Durable{Host: "h", BootID: "b1", Epoch: 3, Writes: 5, Paused: []string{"u1"}}
	if serr, rerr := p.write(d); serr != nil || rerr != nil {
		t.Fatal(serr, rerr)
	}
	if got, src := p.load("b1", log); src != fencing.DurableState || got.Epoch != 3 {
		t.Fatalf("both copies: %s %+v", src, got)
	}
	for name, damage := range map[string]func() error{
		"missing": func() error { return os.Remove(p.statePath) },
		"corrupt": func() error { return os.WriteFile(p.statePath, []byte("{torn"), 0o600) },
	} {
		if err := damage(); err != nil {
			t.Fatal(err)
		}
		if got, src := p.load("b1", log); src != fencing.DurableRuntime || got.Epoch != 3 || len(got.Paused) != 1 {
			t.Fatalf("%s state_dir copy: %s %+v", name, src, got)
		}
	}
	if _, src := p.load("b2", log); src != fencing.DurableNone {
		t.Fatalf("runtime copy of another boot used: %s", src)
	}
	other := p
	other.stateDir = t.TempDir()
	other.statePath = filepath.Join(other.stateDir, fenceStateFile)
	if _, src := other.load("b1", log); src != fencing.DurableNone {
		t.Fatalf("runtime copy of another state_dir used: %s", src)
	}
}
