// Command licenses lists the Go modules linked into hvguard's binaries
// with their licenses, from the module cache (`go list -deps`), and writes
// what the packages and the docs say about them:
//
//	go run ./packaging/licenses -md                         > docs/licenses.md
//	go run ./packaging/licenses -copyright ./cmd/hvguard-agent  (Debian machine-readable copyright)
//	go run ./packaging/licenses -spdx ./cmd/hvguard-agent       (the rpm License: field)
//
// Every module must be in the reviewed table below, whose license was
// read by a person; a module not in it, a license not compatible with
// Apache-2.0, or a license file that no longer shows the reviewed license
// is an error (and fails the tests), so a new or upgraded dependency is
// reviewed before it ships.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// reviewed is the license (an SPDX expression of ANDs: every part
// applies to some of the module's files) of each module that hvguard's
// binaries may link, as read in the module's license files. "std" is the
// Go standard library and runtime.
var reviewed = map[string]string{
	"std":                                   "BSD-3-Clause",
	"github.com/beorn7/perks":               "MIT",
	"github.com/cespare/xxhash/v2":          "MIT",
	"github.com/coreos/go-systemd/v22":      "Apache-2.0",
	"github.com/gophercloud/gophercloud/v2": "Apache-2.0",
	"github.com/hashicorp/errwrap":          "MPL-2.0",
	"github.com/hashicorp/go-multierror":    "MPL-2.0",
	"github.com/klauspost/compress":         "BSD-3-Clause AND Apache-2.0 AND MIT",
	"github.com/munnerz/goautoneg":          "BSD-3-Clause",
	"github.com/nats-io/nats.go":            "Apache-2.0",
	"github.com/nats-io/nkeys":              "Apache-2.0",
	"github.com/nats-io/nuid":               "Apache-2.0",
	"github.com/prometheus/client_golang":   "Apache-2.0",
	"github.com/prometheus/client_model":    "Apache-2.0",
	"github.com/prometheus/common":          "Apache-2.0",
	"github.com/prometheus/procfs":          "Apache-2.0",
	"go.yaml.in/yaml/v3":                    "MIT AND Apache-2.0",
	"golang.org/x/crypto":                   "BSD-3-Clause",
	"golang.org/x/sys":                      "BSD-3-Clause",
	"google.golang.org/protobuf":            "BSD-3-Clause",
	"gopkg.in/yaml.v2":                      "Apache-2.0 AND MIT",
	"libvirt.org/go/libvirt":                "MIT",
}

