// Package docs holds no code: its test checks that every relative link in
// the Markdown documentation (docs/, README.md, packaging/README.md) names
// a file that exists and, for a Markdown file, a heading it has.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#+\s+(.+?)\s*$`)
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
	schemeRE  = regexp.MustCompile(`^[a-z]+:`)
	dropRE    = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// anchors are the GitHub anchors of a Markdown file's headings: lower
// case, punctuation dropped, spaces as hyphens, a repeated one numbered.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(b), ""), -1) {
		a := strings.ReplaceAll(dropRE.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestLinks(t *testing.T) {
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "README.md"), filepath.Join("..", "packaging", "README.md"))
	for _, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if schemeRE.MatchString(link) {
				continue
			}
			file, anchor, _ := strings.Cut(link, "#")
			path := src
			if file != "" {
				path = filepath.Join(filepath.Dir(src), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", src, link, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
				t.Errorf("%s: link %s: %s has no heading with that anchor", src, link, path)
			}
		}
	}
}
