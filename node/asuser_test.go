package node

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// connectAs opens a socket of domain with effective uid uid and connects it to
// sa, as dialAs does for the node socket (credentials changed on one locked
// OS thread, and changed back before it is unlocked): the service's
// SO_PEERCRED, or the kernel's socket diagnostics for TCP, name that user.
func connectAs(t *testing.T, uid, domain int, sa unix.Sockaddr) net.Conn {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			runtime.UnlockOSThread()
			ch <- result{-1, e}
			return
		}
		fd, err := unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			if err = unix.Connect(fd, sa); err != nil {
				unix.Close(fd)
			}
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			ch <- result{-1, e} // still the other user: the thread exits locked
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	f := os.NewFile(uintptr(r.fd), "as-uid")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// rawAs connects to s's socket as uid, and says Hello when hello is set: a
// connection the test writes frames, or parts of them, to by hand.
func rawAs(t *testing.T, s *Server, uid int, hello bool) net.Conn {
	t.Helper()
	c := connectAs(t, uid, unix.AF_UNIX, &unix.SockaddrUnix{Name: s.Socket()})
	if hello {
		if err := wire.WriteFrame(c, 1, wire.Hello{Version: wire.Version, ClientName: "raw"}); err != nil {
			t.Fatal(err)
		}
		if h, _, err := wire.ReadFrame(c); err != nil || h.Type != wire.TypeHelloReply {
			t.Fatalf("hello as uid %d: %v %v", uid, h.Type, err)
		}
	}
	return c
}

// writeHeader writes only the header of a frame of type typ declaring a body
// of n bytes: the service sees a request whose body has not arrived.
func writeHeader(t *testing.T, c net.Conn, typ wire.Type, id uint64, n uint32) {
	t.Helper()
	h := []byte{wire.Magic[0], wire.Magic[1], wire.Version, byte(typ)}
	h = binary.LittleEndian.AppendUint64(h, id)
	h = binary.LittleEndian.AppendUint32(h, n)
	if _, err := c.Write(h); err != nil {
		t.Fatal(err)
	}
}

// recordingHandler keeps every log record, to count the lines of one kind
// for one user.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// count returns how many records with message msg carry the attribute key
// with the value v.
func (h *recordingHandler) count(msg, key string, v int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key && a.Value.Kind() == slog.KindInt64 && a.Value.Int64() == v {
				n++
			}
			return true
		})
	}
	return n
}
