package daemonkit

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// NewLogger builds a daemon's structured logger.
func NewLogger(w io.Writer, lc LogConfig) (*slog.Logger, error) {
	lvl, err := ParseLevel(lc.Level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if lc.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}
