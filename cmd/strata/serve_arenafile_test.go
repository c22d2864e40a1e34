package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// The arena file's path, as `strata serve` meets it: a file or directory
// another user made, a truncation while it serves, a full tmpfs at the start.

// An arena file or directory that another user made or can change is a
// configuration error (exit 2, which systemd does not retry), with the fix in
// the message; nothing in the file is used.
func TestServeArenaFileNotOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test chowns files to another user: run it as root")
		}
		t.Skip("this test chowns files to another user: run it as root")
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir string) string
		want  []string
	}{
		{"a file of another user", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "a")
			if err := os.WriteFile(p, []byte("STRATAAR and whatever they like"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return p
		}, []string{"belongs to uid 65534", "remove it"}},
		{"a directory all can write", func(t *testing.T, dir string) string {
			d := filepath.Join(dir, "open")
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(d, 0o777); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "sub", "a") // serve creates sub; the directory above it is refused
		}, []string{"mode 0777", "chmod go-w"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := c.setup(t, shmArenaDir(t, 64<<20))
			before, _ := os.ReadFile(file)
			s := spawnServe(t, filepath.Join(shortDir(t), "s"), "--arena", "16MiB", "--arena-file", file)
			select {
			case <-s.exited:
			case <-time.After(60 * time.Second):
				t.Fatalf("strata serve did not exit; log:\n%s", s.log.String())
			}
			var ee *exec.ExitError
			if !errors.As(s.err, &ee) || ee.ExitCode() != exitUsage {
				t.Fatalf("exit %v, want %d; log:\n%s", s.err, exitUsage, s.log.String())
			}
			for _, w := range append(c.want, "--arena-file") {
				if !strings.Contains(s.log.String(), w) {
					t.Errorf("the error does not say %q:\n%s", w, s.log.String())
				}
			}
			if after, _ := os.ReadFile(file); string(after) != string(before) {
				t.Fatal("the refused file was changed")
			}
		})
	}
}

// A service whose arena file is truncated under it keeps serving: what the
// arena held is a miss, a put fails saying why, one log line tells the
// operator, SIGTERM ends it cleanly, and the next start formats the file anew.
func TestServeArenaFileTruncated(t *testing.T) {
	const obj = 64 << 10
	file := filepath.Join(shmArenaDir(t, 64<<20), "a")
	socket := filepath.Join(shortDir(t), "s")
	args := []string{"--arena", "32MiB", "--arena-file", file, "--spill-dir", t.TempDir()}
	s := startServeOn(t, socket, args...)
	c := dialWire(t, socket, 2*obj)
	for i, k := range []string{"a", "b", "c"} {
		c.mem[0] = byte(i)
		if r := c.call(wire.TypePut, wire.Put{Items: []wire.Item{c.item(k, 0, obj)}}).(*wire.BatchReply).Results[0]; r.Status != wire.OK {
			t.Fatalf("put %s: %+v", k, r)
		}
	}
	if err := os.Truncate(file, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(s.log.String(), "arena broken") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line says the arena broke:\n%s", s.log.String())
		}
		time.Sleep(time.Millisecond)
	}
	if r := c.call(wire.TypeGet, wire.Get{Items: []wire.Item{c.item("a", obj, obj)}}).(*wire.BatchReply).Results[0]; r.Status != wire.NotFound {
		t.Fatalf("get of an object the truncation took: %+v", r)
	}
	r := c.call(wire.TypePut, wire.Put{Items: []wire.Item{c.item("d", 0, obj)}}).(*wire.BatchReply).Results[0]
	if r.Status == wire.OK || !strings.Contains(r.Message, "arena memory is gone") {
		t.Fatalf("put into a broken arena: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := fetchStats(ctx, socket); err != nil {
		t.Fatalf("stats of the service with a broken arena: %v", err)
	}
	if n := strings.Count(s.log.String(), "arena broken"); n != 1 {
		t.Fatalf("%d log lines say the arena broke:\n%s", n, s.log.String())
	}
	s.stop(t, syscall.SIGTERM)

	again := startServeOn(t, socket, args...)
	if !strings.Contains(again.log.String(), "it is a new arena file") {
		t.Fatalf("the restart did not format the file anew:\n%s", again.log.String())
	}
	d := dialWire(t, socket, 2*obj)
	if r := d.call(wire.TypePut, wire.Put{Items: []wire.Item{d.item("e", 0, obj)}}).(*wire.BatchReply).Results[0]; r.Status != wire.OK {
		t.Fatalf("put after the restart: %+v", r)
	}
	if r := d.call(wire.TypeGet, wire.Get{Items: []wire.Item{d.item("e", obj, obj)}}).(*wire.BatchReply).Results[0]; r.Status != wire.OK {
		t.Fatalf("get after the restart: %+v", r)
	}
}

// A full tmpfs at the start is not a configuration error (exit 2, never
// retried by systemd): the service starts, its arena anonymous memory for
// this run, and says so.
func TestServeArenaFileOnAFullTmpfs(t *testing.T) {
	dir := filepath.Join(shmArenaDir(t, 64<<20), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): needs CAP_SYS_ADMIN", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "someone-else"))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(unix.Fallocate(int(f.Fd()), 0, 0, int64(fs.Bavail)*fs.Bsize), f.Close()); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(shortDir(t), "s")
	s := startServeOn(t, socket, "--arena", "16MiB", "--arena-file", filepath.Join(dir, "a"))
	if !strings.Contains(s.log.String(), "this run's arena is anonymous memory") {
		t.Fatalf("no warning that the arena is anonymous:\n%s", s.log.String())
	}
	c := dialWire(t, socket, 2<<20)
	if r := c.call(wire.TypePut, wire.Put{Items: []wire.Item{c.item("k", 0, 1<<20)}}).(*wire.BatchReply).Results[0]; r.Status != wire.OK {
		t.Fatalf("put: %+v", r)
	}
}
