package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// record replaces every hook with one that logs its step and fails at
// failAt (none: ""), restoring them when the test ends.
func record(t *testing.T, failAt string) *[]string {
	t.Helper()
	var steps []string
	w, sf, rn, sd := writeData, syncFile, rename, syncDir
	t.Cleanup(func() { writeData, syncFile, rename, syncDir = w, sf, rn, sd })
	fail := func(step string) error {
		steps = append(steps, step)
		if step == failAt {
			return errors.New("injected " + step + " failure")
		}
		return nil
	}
	writeData = func(f *os.File, data []byte) error {
		if failAt == "write" {
			// A write that fails midway: half of the data is in the file.
			_, _ = f.Write(data[:len(data)/2])
			return fail("write")
		}
		if err := fail("write"); err != nil {
			return err
		}
		return w(f, data)
	}
	syncFile = func(f *os.File) error {
		if err := fail("fsync"); err != nil {
			return err
		}
		return sf(f)
	}
	rename = func(from, to string) error {
		if err := fail("rename"); err != nil {
			return err
		}
		return rn(from, to)
	}
	syncDir = func(dir string) error {
		if err := fail("fsync-dir " + filepath.Base(dir)); err != nil {
			return err
		}
		return sd(dir)
	}
	return &steps
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// TestWriteSteps: Write fsyncs the file before the rename and the
// directory after it; WriteNoSync does neither.
func TestWriteSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(string, []byte, os.FileMode) error
		want  []string
	}{
		{"Write", Write, []string{"write", "fsync", "rename", "fsync-dir state"}},
		{"WriteNoSync", WriteNoSync, []string{"write", "rename"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			steps := record(t, "")
			path := filepath.Join(dir, "f.json")
			if err := tc.write(path, []byte(`{"v":1}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*steps, tc.want) {
				t.Errorf("steps %v, want %v", *steps, tc.want)
			}
			b, err := os.ReadFile(path)
			if err != nil || string(b) != `{"v":1}` {
				t.Fatalf("content %q, %v", b, err)
			}
			fi, err := os.Stat(path)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
			}
			if got := entries(t, dir); !reflect.DeepEqual(got, []string{"f.json"}) {
				t.Errorf("directory holds %v, want only f.json", got)
			}
		})
	}
}

// TestFailureKeepsOldContent: a failure at any step before the rename
// (a write failing midway included) leaves the old content intact and no
// temporary file; a failure of the directory fsync is reported.
func TestFailureKeepsOldContent(t *testing.T) {
	for _, step := range []string{"write", "fsync", "rename", "fsync-dir state"} {
		t.Run(step, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "f.json")
			if err := Write(path, []byte("old content"), 0o644); err != nil {
				t.Fatal(err)
			}
			record(t, step)
			err := Write(path, []byte("the new content, longer than the old"), 0o600)
			if err == nil {
				t.Fatalf("no error from a failed %s", step)
			}
			b, rerr := os.ReadFile(path)
			if rerr != nil {
				t.Fatal(rerr)
			}
			want := "old content"
			if step == "fsync-dir state" {
				want = "the new content, longer than the old" // renamed; only its durability is in doubt
			}
			if string(b) != want {
				t.Errorf("after a failed %s: content %q, want %q (err %v)", step, b, want, err)
			}
			if got := entries(t, dir); !reflect.DeepEqual(got, []string{"f.json"}) {
				t.Errorf("after a failed %s the directory holds %v, want only f.json", step, got)
			}
		})
	}
}

// TestMissingDirectory: an error naming the path, nothing created.
func TestMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent", "f.json")
	err := Write(path, []byte("x"), 0o600)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err %v, want ErrNotExist", err)
	}
	if want := "write " + path; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Errorf("error %q does not name %s", err, path)
	}
}

// TestRelativePath: a bare file name is written in the working directory
// (whose fsync is the directory fsync).
func TestRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := Write("f.json", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("f.json"); err != nil || string(b) != "x" {
		t.Fatalf("content %q, %v", b, err)
	}
}

// TestRemoveTemps: the temporary file a crash between the write and the
// rename leaves is found and removed; nothing else is.
func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := Write(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The crash: the rename never happens (the hook stops the write there
	// as a SIGKILL would; the deferred clean-up is what a crash skips, so
	// the temporary file is copied aside before it runs).
	var left string
	rn := rename
	t.Cleanup(func() { rename = rn })
	rename = func(from, _ string) error {
		b, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		left = filepath.Join(dir, filepath.Base(from))
		if err := os.WriteFile(left+"-copy", b, 0o600); err != nil {
			return err
		}
		return errors.New("crash")
	}
	if err := Write(path, []byte("new"), 0o600); err == nil {
		t.Fatal("no error")
	}
	rename = rn
	if err := os.Rename(left+"-copy", left); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []string{"state.json.tmp", ".hidden", "00000000000000000001.seg"} {
		if err := os.WriteFile(filepath.Join(dir, keep), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveTemps(dir)
	if err != nil || len(removed) != 1 || removed[0] != filepath.Base(left) {
		t.Fatalf("removed %v, %v; want [%s]", removed, err, filepath.Base(left))
	}
	want := []string{".hidden", "00000000000000000001.seg", "state.json", "state.json.tmp"}
	if got := entries(t, dir); !reflect.DeepEqual(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("content %q, want the old", b)
	}
}