// compatible are the licenses whose code may be linked into an Apache-2.0
// binary and shipped with only their notices and texts.
var compatible = []string{"Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "MIT"}

// mplModules may be MPL-2.0 (file-level copyleft): go-multierror and its
// errwrap, a dependency the project chose, linked unmodified; their source
// is the upstream module at the version named in the copyright file. Any
// other MPL-2.0 module is refused until reviewed and added here.
var mplModules = map[string]bool{
	"github.com/hashicorp/go-multierror": true,
	"github.com/hashicorp/errwrap":       true,
}

// evidence: text that shows a license in a license file. A reviewed
// license must show; a copyleft one must not (a new version of a module
// that adds GPL code is caught).
var evidence = map[string]*regexp.Regexp{
	"Apache-2.0":   regexp.MustCompile(`Apache License,?\s+Version 2\.0`),
	"MIT":          regexp.MustCompile(`Permission is hereby granted, free of charge`),
	"BSD-3-Clause": regexp.MustCompile(`(?s)Redistribution and use in source and binary forms.*(Neither the name|names of its\s+contributors)`),
	"BSD-2-Clause": regexp.MustCompile(`Redistribution and use in source and binary forms`),
	"ISC":          regexp.MustCompile(`Permission to use, copy, modify, and(/or)? distribute`),
	"MPL-2.0":      regexp.MustCompile(`Mozilla Public License,? (v\. |[Vv]ersion )?2\.0`),
}

var copyleft = regexp.MustCompile(`GNU (Affero |Lesser |Library )?General Public License|Mozilla Public License|Server Side Public License|Business Source License`)

// Module is one module linked into a binary, with its license files.
type Module struct {
	Path, Version string
	License       string   // SPDX expression (from reviewed)
	Files         []string // license, notice and patents files, base names
	Dir           string
}

// licenseFile matches the files that carry a module's license terms.
var licenseFile = regexp.MustCompile(`^(?i)(licen[cs]e|copying|notice|patents)([.-].*)?$`)

// List returns the modules linked into the packages pkgs (the standard
// library first), each checked against the reviewed table.
func List(pkgs ...string) ([]Module, error) {
	out, err := goCmd(append([]string{"list", "-deps", "-f",
		`{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}`}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	goroot, err := goCmd("env", "GOROOT")
	if err != nil {
		return nil, err
	}
	gover, err := goCmd("env", "GOVERSION")
	if err != nil {
		return nil, err
	}
	mods := []Module{{Path: "std", Version: strings.TrimSpace(gover), Dir: strings.TrimSpace(goroot)}}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		mods = append(mods, Module{Path: f[0], Version: f[1], Dir: f[2]})
	}
	slices.SortStableFunc(mods[1:], func(a, b Module) int { return strings.Compare(a.Path, b.Path) })
	var errs []error
	for i := range mods {
		errs = append(errs, mods[i].check())
	}
	return mods, errors.Join(errs...)
}

// check fills License and Files and verifies them.
func (m *Module) check() error {
	lic, ok := reviewed[m.Path]
	if !ok {
		return fmt.Errorf("%s %s: not reviewed: read its license and add it to packaging/licenses (reviewed)", m.Path, m.Version)
	}
	m.License = lic
	des, err := os.ReadDir(m.Dir)
	if err != nil {
		return fmt.Errorf("%s: %w", m.Path, err)
	}
	var text strings.Builder
	for _, de := range des {
		if !de.IsDir() && licenseFile.MatchString(de.Name()) {
			m.Files = append(m.Files, de.Name())
			b, err := os.ReadFile(filepath.Join(m.Dir, de.Name()))
			if err != nil {
				return fmt.Errorf("%s: %w", m.Path, err)
			}
			text.Write(b)
		}
	}
	if len(m.Files) == 0 {
		return fmt.Errorf("%s %s: no license file", m.Path, m.Version)
	}
	for _, id := range m.IDs() {
		if !slices.Contains(compatible, id) && !(id == "MPL-2.0" && mplModules[m.Path]) {
			return fmt.Errorf("%s %s: %s is not a license hvguard can ship under Apache-2.0 (%v)", m.Path, m.Version, id, compatible)
		}
		if !evidence[id].MatchString(text.String()) {
			return fmt.Errorf("%s %s: reviewed as %s, but its license files (%v) do not show %s: review it again", m.Path, m.Version, m.License, m.Files, id)
		}
	}
	if c := copyleft.FindString(text.String()); c != "" && !(c == "Mozilla Public License" && slices.Contains(m.IDs(), "MPL-2.0")) {
		return fmt.Errorf("%s %s: its license files mention %q: review it again", m.Path, m.Version, c)
	}
	return nil
}

// IDs are the SPDX identifiers of the module's license expression.
func (m Module) IDs() []string { return strings.Split(m.License, " AND ") }

func goCmd(args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// SPDX is the license expression of a binary made of mods: hvguard's
// Apache-2.0 and every module's licenses.
func SPDX(mods []Module) string {
	ids := []string{"Apache-2.0"}
	for _, m := range mods {
		for _, id := range m.IDs() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids[1:])
	return strings.Join(ids, " AND ")
}

// Binaries are the packaged commands.
var Binaries = []string{"hvguard/cmd/hvguard-agent", "hvguard/cmd/hvguard-controller"}

// Markdown writes docs/licenses.md: which module is in which binary, its
// version and license, and the NOTICE files of those that have one.
func Markdown(w io.Writer) error {
	in := map[string][]string{}
	var all []Module
	for _, b := range Binaries {
		mods, err := List(b)
		if err != nil {
			return err
		}
		for _, m := range mods {
			if in[m.Path] == nil {
				all = append(all, m)
			}
			in[m.Path] = append(in[m.Path], filepath.Base(b))
		}
	}
	slices.SortStableFunc(all[1:], func(a, b Module) int { return strings.Compare(a.Path, b.Path) })
	// ‵ stands for a backquote, which a raw string cannot hold.
	fmt.Fprint(w, strings.ReplaceAll(`# Licenses

hvguard is licensed under the [Apache License 2.0](../LICENSE) (the OpenStack
ecosystem's license); [NOTICE](../NOTICE) is its notice file. Go files carry
no per-file license header: the module's LICENSE and NOTICE cover every file
(the Go ecosystem's convention).

Its binaries are statically linked: each contains the Go standard library
and the modules below, each under its own license. Every one is compatible
with shipping the binaries under Apache-2.0: only Apache-2.0, BSD-2-Clause,
BSD-3-Clause, ISC, MIT and MPL-2.0 are accepted (MPL-2.0 only as reviewed
for ‵go-multierror‵ and its ‵errwrap‵, a dependency the project chose: file-level
copyleft, linked unmodified, their source is the upstream module at the
version below). The packages carry every module's license files and
notices in their ‵copyright‵ file (‵/usr/share/doc/<package>/copyright‵, a
Debian machine-readable copyright file; ‵/usr/share/licenses/<package>/‵ in
the rpm, whose ‵License:‵ is the SPDX expression of all of them). libvirt
itself (LGPL-2.1-or-later) is not linked in: the agent loads the system's
‵libvirt.so‵ (a package dependency).

This page is generated (‵go run ./packaging/licenses -md > docs/licenses.md‵);
‵go test ./packaging/licenses‵ fails when it is out of date, when a linked
module is not in the reviewed table of ‵packaging/licenses/main.go‵ (a new
dependency is read before it ships), when a license is not one of the
accepted ones, or when a module's license files stop showing the reviewed
license (an upgrade that changed it).

| module | version | license | in |
|---|---|---|---|
`, "‵", "`"))
	for _, m := range all {
		name, version := m.Path, m.Version
		if name == "std" {
			// The toolchain that builds a package is not pinned (a patch
			// release differs between machines): the doc names the series,
			// so it does not go stale when the toolchain is updated.
			name = "Go standard library and runtime"
			version = goSeries(version)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", name, version, m.License, strings.Join(in[m.Path], ", "))
	}
	fmt.Fprint(w, "\n## NOTICE files of the modules\n")
	for _, m := range all {
		for _, f := range m.Files {
			if !strings.HasPrefix(strings.ToUpper(f), "NOTICE") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(m.Dir, f))
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "\n### %s (%s)\n\n```\n%s\n```\n", m.Path, f, strings.TrimSpace(string(b)))
		}
	}
	return nil
}

// debName is a license's short name in a Debian copyright file.
var debName = map[string]string{"MIT": "Expat", "BSD-3-Clause": "BSD-3-clause", "BSD-2-Clause": "BSD-2-clause"}

// Copyright writes the Debian machine-readable copyright file of the
// binary built from pkg: hvguard's own files, then one paragraph per
// linked module with its copyright lines and its license files verbatim
// (an Apache-2.0-only module's license by reference to the system's copy,
// with its NOTICE).
func Copyright(w io.Writer, pkg string) error {
	mods, err := List(pkg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, `Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: hvguard
Comment: %s is a statically linked Go program. Besides hvguard's own
 code it contains the Go standard library and the Go modules below, each
 under its license; a paragraph's Files: names the module's import path.

Files: *
Copyright: 2026 the hvguard authors
License: Apache-2.0
`, filepath.Base(pkg))
	for _, m := range mods {
		files := m.Path + "/*"
		if m.Path == "std" {
			files = "go/*"
		}
		var names []string
		for _, id := range m.IDs() {
			if n, ok := debName[id]; ok {
				id = n
			}
			names = append(names, id)
		}
		var text, holders strings.Builder
		seen := map[string]bool{}
		for _, f := range m.Files {
			b, err := os.ReadFile(filepath.Join(m.Dir, f))
			if err != nil {
				return err
			}
			for _, h := range copyrightLines(string(b)) {
				if !seen[h] {
					seen[h] = true
					fmt.Fprintf(&holders, "\n %s", h)
				}
			}
			if m.License == "Apache-2.0" && !strings.HasPrefix(strings.ToUpper(f), "NOTICE") {
				continue // by reference, below
			}
			fmt.Fprintf(&text, "\n .\n %s:\n .", f)
			body := apacheText.ReplaceAllString(string(b), apacheRef)
			for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
				if l = strings.TrimRight(l, " \t\r"); l == "" {
					text.WriteString("\n .")
				} else {
					fmt.Fprintf(&text, "\n %s", l)
				}
			}
		}
		h := strings.TrimPrefix(holders.String(), "\n ")
		if h == "" {
			h = "the authors of " + m.Path
		}
		version := m.Version
		if m.Path == "std" {
			version = "of " + m.Version
		}
		fmt.Fprintf(w, "\nFiles: %s\nCopyright: %s\nLicense: %s\n The Go module %s %s, under these terms (its %s):",
			files, h, strings.Join(names, " and "), m.Path, version, strings.Join(m.Files, ", "))
		if slices.Contains(m.IDs(), "Apache-2.0") {
			text.WriteString("\n .\n On Debian systems, the full text of the Apache License, Version 2.0 is in\n /usr/share/common-licenses/Apache-2.0.")
		}
		fmt.Fprintln(w, text.String())
	}
	fmt.Fprint(w, `
License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may
 not use this file except in compliance with the License. You may obtain a
 copy of the License at http://www.apache.org/licenses/LICENSE-2.0
 .
 Unless required by applicable law or agreed to in writing, software
 distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
 WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
 License for the specific language governing permissions and limitations
 under the License.
 .
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
`)
	return nil
}

// apacheText is the full text of the Apache License 2.0 inside a license
// file that holds more (Debian policy 12.5 and lintian want the system's
// copy referred to instead); apacheRef replaces it.
var apacheText = regexp.MustCompile(`(?s)[ \t]*Apache License\s+Version 2\.0, January 2004.*?END OF TERMS AND CONDITIONS(\s*APPENDIX: How to apply.*?limitations under the License\.)?`)

const apacheRef = "[The Apache License, Version 2.0: on Debian systems its full text is in /usr/share/common-licenses/Apache-2.0.]"

var copyrightLine = regexp.MustCompile(`^\s*Copyright\s+(\([cC]\)\s*|©\s*)?(\d.*)$`)

// copyrightLines returns the holders of a license file's "Copyright
// <year> <holder>" lines ("All rights reserved." dropped).
func copyrightLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if m := copyrightLine.FindStringSubmatch(l); m != nil {
			h := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[2]), "All rights reserved."))
			out = append(out, strings.TrimSuffix(h, "."))
		}
	}
	return out
}

func main() {
	md := flag.Bool("md", false, "write docs/licenses.md to stdout")
	copyright := flag.String("copyright", "", "write the Debian machine-readable copyright file of the binary built from this package")
	spdx := flag.String("spdx", "", "print the SPDX license expression of the binary built from this package")
	flag.Parse()
	var err error
	switch {
	case *md:
		err = Markdown(os.Stdout)
	case *copyright != "":
		err = Copyright(os.Stdout, *copyright)
	case *spdx != "":
		var mods []Module
		if mods, err = List(*spdx); err == nil {
			fmt.Println(SPDX(mods))
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "licenses:", err)
		os.Exit(1)
	}
}

// goSeries turns a Go version such as go1.26.8 into its series, go1.26.x.
func goSeries(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1] + ".x"
}
