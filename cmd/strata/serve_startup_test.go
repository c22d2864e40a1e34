package main

import (
	"bytes"
	"context"
	"golang.org/x/sys/unix"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/spill"
)

// syncBuffer is a bytes.Buffer a running command writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runServeCLI runs `strata serve args` expecting it to refuse to start: should
// it start instead, it is stopped after a while and exits 0, failing the test
// rather than hanging it.
func runServeCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--admin") }) {
		// Not the fixed default port, which another test may hold.
		args = append([]string{"--admin", ""}, args...)
	}
	code := run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), &out, &errb)
	return code, errb.String()
}

// The socket's directory is created (0755) as a daemon's runtime directory is:
// the default /run/strata/strata.sock needs /run/strata.
func TestServeCreatesSocketDirectory(t *testing.T) {
	dir := filepath.Join(shortDir(t), "run", "strata")
	sock := filepath.Join(dir, "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--socket", sock, "--arena", "8MiB", "--admin", ""}, strings.NewReader(""), &out, &errs)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "strata serve: socket") {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before listening; stderr:\n%s", code, errs.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("serve did not start within 60 s; stderr:\n%s", errs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("socket directory: %v, mode %v; want 0755", err, fi.Mode())
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("socket %s: %v", sock, err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d after the signal; stderr:\n%s", code, errs.String())
	}
}

// A socket another service answers on is refused before the arena is mapped:
// with an arena this machine cannot map, the error is the socket's.
func TestServeSocketInUseRefusedBeforeArena(t *testing.T) {
	sock := filepath.Join(shortDir(t), "s.sock")
	cfg := node.DefaultConfig(sock)
	cfg.ArenaBytes, cfg.Admin = 8<<20, ""
	srv, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	code, errs := runServeCLI(t, "--socket", sock, "--arena", "1TiB", "--admin", "")
	if code == 0 || !strings.Contains(errs, "in use") || !strings.Contains(errs, "--socket") || strings.Contains(errs, "arena") {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
}

// unwritableDir returns a directory this process cannot create files in.
func unwritableDir(t *testing.T) string {
	t.Helper()
	dir := "/sys/kernel" // root ignores permission bits; sysfs refuses new files
	if os.Getuid() != 0 {
		dir = filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(dir, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.CreateTemp(dir, "probe")
	if err == nil {
		f.Close()
		os.Remove(f.Name())
		t.Skipf("%s is writable here", dir)
	}
	return dir
}

// A spill directory the service cannot write (or create) is refused at start,
// with the reason, before the arena is mapped: not accepted and then logged
// once per evicted object.
func TestServeRefusesUnusableSpillDir(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, reason string }{
		{unwritableDir(t), "not writable"},
		{filepath.Join(notDir, "spill"), "cannot create it"},
	} {
		sock := filepath.Join(shortDir(t), "s.sock")
		code, errs := runServeCLI(t, "--socket", sock, "--spill-dir", c.dir, "--arena", "1TiB", "--admin", "")
		if code != 2 || !strings.Contains(errs, c.reason) || !strings.Contains(errs, "--spill-dir") || strings.Contains(errs, "arena") {
			t.Errorf("--spill-dir %s: exit %d, stderr:\n%s", c.dir, code, errs)
		}
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("--spill-dir %s: the socket was created (%v)", c.dir, err)
		}
	}
}

// loadConfigFile loads a config file holding doc through the serve settings.
func loadConfigFile(t *testing.T, doc string, args ...string) (node.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newServeSettings()
	fs := newFlagSet("serve", io.Discard)
	given := s.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	s.config = path
	err := s.load(fs, given())
	return s.cfg, err
}

// A config file takes the JSON types a person writes: arrays for lists, numbers,
// booleans, sizes as strings or numbers of bytes.
func TestServeConfigFileTypes(t *testing.T) {
	c, err := loadConfigFile(t, `{"remote": ["a:1", "b:2"], "arena": "8MiB", "spill-capacity": 1048576, "max-clients": 7,
		"high-watermark": 0.8, "low-watermark": 0.5, "remote-tls": true, "hello-timeout": "3s", "socket-mode": "0660",
		"tenant-groups": [[1000, 1001], [2000]], "log-level": "debug", "admin": ""}`)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !slices.Equal(c.RemoteAddrs, []string{"a:1", "b:2"}):
		t.Errorf("remote %q, want two addresses", c.RemoteAddrs)
	case c.ArenaBytes != 8<<20 || c.SpillBytes != 1<<20:
		t.Errorf("arena %d, spill capacity %d", c.ArenaBytes, c.SpillBytes)
	case c.MaxClients != 7 || c.HighWatermark != 0.8 || c.LowWatermark != 0.5:
		t.Errorf("max clients %d, watermarks %v %v", c.MaxClients, c.HighWatermark, c.LowWatermark)
	case !c.RemoteTLS || c.HelloTimeout != 3*time.Second || c.SocketMode != 0o660 || c.Admin != "":
		t.Errorf("tls %v, hello timeout %v, socket mode %#o, admin %q", c.RemoteTLS, c.HelloTimeout, c.SocketMode, c.Admin)
	case len(c.TenantGroups) != 2 || !slices.Equal(c.TenantGroups[0], []int{1000, 1001}) || !slices.Equal(c.TenantGroups[1], []int{2000}):
		t.Errorf("tenant groups %v", c.TenantGroups)
	}
	// A switch given alone on the command line is on; the flag wins over the file.
	c, err = loadConfigFile(t, `{"remote-tls": false, "remote": "a:1, b:2"}`, "--remote-tls")
	if err != nil || !c.RemoteTLS || !slices.Equal(c.RemoteAddrs, []string{"a:1", "b:2"}) {
		t.Errorf("--remote-tls over the file: %v, tls %v, remote %q", err, c.RemoteTLS, c.RemoteAddrs)
	}
}

