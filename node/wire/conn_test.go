package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// memfd returns a sealed memfd of size bytes, closed when the test ends.
func memfd(t testing.TB, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("strata-wire-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func sameFile(t testing.TB, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func TestConnRoundTrip(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	seg := memfd(t, 1<<20)
	if _, err := unix.Pwrite(seg, []byte("hello segment"), 4096); err != nil {
		t.Fatal(err)
	}
	msgs := samples()
	// Pipelined: every frame sent before any is read.
	for i, m := range msgs {
		var fds []int
		if m.Type() == TypeRegisterSegment {
			fds = []int{seg}
		}
		if err := a.Send(ctx, m.Type(), uint64(1000+i), m, fds...); err != nil {
			t.Fatalf("send %s: %v", m.Type(), err)
		}
	}
	for i, want := range msgs {
		h, got, fds, err := b.Recv(ctx)
		if err != nil {
			t.Fatalf("recv %s: %v", want.Type(), err)
		}
		if h.Type != want.Type() || h.ID != uint64(1000+i) {
			t.Fatalf("header %+v for %s id %d", h, want.Type(), 1000+i)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", h.Type, got, want)
		}
		if h.Type != TypeRegisterSegment {
			if fds != nil {
				t.Fatalf("%s came with fds %v", h.Type, fds)
			}
			continue
		}
		if len(fds) != 1 {
			t.Fatalf("RegisterSegment came with %d fds", len(fds))
		}
		if fds[0] == seg || !sameFile(t, fds[0], seg) {
			t.Fatalf("received fd %d is not a new descriptor of the memfd %d", fds[0], seg)
		}
		buf := make([]byte, 13)
		if _, err := unix.Pread(fds[0], buf, 4096); err != nil || string(buf) != "hello segment" {
			t.Fatalf("read through the received fd: %q, %v", buf, err)
		}
		if flags, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("received fd is not close-on-exec (flags %#x, %v)", flags, err)
		}
		unix.Close(fds[0])
	}
}

func TestConnNilMessageIsZero(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	if err := a.Send(ctx, TypeAck, 5, nil); err != nil {
		t.Fatal(err)
	}
	h, m, _, err := b.Recv(ctx)
	if err != nil || h.Type != TypeAck || h.ID != 5 || h.Len != 0 || !reflect.DeepEqual(m, &Ack{}) {
		t.Fatalf("got %+v %+v %v", h, m, err)
	}
}

func TestConnSendRules(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	seg := memfd(t, 4096)
	for _, c := range []struct {
		name string
		send func() error
	}{
		{"register without fd", func() error { return a.Send(ctx, TypeRegisterSegment, 1, &RegisterSegment{Size: 4096}) }},
		{"register with two fds", func() error {
			return a.Send(ctx, TypeRegisterSegment, 1, &RegisterSegment{Size: 4096}, seg, seg)
		}},
		{"ping with fd", func() error { return a.Send(ctx, TypePing, 1, &Ping{}, seg) }},
		{"negative fd", func() error { return a.Send(ctx, TypeRegisterSegment, 1, &RegisterSegment{Size: 1}, -1) }},
		{"type mismatch", func() error { return a.Send(ctx, TypePing, 1, &Pong{}) }},
		{"unknown type", func() error { return a.Send(ctx, Type(99), 1, nil) }},
		{"zero Error", func() error { return a.Send(ctx, TypeError, 1, nil) }},
		{"invalid message", func() error { return a.Send(ctx, TypeRemove, 1, Remove{Keys: []string{""}}) }},
	} {
		if err := c.send(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", c.name, err)
		}
	}
	// Nothing was written: the next frame is the first the peer sees.
	if err := a.Send(ctx, TypePing, 2, Ping{Nonce: 3}); err != nil {
		t.Fatal(err)
	}
	if h, m, _, err := b.Recv(ctx); err != nil || h.ID != 2 || m.(*Ping).Nonce != 3 {
		t.Fatalf("got %+v %+v %v", h, m, err)
	}
}

