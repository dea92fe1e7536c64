package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// retired modules must not be linked into anything (tests included): each
// with what replaces it.
var retired = map[string]string{
	"gopkg.in/yaml.v3": "go.yaml.in/yaml/v3 (gopkg.in/yaml.v3 is archived)",
}

func TestNoRetiredModules(t *testing.T) {
	out, err := goCmd("list", "-deps", "-test", "-f", `{{with .Module}}{{.Path}} {{.Version}}{{end}}`, "hvguard/...")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			if repl, ok := retired[f[0]]; ok {
				t.Errorf("%s %s is retired: use %s", f[0], f[1], repl)
			}
		}
	}
}

// TestShippedModulesReviewed: every module linked into a packaged binary
// is reviewed, compatible, and its license files show the reviewed
// license; no reviewed entry is stale.
func TestShippedModulesReviewed(t *testing.T) {
	mods, err := List(Binaries...)
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range mods {
		linked[m.Path] = true
	}
	for p := range reviewed {
		if !linked[p] {
			t.Errorf("%s is reviewed but no longer linked: remove it from reviewed", p)
		}
	}
}

// TestDocUpToDate: docs/licenses.md is what -md writes.
func TestDocUpToDate(t *testing.T) {
	var buf bytes.Buffer
	if err := Markdown(&buf); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(filepath.Join("..", "..", "docs", "licenses.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, buf.Bytes()) {
		t.Error("docs/licenses.md is out of date: go run ./packaging/licenses -md > docs/licenses.md")
	}
}

// TestCheck: what a review catches, on module directories made here.
func TestCheck(t *testing.T) {
	mit := "Copyright (c) 2020 Someone\n\nPermission is hereby granted, free of charge, to any person\n"
	for _, tc := range []struct {
		name, path, license string
		files               map[string]string
		want                string // in the error; "" = none
	}{
		{"ok", "example.com/ok", "MIT", map[string]string{"LICENSE": mit}, ""},
		{"not reviewed", "example.com/new", "", map[string]string{"LICENSE": mit}, "not reviewed"},
		{"no license file", "example.com/none", "MIT", map[string]string{"README.md": mit}, "no license file"},
		{"changed license", "example.com/changed", "MIT", map[string]string{"LICENSE": "Apache License\nVersion 2.0, January 2004\n"}, "do not show MIT"},
		{"copyleft added", "example.com/gpl", "MIT", map[string]string{"LICENSE": mit, "COPYING": "GNU General Public License version 3"}, "General Public License"},
		{"incompatible", "example.com/mpl", "MPL-2.0", map[string]string{"LICENSE": "Mozilla Public License, version 2.0"}, "not a license hvguard can ship"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, text := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.license != "" {
				reviewed[tc.path] = tc.license
				t.Cleanup(func() { delete(reviewed, tc.path) })
			}
			m := Module{Path: tc.path, Version: "v1.0.0", Dir: dir}
			err := m.check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestCopyright: the Debian copyright file has hvguard's paragraph first
// and one paragraph per linked module, each with a Copyright and a
// License field; the SPDX expression starts with hvguard's license.
func TestCopyright(t *testing.T) {
	var buf bytes.Buffer
	if err := Copyright(&buf, "hvguard/cmd/hvguard-controller"); err != nil {
		t.Fatal(err)
	}
	paras := strings.Split(buf.String(), "\n\n")
	if !strings.HasPrefix(paras[0], "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n") {
		t.Errorf("header %q", paras[0])
	}
	if paras[1] != "Files: *\nCopyright: 2026 the hvguard authors\nLicense: Apache-2.0" {
		t.Errorf("hvguard's paragraph %q", paras[1])
	}
	mods, err := List("hvguard/cmd/hvguard-controller")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, p := range paras[2:] {
		if strings.HasPrefix(p, "Files: ") {
			files++
			if !strings.Contains(p, "\nCopyright: ") || !strings.Contains(p, "\nLicense: ") {
				t.Errorf("paragraph without Copyright or License: %q", p[:min(len(p), 200)])
			}
		}
	}
	if files != len(mods) {
		t.Errorf("%d module paragraphs, %d modules", files, len(mods))
	}
	if got := SPDX(mods); !strings.HasPrefix(got, "Apache-2.0 AND ") {
		t.Errorf("SPDX %q", got)
	}
}
