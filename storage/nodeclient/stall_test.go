package nodeclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// stallCallTimeout is the client's call timeout in the stalled-service tests:
// short, since each of them waits it out.
const stallCallTimeout = 200 * time.Millisecond

// stallBound bounds every wait of these tests, so that a client that hangs
// fails them rather than hanging them.
const stallBound = 10 * time.Second

// stalledBody is the body length a stalled reply's header announces.
const stalledBody = 100

// stallingService answers like the node service, but to a request of type
// stallOn it sends the header of a reply that announces a body and goes
// silent, keeping the connection open: a service stopped in the middle of a
// write, or any process listening on the socket.
type stallingService struct {
	ln      *net.UnixListener
	stallOn wire.Type
	stalled chan struct{} // a value each time it stalls

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startStalling(t *testing.T, stallOn wire.Type) (*stallingService, string) {
	t.Helper()
	socket := filepath.Join(socketDir(t), "s")
	ln, err := wire.Listen(socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	s := &stallingService{ln: ln, stallOn: stallOn, stalled: make(chan struct{}, 64)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.session(c)
			}()
		}
	}()
	t.Cleanup(s.close)
	return s, socket
}

// session reads frames with a plain read (the memfds that come with
// RegisterSegment are dropped by the kernel) and answers them.
func (s *stallingService) session(c net.Conn) {
	for {
		h, body, err := wire.ReadFrame(c)
		if err != nil {
			return
		}
		var reply wire.Message
		switch h.Type {
		case wire.TypeHello:
			reply = wire.HelloReply{ClientID: 1, MaxBatch: wire.MaxItems}
		case wire.TypeRegisterSegment:
			reply = wire.RegisterSegmentReply{SegmentID: 1}
		case wire.TypePut, wire.TypeGet:
			m, err := wire.Decode(h.Type, body)
			if err != nil {
				return
			}
			n := len(m.(*wire.Put).Items)
			if g, ok := m.(*wire.Get); ok {
				n = len(g.Items)
			}
			reply = wire.BatchReply{Results: make([]wire.Result, n)}
		default:
			reply = wire.Error{Code: wire.Internal, Message: "the stalling service does not serve " + h.Type.String()}
		}
		if h.Type == s.stallOn {
			hdr := append([]byte(wire.Magic), wire.Version, byte(reply.Type()))
			hdr = binary.LittleEndian.AppendUint64(hdr, h.ID)
			hdr = binary.LittleEndian.AppendUint32(hdr, stalledBody)
			_, _ = c.Write(hdr)
			s.stalled <- struct{}{}
			continue // reads on, answers nothing more
		}
		if err := wire.WriteFrame(c, h.ID, reply); err != nil {
			return
		}
	}
}

func (s *stallingService) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *stallingService) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func stallClient(t *testing.T, socket string) *Backend {
	t.Helper()
	cfg := DefaultConfig(socket)
	cfg.Logger = quiet
	cfg.CallTimeout = stallCallTimeout
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, b) })
	return b
}

// closeWithin closes b, failing the test if that takes longer than stallBound.
func closeWithin(t *testing.T, b *Backend) {
	t.Helper()
	done := make(chan struct{})
	go func() { b.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(stallBound):
		t.Errorf("Close still blocked after %v", stallBound)
	}
}

// within runs f and fails the test if it does not return within stallBound.
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(stallBound):
		t.Fatalf("%s still blocked after %v", what, stallBound)
	}
	panic("unreachable")
}

