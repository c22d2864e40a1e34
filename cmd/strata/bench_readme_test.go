package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's sample output of `strata bench` is the bench's own: the same
// header lines, table columns, runs, legend and notes, in the same order, as
// a real run prints (the numbers differ machine to machine and are left out
// of the comparison). When the report changes, regenerate the sample with
// `go run ./cmd/strata bench 2>/dev/null` and paste it.
func TestREADMESampleOutputIsTheBenchs(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "prints a report like\nthis:\n\n```\n")
	if !ok {
		t.Fatal(`README: no sample block after "prints a report like this:"`)
	}
	sample, _, ok := strings.Cut(after, "```")
	if !ok {
		t.Fatal("README: the sample block does not end")
	}
	// A small trace on the same defaults (node L3 started in the process,
	// every run), so that it prints every section the default bench does.
	code, out, errs := runCLI(t, "", "bench", "--clients", "8", "--rounds", "4", "--request-tokens", "256",
		"--output-tokens", "16", "--l1-tokens", "2048", "--l2-ratio", "2", "--max-running", "4", "--node-arena", "64MiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want, got := reportShape(sample), reportShape(out)
	if !slices.Equal(want, got) {
		t.Fatalf("the README's sample output and the bench's differ in shape (numbers left out):\nREADME:\n%s\nbench:\n%s\nthe bench printed:\n%s",
			strings.Join(want, "\n"), strings.Join(got, "\n"), out)
	}
}

var (
	reportNumber = regexp.MustCompile(`[0-9][0-9.,]*(µs|ms|s|%| ?[KMG]iB| B)?`)
	reportSpaces = regexp.MustCompile(`\s+`)
)

// reportShape reduces a bench report to what does not depend on the machine
// or the trace's size: each header line's label, the runs table's column
// header and run names, and every other line with its numbers masked.
func reportShape(report string) []string {
	var shape []string
	header, table := true, false
	for line := range strings.Lines(report) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.TrimSpace(line) == "":
			header = header && len(shape) == 0
			table = false
			shape = append(shape, "")
		case header:
			label, _, _ := strings.Cut(line, "  ")
			shape = append(shape, "header: "+label)
		case strings.HasPrefix(line, "run "):
			table = true
			shape = append(shape, "columns: "+reportSpaces.ReplaceAllString(line, " "))
		case table && !strings.HasPrefix(line, "verified:") && !strings.HasPrefix(line, "load-back GB/s:"):
			name, _, _ := strings.Cut(line, " ")
			shape = append(shape, "run: "+name)
		default:
			table = false
			shape = append(shape, reportNumber.ReplaceAllString(line, "#"))
		}
	}
	return shape
}
