// Package strata_test holds the README's architecture section to the code: its
// layers and its table of packages are checked against the import graph that
// `go list` reports, so that a package added, or an import that climbs a
// layer, fails here instead of leaving the README wrong.
package strata_test

import (
	"bufio"
	"context"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const module = "github.com/stratakv/strata/"

// architecture returns the lines of the README's architecture section.
func architecture(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			in = l == "## Architecture"
			continue
		}
		if in {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatal("README.md has no ## Architecture section")
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

// TestReadmeArchitecture checks that the README's layers name every package
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
				t.Errorf("README: %s is in layers %d and %d", p, prev, n)
			}
			layer[p] = n
		}
	}
	if len(layer) == 0 {
		t.Fatal("README: the architecture section lists no layers (lines \"1. `pkg`, ...\")")
	}
	for p, deps := range graph {
		lp, ok := layer[p]
		if !ok {
			t.Errorf("README: package %s is in no layer", p)
			continue
		}
		for _, d := range deps {
			if ld, ok := layer[d]; ok && ld <= lp {
				t.Errorf("README: %s (layer %d) imports %s (layer %d), which is not below it", p, lp, d, ld)
			}
		}
	}
	for p := range layer {
		if _, ok := graph[p]; !ok {
			t.Errorf("README: layer entry %s is not a package", p)
		}
	}

	// The table of packages: the rows after its header, up to the first line
	// that is not a row.
	table := map[string]bool{}
	start := slices.Index(lines, "| package | what it holds |")
	if start < 0 {
		t.Fatal("README: no table of packages (| package | what it holds |)")
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
			t.Errorf("README: package %s is not in the architecture table", p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(table)) {
		if _, ok := graph[p]; ok {
			continue
		}
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			t.Errorf("README: table entry %s is neither a package nor a directory", p)
		}
	}
}