func TestConnRejectsWrongFDs(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	seg := memfd(t, 4096)
	reg := frame(t, 11, &RegisterSegment{Size: 4096, Name: "kv"})
	cases := []struct {
		name  string
		frame []byte
		fds   []int
	}{
		{"ping with an fd", frame(t, 11, &Ping{Nonce: 1}), []int{seg}},
		{"put with an fd", frame(t, 11, &Put{Items: putItems(1, 1, 1)}), []int{seg}},
		{"register without fd", reg, nil},
		{"register with two fds", reg, []int{seg, seg}},
		{"register with too many fds", reg, []int{seg, seg, seg, seg, seg, seg, seg, seg, seg, seg, seg, seg}},
		{"register that does not decode", append(rawHeader(Magic, Version, byte(TypeRegisterSegment), 11, 2), 0x08, 0x80), []int{seg}},
		{"unknown type with an fd", rawHeader(Magic, Version, 99, 11, 0), []int{seg}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := openFDs(t)
			var oob []byte
			if len(c.fds) > 0 {
				oob = unix.UnixRights(c.fds...)
			}
			if _, _, err := a.uc.WriteMsgUnix(c.frame, oob, nil); err != nil {
				t.Fatal(err)
			}
			h, m, fds, err := b.Recv(ctx)
			var me *MessageError
			if !errors.As(err, &me) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("Recv = %+v, %v; want a MessageError", m, err)
			}
			if h.ID != 11 || me.Header.ID != 11 || fds != nil || m != nil {
				t.Errorf("header %+v (error's %+v), fds %v, message %v", h, me.Header, fds, m)
			}
			if after := openFDs(t); after != before {
				t.Errorf("%d descriptors open before, %d after: received fds leaked", before, after)
			}
			// Still in sync.
			if err := a.Send(ctx, TypePing, 12, &Ping{Nonce: 9}); err != nil {
				t.Fatal(err)
			}
			if h, m, _, err := b.Recv(ctx); err != nil || h.ID != 12 || m.(*Ping).Nonce != 9 {
				t.Fatalf("next frame: %+v %+v %v", h, m, err)
			}
		})
	}
}

func TestConnLargeFrame(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	doc := bytes.Repeat([]byte(`{"k":"0123456789"},`), 600_000) // ~11 MiB: many partial writes
	errc := make(chan error, 1)
	go func() { errc <- a.Send(ctx, TypeStatsReply, 1, &StatsReply{JSON: doc}) }()
	h, m, _, err := b.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if h.Type != TypeStatsReply || !bytes.Equal(m.(*StatsReply).JSON, doc) {
		t.Fatalf("large frame came back as %+v, %d bytes", h, len(m.(*StatsReply).JSON))
	}
	if b.body != nil {
		t.Error("a buffer over maxKeptBuffer was kept")
	}
}

// Many goroutines send, with file descriptors and large frames among them; every
// frame arrives whole, and each descriptor with its own frame.
func TestConnConcurrentSend(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	const senders, each = 6, 60
	segs := make([]int, senders)
	for i := range segs {
		segs[i] = memfd(t, 4096)
	}
	big := &StatsReply{JSON: bytes.Repeat([]byte("x"), 300_000)}
	var wg sync.WaitGroup
	errc := make(chan error, senders)
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				id := uint64(s*1000 + i)
				var err error
				switch i % 3 {
				case 0:
					err = a.Send(ctx, TypeRegisterSegment, id, &RegisterSegment{Size: 4096, Name: fmt.Sprint(s)}, segs[s])
				case 1:
					err = a.Send(ctx, TypeStatsReply, id, big)
				default:
					err = a.Send(ctx, TypePing, id, &Ping{Nonce: id})
				}
				if err != nil {
					errc <- err
					return
				}
			}
		})
	}
	seen := map[uint64]bool{}
	for range senders * each {
		h, m, fds, err := b.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[h.ID] {
			t.Fatalf("id %d twice", h.ID)
		}
		seen[h.ID] = true
		switch m := m.(type) {
		case *RegisterSegment:
			var s int
			fmt.Sscan(m.Name, &s)
			if len(fds) != 1 || !sameFile(t, fds[0], segs[s]) {
				t.Fatalf("RegisterSegment of sender %d came with the wrong fds %v", s, fds)
			}
			unix.Close(fds[0])
		case *StatsReply:
			if len(m.JSON) != len(big.JSON) || len(fds) != 0 {
				t.Fatalf("StatsReply of %d bytes with fds %v", len(m.JSON), fds)
			}
		case *Ping:
			if m.Nonce != h.ID || len(fds) != 0 {
				t.Fatalf("Ping %d in frame %d with fds %v", m.Nonce, h.ID, fds)
			}
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func TestConnRecvDeadline(t *testing.T) {
	a, b := socketpair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, _, err := b.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv past deadline: %v", err)
	}
	// Cancelled while blocked.
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel2)
	if _, _, _, err := b.Recv(ctx2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv cancelled: %v", err)
	}
	// Already cancelled.
	if _, _, _, err := b.Recv(ctx2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv with a done context: %v", err)
	}
	// Nothing was read, so the connection is still good, with no deadline left over.
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = a.Send(context.Background(), TypePing, 1, &Ping{Nonce: 1})
	}()
	if h, _, _, err := b.Recv(context.Background()); err != nil || h.ID != 1 {
		t.Fatalf("after timeouts: %+v %v", h, err)
	}
	// A timeout in the middle of a frame loses the stream.
	if _, err := a.uc.Write(frame(t, 2, &Ping{Nonce: 2})[:10]); err != nil {
		t.Fatal(err)
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel3()
	if _, _, _, err := b.Recv(ctx3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv mid-frame past deadline: %v", err)
	}
	if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after losing the stream: %v", err)
	}
}

