// Package python_test runs the engine plugins' pytest suite from `go test`,
// so that the README's one test command (go test -race ./...) covers the Go code
// and the Python plugins alike. The suite (python/tests) drives strata_sglang
// through SGLang's side of the contract and strata_vllm through vLLM's,
// against a real strata serve: through the project's own models of both
// engines always (subtest "model"), through SGLang's real classes when
// STRATA_SGLANG_DIR names a fetched copy (subtest "sglang") and through
// vLLM's when STRATA_VLLM_DIR does (subtest "vllm"); each of these skips with
// one line without its copy, also under CI=true: no engine code is kept here. Its chaos test (python/tests/test_chaos.py)
// runs a few seconds by default; STRATA_CHAOS=60s runs it for the full minute
// (and STRATA_CHAOS_SEED=N repeats a run).
package python_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// debianPython is the interpreter the plugin is tested with: Debian's python3,
// whose python3-torch/-numpy/-pytest packages are what CI installs.
const debianPython = "/usr/bin/python3"

// needOrSkip skips with reason outside CI and fails under CI=true, where the
// plugin's tests must run.
func needOrSkip(t *testing.T, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: the plugin's tests must run; .ci/run installs what they need)", reason)
	}
	t.Skip(reason)
}

func TestPluginPytestSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the plugin's pytest suite starts strata serve processes")
	}
	_, err := os.Stat(debianPython)
	needOrSkip(t, err == nil, debianPython+" is missing: apt-get install python3 python3-torch python3-numpy python3-pytest")
	probe := exec.Command(debianPython, "-c", "import pytest, torch, numpy")
	out, err := probe.CombinedOutput()
	needOrSkip(t, err == nil, "python3 cannot import pytest, torch and numpy (apt-get install python3-torch python3-numpy python3-pytest): "+
		lastLine(out))

	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// Build strata once here, so pytest does not need the go tool on its PATH.
	bin := filepath.Join(t.TempDir(), "strata")
	build := exec.Command("go", "build", "-o", bin, "./cmd/strata")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/strata: %v\n%s", err, out)
	}

	t.Run("model", func(t *testing.T) {
		runPytest(t, repo, bin, "model")
	})
	t.Run("sglang", func(t *testing.T) {
		dir := os.Getenv("STRATA_SGLANG_DIR")
		if dir == "" {
			t.Skip("SGLang's real classes: STRATA_SGLANG_DIR is not set; python/tests/sglang_copy.sh " +
				"extracts a fetched SGLang into a git-ignored folder (the model's run covers every scenario)")
		}
		runPytest(t, repo, bin, "real")
	})
	t.Run("vllm", func(t *testing.T) {
		if os.Getenv("STRATA_VLLM_DIR") == "" {
			t.Skip("vLLM's real classes: STRATA_VLLM_DIR is not set; extract a fetched vLLM with " +
				"`git -C <vllm git dir> archive <commit> vllm | tar -x -C .vllm` (the model's run covers every scenario)")
		}
		runPytest(t, repo, bin, "vllm-real")
	})
}

// runPytest runs python/tests on one side: the models of both engines
// ("model"), SGLang's real classes ("real", harness.py) or vLLM's
// ("vllm-real", vllm_side.py).
func runPytest(t *testing.T, repo, bin, side string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "python/tests")
	cmd.Dir = repo
	env := append(os.Environ(), "STRATA_BIN="+bin, "PYTHONDONTWRITEBYTECODE=1")
	switch side {
	case "vllm-real":
		env = append(env, "STRATA_VLLM_SIDE=real", "STRATA_SGLANG_SIDE=model")
	default:
		env = append(env, "STRATA_SGLANG_SIDE="+side, "STRATA_VLLM_SIDE=model")
	}
	cmd.Env = env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("pytest python/tests (%s side) did not finish in 8 minutes:\n%s", side, buf.String())
	}
	if err != nil {
		t.Fatalf("pytest python/tests (%s side) failed (%v):\n%s", side, err, buf.String())
	}
	t.Logf("pytest python/tests, %s side: %s", side, lastLine(buf.Bytes()))
	reportSkips(t, buf.Bytes())
}

// pytestSkip is one line of pytest's -rs summary: "SKIPPED [3]
// python/tests/test_x.py:12: reason", how many tests one skip call skipped.
var pytestSkip = regexp.MustCompile(`(?m)^SKIPPED \[(\d+)\] ([^:\s]+)(?::\d+)?: (.*)$`)

// reportSkips makes each of pytest's skips a skipped subtest with its reason,
// so that the test command's summary lists them beside Go's own: a pytest
// module skipped whole (no SGLang copy, no redis-server) is otherwise only a
// count in pytest's last line.
func reportSkips(t *testing.T, out []byte) {
	// pytest lists a skip per test (per line of the file): one subtest per
	// file and reason, with the tests it skipped counted.
	type skip struct{ file, reason string }
	var order []skip
	count := map[skip]int{}
	for _, m := range pytestSkip.FindAllSubmatch(out, -1) {
		k := skip{string(m[2]), string(m[3])}
		n, _ := strconv.Atoi(string(m[1]))
		if _, seen := count[k]; !seen {
			order = append(order, k)
		}
		count[k] += n
	}
	for _, k := range order {
		t.Run("pytest "+k.file, func(t *testing.T) {
			t.Skipf("%d pytest test(s) skipped: %s", count[k], k.reason)
		})
	}
}

// lastLine returns the last non-empty line of out: pytest's summary, or the
// import error of a probe.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
