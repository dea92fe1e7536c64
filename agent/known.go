package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"hvguard/lifecycle"
)

// KnownSaveInterval bounds how often the known-state file is rewritten while
// reports flow. After a crash the agent may re-report, with reason resync, a
// transition it reported during the last interval: at-least-once, never lost.
const KnownSaveInterval = time.Second

// knownFile is the on-disk form of lifecycle.Debouncer.Known.
type knownFile struct {
	Version int          `json:"version"`
	SavedAt time.Time    `json:"saved_at"`
	Domains []knownEntry `json:"domains"`
}

type knownEntry struct {
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	State string `json:"state"`
}

var stateByName = func() map[string]lifecycle.State {
	m := map[string]lifecycle.State{}
	for s := lifecycle.StateUnknown; s <= lifecycle.StateGone; s++ {
		m[s.String()] = s
	}
	return m
}()

// loadKnown reads the known-state file. A missing file is not an error (first
// start); a corrupt one is set aside and reported, and the agent starts
// without beliefs (every domain is then announced as defined by the resync).
func loadKnown(path string) ([]lifecycle.DomainSnapshot, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f knownFile
	if err := json.Unmarshal(data, &f); err != nil || f.Version != 1 {
		_ = os.Rename(path, path+".corrupt")
		if err == nil {
			err = fmt.Errorf("version %d", f.Version)
		}
		return nil, fmt.Errorf("%s is unreadable (kept as %s.corrupt): %w", path, filepath.Base(path), err)
	}
	out := make([]lifecycle.DomainSnapshot, 0, len(f.Domains))
	for _, e := range f.Domains {
		st, ok := stateByName[e.State]
		if !ok {
			continue
		}
		out = append(out, lifecycle.DomainSnapshot{UUID: e.UUID, Name: e.Name, State: st})
	}
	return out, nil
}

// saveKnown writes the file atomically (temp file, fsync, rename).
func saveKnown(path string, known []lifecycle.DomainSnapshot, now time.Time) error {
	f := knownFile{Version: 1, SavedAt: now.UTC(), Domains: make([]knownEntry, len(known))}
	for i, k := range known {
		f.Domains[i] = knownEntry{UUID: k.UUID, Name: k.Name, State: k.State.String()}
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := fh.Write(data); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
