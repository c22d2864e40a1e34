package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/node"
)

// What an operator installs beside the binary (deploy/): the systemd unit, its
// tmpfiles.d and sysusers.d entries and the example config. The tests read the
// files the repository ships, parse the config with serve's own loader, parse
// the unit's command line with serve's own flags, and hand the files to
// systemd's own tools (systemd-analyze, systemd-tmpfiles, systemd-sysusers).

const (
	deployDir       = "../../deploy"
	unitPath        = deployDir + "/systemd/strata.service"
	tmpfilesPath    = deployDir + "/systemd/strata.tmpfiles.conf"
	sysusersPath    = deployDir + "/systemd/strata.sysusers.conf"
	exampleConfig   = deployDir + "/serve.json"
	installedBin    = "/usr/local/bin/strata"
	installedConfig = "/etc/strata/serve.json"
)

// stopMargin is what TimeoutStopSec must leave beyond the shutdown timeout:
// after requests in flight had their time, the service still writes the
// spill's buffers out and marks the arena file clean.
const stopMargin = 5 * time.Second

// unitFile is a systemd unit: each section's keys and their values, in order
// (a key may repeat).
type unitFile map[string]map[string][]string

// parseUnit reads a unit file as systemd.syntax(7) describes: sections,
// key=value lines, comments (# or ;) and lines continued with a backslash.
func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	section, pending := "", ""
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			pending += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: %q is neither a section nor key=value", path, n, line)
		}
		u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return u
}

// one is the value of a key given once.
func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s: %d values %q, want one", section, key, len(vs), vs)
	}
	return vs[0]
}

// loadServeConfig loads serve's command line args (its --config file, the
// environment, the flags) exactly as `strata serve` does, and validates the
// result.
func loadServeConfig(t *testing.T, args []string) node.Config {
	t.Helper()
	s := newServeSettings()
	fs := newFlagSet("serve", io.Discard)
	given := s.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		t.Fatalf("serve %q: %v", args, err)
	}
	if err := s.load(fs, given()); err != nil {
		t.Fatalf("serve %q with config %s: %v", args, s.config, err)
	}
	if !s.arenaFileSet {
		t.Errorf("%s names no arena-file: a /run without room for the arena would then run it on anonymous memory with a warning, and every restart would be cold; name it so that such a start is refused", s.config)
	}
	if err := s.cfg.Validate(); err != nil {
		t.Fatalf("config %s: %v", s.config, err)
	}
	return s.cfg
}

// unitExec is the unit's ExecStart split into the binary and serve's flags.
func unitExec(t *testing.T, u unitFile) []string {
	t.Helper()
	args := strings.Fields(u.one(t, "Service", "ExecStart"))
	if len(args) < 2 || args[0] != installedBin || args[1] != "serve" {
		t.Fatalf("ExecStart %q: want %s serve ...", args, installedBin)
	}
	return args[2:]
}

