// Package strata_test holds the documentation to the code: the layers and the
// table of packages in docs/architecture.md are checked against the import
// graph that `go list` reports, so that a package added, or an import that
// climbs a layer, fails here instead of leaving the page wrong; and every
// relative link of README.md and docs/*.md must lead to a file and a heading
// that exist, with the README short enough to read in ten minutes.
package strata_test

import (
	"bufio"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const module = "github.com/stratakv/strata/"

// architectureDoc is the page that holds the layers and the table of packages,
// under the heading architectureSection.
const (
	architectureDoc     = "docs/architecture.md"
	architectureSection = "## Packages and their layers"
)

// architecture returns the lines of docs/architecture.md's section of packages.
func architecture(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(architectureDoc)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			in = l == architectureSection
			continue
		}
		if in {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %q section", architectureDoc, architectureSection)
	}
	return out
}

var backticked = regexp.MustCompile("`([^`]+)`")

func names(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// importGraph returns every package of the module that has non-test Go files,
// with the module's packages it imports, paths relative to the module.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "list", "-f", "{{if .GoFiles}}{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		var deps []string
		for _, d := range f[1:] {
			if strings.HasPrefix(d, module) {
				deps = append(deps, strings.TrimPrefix(d, module))
			}
		}
		g[strings.TrimPrefix(f[0], module)] = deps
	}
	return g
}

// TestReadmeArchitecture checks that the architecture page's layers name every package
// once and that every import goes down them, and that its table names every
// package (and, besides, only directories that exist).
func TestReadmeArchitecture(t *testing.T) {
	lines := architecture(t)
	graph := importGraph(t)

	layer := map[string]int{}
	layerLine := regexp.MustCompile(`^(\d+)\. (.*)$`)
	for _, l := range lines {
		m := layerLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		for _, p := range names(m[2]) {
			if prev, dup := layer[p]; dup {
				t.Errorf(architectureDoc+": %s is in layers %d and %d", p, prev, n)
			}
			layer[p] = n
		}
	}
	if len(layer) == 0 {
		t.Fatal(architectureDoc + ": the architecture section lists no layers (lines \"1. `pkg`, ...\")")
	}
	for p, deps := range graph {
		lp, ok := layer[p]
		if !ok {
			t.Errorf(architectureDoc+": package %s is in no layer", p)
			continue
		}
		for _, d := range deps {
			if ld, ok := layer[d]; ok && ld <= lp {
				t.Errorf(architectureDoc+": %s (layer %d) imports %s (layer %d), which is not below it", p, lp, d, ld)
			}
		}
	}
	for p := range layer {
		if _, ok := graph[p]; !ok {
			t.Errorf(architectureDoc+": layer entry %s is not a package", p)
		}
	}

	// The table of packages: the rows after its header, up to the first line
	// that is not a row.
	table := map[string]bool{}
	start := slices.Index(lines, "| package | what it holds |")
	if start < 0 {
		t.Fatal(architectureDoc + ": no table of packages (| package | what it holds |)")
	}
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		for _, p := range names(strings.SplitN(l, "|", 3)[1]) {
			table[p] = true
		}
	}
	for p := range graph {
		if !table[p] {
			t.Errorf(architectureDoc+": package %s is not in the architecture table", p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(table)) {
		if _, ok := graph[p]; ok {
			continue
		}
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			t.Errorf(architectureDoc+": table entry %s is neither a package nor a directory", p)
		}
	}
}

// readmeMaxLines is how long the README may grow: what a newcomer reads in ten
// minutes. Everything else goes into docs/.
const readmeMaxLines = 250

// docPages returns README.md and every docs/*.md, the pages whose links are held
// true.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, pages...)
}

var (
	mdFence    = regexp.MustCompile("^\\s*(```|~~~)")
	mdHeading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	mdCodeSpan = regexp.MustCompile("`+[^`]*`+")
	mdLink     = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// slugDrop is what GitHub drops from a heading to make its anchor: all
	// but letters, digits, spaces, hyphens and underscores.
	slugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// prose returns the lines of a Markdown page outside its fenced code blocks,
// with their numbers.
func prose(text string) (lines []string, numbers []int) {
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		if mdFence.MatchString(l) {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines, numbers = append(lines, l), append(numbers, i+1)
		}
	}
	return lines, numbers
}

// anchors returns the anchors GitHub gives a page's headings: the heading's
// text lowercased, backticks and other punctuation dropped, spaces made
// hyphens, a repeated slug numbered -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines, _ := prose(text)
	for _, l := range lines {
		m := mdHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestReadmeLinks checks that every relative link of README.md and docs/*.md
// leads to a file that exists and, with a #anchor, to a heading of it; and
// that the README stays short.
func TestReadmeLinks(t *testing.T) {
	texts := map[string]string{}
	read := func(path string) (string, error) {
		if s, ok := texts[path]; ok {
			return s, nil
		}
		raw, err := os.ReadFile(path)
		if err == nil {
			texts[path] = string(raw)
		}
		return string(raw), err
	}
	for _, page := range docPages(t) {
		text, err := read(page)
		if err != nil {
			t.Fatal(err)
		}
		lines, numbers := prose(text)
		for i, l := range lines {
			for _, m := range mdLink.FindAllStringSubmatch(mdCodeSpan.ReplaceAllString(l, "``"), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
				}
				st, err := os.Stat(path)
				if err != nil {
					t.Errorf("%s:%d: link %s: no file %s", page, numbers[i], target, path)
					continue
				}
				if anchor == "" {
					continue
				}
				if st.IsDir() || !strings.HasSuffix(path, ".md") {
					t.Errorf("%s:%d: link %s: an anchor into %s, which is not a Markdown page", page, numbers[i], target, path)
					continue
				}
				dest, err := read(path)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(dest)[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading whose anchor is #%s", page, numbers[i], target, path, anchor)
				}
			}
		}
	}
	readme, err := read("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strings.TrimRight(readme, "\n"), "\n") + 1; n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into docs/ and link it", n, readmeMaxLines)
	}
}

// TestReadmeAnchors holds the anchor rule to GitHub's on headings of the kind
// the pages have.
func TestReadmeAnchors(t *testing.T) {
	got := anchors("# Strata\n## The bench and how to read its report\n```sh\n# not a heading\n```\n" +
		"## `strata inspect`\n## L3 and the failure: impossible, 2.0x\n## Notes\n## Notes\n")
	for _, want := range []string{"strata", "the-bench-and-how-to-read-its-report", "strata-inspect",
		"l3-and-the-failure-impossible-20x", "notes", "notes-1"} {
		if !got[want] {
			t.Errorf("no anchor %q among %v", want, slices.Sorted(maps.Keys(got)))
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block made an anchor")
	}
}
