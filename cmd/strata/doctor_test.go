package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"

	"github.com/stratakv/strata/hostmem"
)

// skipUnlessCI skips the test with reason, or fails it under CI=true, where
// everything it needs is installed.
func skipUnlessCI(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason + " (CI=true: this test must run)")
	}
	t.Skip(reason)
}

// runDoctorCLI runs strata doctor and returns its exit status and output.
func runDoctorCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, append([]string{"doctor"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String() + errb.String()
}

// The arena a fix line proposes fits the machine it is proposed on: a 23 GiB
// machine is not told 64 GiB, a container's 64 MiB /dev/shm does not shrink
// it, and what is proposed passes strata serve's own checks.
func TestDoctorProposesAnArenaThatFits(t *testing.T) {
	const gib, mib = int64(1) << 30, int64(1) << 20
	for _, c := range []struct {
		name     string
		room     machineRoom
		want     string
		withFile bool
	}{
		{"23 GiB available, /dev/shm half the RAM", machineRoom{23 * gib, 15 * gib}, "11GiB", true},
		{"a large machine", machineRoom{500 * gib, 250 * gib}, "64GiB", true},
		{"/dev/shm smaller than half", machineRoom{100 * gib, 20 * gib}, "19GiB", true},
		{"a container's 64 MiB /dev/shm", machineRoom{23 * gib, 64 * mib}, "11GiB", false},
		{"no /dev/shm", machineRoom{23 * gib, -1}, "11GiB", false},
		{"3 GiB available", machineRoom{3 * gib, 8 * gib}, "1GiB", true},
		{"1.5 GiB available: 1 GiB would be refused", machineRoom{3 * gib / 2, 8 * gib}, "512MiB", true},
		{"nothing read", machineRoom{0, -1}, "64MiB", false},
	} {
		arena, withFile := proposedArena(c.room)
		if got := hostmem.FormatSize(arena); got != c.want || withFile != c.withFile {
			t.Errorf("%s: proposed %s (arena file %v), want %s (%v)", c.name, got, withFile, c.want, c.withFile)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		r := machineRoom{rapid.Int64Range(0, 4<<40).Draw(t, "avail"), rapid.Int64Range(-1, 4<<40).Draw(t, "shm")}
		arena, withFile := proposedArena(r)
		switch {
		case arena > 64<<30 || arena < 64<<20:
			t.Fatalf("%s is outside [64 MiB, 64 GiB]", hostmem.FormatSize(arena))
		case arena >= gib && arena%gib != 0, arena%(64*mib) != 0:
			t.Fatalf("%d is not in whole GiB (or 64 MiB steps below 1 GiB)", arena)
		case r.AvailBytes >= serveReserve+64*mib && arena > r.AvailBytes-serveReserve:
			t.Fatalf("%s leaves less than strata serve's 1 GiB reserve of %d available", hostmem.FormatSize(arena), r.AvailBytes)
		case arena > max(r.AvailBytes/2, 64*mib):
			t.Fatalf("%s is more than half of %d available", hostmem.FormatSize(arena), r.AvailBytes)
		case withFile && arena+arena/1024+arenaFileHeader > r.ShmFreeBytes:
			t.Fatalf("an arena file of %s does not fit the %d free on /dev/shm", hostmem.FormatSize(arena), r.ShmFreeBytes)
		}
		if got, err := parseBytes(hostmem.FormatSize(arena)); err != nil || got != arena {
			t.Fatalf("--arena %s reads back as %d, %v", hostmem.FormatSize(arena), got, err)
		}
	})
}

// startDoctorServe starts a strata serve for the doctor to check, on a socket
// in dir (made 0755 so another user can reach the socket, as /run/strata is).
func startDoctorServe(t *testing.T, dir string) string {
	t.Helper()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	strataProcess(t, "serve", "--socket", sock, "--arena", "64MiB", "--arena-file", "", "--admin", "", "--log-level", "error")
	waitStats(t, sock, "listening", func(statsView) bool { return true })
	return sock
}

// The doctor against a real strata serve: every check passes, for both
// engines, and it prints the flags that load each plugin.
func TestDoctorPassesAgainstARealServe(t *testing.T) {
	sock := startDoctorServe(t, shortDir(t))
	code, out := runDoctorCLI(t, "--socket", sock, "--timeout", "10s")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"ok    " + sock + " is a socket this user may connect to",
		"ok    the node service answers",
		"ok    a call that times out is never copied afterwards",
		"ok    a shm host pool built the way SGLang builds it (an unsealed memfd) registers",
		"ok    a CPU-tier file built the way vLLM builds its rows (a 0600 file on /dev/shm) registers",
		"ok    a put/get round trip through SGLang's memory returns the same bytes",
		"ok    a put/get round trip through vLLM's memory returns the same bytes",
		"Start SGLang with:\n  " + sglangFlags(sock),
		"Start vLLM with:\n  " + vllmFlags(sock),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("a check failed:\n%s", out)
	}
	code, out = runDoctorCLI(t, "--socket", sock, "--engine", "vllm")
	if code != 0 || strings.Contains(out, "SGLang") || !strings.Contains(out, "Start vLLM with") {
		t.Errorf("--engine vllm: exit %d:\n%s", code, out)
	}
}