// The unit's ExecStart is a command line serve accepts; with the example
// config in place of the installed one it loads and validates; the socket and
// the arena file are in the unit's runtime directory (kept across restarts),
// the spill in its state directory; and the stop timeout leaves the service
// its whole bounded shutdown before systemd's SIGKILL.
func TestDeployUnitRunsTheExampleConfig(t *testing.T) {
	u := parseUnit(t, unitPath)
	args := unitExec(t, u)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := newServeSettings()
	s.flags(fs)
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		t.Fatalf("ExecStart flags %q: %v, left %q", args, err, fs.Args())
	}
	if s.config != installedConfig {
		t.Fatalf("ExecStart --config %q, want %s (where the unit's header installs deploy/serve.json)", s.config, installedConfig)
	}
	for i, a := range args {
		if a == "--config" || a == "-config" {
			args[i+1] = exampleConfig
		}
	}
	cfg := loadServeConfig(t, args)

	runtimeDir := "/run/" + u.one(t, "Service", "RuntimeDirectory")
	if p := u.one(t, "Service", "RuntimeDirectoryPreserve"); p != "yes" {
		t.Errorf("RuntimeDirectoryPreserve=%s: a stop would remove the runtime directory and the arena file in it", p)
	}
	for what, path := range map[string]string{"socket": cfg.Socket, "arena-file": cfg.ArenaFile} {
		if filepath.Dir(path) != runtimeDir {
			t.Errorf("%s %s is not in the unit's RuntimeDirectory %s", what, path, runtimeDir)
		}
	}
	if state := "/var/lib/" + u.one(t, "Service", "StateDirectory"); !strings.HasPrefix(cfg.SpillDir, state+"/") {
		t.Errorf("spill-dir %s is outside the unit's StateDirectory %s, which ProtectSystem=strict leaves writable", cfg.SpillDir, state)
	}
	if cfg.SocketGroup != u.one(t, "Service", "Group") || cfg.SocketMode != 0o660 {
		t.Errorf("socket group %q mode %#o: want the unit's group %q, mode 0660, so engine users in it connect", cfg.SocketGroup, cfg.SocketMode, u.one(t, "Service", "Group"))
	}

	stop, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v (write it with a unit, e.g. 30s)", err)
	}
	if stop < cfg.ShutdownTimeout+stopMargin {
		t.Errorf("TimeoutStopSec=%v, shutdown-timeout %v: systemd would SIGKILL the service before its shutdown ends (want at least %v more)", stop, cfg.ShutdownTimeout, stopMargin)
	}
	if sig := u[("Service")]["KillSignal"]; len(sig) > 0 && sig[0] != "SIGTERM" {
		t.Errorf("KillSignal=%s: serve shuts down cleanly on SIGTERM", sig[0])
	}
	if r := u.one(t, "Service", "Restart"); r != "on-failure" && r != "always" {
		t.Errorf("Restart=%s: a crash must restart the service", r)
	}
	if st := u.one(t, "Service", "RestartPreventExitStatus"); st != strconv.Itoa(exitUsage) {
		t.Errorf("RestartPreventExitStatus=%s: want %d, serve's status for a configuration that cannot work", st, exitUsage)
	}
	for _, key := range []string{"PrivateDevices", "DynamicUser", "RemoveIPC"} {
		if v := u["Service"][key]; len(v) > 0 && v[len(v)-1] != "no" {
			t.Errorf("%s=%s: it removes or hides /dev/shm files, an arena file among them", key, v[len(v)-1])
		}
	}
}

// requireTool finds a system tool; outside CI a machine without it skips,
// under CI=true (where .ci/run installs it) it fails.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (Debian package %s, which .ci/run installs): %v", name, pkg, err)
		}
		t.Skipf("%s is missing (Debian package %s): %v", name, pkg, err)
	}
	return path
}

// systemd-analyze verify accepts the unit as shipped, warnings included, with
// ExecStart on the strata that `make install` installed (into a scratch
// DESTDIR, the unit's path under it); and its offline security review rates
// the hardening "OK" or better.
func TestDeployUnitVerifies(t *testing.T) {
	analyze := requireTool(t, "systemd-analyze", "systemd")
	raw, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	bin := makeInstall(t)
	unit := filepath.Join(t.TempDir(), "strata.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(raw, []byte("ExecStart="+installedBin+" "), []byte("ExecStart="+bin+" ")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", unit).CombinedOutput()
	// verify exits 0 on warnings such as an unknown key: any output is a finding.
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(analyze, "security", "--offline=yes", "--no-pager", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for strata\.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure level:\n%s", out)
	}
	// 0-10, lower is better; systemd calls up to 4.9 "OK", 5-6.9 "MEDIUM".
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level >= 5 {
		t.Errorf("exposure level %.1f, want under 5 (OK):\n%s", level, out)
	}
}

