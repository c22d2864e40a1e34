package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// One exit rule for every command (see exitUsage): what cannot work as given
// exits 2 with one line on stderr that names the command and the flag, and it
// is refused before any work (nothing on stdout); what ran and failed exits 1.
// Each command's ways to fail are listed here, so a new flag that fails late
// or with the wrong status shows as a named row.
func TestExitRuleEveryCommand(t *testing.T) {
	dir := shortDir(t)
	none := filepath.Join(dir, "none.sock")
	cases := []struct {
		name  string
		stdin string
		args  []string
		code  int
		says  []string // each in stderr's one line
	}{
		{"no command", "", nil, 2, []string{"usage: strata"}},
		{"unknown command", "", []string{"serv"}, 2, []string{`unknown command "serv"`}},
		{"unknown flag", "", []string{"serve", "--arean", "1GiB"}, 2, []string{"strata serve:", "-arean"}},
		{"serve arena zero", "", []string{"serve", "--socket", filepath.Join(dir, "a.sock"), "--admin", "", "--arena", "0"}, 2, []string{"strata serve:", "arena"}},
		{"serve admin not loopback", "", []string{"serve", "--socket", filepath.Join(dir, "b.sock"), "--admin", "10.1.2.3:9470"}, 2, []string{"--admin", "loopback"}},
		{"serve bad admin address", "", []string{"serve", "--socket", filepath.Join(dir, "c.sock"), "--admin", "9470"}, 2, []string{"--admin"}},
		// /proc takes no socket: bind fails as in a read-only directory.
		{"serve socket dir unwritable", "", []string{"serve", "--socket", "/proc/strata-test.sock", "--admin", "", "--arena", "8MiB", "--arena-file", ""}, 2,
			[]string{"strata serve:", "/proc/strata-test.sock", "choose a socket path in a directory it can write"}},
		{"serve socket path is a file", "", []string{"serve", "--socket", writeFile(t, dir, "plain"), "--admin", "", "--arena", "8MiB", "--arena-file", ""}, 2,
			[]string{"is not a socket", "choose another path"}},
		{"serve socket path too long", "", []string{"serve", "--socket", filepath.Join(dir, strings.Repeat("x", 120)+".sock"), "--admin", "", "--arena", "8MiB", "--arena-file", ""}, 2,
			[]string{"--socket", "at most 107"}},
		{"serve config missing", "", []string{"serve", "--config", filepath.Join(dir, "nope.json")}, 2, []string{"strata serve:", "nope.json"}},
		{"inspect timeout", "", []string{"inspect", "--socket", none, "--timeout", "0s"}, 2, []string{"strata inspect:", "--timeout"}},
		{"inspect no service", "", []string{"inspect", "--socket", none}, 1, []string{"strata inspect:", "strata serve --socket " + none}},
		{"keys bad token", "a b", []string{"keys"}, 2, []string{"strata keys:", `"a"`}},
		{"keys bad page size", "1 2", []string{"keys", "--page-size", "0"}, 2, []string{"strata keys:", "page-size"}},
		{"version argument", "", []string{"version", "extra"}, 2, []string{"strata version:", `"extra"`}},
		{"bench nodes", "", []string{"bench", "--nodes", "0"}, 2, []string{"strata bench:", "--nodes 0"}},
		{"bench node arena too big", "", []string{"bench", "--node-arena", "64TiB"}, 2, []string{"strata bench:", "--node-arena"}},
		{"bench json unwritable", "", []string{"bench", "--json", "/proc/strata-test.json"}, 2, []string{"strata bench:", "--json"}},
		{"bench tiers flag", "", []string{"bench", "tiers", "--bogus"}, 2, []string{"strata bench tiers:", "-bogus"}},
		{"bench matrix flag", "", []string{"bench", "matrix", "--bogus"}, 2, []string{"strata bench matrix:", "-bogus"}},
		{"doctor flag", "", []string{"doctor", "--bogus"}, 2, []string{"strata doctor:", "-bogus"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, c.stdin, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.code, errs)
			}
			if c.code == exitUsage && out != "" {
				t.Errorf("refused after printing to stdout (work began before the check):\n%s", out)
			}
			if c.args != nil && strings.Count(strings.TrimRight(errs, "\n"), "\n") > 0 {
				t.Errorf("stderr is not one line:\n%s", errs)
			}
			for _, s := range c.says {
				if !strings.Contains(errs, s) {
					t.Errorf("stderr does not say %q:\n%s", s, errs)
				}
			}
		})
	}
}

func writeFile(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// strata serve stopped by Ctrl-C exits 130, as every command interrupted
// does; stopped by its service manager (SIGTERM) it exits 0, a clean stop.
func TestServeExitOnSignals(t *testing.T) {
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, exitInterrupted}, {syscall.SIGTERM, 0}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			sock := filepath.Join(shortDir(t), "s.sock")
			cmd := strataProcess(t, "serve", "--socket", sock, "--admin", "", "--arena", "8MiB", "--arena-file", "", "--log-level", "error")
			deadline := time.Now().Add(20 * time.Second)
			for {
				if fi, err := os.Lstat(sock); err == nil && fi.Mode().Type() == os.ModeSocket {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("serve did not listen on %s within 20 s", sock)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("serve did not exit within 30 s of %v", c.sig)
			}
			if got := cmd.ProcessState.ExitCode(); got != c.code {
				t.Errorf("exit %d after %v, want %d", got, c.sig, c.code)
			}
		})
	}
}
