package wire

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListenDial(t *testing.T) {
	path := filepath.Join(t.TempDir(), "strata.sock")
	l, err := Listen(path, 0, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file mode %v, want a socket with 0600", fi.Mode())
	}

	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		uc, err := l.AcceptUnix()
		if err != nil {
			done <- err
			return
		}
		s := NewConn(uc)
		defer s.Close()
		pid, uid, _, err := s.PeerCred()
		if err != nil || pid != os.Getpid() || uid != os.Getuid() {
			done <- errors.New("server sees the wrong peer")
			return
		}
		h, m, _, err := s.Recv(ctx)
		if err != nil {
			done <- err
			return
		}
		done <- s.Send(ctx, TypePong, h.ID, &Pong{Nonce: m.(*Ping).Nonce})
	}()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(ctx, TypePing, 42, &Ping{Nonce: 7}); err != nil {
		t.Fatal(err)
	}
	h, m, _, err := c.Recv(ctx)
	if err != nil || h.Type != TypePong || h.ID != 42 || m.(*Pong).Nonce != 7 {
		t.Fatalf("reply %+v %+v %v", h, m, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A second service on the same path is refused, and the first keeps its socket.
	if _, err := Listen(path, 0, -1); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Listen: %v, want ErrInUse", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatal("the live socket file was removed")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after Close: %v", err)
	}
	if _, err := Dial(ctx, path); err == nil {
		t.Fatal("Dial succeeded with no service")
	}
}

func TestListenMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode %v, %v; want 0660", fi.Mode(), err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	// A service that died: its socket file is left, nobody listens.
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal("stale socket not left behind")
	}
	l, err := Listen(path, 0, -1)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer l.Close()
	c, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestListenKeepsOtherFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, 0, -1); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen over a regular file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "data" {
		t.Fatal("the regular file was touched")
	}
}

func TestListenBadPaths(t *testing.T) {
	for _, p := range []string{"", "@abstract", "/tmp/" + strings.Repeat("x", 120)} {
		if _, err := Listen(p, 0, -1); err == nil {
			t.Errorf("Listen(%q) succeeded", p)
		}
	}
	if _, err := Listen(filepath.Join(t.TempDir(), "no", "such", "dir", "s"), 0, -1); err == nil {
		t.Error("Listen in a missing directory succeeded")
	}
}
