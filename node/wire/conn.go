package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// maxFDs is how many file descriptors a received frame may carry before the
	// kernel's control data is cut (the frame is refused either way: only
	// RegisterSegment carries one).
	maxFDs = 8
	// maxKeptBuffer is the largest read or write buffer a Conn keeps between frames;
	// a larger one (a huge stats document) is dropped after use.
	maxKeptBuffer = 1 << 20
)

// Conn is one end of a node-service connection over a Unix stream socket: it reads
// and writes whole frames and passes file descriptors (SCM_RIGHTS) with
// RegisterSegment frames.
//
// Send is safe for concurrent use: frames are written whole, one at a time, in the
// order the calls take the write lock. Recv is meant for one reader goroutine (a
// client's reply dispatcher, a server's per-connection loop); concurrent Recv
// calls are serialised, each getting whole frames. Close may be called at any
// time, from any goroutine, and unblocks both.
type Conn struct {
	uc     *net.UnixConn
	closed atomic.Bool

	rmu  sync.Mutex
	hdr  [HeaderSize]byte
	body []byte
	in   fdReader
	rerr error // set once the incoming stream is lost
	// frameTimeout, when positive, bounds the rest of a frame once its first byte
	// arrived (see SetFrameTimeout).
	frameTimeout atomic.Int64
	gate         atomic.Pointer[func(context.Context, Header) error]

	wmu  sync.Mutex
	wbuf []byte
	werr error // set once the outgoing stream is lost
}

// NewConn wraps c. The Conn owns c from now on: Close closes it.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{uc: c, in: fdReader{uc: c, oob: make([]byte, unix.CmsgSpace(maxFDs*4))}}
}

// SetFrameTimeout bounds how long Recv waits for the rest of a frame once its
// first byte arrived, whatever the deadline of Recv's context: a server waits as
// long as it likes for a client's next request, but a peer that sends a part of a
// frame and stalls must not hold the reader (and the slot) for ever. Zero, the
// default, leaves only the context's deadline. A frame cut off by it fails Recv
// and the connection, like a truncated one.
func (c *Conn) SetFrameTimeout(d time.Duration) { c.frameTimeout.Store(int64(d)) }

// SetGate has Recv call g with each frame's header before it reads the body,
// with Recv's context: a server holds a frame's memory against a budget (and
// waits for it) before the frame takes any, so that a client's next large
// request waits in the socket, not in the server's heap. When g fails, Recv
// reads and drops the body and returns a *MessageError with the header that
// wraps g's error; the connection stays in sync. After g returns, the frame
// timeout starts again for the body. nil removes the gate.
func (c *Conn) SetGate(g func(ctx context.Context, h Header) error) {
	if g == nil {
		c.gate.Store(nil)
		return
	}
	c.gate.Store(&g)
}

// Send validates msg, of type t, and writes it as one frame with request id id; fds
// go with it (SCM_RIGHTS). Only TypeRegisterSegment carries file descriptors, and
// exactly one (the segment's memfd); the caller keeps its own copy of it and closes
// it when it likes. A nil msg sends t's zero message (Ack, Stats). A message that
// breaks the protocol's rules is an error wrapping ErrMalformed, and nothing is
// written. Send honours ctx's deadline and cancellation; a send interrupted after
// part of the frame was written leaves the connection unusable for sending
// (ErrClosed from then on), since the peer cannot find the next frame.
func (c *Conn) Send(ctx context.Context, t Type, id uint64, msg Message, fds ...int) error {
	if msg == nil {
		if msg = newMessage(t); msg == nil {
			return malformed("send: unknown message type %d", uint8(t))
		}
	}
	if msg.Type() != t {
		return malformed("send %s: the message is a %s", t, msg.Type())
	}
	if t == TypeRegisterSegment && len(fds) != 1 {
		return malformed("send RegisterSegment with %d file descriptors; it carries exactly one, the segment's memfd", len(fds))
	}
	if t != TypeRegisterSegment && len(fds) != 0 {
		return malformed("send %s with %d file descriptors; only RegisterSegment carries one", t, len(fds))
	}
	for _, fd := range fds {
		if fd < 0 {
			return malformed("send %s: file descriptor %d is not valid", t, fd)
		}
	}

	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("send %s: %w", t, ErrClosed)
	}
	if c.werr != nil {
		return c.werr
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("send %s: %w", t, err)
	}
	frame, err := AppendFrame(c.wbuf[:0], id, msg)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	c.wbuf = frame[:0]
	if cap(c.wbuf) > maxKeptBuffer {
		c.wbuf = nil
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}

	dl, _ := ctx.Deadline()
	if err := c.uc.SetWriteDeadline(dl); err != nil {
		return c.ioError(ctx, "send "+t.String(), err)
	}
	stop := watch(ctx, c.uc.SetWriteDeadline)
	n, _, err := c.uc.WriteMsgUnix(frame, oob, nil)
	if err == nil && n < len(frame) {
		// A stream socket may take part of a frame; the file descriptors went with
		// its first byte.
		var m int
		m, err = c.uc.Write(frame[n:])
		n += m
	}
	stop()
	if err != nil {
		err = c.ioError(ctx, "send "+t.String(), err)
		if n > 0 {
			c.werr = fmt.Errorf("send: connection unusable after a send failed %d bytes into a frame (%v): %w", n, err, ErrClosed)
			_ = c.uc.CloseWrite() // the peer sees a truncated frame rather than waiting
		}
		return err
	}
	return nil
}