// A config file with a value of the wrong type, or an unknown key, is refused
// with what the key takes (or the known keys), through the command line.
func TestServeConfigFileRefusals(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"remote": [1, 2]}`, `"remote" is item 0 is a number; want an array of strings`},
		{`{"remote": ["a:1,b:2"]}`, "one address per item"},
		{`{"hello-timeout": 10}`, `"hello-timeout" is 10 is a number; give a duration as a string`},
		{`{"arena": true}`, `"arena" is a boolean; want a size`},
		{`{"max-clients": [1]}`, `"max-clients" is an array; want an integer`},
		{`{"remote-tls": "maybe"}`, `"remote-tls": "maybe" is not true or false`},
		{`{"spill-dir": null}`, "leave the key out"},
		{`{"arenas": "4GiB"}`, `unknown key "arenas" (the keys are the flags' names: admin, admin-stats, arena,`},
	} {
		path := filepath.Join(t.TempDir(), "serve.json")
		if err := os.WriteFile(path, []byte(c.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		code, errs := runServeCLI(t, "--config", path, "--socket", filepath.Join(shortDir(t), "s.sock"), "--arena", "8MiB", "--admin", "")
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %q", c.doc, code, errs, c.want)
		}
	}
}

// serve -h shows each flag's type and default.
func TestServeHelpShowsTypesAndDefaults(t *testing.T) {
	code, errs, _ := runCLI(t, "", "serve", "-h")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"--arena size\n", "(default 4GiB)", "--max-clients int\n", "(default 256)", "--hello-timeout duration\n", "(default 10s)",
		"--remote-tls bool\n", "--high-watermark number\n", "(default 0.9)", "--socket-mode mode\n", "(default 0600)",
		"(default /run/strata/strata.sock)", "--remote list\n", "(env STRATA_ARENA)",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("help lacks %q:\n%s", want, errs)
		}
	}
}

// Configuration errors name the flag to fix, not node.Config's fields.
func TestServeConfigErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--arena", "1KiB"}, "--arena"},
		{[]string{"--low-watermark", "0.95"}, "--low-watermark"},
		{[]string{"--copy-workers", "0"}, "--copy-workers"},
		{[]string{"--admin", "10.1.2.3:0"}, "--admin"},
	} {
		args := append([]string{"--socket", filepath.Join(shortDir(t), "s.sock"), "--admin", "127.0.0.1:0"}, c.args...)
		code, errs := runServeCLI(t, args...)
		if code != 2 || !strings.Contains(errs, c.want) || strings.Contains(errs, "Config.") {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, errs)
		}
	}
}

// The text output shows the spill's failures, as --json does.
func TestInspectTextShowsSpillErrors(t *testing.T) {
	var st node.Stats
	st.Spill = &spill.Stats{CapacityBytes: 1 << 30, Faults: map[string]int64{"io": 2, "timeout": 0}}
	st.Ops.SpillErrors = 3
	var b bytes.Buffer
	if err := writeInspect(&b, st); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "3 failed writes") || !strings.Contains(out, "faults: io 2") || strings.Contains(out, "timeout") {
		t.Fatalf("inspect text:\n%s", out)
	}
}

// A client of another user than the service's sees its own tenant's clients
// only, and the text output says so.
func TestInspectTextSaysWhenItShowsOneTenant(t *testing.T) {
	for _, c := range []struct {
		scope string
		want  bool
	}{{node.ScopeTenant, true}, {node.ScopeService, false}} {
		var b bytes.Buffer
		if err := writeInspect(&b, node.Stats{Scope: c.scope, ClientCount: 1}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.String(), "clients of your tenant only (1)"); got != c.want {
			t.Errorf("scope %s: tenant line shown %v, want %v:\n%s", c.scope, got, c.want, b.String())
		}
	}
}

// One rule for exit statuses (exitUsage): a configuration that cannot work
// here exits 2, whether the flag is malformed or what it names is taken or too
// big. A socket in use, a spill directory another service holds, an arena the
// machine cannot give and an arena file off tmpfs used to exit 1, a spill
// directory that is a file 2.
func TestServeConfigurationErrorsExit2(t *testing.T) {
	busy := filepath.Join(shortDir(t), "s.sock")
	spillDir := t.TempDir()
	cfg := node.DefaultConfig(busy)
	cfg.ArenaBytes, cfg.Admin, cfg.ArenaFile, cfg.SpillDir = 8<<20, "", "", spillDir
	srv, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"socket in use", []string{"--socket", busy}, "--socket"},
		{"spill directory in use", []string{"--spill-dir", spillDir}, "--spill-dir"},
		{"arena too big", []string{"--arena", "1PiB"}, "--arena"},
		{"arena file off tmpfs", []string{"--arena-file", filepath.Join(diskDir(t), "arena")}, "--arena-file"},
	} {
		if c.name == "arena file off tmpfs" && c.args[1] == "arena" {
			continue // no disk here (diskDir said so)
		}
		args := append([]string{"--socket", filepath.Join(shortDir(t), "s.sock"), "--arena", "8MiB", "--arena-file", "", "--admin", ""}, c.args...)
		code, errs := runServeCLI(t, args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, want 2 naming %s; stderr:\n%s", c.name, code, c.want, errs)
		}
	}
}

// diskDir is a temporary directory on a disk file system (not tmpfs), beside
// the test's package (the temporary directory may be a tmpfs), or "" when
// that is no disk either.
func diskDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(".", "disk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		t.Logf("no disk file system beside the package (%v): the arena-file case is left out", err)
		return ""
	}
	abs, _ := filepath.Abs(dir)
	return abs
}
