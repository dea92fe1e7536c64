// Package atomicfile replaces a file's content atomically: a reader (or a
// restart after a crash) sees the old content or the new, never a torn or
// empty file. It is the one helper every hvguard state file is written
// with (the outbox state, the known domains, the fence state and its
// membership cache, the last reconciliation). Standard library only, so
// that any package may use it.
//
// The protocol of Write:
//
//  1. a new temporary file in the same directory (same file system, so
//     the rename below is atomic; a unique name, so two writers of one
//     path never write into one temporary file), mode perm;
//  2. the data written, the file fsync'd, then closed;
//  3. renamed over path;
//  4. the directory fsync'd, so that the rename itself survives a power
//     loss.
//
// A failure in steps 1–3 leaves path as it was and removes the temporary
// file. A failure of step 4 returns an error although path already holds
// the new content (a reader sees it; a power loss may bring back the old).
// A crash (SIGKILL) between steps 1 and 3 leaves a temporary file
// ".<name>.tmp-<random>" next to path, never path itself torn; the next
// Write does not need it, and RemoveTemps, called by the directory's sole
// writer when it starts, removes it.
//
// WriteNoSync is the same protocol without the two fsyncs: it survives a
// crash of the process (the page cache keeps what was written) but not
// necessarily a crash of the host. It is for writes on a loop whose
// latency is a safety input (the fencing loop: an fsync behind a busy
// hypervisor's guest I/O can take seconds), of state a host crash makes
// moot anyway.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Test hooks: each step of the protocol, replaced by the package's tests
// to fail it or to see it called.
var (
	writeData = func(f *os.File, data []byte) error { _, err := f.Write(data); return err }
	syncFile  = func(f *os.File) error { return f.Sync() }
	rename    = os.Rename
	syncDir   = SyncDir
)

// SyncDir fsyncs the directory dir, so that the names created, renamed or
// removed in it survive a power loss (the outbox after creating a
// segment file; Write after its rename).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// Write replaces path's content with data, atomically and durably (the
// package comment gives the protocol). perm applies to a new file and to
// a replaced one alike (the temporary file's mode).
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// WriteNoSync replaces path's content with data atomically, without
// fsync: it survives a crash of the process, not necessarily one of the
// host (the package comment says when to use it).
func WriteNoSync(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

// tempPattern is the name of Write's temporary files (os.CreateTemp
// replaces the * with a random number).
const tempPattern = ".%s.tmp-*"

// RemoveTemps removes the temporary files a crashed Write left in dir and
// returns their names. Only the directory's sole writer may call it (at
// start, under its lock): it would remove another writer's temporary
// file in flight.
func RemoveTemps(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, de := range des {
		if ok, _ := filepath.Match(fmt.Sprintf(tempPattern, "*"), de.Name()); !ok || de.IsDir() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, de.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, de.Name())
	}
	return removed, errors.Join(errs...)
}

func write(path string, data []byte, perm os.FileMode, durable bool) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf(tempPattern, base))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil && tmp != "" {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := writeData(f, data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := syncFile(f); err != nil {
			return fmt.Errorf("write %s: fsync: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: rename: %w", path, err)
	}
	tmp = "" // renamed: nothing to remove any more
	if durable {
		if err := syncDir(filepath.Clean(dir)); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// ObserveDirSyncs makes every later directory fsync also call seen with
// the directory, until the returned function restores the default. For
// tests in other packages: that a state file is written durably is seen
// as its directory's fsync. Not safe to call while writes are in flight.
func ObserveDirSyncs(seen func(dir string)) (restore func()) {
	prev := syncDir
	syncDir = func(dir string) error {
		seen(dir)
		return prev(dir)
	}
	return func() { syncDir = prev }
}
