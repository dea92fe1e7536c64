package agent

import (
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"hvguard/agent/delivery"
	"hvguard/daemonkit/atomicfile"
	"hvguard/lifecycle"
)

// TestStateFilesDurable: every state file the agent writes off the
// fencing loop (the known domains, the last reconciliation, the outbox
// state) is written with atomicfile.Write, whose directory fsync is seen;
// the fence state (on the fencing loop, docs/fencing.md) deliberately is
// not fsync'd.
func TestStateFilesDurable(t *testing.T) {
	var dirs []string
	t.Cleanup(atomicfile.ObserveDirSyncs(func(dir string) { dirs = append(dirs, dir) }))
	dir := t.TempDir()
	synced := func(name string, write func() error) bool {
		t.Helper()
		dirs = nil
		if err := write(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return slices.Contains(dirs, dir)
	}
	durable := map[string]func() error{
		"domains.json": func() error {
			return saveKnown(filepath.Join(dir, "domains.json"), []lifecycle.DomainSnapshot{{UUID: "u1", Name: "d1", State: lifecycle.StateRunning}}, nil, time.Unix(0, 0))
		},
		ReconcileStatusFile: func() error {
			return writeStatusAtomic(filepath.Join(dir, ReconcileStatusFile), ReconcileStatus{})
		},
		"outbox state.json": func() error {
			ob, err := delivery.OpenOutbox(dir, delivery.OutboxConfig{Host: "node1"}, slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			return ob.Close()
		},
	}
	for name, write := range durable {
		if !synced(name, write) {
			t.Errorf("%s: written without the directory fsync (fsyncs seen: %v)", name, dirs)
		}
	}
	if synced(fenceStateFile, func() error { return writeJSONAtomic(filepath.Join(dir, fenceStateFile), struct{}{}) }) {
		t.Errorf("%s: fsync'd on the fencing loop", fenceStateFile)
	}
}
