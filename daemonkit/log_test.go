package daemonkit

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// journalFile returns a file standing for the journal stream: its device
// and inode are put in JOURNAL_STREAM, as systemd does for a unit's stderr.
func journalFile(t *testing.T, match bool) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	ino := st.Ino
	if !match {
		ino++ // another stream: a child's inherited variable
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, ino))
	return f
}

func lines(t *testing.T, f *os.File) []string {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// TestJournalPriorities: on the journal stream every line starts with its
// level's syslog priority (error 3, warn 4, info 6, debug 7), the rest of
// the line unchanged JSON or text; loggers derived with With/WithGroup too.
func TestJournalPriorities(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			f := journalFile(t, true)
			log, err := NewLogger(f, LogConfig{Level: "debug", Format: format})
			if err != nil {
				t.Fatal(err)
			}
			fl := log.With("component", "fencing").WithGroup("g")
			log.Debug("d")
			log.Info("i")
			log.Warn("w")
			fl.Error("FENCING: pausing domains", "domains", 1)
			log.Log(t.Context(), slog.LevelError+4, "above error")
			want := []struct{ prio, msg string }{{"<7>", "d"}, {"<6>", "i"}, {"<4>", "w"}, {"<3>", "FENCING: pausing domains"}, {"<3>", "above error"}}
			got := lines(t, f)
			if len(got) != len(want) {
				t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
			}
			for i, w := range want {
				rest, ok := strings.CutPrefix(got[i], w.prio)
				if !ok {
					t.Errorf("line %d %q: want prefix %s", i, got[i], w.prio)
					continue
				}
				if format == "json" {
					var m map[string]any
					if err := json.Unmarshal([]byte(rest), &m); err != nil || m["msg"] != w.msg {
						t.Errorf("line %d %q: not the JSON record of %q (%v)", i, rest, w.msg, err)
					}
				} else if !strings.HasPrefix(rest, "time=") || !strings.Contains(rest, w.msg) {
					t.Errorf("line %d %q: not the text record of %q", i, rest, w.msg)
				}
			}
			if !strings.Contains(got[3], `"component":"fencing"`) && !strings.Contains(got[3], "component=fencing") {
				t.Errorf("derived logger lost its attributes: %q", got[3])
			}
		})
	}
}

// TestNoPrefixOffJournal: another stream (a terminal, a file, a pipe, an
// inherited JOURNAL_STREAM naming another file) gets plain lines.
func TestNoPrefixOffJournal(t *testing.T) {
	f := journalFile(t, false)
	log, err := NewLogger(f, DefaultLog())
	if err != nil {
		t.Fatal(err)
	}
	log.Error("e")
	if got := lines(t, f); len(got) != 1 || !strings.HasPrefix(got[0], "{") {
		t.Errorf("lines %q, want one plain JSON line", got)
	}
}

// TestJournalConcurrent: records from many goroutines (and derived
// loggers) are never interleaved: one prefix, one record a line.
func TestJournalConcurrent(t *testing.T) {
	f := journalFile(t, true)
	log, err := NewLogger(f, DefaultLog())
	if err != nil {
		t.Fatal(err)
	}
	const n, per = 8, 200
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			l := log.With("g", g)
			for i := range per {
				if i%2 == 0 {
					l.Warn("w", "i", i)
				} else {
					l.Info("i", "i", i)
				}
			}
		})
	}
	wg.Wait()
	got := lines(t, f)
	if len(got) != n*per {
		t.Fatalf("%d lines, want %d", len(got), n*per)
	}
	for _, l := range got {
		prio, rest := l[:3], l[3:]
		var m map[string]any
		if err := json.Unmarshal([]byte(rest), &m); err != nil {
			t.Fatalf("torn line %q: %v", l, err)
		}
		if want := map[string]string{"WARN": "<4>", "INFO": "<6>"}[m["level"].(string)]; prio != want {
			t.Fatalf("line %q: prefix %s, want %s", l, prio, want)
		}
	}
}
