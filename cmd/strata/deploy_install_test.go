package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// makeInstall runs the README's install step, `make install`, into a scratch
// DESTDIR and returns the binary it installed: the same command, Makefile and
// default PREFIX an operator uses, so that the unit's ExecStart, the README and
// the Makefile cannot name three different paths.
func makeInstall(t *testing.T) string {
	t.Helper()
	mk := requireTool(t, "make", "make")
	dest := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// OUT: build beside the test, not into the checkout's ./strata.
	cmd := exec.CommandContext(ctx, mk, "-s", "-C", "../..", "install", "DESTDIR="+dest,
		"OUT="+filepath.Join(t.TempDir(), "strata"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install DESTDIR=%s: %v\n%s", dest, err, out)
	}
	bin := filepath.Join(dest, installedBin)
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatalf("make install put no binary where the unit runs it (%s): %v", installedBin, err)
	}
	if st.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s is not executable (%v)", bin, st.Mode())
	}
	return bin
}

// The installed binary is strata: it prints its version and knows serve.
func TestMakeInstallInstallsStrata(t *testing.T) {
	bin := makeInstall(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "strata ") {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	out, err = exec.Command(bin, "serve", "-h").CombinedOutput()
	if !strings.Contains(string(out), "--socket") {
		t.Fatalf("%s serve -h: %v\n%s", bin, err, out)
	}
}
