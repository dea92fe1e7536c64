package daemonkit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// ExitConfig is the exit status for an unreadable or invalid configuration
// (sysexits.h EX_CONFIG). The units' RestartPreventExitStatus=78 stops
// systemd from restarting a daemon that cannot start until an operator
// fixes the file.
const ExitConfig = 78

// CLI is the command line both daemons share: --config, --check-config
// [PATH], --print-defaults, --log-level, --log-format, --version, --help.
// A daemon adds its own flags to FS before Parse.
type CLI struct {
	FS                       *flag.FlagSet
	Config, Level, Format    *string
	Check, Defaults, Version *bool
}

// NewCLI registers the shared flags; usage is printed by --help.
func NewCLI(name, defaultConfig string, stderr io.Writer, usage func()) *CLI {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = usage
	return &CLI{FS: fs,
		Config:   fs.String("config", defaultConfig, ""),
		Check:    fs.Bool("check-config", false, ""),
		Defaults: fs.Bool("print-defaults", false, ""),
		Level:    fs.String("log-level", "", ""),
		Format:   fs.String("log-format", "", ""),
		Version:  fs.Bool("version", false, ""),
	}
}

// Parse parses args. It returns exit code and done=true when the process
// must exit (--help: 0; a bad command line: 2).
func (c *CLI) Parse(args []string, stderr io.Writer) (code int, done bool) {
	if err := c.FS.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	// "--check-config PATH" is what operators type: accept it as
	// "--config PATH --check-config" unless --config was given too.
	if *c.Check && c.FS.NArg() == 1 && !FlagSet(c.FS, "config") {
		*c.Config = c.FS.Arg(0)
	} else if c.FS.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see --help)\n", c.FS.Name(), c.FS.Arg(0))
		return 2, true
	}
	return 0, false
}

// Overrides applies --log-level and --log-format to lc.
func (c *CLI) Overrides(lc *LogConfig) {
	if *c.Level != "" {
		lc.Level = *c.Level
	}
	if *c.Format != "" {
		lc.Format = *c.Format
	}
}

// FlagSet reports whether the named flag was given on the command line.
func FlagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// LoadFile reads path and parses it with parse; errors name the file.
func LoadFile[T any](path string, parse func([]byte) (T, error)) (T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("config: %w", err)
	}
	cfg, err := parse(data)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Config is what a daemon's configuration offers the shared command line.
type Config interface {
	Complete() error
	Validate() error
	Logging() *LogConfig
}

// ParseYAML decodes data strictly over defaults, completes and validates
// the result.
func ParseYAML[T any, P interface {
	*T
	Config
}](data []byte, defaults T) (T, error) {
	cfg := defaults
	if err := DecodeStrict(data, &cfg); err != nil {
		var zero T
		return zero, err
	}
	p := P(&cfg)
	if err := p.Complete(); err != nil {
		var zero T
		return zero, err
	}
	return cfg, p.Validate()
}

// Start handles --version and --print-defaults, or loads --config with
// load, applies --log-level/--log-format and validates. done: exit with
// code (0 after --version or --print-defaults, ExitConfig for a bad
// configuration, said on stderr).
func Start[T any, P interface {
	*T
	Config
}](c *CLI, stdout, stderr io.Writer, version string, defaults T, load func(string) (T, error)) (cfg T, code int, done bool) {
	name := c.FS.Name()
	switch {
	case *c.Version:
		fmt.Fprintf(stdout, "%s %s\n", name, version)
		return cfg, 0, true
	case *c.Defaults:
		out, _ := yaml.Marshal(defaults)
		_, _ = stdout.Write(out)
		return cfg, 0, true
	}
	cfg, err := load(*c.Config)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return cfg, ExitConfig, true
	}
	p := P(&cfg)
	c.Overrides(p.Logging())
	if err := p.Validate(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return cfg, ExitConfig, true
	}
	return cfg, 0, false
}
