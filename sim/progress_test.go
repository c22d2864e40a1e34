package sim

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeClock returns a clock that advances by step on every reading.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		t = t.Add(step)
		return t
	}
}

func TestProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, false)
	p.now = fakeClock(250 * time.Millisecond)
	p.Start("strata", 1000)
	for i := 1; i <= 1000; i++ {
		p.Step(i)
		p.Step(i) // repeats are free and print nothing
	}
	p.Finish()
	p.Finish() // a second Finish has no run to finish
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 10 {
		t.Fatalf("got %d lines, want 10:\n%s", len(lines), out)
	}
	if lines[3] != "strata: 40% (400/1000)" {
		t.Errorf("line 4 = %q", lines[3])
	}
	if lines[9] != "strata: 100% (1000/1000) in 250ms" {
		t.Errorf("last line = %q", lines[9])
	}
	if strings.Contains(out, "\r") {
		t.Error("plain output has a carriage return")
	}
}

func TestProgressPlainCoarseSteps(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, false)
	p.now = fakeClock(time.Second)
	p.Start("ceiling", 3)
	p.Step(1)
	p.Step(2)
	p.Step(3)
	p.Step(7)              // past the total: clamped
	p.Start("strata", 300) // finishes ceiling first
	p.Step(120)
	p.Start("empty", 0)
	p.Step(5)
	p.Finish()
	want := "ceiling: 33% (1/3)\n" +
		"ceiling: 66% (2/3)\n" +
		"ceiling: 100% (3/3) in 1s\n" +
		"strata: 40% (120/300)\n" +
		"strata: 40% (120/300) in 1s\n" +
		"empty: 100% (0/0) in 1s\n"
	if got := buf.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, true)
	p.now = fakeClock(1500 * time.Millisecond)
	p.Start("l1-only", 1000)
	for i := 1; i <= 1000; i++ {
		p.Step(i)
	}
	p.Finish()
	out := buf.String()
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Errorf("want one newline, at the end: %q", out)
	}
	// One draw at Start (0%) and one per percentage, then the final redraw.
	if n := strings.Count(out, "\r"); n != 102 {
		t.Errorf("got %d redraws, want 102", n)
	}
	if !strings.Contains(out, "\rl1-only [===============               ]  50% ( 500/1000)") {
		t.Errorf("no half-way bar in %q", out[:200])
	}
	if !strings.HasSuffix(out, "\rl1-only ["+strings.Repeat("=", 30)+"] 100% (1000/1000) in 1.5s\n") {
		t.Errorf("bad final line: %q", out[strings.LastIndex(out, "\r"):])
	}
	// Every redraw is equally long, so each covers the one before.
	draws := strings.Split(strings.TrimSuffix(strings.TrimSuffix(out, " in 1.5s\n"), "\n"), "\r")[1:]
	for _, d := range draws {
		if len(d) != len(draws[0]) {
			t.Fatalf("redraw %q is %d long, first %d", d, len(d), len(draws[0]))
		}
	}
}

func TestProgressIdle(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, true)
	p.Step(10) // before Start
	p.Finish()
	if buf.Len() != 0 {
		t.Errorf("wrote %q with no run", buf.String())
	}
}

func BenchmarkProgressStep(b *testing.B) {
	var buf bytes.Buffer
	p := NewProgress(&buf, true)
	p.Start("strata", b.N)
	for i := range b.N {
		p.Step(i)
	}
	p.Finish()
}

func TestIsTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("a regular file is a terminal")
	}
	if IsTerminal(nil) {
		t.Error("nil is a terminal")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(w) {
		t.Error("a pipe is a terminal")
	}
	closed, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	if IsTerminal(closed) {
		t.Error("a closed file is a terminal")
	}
}