// systemd-sysusers and systemd-tmpfiles, run on a scratch root, create the
// service's user and its runtime directory owned by it, with no age to clean
// it by.
func TestDeployTmpfilesCreateTheRuntimeDirectory(t *testing.T) {
	sysusers := requireTool(t, "systemd-sysusers", "systemd")
	tmpfiles := requireTool(t, "systemd-tmpfiles", "systemd")
	if os.Geteuid() != 0 {
		t.Skip("systemd-tmpfiles chowns what it creates: only root can, even on a scratch root")
	}
	root := t.TempDir()
	// Given --root, the tools read a relative path inside it.
	sysusersConf, err := filepath.Abs(sysusersPath)
	if err != nil {
		t.Fatal(err)
	}
	tmpfilesConf, err := filepath.Abs(tmpfilesPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{sysusers, "--root=" + root, sysusersConf}, {tmpfiles, "--create", "--root=" + root, tmpfilesConf}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v\n%s", c, err, out)
		}
	}
	u := parseUnit(t, unitPath)
	user := u.one(t, "Service", "User")
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	uid := -1
	for _, line := range strings.Split(string(passwd), "\n") {
		if f := strings.Split(line, ":"); len(f) > 2 && f[0] == user {
			uid, _ = strconv.Atoi(f[2])
		}
	}
	if uid < 0 {
		t.Fatalf("systemd-sysusers made no user %q (the unit's User=):\n%s", user, passwd)
	}
	dir := filepath.Join(root, "run", u.one(t, "Service", "RuntimeDirectory"))
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("systemd-tmpfiles did not create the runtime directory: %v", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: mode %v, owner %+v; want 0755, owned by %s (uid %d)", dir, fi.Mode(), fi.Sys(), user, uid)
	}
	// An age would let systemd-tmpfiles --clean (a daily timer) remove an
	// arena file the service has not touched for that long while stopped.
	raw, err := os.ReadFile(tmpfilesPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "/run/"+u.one(t, "Service", "RuntimeDirectory") && (len(f) < 6 || f[5] != "-") {
			t.Errorf("%s: %q gives the runtime directory an age: want \"-\"", tmpfilesPath, line)
		}
	}
}

// The example config run as the unit runs it (serve --config), with its paths
// moved into scratch directories, a small arena and no socket group (the test
// machine has no group strata): SIGTERM ends it with status 0 (a stop systemd
// counts as clean) well within the unit's TimeoutStopSec, and the next start
// on it is warm, every object put before it served again.
func TestDeployExampleConfigStopsCleanAndRestartsWarm(t *testing.T) {
	u := parseUnit(t, unitPath)
	stopTimeout, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(shortDir(t), "s")
	doc["socket"], doc["arena-file"], doc["spill-dir"] = socket, filepath.Join(shmArenaDir(t, 256<<20), "strata.arena"), filepath.Join(t.TempDir(), "spill")
	doc["arena"] = "64MiB"
	delete(doc, "socket-group")
	cfg, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}

	s := startServeOn(t, socket, "--config", path)
	waitReady(t, socket)
	c := newRestartClient(t, socket, "deploy")
	keys := []string{"d0", "d1", "d2", "d3", "d4", "d5"}
	sizes := make([]int, len(keys))
	for i := range keys {
		sizes[i] = objSize(i)
	}
	if acked, err := c.put(keys, sizes); err != nil || len(acked) != len(keys) {
		t.Fatalf("put: %v, %d of %d acknowledged", err, len(acked), len(keys))
	}
	c.drop()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("strata serve did not exit within TimeoutStopSec=%v of SIGTERM: systemd would SIGKILL it; log:\n%s", stopTimeout, s.log.String())
	}
	if s.err != nil {
		t.Fatalf("strata serve exited with %v after SIGTERM: systemd would count the stop as a failure; log:\n%s", s.err, s.log.String())
	}

	startServeOn(t, socket, "--config", path)
	st := waitReady(t, socket)
	if !st.Start.Warm || !st.Start.PreviousClean || st.Start.Recovered != int64(len(keys)) {
		t.Fatalf("restart on the example config: %+v, want warm after a clean stop with %d objects", st.Start, len(keys))
	}
	found, wrong, err := c.get(keys, sizes)
	for i, f := range found {
		if !f {
			t.Errorf("%s is not served after the restart", keys[i])
		}
	}
	if err != nil || len(wrong) > 0 {
		t.Fatalf("get after the restart: %v, wrong bytes in %q", err, wrong)
	}
}
