package daemonkit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration that reads and writes YAML as a Go duration
// string ("15s", "500ms").
type Duration time.Duration

// UnmarshalYAML accepts a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as \"15s\", got %q", n.Line, n.Value)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: want a duration such as \"15s\", got %q", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Bad reports one configuration problem: the field's YAML path, the bad
// value and why it is bad. Validators call it for every problem, so all of
// them are reported at once.
type Bad func(field string, val any, why string)

// Problems collects what a Bad reports.
type Problems struct{ errs []error }

// Bad is the collector's report function.
func (p *Problems) Bad(field string, val any, why string) {
	p.errs = append(p.errs, fmt.Errorf("%s: %v: %s", field, val, why))
}

// Err returns every problem joined (nil: none).
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// DecodeStrict decodes YAML data over v (which holds the defaults),
// rejecting unknown fields. Empty data leaves v as it is.
func DecodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// Positive reports d through bad unless it is > 0.
func Positive(bad Bad, field string, d Duration) {
	if d <= 0 {
		bad(field, d.D(), "must be positive")
	}
}

// ValidateListen checks an optional host:port listen address.
func ValidateListen(bad Bad, field, addr string) {
	if addr == "" {
		return
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		bad(field, fmt.Sprintf("%q", addr), "must be host:port or empty to disable")
	}
}
