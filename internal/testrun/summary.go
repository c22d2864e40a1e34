package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
}

// skip is one skipped test and the reason it logged.
type skip struct {
	pkg, test, reason string
}

// summary is what the run did, counted from its events.
type summary struct {
	passed, failed int
	skips          []skip
	failedPkgs     []string
}

// summarize copies the non-verbose part of the stream to w as it comes: each
// package's result line, build errors, and the whole output of a test that
// failed; it keeps every test's output until the test ends, to find a skip's
// reason or print a failure.
func summarize(r io.Reader, w io.Writer) (*summary, error) {
	s := &summary{}
	out := map[[2]string][]string{} // package, test -> output lines so far
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// go test writes a few lines that are not events (a package
			// that does not build, before Go 1.24): pass them through.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "output":
			if e.Test == "" {
				// A package's own lines: its result ("ok  pkg 1.2s",
				// "FAIL pkg"), "no test files", panics outside a test.
				if t := strings.TrimSpace(e.Output); t != "PASS" && t != "FAIL" && !strings.HasPrefix(t, "=== ") {
					fmt.Fprint(w, e.Output)
				}
				continue
			}
			out[key] = append(out[key], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				if e.Action == "fail" {
					s.failedPkgs = append(s.failedPkgs, e.Package)
				}
				continue
			}
			lines := out[key]
			delete(out, key)
			switch e.Action {
			case "pass":
				s.passed++
			case "fail":
				s.failed++
				// A parent test fails with its subtests: print each
				// failure's own output once, at the failing leaf.
				for _, l := range lines {
					if !strings.HasPrefix(l, "=== ") {
						fmt.Fprint(w, l)
					}
				}
			case "skip":
				s.skips = append(s.skips, skip{e.Package, e.Test, skipReason(lines)})
			}
		}
	}
	return s, sc.Err()
}

// skipReason is what a skipped test logged: the lines between its "=== RUN"
// and its "--- SKIP", with their file:line prefixes cut off.
func skipReason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		if _, rest, ok := strings.Cut(t, ": "); ok && strings.Contains(t[:len(t)-len(rest)], ".go:") {
			t = rest
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

// print ends the run with the skips, each with its reason, and one line a
// person reads last.
func (s *summary) print(w io.Writer) {
	if len(s.skips) > 0 {
		slices.SortFunc(s.skips, func(a, b skip) int {
			return strings.Compare(a.pkg+" "+a.test, b.pkg+" "+b.test)
		})
		fmt.Fprintf(w, "\nskipped, and why:\n")
		for _, k := range s.skips {
			fmt.Fprintf(w, "  SKIP %s %s: %s\n", shortPkg(k.pkg), k.test, k.reason)
		}
	}
	verdict := "ok"
	if s.failed > 0 || len(s.failedPkgs) > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\n%s: %d tests passed, %d failed, %d skipped", verdict, s.passed, s.failed, len(s.skips))
	if len(s.skips) > 0 {
		fmt.Fprintf(w, " (listed above with their reasons)")
	}
	if len(s.failedPkgs) > 0 {
		fmt.Fprintf(w, "; failing packages: %s", strings.Join(shortPkgs(s.failedPkgs), ", "))
	}
	fmt.Fprintln(w)
}

const module = "github.com/stratakv/strata/"

func shortPkg(p string) string {
	if p+"/" == module {
		return "."
	}
	return "./" + strings.TrimPrefix(p, module)
}

func shortPkgs(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = shortPkg(p)
	}
	return out
}
