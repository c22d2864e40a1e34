package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratakv/strata/node"
)

func TestBenchHelpMentionsTiers(t *testing.T) {
	code, help, _ := runCLI(t, "", "bench", "-h")
	if code != 0 || !strings.Contains(help, "strata bench tiers [flags]") {
		t.Fatalf("exit %d, help:\n%s", code, help)
	}
}

// --nodes 0 is refused as -1 is, before any run.
func TestBenchNodesBelowOneRefused(t *testing.T) {
	for _, n := range []string{"0", "-1"} {
		code, out, errs := runCLI(t, "", "bench", "--nodes", n)
		if code != 2 || out != "" || !strings.Contains(errs, "--nodes "+n) {
			t.Errorf("--nodes %s: exit %d, stderr %q", n, code, errs)
		}
	}
}

func TestInspectTimeoutMustBePositive(t *testing.T) {
	for _, d := range []string{"0s", "-1s"} {
		code, _, errs := runCLI(t, "", "inspect", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--timeout", d)
		if code != 2 || !strings.Contains(errs, "--timeout") {
			t.Errorf("--timeout %s: exit %d, stderr %q", d, code, errs)
		}
	}
}

// A service that is not there is named once, not twice.
func TestInspectNoServiceSaysSoOnce(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	code, _, errs := runCLI(t, "", "inspect", "--socket", sock)
	if code != 1 || strings.Count(errs, "node service at") != 1 || !strings.Contains(errs, "strata serve --socket "+sock) {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// Fewer tokens than a page give no key, and stderr says why.
func TestKeysFewerTokensThanAPageSaysSo(t *testing.T) {
	code, out, errs := runCLI(t, "1 2 3", "keys", "--page-size", "4")
	if code != 0 || out != "" || !strings.Contains(errs, "3 tokens make no whole page of 4 tokens") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = runCLI(t, "1 2 3 4", "keys", "--page-size", "4", "--bigram")
	if code != 0 || out != "" || !strings.Contains(errs, "(5 tokens needed)") {
		t.Fatalf("bigram: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestVersionNamesTheCommit(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Version: "v1.0.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}}}
	if got, want := describeBuild(info), "v1.0.0 commit 0123456789ab-dirty (2026-01-02T03:04:05Z) go1.26"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := describeBuild(&debug.BuildInfo{GoVersion: "go1.26"}); !strings.Contains(got, "commit unknown") {
		t.Errorf("without VCS settings: %q", got)
	}
	code, out, _ := runCLI(t, "", "version")
	if code != 0 || !strings.Contains(out, "commit ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

// -h prints the usage on stdout and exits 0, as kubectl and etcd do (so that
// `strata serve -h | grep spill` finds the spill's flags), and every flag of
// every command shows its default once, the empty and false ones included.
func TestHelpGoesToStdoutWithEveryDefault(t *testing.T) {
	for _, cmd := range [][]string{{"serve"}, {"inspect"}, {"keys"}, {"version"}, {"bench"}, {"bench", "tiers"}, {"bench", "matrix"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(cmd, "-h"), strings.NewReader(""), &out, &errb)
		if code != 0 || errb.Len() != 0 || !strings.Contains(out.String(), "usage: strata "+strings.Join(cmd, " ")) {
			t.Errorf("%v -h: exit %d, stdout %d bytes, stderr %q", cmd, code, out.Len(), errb.String())
			continue
		}
		var flagName string
		shown := true
		check := func() {
			if flagName != "" && !shown {
				t.Errorf("%v -h: %s shows no default", cmd, flagName)
			}
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, "  -") {
				check()
				flagName, shown = strings.Fields(line)[0], false
			}
			if n := strings.Count(line, "(default"); n > 0 {
				if shown && flagName != "" {
					t.Errorf("%v -h: %s says its default twice: %q", cmd, flagName, line)
				}
				shown = true
				if n > 1 {
					t.Errorf("%v -h: %s says its default %d times: %q", cmd, flagName, n, line)
				}
			}
		}
		check()
	}
}

// inspect --json prints the service's 64-bit ids exactly: the content id an
// operator compares across restarts was rounded to a float64's 17 digits.
func TestInspectJSONKeepsEveryDigit(t *testing.T) {
	sock := filepath.Join(shortDir(t), "s.sock")
	cfg := node.DefaultConfig(sock)
	cfg.ArenaBytes, cfg.Admin, cfg.ArenaFile = 8<<20, "", ""
	srv, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	code, out, errs := runCLI(t, "", "inspect", "--json", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	st := srv.Stats().Start
	for _, id := range []uint64{st.ContentID, st.InstanceID} {
		if want := strconv.FormatUint(id, 10); !strings.Contains(out, want) {
			t.Fatalf("inspect --json does not show %s exactly:\n%s", want, out)
		}
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil || v["start"] == nil {
		t.Fatalf("inspect --json is not the stats document (%v):\n%s", err, out)
	}
}

// An output file that cannot be written is refused before the bench runs,
// with exit 2 naming the flag: /proc's mode says writable, yet it takes no
// new file (the whole bench ran, then failed).
func TestBenchRefusesAnUnwritableOutputBeforeRunning(t *testing.T) {
	for flag, path := range map[string]string{"--json": "/proc/strata-bench-x.json", "--plot": "/proc/strata-bench-x.png"} {
		start := time.Now()
		code, _, errs := runCLI(t, "", "bench", flag, path, "--runs", "l1-only", "--rounds", "1")
		if code != 2 || !strings.Contains(errs, flag) || !strings.Contains(errs, "cannot be created") {
			t.Errorf("%s /proc/...: exit %d, stderr %q; want 2 naming %s", flag, code, errs, flag)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: refused after %v: the bench ran first", flag, took)
		}
	}
	dir := t.TempDir()
	existing := filepath.Join(dir, "old.json")
	if err := os.WriteFile(existing, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkOutputFile(existing); err != nil {
		t.Fatalf("an existing writable file: %v", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Fatalf("the check changed an existing file: %q", b)
	}
	if err := checkOutputFile(filepath.Join(dir, "new.json")); err != nil {
		t.Fatalf("a new file in a writable directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the check left the new file behind: %v", err)
	}
}