func TestConnSendDeadline(t *testing.T) {
	a, b := socketpair(t)
	_ = b
	// Nobody reads: an 8 MiB frame cannot fit in the socket buffer.
	big := &StatsReply{JSON: bytes.Repeat([]byte("y"), 8<<20)}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := a.Send(ctx, TypeStatsReply, 1, big)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send past deadline: %v", err)
	}
	// Part of the frame went out, so the connection cannot send any more.
	if err := a.Send(context.Background(), TypePing, 2, &Ping{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after a partial frame: %v", err)
	}
	// The peer sees a truncated frame, not a hang.
	if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("peer of a partial frame: %v", err)
	}
}

func TestConnClose(t *testing.T) {
	a, b := socketpair(t)
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := b.Recv(ctx)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Recv after Close: %v", err)
	}
	if _, _, _, err := b.Recv(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
	if err := b.Send(ctx, TypePing, 1, &Ping{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The peer sees a clean end of stream.
	if _, _, _, err := a.Recv(ctx); err != io.EOF {
		t.Fatalf("peer Recv: %v, want io.EOF", err)
	}
}

func TestConnTruncatedByPeer(t *testing.T) {
	a, b := socketpair(t)
	if _, err := a.uc.Write(frame(t, 1, &Hello{ClientName: "a longer client name"})[:20]); err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, _, _, err := b.Recv(context.Background())
	if !errors.Is(err, ErrMalformed) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Recv of a frame cut by the peer: %v", err)
	}
}

func TestConnBadMagicLosesStream(t *testing.T) {
	a, b := socketpair(t)
	if _, err := a.uc.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	h, _, _, err := b.Recv(context.Background())
	var me *MessageError
	if !errors.Is(err, ErrMalformed) || errors.As(err, &me) || h != (Header{}) {
		t.Fatalf("Recv of HTTP: %+v %v", h, err)
	}
	if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after bad magic: %v", err)
	}
}

func TestPeerCred(t *testing.T) {
	a, _ := socketpair(t)
	pid, uid, gid, err := a.PeerCred()
	if err != nil {
		t.Fatal(err)
	}
	if pid != os.Getpid() || uid != os.Getuid() || gid != os.Getgid() {
		t.Fatalf("PeerCred = %d %d %d, want %d %d %d", pid, uid, gid, os.Getpid(), os.Getuid(), os.Getgid())
	}
}

// A side that shut its writing half reads what the peer still sends and
// learns when the peer closes (AwaitClose); an ended context stops the wait.
func TestCloseWriteThenAwaitClose(t *testing.T) {
	a, b := socketpair(t)
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, _, err := b.Recv(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("the peer's receive after CloseWrite: %v, want EOF", err)
	}
	if err := b.Send(ctx, TypePing, 1, Ping{Nonce: 7}); err != nil {
		t.Fatalf("the peer can still send: %v", err)
	}
	closed := make(chan bool, 1)
	go func() { closed <- a.AwaitClose(ctx) }()
	b.Close()
	select {
	case ok := <-closed:
		if !ok {
			t.Fatal("AwaitClose did not see the peer close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitClose did not return after the peer closed")
	}
	c, d := socketpair(t)
	_ = d
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if c.AwaitClose(short) {
		t.Fatal("AwaitClose reported a close when its context ended first")
	}
}
