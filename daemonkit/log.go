package daemonkit

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
)

// LogConfig selects the log level and format.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // json or text
}

// DefaultLog is info level, JSON.
func DefaultLog() LogConfig { return LogConfig{Level: "info", Format: "json"} }

// Validate reports bad fields through bad.
func (l LogConfig) Validate(bad Bad) {
	if _, err := ParseLevel(l.Level); err != nil {
		bad("log.level", fmt.Sprintf("%q", l.Level), "must be debug, info, warn or error")
	}
	if l.Format != "json" && l.Format != "text" {
		bad("log.format", fmt.Sprintf("%q", l.Format), "must be json or text")
	}
}

// ParseLevel maps a level name to slog's level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

// NewLogger builds a daemon's structured logger. Under systemd, when w is
// the journal stream (JournalStream), each line starts with the syslog
// priority of its level (JournalPriority) as sd-daemon(3)'s "<N>" prefix,
// which journald strips and stores as the entry's PRIORITY (the units say
// SyslogLevelPrefix=yes): `journalctl -p err` shows the errors. Elsewhere
// (a terminal, a file, a pipe) the lines are plain JSON or text.
func NewLogger(w io.Writer, lc LogConfig) (*slog.Logger, error) {
	lvl, err := ParseLevel(lc.Level)
	if err != nil {
		return nil, err
	}
	prefix := false
	if f, ok := w.(*os.File); ok {
		prefix = JournalStream(f)
	}
	var out io.Writer = w
	var pw *priorityWriter
	if prefix {
		pw = &priorityWriter{w: w}
		out = &pw.buf
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	if lc.Format == "text" {
		h = slog.NewTextHandler(out, opts)
	} else {
		h = slog.NewJSONHandler(out, opts)
	}
	if prefix {
		h = priorityHandler{h: h, pw: pw}
	}
	return slog.New(h), nil
}

// JournalPriority is the syslog priority (syslog(3), journalctl -p) of a
// slog level: error and above 3 (err), warn 4 (warning), info 6 (info),
// below info 7 (debug).
func JournalPriority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3
	case l >= slog.LevelWarn:
		return 4
	case l >= slog.LevelInfo:
		return 6
	}
	return 7
}

// JournalStream reports whether f is the stream systemd connected to the
// journal: the device and inode in $JOURNAL_STREAM (set by systemd for a
// unit whose output goes to the journal, systemd.exec(5)) are f's. The
// comparison, not the variable alone, decides: a child process inherits
// the variable with other output.
func JournalStream(f *os.File) bool {
	var dev, ino uint64
	if _, err := fmt.Sscanf(os.Getenv("JOURNAL_STREAM"), "%d:%d", &dev, &ino); err != nil {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && st.Ino == ino
}

// priorityWriter holds one record's line while the inner handler formats
// it (into buf), then writes it to w behind its "<N>" prefix in one
// write. mu serialises records: every handler derived by WithAttrs or
// WithGroup shares the one priorityWriter.
type priorityWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

// priorityHandler prefixes each record with its journal priority.
type priorityHandler struct {
	h  slog.Handler
	pw *priorityWriter
}

func (p priorityHandler) Enabled(ctx context.Context, l slog.Level) bool { return p.h.Enabled(ctx, l) }

func (p priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	p.pw.mu.Lock()
	defer p.pw.mu.Unlock()
	p.pw.buf.Reset()
	fmt.Fprintf(&p.pw.buf, "<%d>", JournalPriority(r.Level))
	if err := p.h.Handle(ctx, r); err != nil {
		return err
	}
	_, err := p.pw.w.Write(p.pw.buf.Bytes())
	return err
}

func (p priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return priorityHandler{h: p.h.WithAttrs(as), pw: p.pw}
}

func (p priorityHandler) WithGroup(name string) slog.Handler {
	return priorityHandler{h: p.h.WithGroup(name), pw: p.pw}
}