// Recv reads the next frame and decodes its message. fds are the file
// descriptors that came with it (only ever with a RegisterSegment, exactly one);
// the caller owns them and must close them. A frame that breaks the protocol in
// its contents (unknown type, bad body, wrong file descriptors) is returned as a
// *MessageError with its header, and any file descriptors it carried are closed;
// the connection stays in sync and a server can answer Error to h.ID. At a clean
// end of stream the error is io.EOF. Recv honours ctx's deadline and cancellation:
// if it ends Recv before the frame's first byte arrived, the connection can still
// be used; after that, as after a truncated or unreadable frame, it cannot, and
// later calls fail with ErrClosed.
func (c *Conn) Recv(ctx context.Context) (h Header, msg Message, fds []int, err error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return Header{}, nil, nil, fmt.Errorf("recv: %w", ErrClosed)
	}
	if c.rerr != nil {
		return Header{}, nil, nil, c.rerr
	}
	if err := ctx.Err(); err != nil {
		return Header{}, nil, nil, fmt.Errorf("recv: %w", err)
	}
	dl, _ := ctx.Deadline()
	if err := c.uc.SetReadDeadline(dl); err != nil {
		return Header{}, nil, nil, c.ioError(ctx, "recv", err)
	}
	stop := watch(ctx, c.uc.SetReadDeadline)
	c.in.reset()
	c.in.ctx, c.in.deadline, c.in.frameTimeout = ctx, dl, time.Duration(c.frameTimeout.Load())
	var admit func(Header) error
	if g := c.gate.Load(); g != nil {
		admit = func(h Header) error {
			err := (*g)(ctx, h)
			// The wait for the gate is not the peer's: the body gets its own
			// frame timeout from now.
			if c.in.frameTimeout > 0 {
				c.in.startFrame()
			}
			return err
		}
	}
	h, body, err := readFrame(&c.in, &c.hdr, c.body, admit)
	c.in.ctx = nil
	stop()
	if body != nil {
		c.body = body[:0]
		if cap(body) > maxKeptBuffer {
			c.body = nil
		}
	}
	fds, c.in.fds = c.in.fds, nil
	var me *MessageError
	switch {
	case err == io.EOF && len(fds) == 0:
		return Header{}, nil, nil, io.EOF
	case errors.As(err, &me):
		closeFDs(fds)
		return h, nil, nil, err
	case err != nil:
		closeFDs(fds)
		err = c.ioError(ctx, "recv", err)
		if c.in.n > 0 || !isTimeout(err) {
			c.rerr = fmt.Errorf("recv: connection unusable after an earlier error (%v): %w", err, ErrClosed)
		}
		return Header{}, nil, nil, err
	}
	reject := func(err error) (Header, Message, []int, error) {
		closeFDs(fds)
		return h, nil, nil, &MessageError{Header: h, Err: err}
	}
	switch {
	case c.in.err != nil:
		return reject(malformed("unreadable control data: %v", c.in.err))
	case c.in.truncated:
		return reject(malformed("more than %d file descriptors with one frame", maxFDs))
	case h.Type == TypeRegisterSegment && len(fds) != 1:
		return reject(malformed("RegisterSegment carries %d file descriptors; it needs exactly one, the segment's memfd", len(fds)))
	case h.Type != TypeRegisterSegment && len(fds) != 0:
		return reject(malformed("%s carries %d file descriptors; only RegisterSegment may carry one", h.Type, len(fds)))
	}
	msg, err = Decode(h.Type, body)
	if err != nil {
		return reject(err)
	}
	return h, msg, fds, nil
}

// Close closes the connection. Calls in progress and later calls fail with
// ErrClosed. Closing twice is harmless.
func (c *Conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	return c.uc.Close()
}

// CloseWrite shuts the connection's sending side: the peer reads the end of
// the stream, and what it still sends can be read. A client that gives up on a
// connection this way learns when the peer has closed it (AwaitClose).
func (c *Conn) CloseWrite() error {
	return c.uc.CloseWrite()
}

// AwaitClose discards what the peer still sends until it closes the
// connection, and reports whether it did before ctx ended. Call it only once
// nothing else receives on the connection (after Recv failed, say): it reads
// the socket directly.
func (c *Conn) AwaitClose(ctx context.Context) bool {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = c.uc.SetReadDeadline(time.Now()) })
	defer stop()
	_ = c.uc.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	for {
		if _, err := c.uc.Read(buf); err != nil {
			return ctx.Err() == nil && (errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET))
		}
	}
}

// CloseRead shuts the connection's receiving side: a Recv in progress and
// later ones end (io.EOF), while replies can still be sent. A server ends a
// session this way, and closes it once the requests in flight have ended.
func (c *Conn) CloseRead() error {
	return c.uc.CloseRead()
}

// PeerCred returns the process id, user id and group id of the peer process, as
// the kernel recorded them when the connection was made (SO_PEERCRED): what a
// server trusts, rather than Hello.PID.
func (c *Conn) PeerCred() (pid, uid, gid int, err error) {
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return 0, 0, 0, fmt.Errorf("peer credentials: SO_PEERCRED: %w", cerr)
	}
	return int(cred.Pid), int(cred.Uid), int(cred.Gid), nil
}

// ioError describes a failed socket operation: ErrClosed when this side closed
// the connection, the context's error when it ended the call.
func (c *Conn) ioError(ctx context.Context, op string, err error) error {
	switch {
	case c.closed.Load() || errors.Is(err, net.ErrClosed):
		return fmt.Errorf("%s: %w", op, ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w: %w", op, ctx.Err(), err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s: %w: %w", op, context.DeadlineExceeded, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// watch makes ctx's cancellation end a blocked read or write by moving its
// deadline (set) into the past. The returned stop undoes the watch; it waits for a
// watch that already fired, so that it cannot move the deadline of a later call.
func watch(ctx context.Context, set func(time.Time) error) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	fired := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		_ = set(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if !cancel() {
			<-fired
		}
	}
}
