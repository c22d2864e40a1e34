package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The command lines the README and docs/*.md show (in shell code blocks and
// in backtick spans) are held to the command: each `strata ...` or `go run
// ./cmd/strata ...` must name a subcommand that exists, and every flag it
// passes must be one of that subcommand's, as its -h lists them. A flag
// renamed or removed then fails here instead of in a reader's shell.

// docCommand is one strata command line found in a page.
type docCommand struct {
	where string   // page:line
	args  []string // the words after "strata"
}

var (
	docFence     = regexp.MustCompile("^\\s*(```|~~~)\\s*([A-Za-z]*)")
	docSpan      = regexp.MustCompile("`([^`]+)`")
	docFlagLine  = regexp.MustCompile(`^\s+--?([A-Za-z0-9][A-Za-z0-9_-]*)`)
	docFlagToken = regexp.MustCompile(`^--?([A-Za-z][A-Za-z0-9_-]*)(=.*)?$`)
	// docStrata is where a strata command starts: the binary, or go run of
	// its package, after the start of a line or span or a shell separator.
	docStrata = regexp.MustCompile(`(?:^|[|;&(]\s*|\s)(?:\S*/)?(?:strata|go run \./cmd/strata)\s+(.*)$`)
	// docShell names the fenced blocks that hold shell command lines.
	docShell = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}
)

// docCommands returns every strata command line of the README and docs/*.md.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"../../README.md"}, pages...)
	var out []docCommand
	add := func(where, line string) {
		for _, seg := range splitShell(line) {
			m := docStrata.FindStringSubmatch(seg)
			if m == nil {
				continue
			}
			words := strings.Fields(m[1])
			if len(words) == 0 || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(words[0]) {
				continue // "strata 62.5%": a report's row, not a command
			}
			out = append(out, docCommand{where, words})
		}
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		raw := string(b)
		name := strings.TrimPrefix(page, "../../")
		fenced, shell := false, false
		var cont string // a shell line continued with a backslash
		// A paragraph's spans may wrap: they are read from the paragraph
		// joined, named by the line it starts on.
		var para []string
		paraStart := 0
		spans := func() {
			for _, m := range docSpan.FindAllStringSubmatch(strings.Join(para, " "), -1) {
				if strings.HasPrefix(m[1], "strata ") || strings.HasPrefix(m[1], "go run ./cmd/strata ") {
					add(name+":"+strconv.Itoa(paraStart), m[1])
				}
			}
			para = para[:0]
		}
		for i, line := range strings.Split(raw, "\n") {
			where := name + ":" + strconv.Itoa(i+1)
			if m := docFence.FindStringSubmatch(line); m != nil {
				spans()
				fenced, shell = !fenced, !fenced && docShell[m[2]]
				continue
			}
			if fenced {
				if !shell {
					continue
				}
				line = cont + line
				if strings.HasSuffix(line, "\\") {
					cont = strings.TrimSuffix(line, "\\") + " "
					continue
				}
				cont = ""
				if c, _, ok := strings.Cut(line, "#"); ok {
					line = c
				}
				add(where, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "$ ")))
				continue
			}
			if strings.TrimSpace(line) == "" {
				spans()
				continue
			}
			if len(para) == 0 {
				paraStart = i + 1
			}
			para = append(para, strings.TrimSpace(line))
		}
		spans()
	}
	return out
}

// splitShell cuts a command line at the shell's separators and redirections,
// so that `echo ... | strata keys` and `strata bench 2>/dev/null` give the
// strata part alone.
func splitShell(line string) []string {
	f := func(r rune) bool { return r == '|' || r == ';' || r == '&' || r == '>' || r == '<' }
	return strings.FieldsFunc(line, f)
}

// subcommandFlags returns the flags the subcommand named by words prints for
// -h, and how many of words name it ("bench tiers" is two); ok is false when
// no such subcommand exists.
func subcommandFlags(t *testing.T, words []string, cache map[string][]string) (flags []string, n int, ok bool) {
	t.Helper()
	if _, exists := commands()[words[0]]; !exists {
		return nil, 0, false
	}
	name, n := words[0], 1
	if name == "bench" && len(words) > 1 && (words[1] == "tiers" || words[1] == "matrix") {
		name, n = "bench "+words[1], 2
	}
	if fl, ok := cache[name]; ok {
		return fl, n, true
	}
	code, out, errs := runCLI(t, "", append(strings.Fields(name), "-h")...)
	if code != 0 {
		t.Fatalf("strata %s -h: exit %d: %s", name, code, errs)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if m := docFlagLine.FindStringSubmatch(sc.Text()); m != nil {
			flags = append(flags, m[1])
		}
	}
	if len(flags) == 0 && name != "version" {
		t.Fatalf("strata %s -h printed no flags:\n%s", name, out)
	}
	cache[name] = flags
	return flags, n, true
}

func TestReadmeCommandsExist(t *testing.T) {
	cmds := docCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("found only %d strata command lines in README.md and docs/*.md: the scan is broken", len(cmds))
	}
	t.Logf("%d strata command lines in README.md and docs/*.md", len(cmds))
	cache := map[string][]string{}
	for _, c := range cmds {
		flags, n, ok := subcommandFlags(t, c.args, cache)
		if !ok {
			t.Errorf("%s: strata %s: no such subcommand (strata help lists them)", c.where, c.args[0])
			continue
		}
		name := strings.Join(c.args[:n], " ")
		for _, w := range c.args[n:] {
			w = strings.Trim(w, "[]()'\",.:")
			if w == "--" {
				if name == "bench matrix" {
					// What follows -- goes to each bench.
					flags, _, _ = subcommandFlags(t, []string{"bench"}, cache)
					name = "bench (after bench matrix --)"
				}
				continue
			}
			m := docFlagToken.FindStringSubmatch(w)
			if m == nil || m[1] == "h" || m[1] == "help" {
				continue
			}
			if !slices.Contains(flags, m[1]) {
				t.Errorf("%s: strata %s has no flag --%s (strata %s -h lists its flags)", c.where, name, m[1], name)
			}
		}
	}
}

// TestReadmeCommandsScan holds the scan itself to the cases it must tell
// apart: commands in shell blocks and spans, continued lines, pipes, and a
// report's rows that only start with the word strata.
func TestReadmeCommandsScan(t *testing.T) {
	for _, tc := range []struct {
		seg  string
		want []string
	}{
		{"strata serve --socket S", []string{"serve", "--socket", "S"}},
		{"go run ./cmd/strata bench --l3 redis", []string{"bench", "--l3", "redis"}},
		{" strata keys --page-size 2", []string{"keys", "--page-size", "2"}},
		{"/usr/local/bin/strata serve --config F", []string{"serve", "--config", "F"}},
		{"strata_node_ready", nil},
		{"echo strata", nil},
	} {
		m := docStrata.FindStringSubmatch(tc.seg)
		var got []string
		if m != nil {
			got = strings.Fields(m[1])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.seg, got, tc.want)
		}
	}
	if got := splitShell("echo '[1,2]' | strata keys --page-size 2 2>/dev/null"); len(got) != 3 || strings.TrimSpace(got[1]) != "strata keys --page-size 2 2" {
		t.Errorf("splitShell: %q", got)
	}
}