// The service sends the header of its HelloReply (or of its answer to the
// registration of a pool) and stalls: connect fails at its deadline with an
// error that names the stalled frame, and the connector keeps trying. Before,
// the deadline made the read return -1 bytes and the client panicked.
func TestConnectFailsOnAStalledReply(t *testing.T) {
	for _, c := range []struct {
		stallOn wire.Type
		reply   wire.Type
	}{
		{wire.TypeHello, wire.TypeHelloReply},
		{wire.TypeRegisterSegment, wire.TypeRegisterSegmentReply},
	} {
		t.Run(c.stallOn.String(), func(t *testing.T) {
			s, socket := startStalling(t, c.stallOn)
			b := stallClient(t, socket)
			if c.stallOn == wire.TypeRegisterSegment {
				// Registered while not connected: connect registers it (registerOn).
				if err := b.RegisterPool(context.Background(), poolSpec(testGroup(t, b, 8), "kv")); err != nil {
					t.Fatal(err)
				}
			}
			began := time.Now()
			err := within(t, "connect", func() error { _, err := b.connect(); return err })
			if err == nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("connect = %v, want a deadline error", err)
			}
			want := fmt.Sprintf("%s frame (id 1) body: 0 of %d bytes arrived before the receive's deadline", c.reply, stalledBody)
			if !contains(err.Error(), want) {
				t.Fatalf("connect error %q does not say %q", err, want)
			}
			if d := time.Since(began); d > stallBound {
				t.Fatalf("connect took %v", d)
			}
			ctx, cancel := context.WithTimeout(context.Background(), stallCallTimeout)
			defer cancel()
			if err := b.WaitConnected(ctx); !errors.Is(err, storage.ErrUnavailable) {
				t.Fatalf("WaitConnected = %v, want ErrUnavailable", err)
			}
			// The connector stays alive and retries.
			n := s.connections()
			waitFor(t, "the connector to try again", func() bool { return s.connections() > n })
		})
	}
}

// The service registered the pools, then sends the header of a reply to a
// RegisterPool or a Put and stalls: the call returns at its deadline, the
// connection is given up (the frame timeout ends the reader's wait for the
// rest of the reply) and the client connects again.
func TestCallsOnAStalledReplyReturnAndTheClientReconnects(t *testing.T) {
	t.Run("RegisterPool", func(t *testing.T) {
		s, socket := startStalling(t, wire.TypeRegisterSegment)
		b := stallClient(t, socket)
		g := testGroup(t, b, 8)
		// Connected with no pools: nothing stalls yet.
		waitConnected(t, b)
		ctx, cancel := context.WithTimeout(context.Background(), stallCallTimeout)
		defer cancel()
		// A live registration that the service does not answer is given up and
		// left to the next connection: RegisterPool says nil.
		if err := within(t, "RegisterPool", func() error { return b.RegisterPool(ctx, poolSpec(g, "kv")) }); err != nil {
			t.Fatalf("RegisterPool = %v", err)
		}
		recvStalled(t, s)
		waitFor(t, "the client to connect again", func() bool { return s.connections() > 1 })
	})
	t.Run("Put", func(t *testing.T) {
		s, socket := startStalling(t, wire.TypePut)
		b := stallClient(t, socket)
		g := testGroup(t, b, 8)
		if err := b.RegisterPool(context.Background(), poolSpec(g, "kv")); err != nil {
			t.Fatal(err)
		}
		waitConnected(t, b)
		// The call's deadline comes before the frame timeout, which starts when
		// the reply's header arrives; on a machine too busy to run the call
		// until the frame timeout has dropped the connection, it fails as lost.
		ctx, cancel := context.WithTimeout(context.Background(), stallCallTimeout/2)
		defer cancel()
		errs := within(t, "Put", func() []error { return b.Put(ctx, "kv", keys(2), []pool.PageID{0, 1}) })
		for i, err := range errs {
			if !errors.Is(err, storage.ErrTimeout) && !errors.Is(err, storage.ErrUnavailable) {
				t.Fatalf("put %d on a stalled reply: %v, want ErrTimeout (or ErrUnavailable)", i, err)
			}
		}
		recvStalled(t, s)
		waitFor(t, "the client to connect again", func() bool { return s.connections() > 1 })
		waitConnected(t, b)
	})
}

func waitConnected(t *testing.T, b *Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stallBound)
	defer cancel()
	if err := b.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
}

func recvStalled(t *testing.T, s *stallingService) {
	t.Helper()
	select {
	case <-s.stalled:
	case <-time.After(stallBound):
		t.Fatal("the service never stalled")
	}
}