// Each way the doctor fails prints FAIL and a fix that fits, exits 1, and
// takes seconds, not the engine's start-up.
func TestDoctorFailuresSayTheFix(t *testing.T) {
	dir := shortDir(t)
	small := machineRoom{AvailBytes: 23 << 30, ShmFreeBytes: -1}
	check := func(name, sock string, timeout time.Duration, room machineRoom, wants ...string) {
		t.Helper()
		var out bytes.Buffer
		d := &doctor{w: &out, socket: sock, timeout: timeout, engines: doctorEngines, room: func() machineRoom { return room }}
		t0 := time.Now()
		err := d.run(context.Background())
		if !errorsIs(err, errCheckFailed) {
			t.Errorf("%s: got %v, want errCheckFailed:\n%s", name, err, out.String())
		}
		if took := time.Since(t0); took > timeout+5*time.Second {
			t.Errorf("%s: took %v", name, took)
		}
		for _, w := range append([]string{"FAIL  ", "\n      fix: "}, wants...) {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: the output lacks %q:\n%s", name, w, out.String())
			}
		}
	}
	missing := filepath.Join(dir, "none.sock")
	check("no socket", missing, 5*time.Second, small,
		"no socket at "+missing, "strata serve --socket "+missing+" --arena 11GiB (or pass")
	check("no socket, /dev/shm with room", missing, 5*time.Second, machineRoom{23 << 30, 15 << 30},
		"--arena 11GiB --arena-file /dev/shm/strata/strata.arena")
	// The CLI proposes what this machine has.
	code, out := runDoctorCLI(t, "--socket", missing)
	arena, _ := proposedArena(readMachineRoom())
	if code != 1 || !strings.Contains(out, "--arena "+hostmem.FormatSize(arena)) {
		t.Errorf("no socket through the CLI: exit %d, want 1 and --arena %s:\n%s", code, hostmem.FormatSize(arena), out)
	}

	// A socket file with nothing listening: the service crashed.
	stale := filepath.Join(dir, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(fd)
	check("stale socket", stale, 5*time.Second, small, "nothing listens on "+stale, "outlived its service", "--arena 11GiB")

	// Something accepts (the kernel's backlog) and never answers: a stopped service.
	hung := filepath.Join(dir, "hung.sock")
	lfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrUnix{Name: hung}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 4); err != nil {
		t.Fatal(err)
	}
	check("hung service", hung, time.Second, small, "did not answer within 1s", "stopped (SIGSTOP")

	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check("not a socket", plain, time.Second, small, plain+" is a regular file, not a socket")

	for _, args := range [][]string{{"--engine", "trtllm"}, {"--timeout", "0s"}, {"--sockett", "x"}, {"extra"}} {
		if code, out := runDoctorCLI(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2:\n%s", args, code, out)
		}
	}
}

// A user the socket's mode keeps out is told how to let the engine in. As
// root (whom modes do not stop) the doctor runs as nobody; otherwise the
// socket is made 0000.
func TestDoctorPermissionProblem(t *testing.T) {
	dir := shortDir(t)
	sock := startDoctorServe(t, dir)
	var code int
	var out string
	if os.Getuid() == 0 {
		// The test binary stands in for strata; nobody must be able to run it.
		bin := filepath.Join(dir, "strata")
		if err := copyFile(os.Args[0], bin); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "doctor", "--socket", sock, "--timeout", "5s")
		cmd.Env = append(os.Environ(), "STRATA_TEST_AS_MAIN=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		b, err := cmd.CombinedOutput()
		if _, exited := err.(*exec.ExitError); err != nil && !exited {
			skipUnlessCI(t, "cannot run the doctor as nobody (uid 65534): "+err.Error())
		}
		code, out = cmd.ProcessState.ExitCode(), string(b)
	} else {
		if err := os.Chmod(sock, 0); err != nil {
			t.Fatal(err)
		}
		code, out = runDoctorCLI(t, "--socket", sock)
	}
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	for _, w := range []string{"FAIL  this user (uid", "may not connect to " + sock, "mode 0", "--socket-mode 0660 --socket-group GROUP"} {
		if !strings.Contains(out, w) {
			t.Errorf("the output lacks %q:\n%s", w, out)
		}
	}
}

// copyFile copies src to dst, executable by everyone.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The flags strata doctor prints are the Python doctors' (one source of
// truth: python/strata_sglang/doctor.py and python/strata_vllm/doctor.py),
// and so is the arena its fix lines propose (python/strata_client/doctor.py).
func TestDoctorAgreesWithThePythonDoctors(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		skipUnlessCI(t, "no python3 to compare the engines' flags with the Python doctors'")
	}
	sock := "/run/strata/a b&<c>.sock"
	code := `import sys
sys.path.insert(0, sys.argv[1])
from strata_client.doctor import format_arena, proposed_arena
from strata_sglang.doctor import sglang_flags
from strata_vllm.doctor import kv_transfer_config
print(sglang_flags(sys.argv[2]))
print(kv_transfer_config(sys.argv[2]))
for line in sys.stdin:
    arena, f = proposed_arena(*map(int, line.split()))
    print(format_arena(arena), f)`
	repo, _ := filepath.Abs("../..")
	cmd := exec.Command(py, "-c", code, filepath.Join(repo, "python"), sock)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	want := sglangFlags(sock) + "\n" + vllmFlags(sock) + "\n"
	var rooms strings.Builder
	for _, avail := range []int64{0, 1 << 30, 3 << 29, 2 << 30, 3 << 30, 23<<30 + 12345, 100 << 30, 200 << 30, 1 << 40} {
		for _, shm := range []int64{-1, 0, 64 << 20, 1<<30 + 8<<20, 2 << 30, 15 << 30, 1 << 40} {
			fmt.Fprintf(&rooms, "%d %d\n", avail, shm)
			arena, withFile := proposedArena(machineRoom{avail, shm})
			want += fmt.Sprintf("%s %s\n", hostmem.FormatSize(arena), map[bool]string{true: "True", false: "False"}[withFile])
		}
	}
	cmd.Stdin = strings.NewReader(rooms.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	if string(out) != want {
		t.Errorf("the Python doctors print\n%s\nstrata doctor prints\n%s", out, want)
	}
}
