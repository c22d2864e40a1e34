package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A real go test run over a module of four tests (one passes, one skips with
// a reason, one has a skipped subtest, one fails) prints the failure, lists
// both skips with their reasons, ends with the counts, and exits 1.
func TestRunListsSkipsWithReasons(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command: %v", err)
	}
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.24\n")
	write("m_test.go", `package m

import "testing"

func TestPasses(t *testing.T) {}

func TestSkipsWhole(t *testing.T) { t.Skip("redis-server is missing: apt-get install redis-server") }

func TestParent(t *testing.T) {
	t.Run("pytest python/tests/test_x.py", func(t *testing.T) { t.Skipf("%d pytest test(s) skipped: no copy", 3) })
	t.Run("runs", func(t *testing.T) {})
}

func TestFails(t *testing.T) { t.Error("the answer is 41") }
`)
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.Chdir(wd) }()

	var stdout, stderr bytes.Buffer
	code := run([]string{"-count=1", "./..."}, &stdout, &stderr)
	out := stdout.String()
	if code != 1 {
		t.Errorf("exit %d, want 1 (a test failed)\n%s%s", code, out, stderr.String())
	}
	for _, want := range []string{
		"the answer is 41",
		"FAIL\texample.com/m",
		"skipped, and why:",
		"SKIP ./example.com/m TestSkipsWhole: redis-server is missing: apt-get install redis-server",
		"SKIP ./example.com/m TestParent/pytest_python/tests/test_x.py: 3 pytest test(s) skipped: no copy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if want := "FAIL: 3 tests passed, 1 failed, 2 skipped (listed above with their reasons); failing packages: ./example.com/m"; last != want {
		t.Errorf("last line %q, want %q", last, want)
	}
	if strings.Contains(out, "=== RUN") || strings.Contains(out, "--- PASS") {
		t.Errorf("passing tests' chatter printed (go test without -v prints none):\n%s", out)
	}
}

// A stream's lines that are not events pass through, and a package's own
// result line is printed as go test prints it.
func TestSummarizePassesOtherLines(t *testing.T) {
	in := strings.Join([]string{
		`# example.com/m [build failed]`,
		`{"Action":"output","Package":"example.com/ok","Output":"ok  \texample.com/ok\t0.01s\n"}`,
		`{"Action":"pass","Package":"example.com/ok"}`,
	}, "\n")
	var w bytes.Buffer
	s, err := summarize(strings.NewReader(in), &w)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.String(); got != "# example.com/m [build failed]\nok  \texample.com/ok\t0.01s\n" {
		t.Errorf("printed %q", got)
	}
	if s.failed != 0 || len(s.failedPkgs) != 0 {
		t.Errorf("counted failures in a passing stream: %+v", s)
	}
}
