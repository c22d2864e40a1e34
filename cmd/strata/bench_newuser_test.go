package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A workload whose requests are longer than the default L1 of 16384 tokens runs
// on the defaults: L1 holds the longest request, and no request fails (it once
// failed them all, printed 0.0% and exited 0). One document is all the trace
// reuses, which L1 holds: stderr says that L3 has nothing to serve.
func TestBenchLongRequestsRunOnDefaultL1(t *testing.T) {
	code, out, errs := runCLI(t, "", "bench", "--workload", "long-context", "--documents", "1", "--questions", "2",
		"--document-tokens", "20000", "--runs", "l1-only,ceiling")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "L1 (device)    20,224 tokens") {
		t.Errorf("L1 does not hold the 20,192-token request:\n%s", out)
	}
	if !strings.Contains(errs, "so L3 has nothing to serve: give a larger workload") {
		t.Errorf("stderr does not say L3 has nothing to serve:\n%s", errs)
	}
	if strings.Contains(out, "failed") {
		t.Errorf("requests failed:\n%s", out)
	}
}

// An L1 the user chose that cannot hold a request is refused before any run.
func TestBenchL1SmallerThanARequestIsRefused(t *testing.T) {
	code, out, errs := runCLI(t, "", "bench", "--clients", "2", "--rounds", "2", "--request-tokens", "512", "--l1-tokens", "256")
	if code != 2 || out != "" || !strings.Contains(errs, "--l1-tokens") || strings.Contains(errs, "l1-only") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// Every path, address and socket is checked before the first run: the bench
// exits 2 naming the flag, with nothing on stdout and no run started.
func TestBenchChecksPathsBeforeTheFirstRun(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--socket", []string{"--socket", filepath.Join(dir, "nonexistent.sock")}},
		{"--socket", []string{"--socket", file}},
		{"--json", []string{"--json", filepath.Join(missing, "r.json")}},
		{"--json", []string{"--json", dir}},
		{"--plot", []string{"--plot", filepath.Join(missing, "r.png")}},
		{"--redis", []string{"--l3", "redis", "--redis", "127.0.0.1:1"}},
		{"--l3-dir", []string{"--l3", "file", "--l3-dir", filepath.Join(missing, "l3")}},
		{"--l3-dir", []string{"--l3", "file", "--l3-dir", file}},
	} {
		code, out, errs := runCLI(t, "", append([]string{"bench"}, c.args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, c.flag+":") || strings.Contains(errs, "l1-only") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", c.args, code, out, errs)
		}
	}
}

// A bench the user interrupts says "interrupted" and exits 130, not 1 with
// "run l1-only: context canceled".
func TestBenchInterruptedExits130(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"bench", "--clients", "2", "--rounds", "2", "--request-tokens", "256", "--l1-tokens", "2048"},
		strings.NewReader(""), &out, &errb)
	if code != 130 || !strings.HasSuffix(errb.String(), "strata bench: interrupted\n") || strings.Contains(errb.String(), "context canceled") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

// The table explains its columns in two lines under it.
func TestBenchTableHasALegend(t *testing.T) {
	code, out, errs := runCLI(t, "", "bench", "--clients", "2", "--rounds", "2", "--request-tokens", "256",
		"--l1-tokens", "2048", "--runs", "l1-only,ceiling")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"\nverified: hit pages checked byte for byte", "the ceiling keeps keys, not bytes: 0)\nload-back GB/s: "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// bench tiers checks its paths and addresses before the run too.
func TestBenchTiersChecksPathsBeforeTheRun(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--json", []string{"--small", "--json", filepath.Join(dir, "missing", "r.json")}},
		{"--socket", []string{"--backend", "node", "--socket", filepath.Join(dir, "none.sock")}},
		{"--redis", []string{"--backend", "redis", "--redis", "127.0.0.1:1"}},
	} {
		code, out, errs := runCLI(t, "", append([]string{"bench", "tiers"}, c.args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, c.flag+":") || strings.Contains(errs, "put batch") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", c.args, code, out, errs)
		}
	}
}
